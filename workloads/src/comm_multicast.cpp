// This rank's part of a batch multicast (MoE dispatch: each row to its own destination set) and of the in-fabric
// broadcast, a batch multicast of one row.
//
// The leader registers every rank's window at the plane switches (control plane); ranks publish the PSN their
// packets start at, so stale replicas of an earlier multicast are never written; each rank multicasts its rows
// through its plane switches (each MTU one compact-ECH packet with the row's destinations) and counts the bytes it
// receives. Packets the fabric did not complete go point to point to every destination (idempotent).
#include <algorithm>
#include <set>
#include <sstream>

#include "comm_op.h"
#include "comm_plan.h"
#include "comm_round.h"
#include "ifec/common/blob.h"
#include "ifec/common/range_set.h"

namespace ifec::workloads {

namespace {

using common::BlobReader;
using common::BlobWriter;

// The leader: every rank's window at every IFEC switch of every plane; `then` gets the planes a switch refused (or
// that some rank has no switch on), and the last refusal's reason.
void register_windows(Communicator& c, uint16_t window, std::function<void(std::vector<int>, std::string)> then) {
  const routing::Topology& topo = c.topology();
  auto bad = std::make_shared<std::set<int>>();
  auto why = std::make_shared<std::string>();
  auto join = std::make_shared<Join>();
  join->done = [bad, why, then] { then(std::vector<int>(bad->begin(), bad->end()), *why); };
  join->expect();
  for (int p = 0; p < topo.num_planes; ++p) {
    std::set<int> switches;
    for (int r = 0; r < c.size(); ++r) {
      switches.insert(c.switch_node_of(r, p));
    }
    for (int sw : switches) {
      if (sw < 0) {
        bad->insert(p);
        continue;
      }
      for (int r = 0; r < c.size(); ++r) {
        const int g = c.gpu(r);
        const endpoint::WindowInfo* w = window_of(c, r, window);
        if (w == nullptr) {
          continue;
        }
        common::WindowRegistration reg{g, topo.nodes[topo.gpu_node(g)].loopback, window, w->va, w->rkey, w->job};
        join->expect();
        c.control().register_window(topo.nodes[sw].name, reg, [bad, why, p, join](const common::ControlStatus& st) {
          if (st) {
            bad->insert(p);
            *why = st->message();
          }
          join->arrived();
        });
      }
    }
  }
  join->arrived();
}

class MulticastRowsOp : public CommOp {
 public:
  MulticastRowsOp(Communicator& c, BatchMulticastArgs a, Communicator::Done done, std::string what)
      : CommOp(c, std::move(done)), a_(std::move(a)), landed_(a_.incoming) {
    res_.algo = std::move(what);
    for (const auto& [off, len] : a_.incoming) {
      expected_ += len;
    }
  }

 protected:
  void start() override {
    if (const std::string err = check_rows(); !err.empty()) {
      fail(err);
      return;
    }
    auto share = [this](std::vector<uint8_t> mine) { gather(std::move(mine), [this](Gathered g) { on_shared(g); }); };
    BlobWriter w;
    w.put<uint32_t>(comm_.endpoint().ech().next_psn());
    if (comm_.rank() != 0) {
      share(w.take());
      return;
    }
    // The switches may answer after this operation ended (its time limit): then there is nothing to tell.
    std::weak_ptr<CommOp> alive = weak_from_this();
    register_windows(comm_, a_.window,
                     [this, alive, share](const std::vector<int>& bad_planes, const std::string& why) {
                       if (alive.expired()) {
                         return;
                       }
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
    if (mc_) {
      give_up_lost_planes(comm_, *mc_, all_planes(comm_));
    }
  }

  std::string describe_stuck() const override {
    std::ostringstream os;
    os << "multicast: " << (mc_ ? mc_->pending() : 0) << " packet(s) pending, " << stores_out_
       << " store(s) in flight, " << landed_.bytes() << " of " << expected_ << " B received";
    return os.str();
  }

 private:
  std::string check_rows() const {
    for (const RowsOut& row : a_.rows) {
      for (int d : row.destinations) {
        if (d < 0 || d >= comm_.size() || d == comm_.rank()) {
          return "batch multicast: destination rank " + std::to_string(d) + " of the row at offset " +
                 std::to_string(row.offset) + " is not another rank of 0.." + std::to_string(comm_.size() - 1);
        }
      }
    }
    return "";
  }

  // A row's destinations as compact-ECH bitmaps: one per block of 64 GPUs they fall in (base = the block's first;
  // GPUs below 64 make one bitmap at base 0, an ECH v1 header), in GPU order.
  std::vector<std::pair<uint16_t, uint64_t>> bitmaps(const RowsOut& row) const {
    std::vector<std::pair<uint16_t, uint64_t>> out;
    std::vector<int> gpus;
    for (int d : row.destinations) {
      gpus.push_back(comm_.gpu(d));
    }
    std::sort(gpus.begin(), gpus.end());
    for (int g : gpus) {
      const auto base = static_cast<uint16_t>(g / 64 * 64);
      if (out.empty() || out.back().first != base) {
        out.push_back({base, 0});
      }
      out.back().second |= 1ULL << (g - base);
    }
    return out;
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
    res_.data_start_ns = now();  // the control plane's part (registrations, first PSNs) ends here
    send(bad);
  }

  // The planes this rank multicasts on: registered everywhere, live, and with a switch here.
  std::vector<std::pair<int, double>> usable_planes(const std::set<int>& bad) {
    std::vector<std::pair<int, double>> planes;  // (plane, my live Gb/s there)
    for (int p = 0; p < comm_.topology().num_planes; ++p) {
      const double w = my_plane_gbps(comm_, p);
      if (!bad.count(p) && w > 0 && comm_.plane_problem(p).empty() && loopback_of_switch(comm_, p) != 0) {
        planes.push_back({p, w});
      }
    }
    return planes;
  }

  // Each MTU of a row is one packet, to the plane least loaded relative to its bandwidth (a row's tail packet
  // varies); without a plane it goes point to point.
  void send(const std::set<int>& bad) {
    const std::vector<std::pair<int, double>> planes = usable_planes(bad);
    const uint32_t mtu = comm_.topology().params.mtu;
    endpoint::EchMulticastSpec spec;
    spec.job = comm_.options().ifec.job;
    spec.window = a_.window;
    spec.window_per_plane = comm_.options().ifec.multicast_window;
    spec.timing = comm_.options().ifec.timing;
    std::vector<double> gbps;
    for (const auto& pw : planes) {
      gbps.push_back(pw.second);
    }
    LoadSpreader spread(gbps);
    for (const RowsOut& row : a_.rows) {
      for (const auto& [base, bitmap] : bitmaps(row)) {
        for (uint64_t rel = 0; rel < a_.row_bytes; rel += mtu) {
          const uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(mtu, a_.row_bytes - rel));
          if (planes.empty()) {
            direct_.push_back({row.offset + rel, len, bitmap, base});
            continue;
          }
          const int plane = planes[spread.place(len)].first;
          spec.packets.push_back({plane, loopback_of_switch(comm_, plane), row.offset + rel, len, bitmap, base});
        }
      }
    }
    if (!planes.empty()) {
      // Many sources may share a destination (fan-in): never below the configured first timeout.
      fit_ech_timing(spec.timing, static_cast<double>(spec.window_per_plane) * (mtu + 100),
                     *std::min_element(gbps.begin(), gbps.end()), spec.timing.initial_rto_ns);
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
        direct_.push_back({pk.offset, pk.len, pk.bitmap, pk.base});
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
      for (uint64_t bits = d.bitmap; bits != 0; bits &= bits - 1) {
        const int g = d.base + __builtin_ctzll(bits);
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
    uint64_t bitmap = 0;  // GPUs base + i
    uint16_t base = 0;
  };
  BatchMulticastArgs a_;
  common::ExpectedRanges landed_;  // after a_: made from its incoming rows
  uint64_t expected_ = 0;
  std::shared_ptr<endpoint::EchMulticast> mc_;
  std::vector<Direct> direct_;
  size_t stores_out_ = 0;
  bool sent_ = false;
};

}  // namespace

std::shared_ptr<CommOp> make_multicast_rows_op(Communicator& c, BatchMulticastArgs a, Communicator::Done done) {
  return std::make_shared<MulticastRowsOp>(c, std::move(a), std::move(done), "in-fabric batch multicast");
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
