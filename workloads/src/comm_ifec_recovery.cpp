// After an in-fabric round: the ranks' reports, the copies and redos decided from them, the endpoint path, and the
// stores held until this rank knows what they are for.
#include "comm_ifec_recovery.h"

#include "ifec/common/blob.h"
#include "ifec/common/checks.h"

namespace ifec::workloads {

RoundReport report_round(const endpoint::EchReduction& red, const IfecChunks& ch, int rank, int ranks) {
  RoundReport r;
  r.has.assign(red.spec().chunks.size(), 0);
  for (size_t t = 0; t < r.has.size(); ++t) {
    const endpoint::EchOutcome o = red.outcome(t);
    r.has[t] = o == endpoint::EchOutcome::kDone && ch.needs_result(rank);
    r.anomalies += o == endpoint::EchOutcome::kAnomaly;
    r.given_up += o == endpoint::EchOutcome::kGivenUp;
  }
  // Results that carried the anomaly flag (NaN/Inf met in the switch): counted once, by the first receiver.
  int first_receiver = 0;
  while (first_receiver < ranks - 1 && !ch.needs_result(first_receiver)) {
    ++first_receiver;
  }
  if (rank == first_receiver) {
    r.anomalies += static_cast<uint32_t>(red.flagged_results());
  }
  r.planes_lost = red.planes_given_up();
  return r;
}

// `has` travels as one bit per chunk: every rank receives every rank's report (N x N x chunks), and the simulator's
// in-process bootstrap hands each rank its own copy (the 1,024-GPU SUN's 4,096 chunks: 4 GB in bytes, 0.5 GB in bits).
std::vector<uint8_t> encode_report(const RoundReport& r) {
  std::vector<uint8_t> bits((r.has.size() + 7) / 8, 0);
  for (size_t t = 0; t < r.has.size(); ++t) {
    bits[t / 8] |= static_cast<uint8_t>((r.has[t] != 0) << (t % 8));
  }
  common::BlobWriter w;
  w.put<uint32_t>(static_cast<uint32_t>(r.has.size())).put_vector(bits).put(r.anomalies).put(r.given_up);
  w.put<uint32_t>(static_cast<uint32_t>(r.planes_lost.size()));
  for (const auto& [p, why] : r.planes_lost) {
    w.put<int32_t>(p).put_string(why);
  }
  return w.take();
}

RoundReport decode_report(const std::vector<uint8_t>& bytes, const std::string& what) {
  common::BlobReader rd(bytes, what);
  RoundReport r;
  const uint32_t chunks = rd.get<uint32_t>();
  const std::vector<uint8_t> bits = rd.get_vector<uint8_t>();
  IFEC_CHECK(bits.size() == (uint64_t{chunks} + 7) / 8, what << ": " << bits.size() << " bytes of outcomes for "
                                                             << chunks << " chunks (expected "
                                                             << (uint64_t{chunks} + 7) / 8 << ")");
  r.has.resize(chunks);
  for (uint32_t t = 0; t < chunks; ++t) {
    r.has[t] = (bits[t / 8] >> (t % 8)) & 1;
  }
  r.anomalies = rd.get<uint32_t>();
  r.given_up = rd.get<uint32_t>();
  for (uint32_t i = rd.get<uint32_t>(); i > 0; --i) {
    const int p = rd.get<int32_t>();
    r.planes_lost.emplace(p, rd.get_string());
  }
  return r;
}

RoundResolution resolve_round(const Gathered& g, const std::vector<uint32_t>& todo, const IfecChunks& ch) {
  const int n = static_cast<int>(g.parts.size());
  RoundResolution res;
  std::vector<std::vector<uint8_t>> has(n);
  for (int r = 0; r < n; ++r) {
    RoundReport rep = decode_report(g.parts[r], "rank " + std::to_string(r) + "'s round outcome");
    has[r] = std::move(rep.has);
    res.anomalies += rep.anomalies;
    res.given_up += rep.given_up;
    res.planes_lost.insert(rep.planes_lost.begin(), rep.planes_lost.end());
  }
  for (size_t t = 0; t < todo.size(); ++t) {
    RoundResolution::Copy c{todo[t], -1, {}};
    for (int r = 0; r < n; ++r) {
      if (has[r][t]) {
        c.holder = c.holder < 0 ? r : c.holder;
      } else if (ch.needs_result(r)) {
        c.lacking.push_back(r);
      }
    }
    if (c.lacking.empty()) {
      continue;
    }
    if (c.holder < 0) {
      res.redo.push_back(todo[t]);
      continue;
    }
    if (ch.barrier()) {
      continue;  // the switch saw every rank arrive: the barrier is complete for all of them
    }
    res.copied += c.lacking.size();
    res.copies.push_back(std::move(c));
  }
  return res;
}

std::string RoundResolution::faults(int round) const {
  if (anomalies + given_up == 0 && planes_lost.empty()) {
    return "";
  }
  std::string line = "round " + std::to_string(round) + ": ";
  for (const auto& [p, why] : planes_lost) {
    line += "plane " + std::to_string(p) + " given up (" + why + "); ";
  }
  line += std::to_string(anomalies) + " anomaly notices (slot timeouts or released results), " +
          std::to_string(given_up) + " rank chunks given up; " + std::to_string(copied) +
          " results copied from a rank that had them; " + std::to_string(redo.size()) + " chunks nobody received";
  return line;
}

std::vector<endpoint::OpHandle> ResultCopies::start(const std::vector<RoundResolution::Copy>& copies) {
  from_.clear();
  in_.clear();
  bytes_in_ = 0;
  std::vector<endpoint::OpHandle> out;
  endpoint::Endpoint& ep = comm_.endpoint();
  for (const RoundResolution::Copy& c : copies) {
    const uint64_t off = ch_.offset(c.chunk);
    const uint64_t bytes = ch_.bytes(c.chunk);
    for (int r : c.lacking) {
      if (c.holder == comm_.rank()) {
        out.push_back(ep.store(comm_.gpu(r), a_.window, a_.offset + off,
                               ep.memory().window(a_.window)->data + a_.offset + off, bytes));
      } else if (r == comm_.rank()) {
        from_[off] = comm_.gpu(c.holder);
        bytes_in_ += bytes;
      }
    }
  }
  out_ = out.size();
  return out;
}

bool ResultCopies::claim(int peer, uint16_t window, uint64_t offset, uint64_t len) {
  if (window != a_.window || offset < a_.offset) {
    return false;
  }
  auto it = from_.find(offset - a_.offset);
  if (it == from_.end() || it->second != peer) {
    return false;
  }
  in_.insert(offset, len);
  return true;
}

uint64_t EndpointPath::plan(const std::vector<uint32_t>& chunks) {
  runs_.clear();
  uint64_t n = 0;
  for (size_t i = 0; i < chunks.size();) {
    size_t j = i + 1;
    while (j < chunks.size() && chunks[j] == chunks[j - 1] + 1) {
      ++j;
    }
    runs_.push_back({chunks[i], chunks[j - 1] + 1});
    n += chunks[j - 1] + 1 - chunks[i];
    i = j;
  }
  return n;
}

bool EndpointPath::run_next(schedule::Run::Finished done) {
  run_.reset();
  if (runs_.empty()) {
    return false;
  }
  const auto [k, end] = runs_.front();
  runs_.erase(runs_.begin());
  CollArgs sub = a_;
  if (!ch_.barrier()) {
    sub.offset = a_.offset + ch_.offset(k);
    sub.count = std::min<uint64_t>(a_.count, end * ch_.per_chunk()) - k * ch_.per_chunk();
  }
  run_ = std::make_unique<schedule::Run>(comm_, schedule::build(comm_, sub, Algo::kRing));
  run_->start([k = k, end = end, done = std::move(done)](bool ok, const std::string& error) {
    done(ok,
         ok ? error : "endpoint path for chunks " + std::to_string(k) + ".." + std::to_string(end - 1) + ": " + error);
  });
  return true;
}

void HeldStores::replay(const std::function<bool(const Communicator::Arrival&)>& claim) {
  std::vector<Communicator::Arrival> h;
  h.swap(held_);
  for (const Communicator::Arrival& x : h) {
    if (!claim(x)) {
      held_.push_back(x);
    }
  }
}

void HeldStores::pass_on(const std::function<void(const Communicator::Arrival&)>& pass_on) {
  for (const Communicator::Arrival& a : held_) {
    pass_on(a);
  }
  held_.clear();
}

}  // namespace ifec::workloads
