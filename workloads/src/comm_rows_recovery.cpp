// The batch reduction's recovery: undelivered chunks summed at their destination from point-to-point pieces.
#include "comm_rows_recovery.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "ifec/common/blob.h"
#include "ifec/common/numeric.h"

namespace ifec::workloads {

std::vector<uint8_t> encode_undelivered(const Communicator& c, const RowBook& rows, const RowChunks& ch,
                                        const ChunkPlaces& places, const endpoint::EchReduction& recv,
                                        const std::vector<RowChunk>& received, uint64_t anomalies) {
  std::vector<uint32_t> failed;  // row index, chunk, row index, chunk, ...
  uint32_t position = 0;         // among this rank's rows with contributors
  for (const RowIn& row : rows.mine()) {
    if (row.contributors.empty()) {
      continue;
    }
    for (uint32_t k = 0; k < ch.per_row; ++k) {
      if (places.at(position, k).plane < 0) {
        failed.push_back(row.index);
        failed.push_back(k);
      }
    }
    ++position;
  }
  for (size_t i = 0; i < received.size(); ++i) {
    if (recv.outcome(i) != endpoint::EchOutcome::kDone) {
      failed.push_back(received[i].first);
      failed.push_back(received[i].second);
    }
  }
  // Each failed chunk's contributors (count, ranks), in the same order: they place their pieces by it.
  std::vector<int> contributors;
  for (size_t i = 0; i < failed.size(); i += 2) {
    const RowIn* row = rows.mine(failed[i]);
    contributors.push_back(static_cast<int>(row->contributors.size()));
    contributors.insert(contributors.end(), row->contributors.begin(), row->contributors.end());
  }
  common::BlobWriter w;
  w.put_vector(failed);
  w.put<uint64_t>(anomalies);
  w.put_vector(contributors);
  return w.take();
}

uint64_t PieceRecovery::learn(const Gathered& g, uint64_t& anomalies) {
  failed_.assign(comm_.size(), {});
  uint64_t total = 0;
  for (int d = 0; d < comm_.size(); ++d) {
    common::BlobReader rd(g.parts[d], "rank " + std::to_string(d) + "'s undelivered chunks");
    const std::vector<uint32_t> f = rd.get_vector<uint32_t>();
    anomalies += rd.get<uint64_t>();
    const std::vector<int> lists = rd.get_vector<int>();
    size_t at = 0;
    for (size_t i = 0; i + 1 < f.size(); i += 2) {
      IFEC_CHECK(at < lists.size() && at + 1 + static_cast<size_t>(lists[at]) <= lists.size(),
                 "rank " << d << "'s undelivered chunks: contributor lists cut short");
      failed_[d].push_back({f[i], f[i + 1], {lists.begin() + at + 1, lists.begin() + at + 1 + lists[at]}});
      at += 1 + static_cast<size_t>(lists[at]);
    }
    total += failed_[d].size();
  }
  return total;
}

uint64_t PieceRecovery::collect() {
  uint64_t pieces = 0;
  for (const Failed& f : failed_[comm_.rank()]) {
    pieces += f.contributors.size();
    expected_ += f.contributors.size() * ch_.elements(f.chunk) * ch_.esize;
  }
  in_.clear();
  collecting_ = true;
  return std::max<uint64_t>(64, pieces * ch_.chunk_elems * ch_.esize);
}

void PieceRecovery::send(const std::function<void(const endpoint::OpHandle&)>& posted) {
  endpoint::Endpoint& ep = comm_.endpoint();
  const uint64_t chunk_bytes = ch_.chunk_bytes();
  std::map<std::pair<int, uint32_t>, uint64_t> my_offset;  // (destination, row index) -> my source offset
  for (const RowContribution& rc : a_.contribute) {
    my_offset[{rc.destination, rc.index}] = rc.source_offset;
  }
  for (int d = 0; d < comm_.size(); ++d) {
    uint64_t slot = 0;
    for (const Failed& f : failed_[d]) {
      for (int contributor : f.contributors) {
        if (contributor == comm_.rank()) {
          const uint64_t from = my_offset[{d, f.index}] + uint64_t{f.chunk} * chunk_bytes;
          ++out_;
          posted(ep.store(comm_.gpu(d), scratch_, slot * chunk_bytes, ep.memory().window(a_.source_window)->data + from,
                          ch_.elements(f.chunk) * ch_.esize));
        }
        ++slot;
      }
    }
  }
  sent_ = true;
}

bool PieceRecovery::claim(uint16_t window, uint64_t offset, uint64_t len) {
  if (window != scratch_ || !collecting_) {
    return false;
  }
  in_.insert(offset, len);
  return true;
}

void PieceRecovery::sum() {
  summed_ = true;
  const uint64_t chunk_bytes = ch_.chunk_bytes();
  endpoint::Endpoint& ep = comm_.endpoint();
  const uint8_t* scratch = ep.memory().window(scratch_)->data;
  uint8_t* result = ep.memory().window(a_.result_window)->data + a_.result_offset;
  std::vector<common::Acc> acc(ch_.chunk_elems);
  uint64_t slot = 0;
  for (const Failed& f : failed_[comm_.rank()]) {
    for (size_t i = 0; i < f.contributors.size(); ++i, ++slot) {
      common::accumulate(a_.dtype, common::EchRedOp::kSum, acc.data(), scratch + slot * chunk_bytes,
                         ch_.elements(f.chunk), i == 0);
    }
    common::finalize(a_.dtype, acc.data(), result + uint64_t{f.index} * ch_.row_bytes + uint64_t{f.chunk} * chunk_bytes,
                     ch_.elements(f.chunk));
  }
}

std::string PieceRecovery::describe() const {
  std::ostringstream os;
  os << out_ << " store(s) in flight, " << in_.bytes() << " of " << expected_ << " B of pieces";
  return os.str();
}

}  // namespace ifec::workloads
