// This rank's part of the batch operations over rows (MoE dispatch and combine) and of the in-fabric broadcast.
//
// Batch multicast: the leader registers every rank's window at the plane switches (control plane); ranks publish
// the PSN their packets start at, so stale replicas of an earlier multicast are never written; each rank multicasts
// its rows through its plane switches (each MTU one compact-ECH packet with the row's destinations) and counts the
// bytes it receives. Packets the fabric did not complete go point to point to every destination (idempotent).
//
// Batch reduction: ranks publish the rows they are the destination of; the leader reserves one group per
// destination on every one-tier plane all ranks share, with a slot budget from the switch's free pool, and hands the
// plan out; every rank numbers every destination's chunks the same way (row order, least-loaded plane) and sends its
// contributions in the batch's one global order (deadlock-free with the switches' in-order slots). Chunks a
// destination did not receive are summed there from point-to-point stores of their contributors' pieces.
#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "comm_op.h"
#include "ifec/common/blob.h"
#include "ifec/common/checks.h"
#include "ifec/common/numeric.h"
#include "ifec/common/protocol.h"
#include "ifec/common/range_set.h"

namespace ifec::workloads {

namespace {

using common::BlobReader;
using common::BlobWriter;
using common::TimeNs;

// Live bandwidth (Gb/s) of this rank's ports on `plane`.
double my_plane_gbps(Communicator& c, int plane) {
  double w = 0;
  endpoint::Endpoint& ep = c.endpoint();
  for (int p = 0; p < ep.num_ports(); ++p) {
    if (ep.port_info(p).plane == plane && ep.port_info(p).port->link_up()) {
      w += ep.port_info(p).port->rate_bps() / 1e9;
    }
  }
  return w;
}

uint32_t loopback_of_switch(Communicator& c, int plane) {
  const int node = c.switch_node_of(c.rank(), plane);
  return node < 0 ? 0 : c.topology().nodes[node].loopback;
}

// ------------------------------------------------------------------------------------------ batch multicast --

class MulticastRowsOp : public CommOp {
 public:
  MulticastRowsOp(Communicator& c, BatchMulticastArgs a, Communicator::Done done, std::string what)
      : CommOp(c, std::move(done)), a_(std::move(a)) {
    res_.algo = std::move(what);
    for (const auto& [off, len] : a_.incoming) {
      expected_ += len;
    }
  }

 protected:
  void start() override {
    if (!a_.rows.empty() && comm_.gpu(comm_.rank()) >= 64) {
      fail("batch multicast: source GPU " + std::to_string(comm_.gpu(comm_.rank())) +
           " is not below 64 (the compact ECH's source and bitmap)");
      return;
    }
    for (const RowsOut& row : a_.rows) {
      for (int d : row.destinations) {
        if (d < 0 || d >= comm_.size() || d == comm_.rank() || comm_.gpu(d) >= 64) {
          fail("batch multicast: destination rank " + std::to_string(d) + " of the row at offset " +
               std::to_string(row.offset) +
               " is not another rank on a GPU below 64 (the compact ECH's 64-bit destination bitmap)");
          return;
        }
      }
    }
    auto share = [this](std::vector<uint8_t> mine) { gather(std::move(mine), [this](Gathered g) { on_shared(g); }); };
    BlobWriter w;
    w.put<uint32_t>(comm_.endpoint().ech().next_psn());
    if (comm_.rank() != 0) {
      share(w.take());
      return;
    }
    register_windows([this, share](const std::vector<int>& bad_planes, const std::string& why) mutable {
      BlobWriter lw;
      lw.put<uint32_t>(comm_.endpoint().ech().next_psn()).put_vector(bad_planes).put_string(why);
      share(lw.take());
    });
  }

  bool on_remote_write(int peer, uint16_t window, uint64_t offset, uint64_t len) override {
    if (window != a_.window) {
      return false;
    }
    landed_.insert(offset, len);
    check_done();
    return true;
  }

  void on_routes_changed() override {
    if (!mc_) {
      return;
    }
    for (int p = 0; p < comm_.topology().num_planes; ++p) {
      if (const std::string why = comm_.plane_problem(p); !why.empty()) {
        mc_->give_up_plane(p, why);
      }
    }
  }

  std::string describe_stuck() const override {
    std::ostringstream os;
    os << "multicast: " << (mc_ ? mc_->pending() : 0) << " packet(s) pending, " << stores_out_
       << " store(s) in flight, " << landed_.bytes() << " of " << expected_ << " B received";
    return os.str();
  }

 private:
  // The leader: every rank's window at every IFEC switch of every plane (a plane whose switch refuses is skipped).
  void register_windows(std::function<void(std::vector<int>, std::string)> then) {
    const routing::Topology& topo = comm_.topology();
    auto bad = std::make_shared<std::set<int>>();
    auto why = std::make_shared<std::string>();
    auto outstanding = std::make_shared<int>(1);
    auto arrived = [bad, why, outstanding, then] {
      if (--*outstanding == 0) {
        then(std::vector<int>(bad->begin(), bad->end()), *why);
      }
    };
    for (int p = 0; p < topo.num_planes; ++p) {
      std::set<int> switches;
      for (int r = 0; r < comm_.size(); ++r) {
        switches.insert(comm_.switch_node_of(r, p));
      }
      for (int sw : switches) {
        if (sw < 0) {
          bad->insert(p);
          continue;
        }
        for (int r = 0; r < comm_.size(); ++r) {
          const int g = comm_.gpu(r);
          endpoint::Endpoint& ep = comm_.endpoint();
          const endpoint::WindowInfo* w =
              r == comm_.rank() ? ep.memory().window(a_.window) : ep.peer_window(g, a_.window);
          if (w == nullptr) {
            continue;
          }
          common::WindowRegistration reg{g, topo.nodes[topo.gpu_node(g)].loopback, a_.window, w->va, w->rkey, w->job};
          ++*outstanding;
          comm_.control().register_window(topo.nodes[sw].name, reg,
                                          [bad, why, p, arrived](const common::ControlStatus& st) {
                                            if (st) {
                                              bad->insert(p);
                                              *why = st->message();
                                            }
                                            arrived();
                                          });
        }
      }
    }
    arrived();
  }

  void on_shared(const Gathered& g) {
    std::set<int> bad;
    BlobReader lead(g.parts.at(0), "leader's multicast set-up");
    lead.get<uint32_t>();
    for (int p : lead.get_vector<int>()) {
      bad.insert(p);
    }
    const std::string why = lead.get_string();
    for (int r = 0; r < comm_.size(); ++r) {
      BlobReader rd(g.parts[r], "rank " + std::to_string(r) + "'s first PSN");
      const uint32_t psn = rd.get<uint32_t>();
      if (r != comm_.rank()) {
        comm_.endpoint().ech().accept_multicast(a_.window, comm_.gpu(r), psn);
      }
    }
    for (int p : bad) {
      res_.faults.push_back("plane " + std::to_string(p) + " not used: " + (why.empty() ? "no switch" : why));
    }
    send(bad);
  }

  void send(const std::set<int>& bad) {
    std::vector<std::pair<int, double>> planes;  // (plane, my live Gb/s there)
    for (int p = 0; p < comm_.topology().num_planes; ++p) {
      const double w = my_plane_gbps(comm_, p);
      if (!bad.count(p) && w > 0 && comm_.plane_problem(p).empty() && loopback_of_switch(comm_, p) != 0) {
        planes.push_back({p, w});
      }
    }
    const uint32_t mtu = comm_.topology().params.mtu;
    endpoint::EchMulticastSpec spec;
    spec.job = comm_.options().ifec.job;
    spec.window = a_.window;
    spec.window_per_plane = comm_.options().ifec.multicast_window;
    spec.timing = comm_.options().ifec.timing;
    std::vector<double> load(planes.size(), 0);
    for (const RowsOut& row : a_.rows) {
      uint64_t bitmap = 0;
      for (int d : row.destinations) {
        bitmap |= 1ULL << comm_.gpu(d);
      }
      for (uint64_t rel = 0; bitmap != 0 && rel < a_.row_bytes; rel += mtu) {
        const uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(mtu, a_.row_bytes - rel));
        if (planes.empty()) {
          direct_.push_back({row.offset + rel, len, bitmap});
          continue;
        }
        size_t best = 0;  // the plane least loaded relative to its bandwidth (a row's tail packet varies)
        for (size_t q = 1; q < planes.size(); ++q) {
          if ((load[q] + len) / planes[q].second < (load[best] + len) / planes[best].second) {
            best = q;
          }
        }
        load[best] += len;
        spec.packets.push_back(
            {planes[best].first, loopback_of_switch(comm_, planes[best].first), row.offset + rel, len, bitmap});
      }
    }
    if (!planes.empty()) {
      double slowest = planes[0].second;
      for (const auto& pw : planes) {
        slowest = std::min(slowest, pw.second);
      }
      // Many sources may share a destination (fan-in): never below the configured first timeout.
      fit_ech_timing(spec.timing, static_cast<double>(spec.window_per_plane) * (mtu + 100), slowest,
                     spec.timing.initial_rto_ns);
    }
    if (spec.packets.empty()) {
      stores_for_direct();
      return;
    }
    mc_ = comm_.endpoint().ech().multicast(std::move(spec));
    on_routes_changed();
    mc_->on_done([this] { packets_done(); });
  }

  // Packets the fabric never completed, and rows without a usable plane, go point to point from the source (its
  // bytes are intact) to every destination (writing the same bytes twice is harmless).
  void packets_done() {
    uint64_t given_up = 0;
    for (size_t i = 0; i < mc_->spec().packets.size(); ++i) {
      if (mc_->outcome(i) != endpoint::EchOutcome::kDone) {
        const endpoint::EchPacket& pk = mc_->spec().packets[i];
        direct_.push_back({pk.offset, pk.len, pk.bitmap});
        ++given_up;
      }
    }
    for (const auto& [p, why] : mc_->planes_given_up()) {
      res_.faults.push_back("plane " + std::to_string(p) + " given up (" + why + ")");
    }
    if (given_up > 0) {
      res_.faults.push_back(std::to_string(given_up) + " packets sent point to point: not completed in the fabric");
    }
    stores_for_direct();
  }

  void stores_for_direct() {
    endpoint::Endpoint& ep = comm_.endpoint();
    const uint8_t* base = ep.memory().window(a_.window)->data;
    for (const Direct& d : direct_) {
      for (int g = 0; g < 64; ++g) {
        if (d.bitmap & (1ULL << g)) {
          ++stores_out_;
          watch(ep.store(g, a_.window, d.offset, base + d.offset, d.len), [this](bool ok, const std::string& error) {
            if (!ok) {
              fail("point-to-point store of a multicast packet: " + error);
              return;
            }
            --stores_out_;
            check_done();
          });
        }
      }
    }
    if (!direct_.empty()) {
      res_.fell_back = true;
      res_.fallback_chunks = direct_.size();
      res_.fallback_reason = mc_ ? "packets the fabric did not complete" : "no plane this rank can multicast on";
    }
    sent_ = true;
    check_done();
  }

  void check_done() {
    if (sent_ && stores_out_ == 0 && landed_.bytes() >= expected_) {
      succeed();
    }
  }

  struct Direct {
    uint64_t offset = 0;
    uint32_t len = 0;
    uint64_t bitmap = 0;
  };
  BatchMulticastArgs a_;
  uint64_t expected_ = 0;
  common::RangeSet landed_;
  std::shared_ptr<endpoint::EchMulticast> mc_;
  std::vector<Direct> direct_;
  size_t stores_out_ = 0;
  bool sent_ = false;
};

// ------------------------------------------------------------------------------------------ batch reduction --

// Where one chunk of one destination's row travels.
struct ChunkPlace {
  int plane = -1;  // -1: no plane (point to point)
  uint32_t seq = 0;
};

class ReduceRowsOp : public CommOp {
 public:
  ReduceRowsOp(Communicator& c, BatchReduceArgs a, Communicator::Done done)
      : CommOp(c, std::move(done)), a_(std::move(a)) {
    res_.algo = "in-fabric batch reduction";
    esize_ = element_size(a_.dtype);
    const routing::Topology& topo = c.topology();
    chunk_elems_ = static_cast<uint32_t>(
        std::max<size_t>(1, std::min<uint32_t>({topo.params.mtu, topo.params.ifec.slot_bytes, 4096}) / esize_));
    cpr_ = (a_.row_elements + chunk_elems_ - 1) / std::max<uint32_t>(1, chunk_elems_);
    row_bytes_ = uint64_t{a_.row_elements} * esize_;
    scratch_ = a_.scratch_window != 0 ? a_.scratch_window : common::kRowScratchWindow;
  }

 protected:
  void start() override {
    if (a_.row_elements == 0) {
      fail("batch reduction: row_elements is 0");
      return;
    }
    BlobWriter w;
    w.put<uint32_t>(static_cast<uint32_t>(a_.mine.size()));
    for (const RowIn& row : a_.mine) {
      w.put(row.index).put_vector(row.contributors);
    }
    gather(w.take(), [this](Gathered g) { learn_rows(g); });
  }

  bool on_remote_write(int peer, uint16_t window, uint64_t offset, uint64_t len) override {
    if (window != scratch_ || !collecting_) {
      return false;
    }
    pieces_in_.insert(offset, len);
    if (pieces_in_.bytes() >= pieces_expected_) {
      defer([this] { maybe_sum(); });
    }
    return true;
  }

  void on_routes_changed() override {
    for (const auto& red : {contrib_, recv_}) {
      for (int p = 0; red && p < comm_.topology().num_planes; ++p) {
        if (const std::string why = comm_.plane_problem(p); !why.empty()) {
          red->give_up_plane(p, why);
        }
      }
    }
  }

  std::string describe_stuck() const override {
    std::ostringstream os;
    os << "batch reduction: " << (contrib_ ? contrib_->pending() : 0) << " contribution(s) and "
       << (recv_ ? recv_->pending() : 0) << " result chunk(s) pending; fallback: " << stores_out_
       << " store(s) in flight, " << pieces_in_.bytes() << " of " << pieces_expected_ << " B of pieces";
    return os.str();
  }

 private:
  // ---- every destination's rows, and the leader's plan ----

  void learn_rows(const Gathered& g) {
    rows_.assign(comm_.size(), {});
    for (int d = 0; d < comm_.size(); ++d) {
      BlobReader rd(g.parts[d], "rank " + std::to_string(d) + "'s rows");
      for (uint32_t n = rd.get<uint32_t>(); n > 0; --n) {
        RowIn row;
        row.index = rd.get<uint32_t>();
        row.contributors = rd.get_vector<int>();
        rows_[d].push_back(row);
      }
      std::sort(rows_[d].begin(), rows_[d].end(), [](const RowIn& x, const RowIn& y) { return x.index < y.index; });
    }
    if (const std::string err = check_rows(); !err.empty()) {
      fail("batch reduction: " + err);
      return;
    }
    auto share = [this](std::vector<uint8_t> mine) {
      gather(std::move(mine), [this](Gathered g) { on_plan(g.parts.at(0)); });
    };
    if (comm_.rank() != 0) {
      share({});
      return;
    }
    make_plan(share);
  }

  std::string check_rows() const {
    const endpoint::WindowInfo* rw = comm_.endpoint().memory().window(a_.result_window);
    for (const RowIn& row : a_.mine) {
      if (rw == nullptr || a_.result_offset + (uint64_t{row.index} + 1) * row_bytes_ > rw->size) {
        return "row index " + std::to_string(row.index) + " overruns result window " +
               std::to_string(a_.result_window) + " of GPU " + std::to_string(comm_.endpoint().index());
      }
      if (row.contributors.size() > 255) {
        return std::to_string(row.contributors.size()) + " contributors to row " + std::to_string(row.index) +
               " (at most 255)";
      }
      for (int c : row.contributors) {
        if (c < 0 || c >= comm_.size() || c == comm_.rank()) {
          return "row " + std::to_string(row.index) + " lists contributor rank " + std::to_string(c) +
                 " (another rank of 0.." + std::to_string(comm_.size() - 1) + ")";
        }
      }
    }
    const endpoint::WindowInfo* sw = comm_.endpoint().memory().window(a_.source_window);
    for (const RowContribution& c : a_.contribute) {
      const RowIn* row = find_row(c.destination, c.index);
      if (row == nullptr || std::count(row->contributors.begin(), row->contributors.end(), comm_.rank()) == 0) {
        return "rank " + std::to_string(comm_.rank()) + " contributes to row " + std::to_string(c.index) + " of rank " +
               std::to_string(c.destination) + ", which does not list it";
      }
      if (sw == nullptr || c.source_offset + row_bytes_ > sw->size) {
        return "contribution at offset " + std::to_string(c.source_offset) + " overruns source window " +
               std::to_string(a_.source_window);
      }
    }
    return "";
  }

  const RowIn* find_row(int d, uint32_t index) const {
    if (d < 0 || d >= static_cast<int>(rows_.size())) {
      return nullptr;
    }
    auto it = std::lower_bound(rows_[d].begin(), rows_[d].end(), index,
                               [](const RowIn& r, uint32_t i) { return r.index < i; });
    return it != rows_[d].end() && it->index == index ? &*it : nullptr;
  }

  uint16_t group_of(int d) const { return static_cast<uint16_t>(group_base_ + d); }

  // The leader: one-tier planes every rank shares, one group per destination on each, budgets from the free pool.
  void make_plan(std::function<void(std::vector<uint8_t>)> share) {
    const routing::Topology& topo = comm_.topology();
    // [15:14] and [7:6]: 16 operations in turn (a late result of one is not taken for the next's); [13:8]: the
    // first rank's GPU; [5:0]: the destination rank.
    const unsigned turn = comm_.next_group() & 0xF;
    group_base_ = static_cast<uint16_t>(((turn >> 2) << 14) | ((comm_.gpu(0) & 0x3F) << 8) | ((turn & 0x3) << 6));
    std::vector<int> dests;
    for (int d = 0; d < comm_.size(); ++d) {
      if (!rows_[d].empty()) {
        dests.push_back(d);
      }
    }
    auto plan = std::make_shared<std::vector<std::pair<int, uint32_t>>>();  // (plane, budget)
    auto reasons = std::make_shared<std::string>();
    auto outstanding = std::make_shared<int>(1);
    auto arrived = [this, plan, reasons, outstanding, share] {
      if (--*outstanding > 0) {
        return;
      }
      BlobWriter w;
      w.put(group_base_).put<uint32_t>(static_cast<uint32_t>(plan->size()));
      for (const auto& [p, budget] : *plan) {
        w.put<int32_t>(p).put(budget);
      }
      w.put_string(*reasons);
      share(w.take());
    };
    for (int p = 0; p < topo.num_planes; ++p) {
      const int sw = comm_.switch_node_of(0, p);
      bool shared = sw >= 0 && comm_.plane_problem(p).empty();
      for (int r = 0; r < comm_.size(); ++r) {
        shared = shared && comm_.switch_node_of(r, p) == sw;
      }
      if (!shared || dests.empty()) {
        *reasons +=
            (reasons->empty() ? "" : "; ") + ("plane " + std::to_string(p) + ": not one live switch for every rank");
        continue;
      }
      ++*outstanding;
      comm_.control().free_slots(topo.nodes[sw].name, [this, p, sw, dests, plan, reasons,
                                                       arrived](const common::ControlReply<uint32_t>& free) {
        const uint32_t budget = free.ok() ? std::min<uint32_t>(comm_.options().ifec.slots_per_plane,
                                                               free.value / static_cast<uint32_t>(dests.size()))
                                          : 0;
        if (budget == 0) {
          *reasons += (reasons->empty() ? "" : "; ") + ("plane " + std::to_string(p) + ": " +
                                                        (free.ok() ? "slot pool exhausted" : free.error->message()));
          arrived();
          return;
        }
        reserve_groups(p, sw, budget, dests, plan, reasons, arrived);
      });
    }
    arrived();
  }

  void reserve_groups(int p, int sw, uint32_t budget, const std::vector<int>& dests,
                      std::shared_ptr<std::vector<std::pair<int, uint32_t>>> plan, std::shared_ptr<std::string> reasons,
                      std::function<void()> arrived) {
    const routing::Topology& topo = comm_.topology();
    const std::string name = topo.nodes[sw].name;
    auto left = std::make_shared<int>(static_cast<int>(dests.size()));
    auto why = std::make_shared<std::string>();
    auto made = std::make_shared<std::vector<uint16_t>>();
    for (int d : dests) {
      common::GroupReservation gr;
      gr.job = comm_.options().ifec.job;
      gr.group = group_of(d);
      gr.op = common::EchOp::kReduce;
      gr.dtype = a_.dtype;
      gr.redop = common::EchRedOp::kSum;
      gr.window = a_.result_window;
      gr.slots = budget;
      for (int r = 0; r < comm_.size(); ++r) {
        const int g = comm_.gpu(r);
        common::GroupMember m;
        m.ip = topo.nodes[topo.gpu_node(g)].loopback;
        m.destination = r == d;
        const endpoint::WindowInfo* w = r == comm_.rank() ? comm_.endpoint().memory().window(a_.result_window)
                                                          : comm_.endpoint().peer_window(g, a_.result_window);
        m.result_va = m.destination && w ? w->va + a_.result_offset : 0;
        m.rkey = m.destination && w ? w->rkey : 0;
        gr.members.push_back(m);
      }
      comm_.control().reserve(
          name, gr,
          [this, p, name, budget, left, why, made, plan, reasons, arrived,
           id = gr.group](const common::ControlStatus& st) {
            if (st) {
              *why = st->message();
            } else {
              made->push_back(id);
            }
            if (--*left > 0) {
              return;
            }
            if (!why->empty()) {
              for (uint16_t g : *made) {
                comm_.control().release(name, comm_.options().ifec.job, g, [](const common::ControlStatus&) {});
              }
              *reasons += (reasons->empty() ? "" : "; ") + ("plane " + std::to_string(p) + ": " + *why);
            } else {
              for (uint16_t g : *made) {
                reserved_.push_back({name, g});
              }
              plan->push_back({p, budget});
            }
            arrived();
          });
    }
  }

  // ---- numbering and sending ----

  void on_plan(const std::vector<uint8_t>& bytes) {
    BlobReader rd(bytes, "batch reduction plan");
    group_base_ = rd.get<uint16_t>();
    for (uint32_t n = rd.get<uint32_t>(); n > 0; --n) {
      const int p = rd.get<int32_t>();
      planes_.push_back({p, rd.get<uint32_t>()});
    }
    no_plane_ = rd.get_string();
    number_chunks();
    post();
  }

  // Chunks of each destination over the planes in row-index order, each to the plane least loaded in bytes
  // relative to its bandwidth: every rank derives the same plane and per-plane sequence for every chunk.
  void number_chunks() {
    std::vector<double> weight;
    for (const auto& [p, budget] : planes_) {
      double w = 0;
      for (int r = 0; r < comm_.size(); ++r) {
        if (r != comm_.rank()) {
          const double pw = comm_.endpoint().plane_weight(comm_.gpu(r), p);
          w = w == 0 ? pw : std::min(w, pw);
        }
      }
      weight.push_back(w > 0 ? w : 1);
    }
    place_.assign(comm_.size(), {});
    for (int d = 0; d < comm_.size(); ++d) {
      std::vector<double> load(planes_.size(), 0);
      std::vector<uint32_t> seq(planes_.size(), 0);
      for (const RowIn& row : rows_[d]) {
        for (uint32_t c = 0; c < cpr_; ++c) {
          ChunkPlace cp;
          if (!planes_.empty() && !row.contributors.empty()) {
            const double bytes = static_cast<double>(elems_of(c) * esize_);
            size_t best = 0;
            for (size_t q = 1; q < planes_.size(); ++q) {
              if ((load[q] + bytes) / weight[q] < (load[best] + bytes) / weight[best]) {
                best = q;
              }
            }
            load[best] += bytes;
            cp.plane = static_cast<int>(best);  // index into planes_
            cp.seq = seq[best]++;
          }
          place_[d][{row.index, c}] = cp;
        }
      }
    }
  }

  uint32_t elems_of(uint32_t c) const { return std::min<uint32_t>(chunk_elems_, a_.row_elements - c * chunk_elems_); }

  // Two reductions on the agent: this rank's contributions (toward other destinations' groups), and the results it
  // receives (its own group): each finishes on its own.
  void post() {
    const routing::Topology& topo = comm_.topology();
    const double slowest = planes_.empty() ? 1 : my_plane_gbps(comm_, planes_[0].first);
    endpoint::EchReduceSpec base;
    base.job = comm_.options().ifec.job;
    base.op = common::EchOp::kReduce;
    base.dtype = a_.dtype;
    base.redop = common::EchRedOp::kSum;
    base.contributor = static_cast<uint16_t>(comm_.rank());
    base.source_window = a_.source_window;
    base.result_window = a_.result_window;
    base.timing = comm_.options().ifec.timing;
    fit_ech_timing(base.timing, static_cast<double>(comm_.options().ifec.row_window) * (chunk_elems_ * esize_ + 100),
                   slowest, base.timing.initial_rto_ns);
    rto_ = base.timing.initial_rto_ns;
    endpoint::EchReduceSpec out = base;
    out.shared_window = comm_.options().ifec.row_window;
    endpoint::EchReduceSpec in = base;
    std::map<std::pair<int, int>, uint32_t> lane_of;  // (plane index, destination) -> lane
    auto lane = [&](endpoint::EchReduceSpec& s, size_t pi, int d) {
      const auto key = std::make_pair(static_cast<int>(pi), d);
      auto it = lane_of.find(key);
      if (it != lane_of.end() && it->second < s.lanes.size() && s.lanes[it->second].group == group_of(d)) {
        return it->second;
      }
      endpoint::EchLane l;
      l.plane = planes_[pi].first;
      l.switch_ip = topo.nodes[comm_.switch_node_of(comm_.rank(), l.plane)].loopback;
      l.group = group_of(d);
      l.window = planes_[pi].second;
      s.lanes.push_back(l);
      lane_of[key] = static_cast<uint32_t>(s.lanes.size() - 1);
      return lane_of[key];
    };
    // Contributions in the batch's one global order: (row index, destination, chunk).
    std::vector<RowContribution> mine = a_.contribute;
    std::sort(mine.begin(), mine.end(), [](const RowContribution& x, const RowContribution& y) {
      return x.index != y.index ? x.index < y.index : x.destination < y.destination;
    });
    for (const RowContribution& rc : mine) {
      const RowIn* row = find_row(rc.destination, rc.index);
      for (uint32_t c = 0; c < cpr_; ++c) {
        const ChunkPlace& cp = place_[rc.destination][{rc.index, c}];
        if (cp.plane < 0) {
          continue;  // no plane: point to point after the fabric phase
        }
        endpoint::EchChunk ch;
        ch.lane = lane(out, static_cast<size_t>(cp.plane), rc.destination);
        ch.seq = cp.seq;
        ch.elements = static_cast<uint16_t>(elems_of(c));
        ch.expected = static_cast<uint8_t>(row->contributors.size());
        ch.source_offset = rc.source_offset + uint64_t{c} * chunk_elems_ * esize_;
        ch.reth_va = uint64_t{rc.index} * row_bytes_ + uint64_t{c} * chunk_elems_ * esize_;
        out.chunks.push_back(ch);
      }
    }
    lane_of.clear();
    for (const RowIn& row : rows_[comm_.rank()]) {
      for (uint32_t c = 0; c < cpr_ && !row.contributors.empty(); ++c) {
        const ChunkPlace& cp = place_[comm_.rank()][{row.index, c}];
        if (cp.plane < 0) {
          continue;
        }
        endpoint::EchChunk ch;
        ch.lane = lane(in, static_cast<size_t>(cp.plane), comm_.rank());
        ch.seq = cp.seq;
        ch.elements = static_cast<uint16_t>(elems_of(c));
        ch.contribute = false;
        ch.receive = true;
        in.chunks.push_back(ch);
        recv_chunk_.push_back({row.index, c});
      }
    }
    contrib_ = comm_.endpoint().ech().reduce(std::move(out));
    recv_ = comm_.endpoint().ech().reduce(std::move(in));
    on_routes_changed();
    contrib_->on_done([this] { contributions_done(); });
    recv_->on_done([this] { receives_done(); });
  }

  // Every rank's contributions were accepted (or given up): results still on their way (the switches resend lost
  // ones) get a little while, then the rest is summed point to point.
  void contributions_done() {
    gather({}, [this](Gathered g) {
      std::weak_ptr<CommOp> w = weak_from_this();
      comm_.clock().schedule(now() + 4 * rto_, [this, w] {
        if (auto op = w.lock(); op && !finished() && recv_ && !recv_->done()) {
          recv_->give_up_all("no result within the grace after every contribution was accepted");
        }
      });
      all_contributed_ = true;
      maybe_fallback();
    });
  }

  void receives_done() {
    receives_done_ = true;
    maybe_fallback();
  }

  // ---- point-to-point fallback for chunks a destination did not receive ----

  void maybe_fallback() {
    if (!all_contributed_ || !receives_done_ || fallback_started_) {
      return;
    }
    fallback_started_ = true;
    std::vector<uint32_t> failed;  // (row index << 8 | chunk) of this rank's rows the fabric did not deliver
    for (const RowIn& row : rows_[comm_.rank()]) {
      for (uint32_t c = 0; c < cpr_ && !row.contributors.empty(); ++c) {
        if (place_[comm_.rank()][{row.index, c}].plane < 0) {
          failed.push_back(row.index);
          failed.push_back(c);
        }
      }
    }
    for (size_t i = 0; i < recv_chunk_.size(); ++i) {
      if (recv_->outcome(i) != endpoint::EchOutcome::kDone) {
        failed.push_back(recv_chunk_[i].first);
        failed.push_back(recv_chunk_[i].second);
      }
    }
    BlobWriter w;
    w.put_vector(failed);
    w.put<uint64_t>(contrib_->anomalies() + recv_->anomalies());
    gather(w.take(), [this](Gathered g) { plan_fallback(g); });
  }

  void plan_fallback(const Gathered& g) {
    release();
    failed_.assign(comm_.size(), {});
    uint64_t total = 0;
    for (int d = 0; d < comm_.size(); ++d) {
      BlobReader rd(g.parts[d], "rank " + std::to_string(d) + "'s undelivered chunks");
      const std::vector<uint32_t> f = rd.get_vector<uint32_t>();
      res_.anomalies += rd.get<uint64_t>();
      for (size_t i = 0; i + 1 < f.size(); i += 2) {
        failed_[d].push_back({f[i], f[i + 1]});
      }
      total += failed_[d].size();
    }
    if (total == 0) {
      succeed();
      return;
    }
    res_.fell_back = true;
    res_.fallback_chunks = failed_[comm_.rank()].size();
    res_.fallback_reason = planes_.empty() ? (no_plane_.empty() ? "no plane" : no_plane_)
                                           : "chunks the fabric did not deliver (timeouts, lost results, anomalies, "
                                             "planes that lost a path)";
    res_.faults.push_back(
        std::to_string(total) + " chunks (" + std::to_string(res_.fallback_chunks) +
        " of this rank's) summed at their destination from point-to-point stores: " + res_.fallback_reason);
    uint64_t pieces = 0;
    for (const auto& [index, c] : failed_[comm_.rank()]) {
      const uint64_t contributors = find_row(comm_.rank(), index)->contributors.size();
      pieces += contributors;
      pieces_expected_ += contributors * elems_of(c) * esize_;
    }
    // Counted from here: a peer stores its pieces as soon as it learns this scratch's key, which may be before
    // this rank hears back from the same exchange.
    pieces_in_.clear();
    collecting_ = true;
    std::weak_ptr<CommOp> alive = weak_from_this();
    comm_.allocate_window(scratch_, std::max<uint64_t>(64, pieces * chunk_elems_ * esize_),
                          [this, alive](const std::string& err) {
                            if (auto op = alive.lock(); !op || op->finished()) {
                              return;
                            }
                            if (!err.empty()) {
                              fail("batch reduction fallback: " + err);
                              return;
                            }
                            send_pieces();
                          });
  }

  // Pieces sit in the destination's scratch in its failed-chunk order, each chunk's contributors in row order.
  void send_pieces() {
    endpoint::Endpoint& ep = comm_.endpoint();
    const uint64_t chunk_bytes = uint64_t{chunk_elems_} * esize_;
    std::map<std::pair<int, uint32_t>, uint64_t> my_offset;  // (destination, row index) -> my source offset
    for (const RowContribution& rc : a_.contribute) {
      my_offset[{rc.destination, rc.index}] = rc.source_offset;
    }
    for (int d = 0; d < comm_.size(); ++d) {
      uint64_t slot = 0;
      for (const auto& [index, c] : failed_[d]) {
        const RowIn* row = find_row(d, index);
        for (int contributor : row->contributors) {
          if (contributor == comm_.rank()) {
            const uint64_t from = my_offset[{d, index}] + uint64_t{c} * chunk_bytes;
            ++stores_out_;
            watch(ep.store(comm_.gpu(d), scratch_, slot * chunk_bytes,
                           ep.memory().window(a_.source_window)->data + from, elems_of(c) * esize_),
                  [this](bool ok, const std::string& error) {
                    if (!ok) {
                      fail("batch reduction fallback store: " + error);
                      return;
                    }
                    --stores_out_;
                    maybe_sum();
                  });
          }
          ++slot;
        }
      }
    }
    pieces_sent_ = true;
    maybe_sum();
  }

  // Every piece here and every store of ours posted and done (peers that learned the scratch keys first may fill
  // this rank's scratch before it posts its own pieces): sum each undelivered chunk (fp32, one rounding, as the
  // switch).
  void maybe_sum() {
    if (!pieces_sent_ || stores_out_ > 0 || pieces_in_.bytes() < pieces_expected_ || summed_) {
      return;
    }
    summed_ = true;
    const uint64_t chunk_bytes = uint64_t{chunk_elems_} * esize_;
    endpoint::Endpoint& ep = comm_.endpoint();
    const uint8_t* scratch = ep.memory().window(scratch_)->data;
    uint8_t* result = ep.memory().window(a_.result_window)->data + a_.result_offset;
    std::vector<common::Acc> acc(chunk_elems_);
    uint64_t slot = 0;
    for (const auto& [index, c] : failed_[comm_.rank()]) {
      const RowIn* row = find_row(comm_.rank(), index);
      for (size_t i = 0; i < row->contributors.size(); ++i, ++slot) {
        common::accumulate(a_.dtype, common::EchRedOp::kSum, acc.data(), scratch + slot * chunk_bytes, elems_of(c),
                           i == 0);
      }
      common::finalize(a_.dtype, acc.data(), result + uint64_t{index} * row_bytes_ + uint64_t{c} * chunk_bytes,
                       elems_of(c));
    }
    succeed();
  }

  void release() {
    for (const auto& [sw, g] : reserved_) {
      comm_.control().release(sw, comm_.options().ifec.job, g, [](const common::ControlStatus&) {});
    }
    reserved_.clear();
  }

  BatchReduceArgs a_;
  size_t esize_ = 4;
  uint32_t chunk_elems_ = 1;
  uint32_t cpr_ = 1;
  uint64_t row_bytes_ = 0;
  uint16_t scratch_ = 0;
  uint16_t group_base_ = 0;
  std::vector<std::vector<RowIn>> rows_;          // [destination rank], by index
  std::vector<std::pair<int, uint32_t>> planes_;  // (plane, budget)
  std::string no_plane_;
  std::vector<std::map<std::pair<uint32_t, uint32_t>, ChunkPlace>> place_;  // [destination][(row index, chunk)]
  std::vector<std::pair<std::string, uint16_t>> reserved_;                  // leader: (switch, group)
  std::shared_ptr<endpoint::EchReduction> contrib_;
  std::shared_ptr<endpoint::EchReduction> recv_;
  std::vector<std::pair<uint32_t, uint32_t>> recv_chunk_;  // recv_'s chunk i: (row index, chunk)
  common::TimeNs rto_ = 0;
  bool all_contributed_ = false;
  bool receives_done_ = false;
  bool fallback_started_ = false;
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> failed_;  // [destination] (row index, chunk)
  size_t stores_out_ = 0;
  bool pieces_sent_ = false;
  common::RangeSet pieces_in_;
  uint64_t pieces_expected_ = 0;
  bool collecting_ = false;
  bool summed_ = false;
};

}  // namespace

std::shared_ptr<CommOp> make_multicast_rows_op(Communicator& c, BatchMulticastArgs a, Communicator::Done done) {
  return std::make_shared<MulticastRowsOp>(c, std::move(a), std::move(done), "in-fabric batch multicast");
}

std::shared_ptr<CommOp> make_reduce_rows_op(Communicator& c, BatchReduceArgs a, Communicator::Done done) {
  return std::make_shared<ReduceRowsOp>(c, std::move(a), std::move(done));
}

std::shared_ptr<CommOp> make_ifec_broadcast_op(Communicator& c, const CollArgs& a, Communicator::Done done) {
  BatchMulticastArgs b;
  b.window = a.window;
  b.row_bytes = a.count * element_size(a.dtype);
  if (c.rank() == a.root) {
    RowsOut row;
    row.offset = a.offset;
    for (int r = 0; r < c.size(); ++r) {
      if (r != a.root) {
        row.destinations.push_back(r);
      }
    }
    if (b.row_bytes > 0) {
      b.rows.push_back(row);
    }
  } else if (b.row_bytes > 0) {
    b.incoming.push_back({a.offset, b.row_bytes});
  }
  return std::make_shared<MulticastRowsOp>(c, std::move(b), std::move(done), "in-fabric multicast");
}

}  // namespace ifec::workloads
