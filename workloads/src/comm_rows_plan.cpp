// The batch reduction's plan: rows learned and checked, the leader's groups, every chunk's plane and sequence.
#include "comm_rows_plan.h"

#include <algorithm>

#include "comm_round.h"
#include "ifec/common/blob.h"

namespace ifec::workloads {

namespace {

// One group per destination on switch `sw` (members: every rank; destination: that one, the only member with a
// result address).
std::vector<SwitchReservation> destination_groups(Communicator& c, const GroupOp& what, uint64_t offset,
                                                  const std::string& sw, uint32_t budget, const std::vector<int>& dests,
                                                  uint16_t base) {
  std::vector<SwitchReservation> groups;
  for (int d : dests) {
    common::GroupReservation gr = group_reservation(c, what, rows_group(base, d), budget);
    for (int r = 0; r < c.size(); ++r) {
      common::GroupMember m = group_member(c, r, what.window, offset);
      m.destination = r == d;
      if (!m.destination) {
        m.result_va = 0;
        m.rkey = 0;
      }
      gr.members.push_back(m);
    }
    groups.push_back({sw, gr});
  }
  return groups;
}

}  // namespace

RowChunks::RowChunks(const Communicator& c, const BatchReduceArgs& a)
    : row_elements(a.row_elements), esize(element_size(a.dtype)) {
  const routing::Topology& topo = c.topology();
  chunk_elems = static_cast<uint32_t>(
      std::max<size_t>(1, std::min<uint32_t>({topo.params.mtu, topo.params.ifec.slot_bytes, 4096}) / esize));
  per_row = (row_elements + chunk_elems - 1) / std::max<uint32_t>(1, chunk_elems);
  row_bytes = uint64_t{row_elements} * esize;
}

std::vector<uint8_t> RowBook::encode(const std::vector<RowIn>& mine) {
  common::BlobWriter w;
  w.put<uint32_t>(static_cast<uint32_t>(mine.size()));
  for (const RowIn& row : mine) {
    w.put(row.index).put_vector(row.contributors);
  }
  return w.take();
}

std::string RowBook::learn(Communicator& c, const BatchReduceArgs& a, const RowChunks& ch, const Gathered& g) {
  mine_ = a.mine;
  std::sort(mine_.begin(), mine_.end(), [](const RowIn& x, const RowIn& y) { return x.index < y.index; });
  contributions_.clear();
  for (const RowContribution& rc : a.contribute) {
    contributions_.push_back({rc.destination, rc.index, 0, 0});
  }
  std::sort(contributions_.begin(), contributions_.end(), [](const Contribution& x, const Contribution& y) {
    return x.destination != y.destination ? x.destination < y.destination : x.index < y.index;
  });
  for (size_t i = 1; i < contributions_.size(); ++i) {
    if (contributions_[i].destination == contributions_[i - 1].destination &&
        contributions_[i].index == contributions_[i - 1].index) {
      return "rank " + std::to_string(c.rank()) + " contributes twice to row " +
             std::to_string(contributions_[i].index) + " of rank " + std::to_string(contributions_[i].destination);
    }
  }
  destinations_.clear();
  longest_ = 0;
  size_t first = 0;
  for (int d = 0; d < static_cast<int>(g.parts.size()); ++d) {
    const size_t mark = first;
    while (first < contributions_.size() && contributions_[first].destination == d) {
      ++first;
    }
    if (d == c.rank()) {
      if (!mine_.empty()) {
        destinations_.push_back(d);
      }
      uint32_t with = 0;
      for (const RowIn& row : mine_) {
        with += !row.contributors.empty();
      }
      longest_ = std::max(longest_, with);
      continue;
    }
    if (std::string err = scan(c, d, g.parts[d], mark); !err.empty()) {
      return err;
    }
  }
  for (const Contribution& k : contributions_) {
    if (k.destination < 0 || k.destination >= c.size() || k.contributors == 0) {
      return "rank " + std::to_string(c.rank()) + " contributes to row " + std::to_string(k.index) + " of rank " +
             std::to_string(k.destination) + ", which does not list it";
    }
  }
  return check(c, a, ch);
}

std::string RowBook::scan(Communicator& c, int d, const std::vector<uint8_t>& part, size_t first) {
  common::BlobReader rd(part, "rank " + std::to_string(d) + "'s rows");
  // The rows in index order with their contributor counts; this rank's own rows' lists read in full.
  struct Row {
    uint32_t index;
    uint32_t contributors;
    bool lists_me;
  };
  std::vector<Row> rows;
  for (uint32_t n = rd.get<uint32_t>(); n > 0; --n) {
    const uint32_t index = rd.get<uint32_t>();
    auto k = std::lower_bound(contributions_.begin() + first, contributions_.end(), std::make_pair(d, index),
                              [](const Contribution& x, const std::pair<int, uint32_t>& v) {
                                return x.destination != v.first ? x.destination < v.first : x.index < v.second;
                              });
    const bool mine = k != contributions_.end() && k->destination == d && k->index == index;
    if (!mine) {
      rows.push_back({index, static_cast<uint32_t>(rd.skip_vector<int>()), false});
      continue;
    }
    const std::vector<int> contributors = rd.get_vector<int>();
    rows.push_back({index, static_cast<uint32_t>(contributors.size()),
                    std::count(contributors.begin(), contributors.end(), c.rank()) > 0});
  }
  if (rows.empty()) {
    return "";
  }
  destinations_.push_back(d);
  std::sort(rows.begin(), rows.end(), [](const Row& x, const Row& y) { return x.index < y.index; });
  uint32_t position = 0;
  auto k = contributions_.begin() + static_cast<std::ptrdiff_t>(first);
  for (const Row& row : rows) {
    for (; k != contributions_.end() && k->destination == d && k->index < row.index; ++k) {
    }
    if (k != contributions_.end() && k->destination == d && k->index == row.index && row.lists_me) {
      k->position = position;
      k->contributors = row.contributors;
    }
    position += row.contributors > 0;
  }
  longest_ = std::max(longest_, position);
  return "";
}

const RowIn* RowBook::mine(uint32_t index) const {
  auto it = std::lower_bound(mine_.begin(), mine_.end(), index, [](const RowIn& r, uint32_t i) { return r.index < i; });
  return it != mine_.end() && it->index == index ? &*it : nullptr;
}

const RowBook::Contribution* RowBook::contribution(int destination, uint32_t index) const {
  auto it = std::lower_bound(contributions_.begin(), contributions_.end(), std::make_pair(destination, index),
                             [](const Contribution& x, const std::pair<int, uint32_t>& v) {
                               return x.destination != v.first ? x.destination < v.first : x.index < v.second;
                             });
  return it != contributions_.end() && it->destination == destination && it->index == index ? &*it : nullptr;
}

std::string RowBook::check(Communicator& c, const BatchReduceArgs& a, const RowChunks& ch) const {
  const endpoint::WindowInfo* rw = c.endpoint().memory().window(a.result_window);
  for (const RowIn& row : a.mine) {
    if (rw == nullptr || a.result_offset + (uint64_t{row.index} + 1) * ch.row_bytes > rw->size) {
      return "row index " + std::to_string(row.index) + " overruns result window " + std::to_string(a.result_window) +
             " of GPU " + std::to_string(c.endpoint().index());
    }
    if (row.contributors.size() > 255) {
      return std::to_string(row.contributors.size()) + " contributors to row " + std::to_string(row.index) +
             " (at most 255)";
    }
    for (int r : row.contributors) {
      if (r < 0 || r >= c.size() || r == c.rank()) {
        return "row " + std::to_string(row.index) + " lists contributor rank " + std::to_string(r) +
               " (another rank of 0.." + std::to_string(c.size() - 1) + ")";
      }
    }
  }
  const endpoint::WindowInfo* sw = c.endpoint().memory().window(a.source_window);
  for (const RowContribution& rc : a.contribute) {
    if (sw == nullptr || rc.source_offset + ch.row_bytes > sw->size) {
      return "contribution at offset " + std::to_string(rc.source_offset) + " overruns source window " +
             std::to_string(a.source_window);
    }
  }
  return "";
}

GroupOp rows_group_op(const BatchReduceArgs& a) {
  return {common::EchOp::kReduce, a.dtype, common::EchRedOp::kSum, a.result_window};
}

void plan_rows(Communicator& c, const BatchReduceArgs& a, const RowBook& rows, PlanBuilder::Then then) {
  const routing::Topology& topo = c.topology();
  // [15:14] and [7:6]: 16 operations in turn (a late result of one is not taken for the next's); [13:8]: the
  // first rank's GPU; [5:0]: the destination rank.
  const unsigned turn = c.next_group() & 0xF;
  const uint16_t base = static_cast<uint16_t>(((turn >> 2) << 14) | ((c.gpu(0) & 0x3F) << 8) | ((turn & 0x3) << 6));
  const std::vector<int> dests = rows.destinations();
  std::shared_ptr<PlanBuilder> b = PlanBuilder::open(c, base, std::move(then));
  for (int p = 0; p < topo.num_planes; ++p) {
    const int sw = c.switch_node_of(0, p);
    bool shared = sw >= 0 && c.plane_problem(p).empty();
    for (int r = 0; r < c.size(); ++r) {
      shared = shared && c.switch_node_of(r, p) == sw;
    }
    if (!shared || dests.empty()) {
      b->skip(p, "not one live switch for every rank");
      continue;
    }
    b->expect();
    const std::string name = topo.nodes[sw].name;
    c.control().free_slots(name, [&c, b, p, name, dests, what = rows_group_op(a),
                                  offset = a.result_offset](const common::ControlReply<uint32_t>& free) {
      // The switch's free pool shared by the destinations' groups.
      const uint32_t budget = free.ok() ? std::min<uint32_t>(c.options().ifec.slots_per_plane,
                                                             free.value / static_cast<uint32_t>(dests.size()))
                                        : 0;
      if (budget == 0) {
        b->skip(p, free.ok() ? "slot pool exhausted" : free.error->message());
      } else {
        b->reserve({p, 0, budget}, destination_groups(c, what, offset, name, budget, dests, b->group()));
      }
      b->arrived();
    });
  }
  b->close();
}

void ChunkPlaces::number(Communicator& c, const Plan& plan, const RowBook& rows, const RowChunks& ch) {
  std::vector<double> weight;
  for (const PlanePlan& pp : plan.planes) {
    double w = 0;
    for (int r = 0; r < c.size(); ++r) {
      if (r != c.rank()) {
        const double pw = c.endpoint().plane_weight(c.gpu(r), pp.plane);
        w = w == 0 ? pw : std::min(w, pw);
      }
    }
    weight.push_back(w > 0 ? w : 1);
  }
  per_row_ = ch.per_row;
  place_.assign(plan.planes.empty() ? 0 : size_t{rows.longest()} * ch.per_row, {});
  LoadSpreader spread(weight);
  std::vector<uint32_t> seq(plan.planes.size(), 0);
  for (size_t i = 0; i < place_.size(); ++i) {
    const auto k = static_cast<uint32_t>(i % ch.per_row);
    const size_t best = spread.place(static_cast<double>(ch.elements(k) * ch.esize));
    place_[i].plane = static_cast<int>(best);
    place_[i].seq = seq[best]++;
  }
}

const ChunkPlace& ChunkPlaces::at(uint32_t position, uint32_t chunk) const {
  static const ChunkPlace kNone;
  const size_t i = size_t{position} * per_row_ + chunk;
  return i < place_.size() ? place_[i] : kNone;
}

}  // namespace ifec::workloads
