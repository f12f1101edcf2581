// This rank's part of a batch reduction over rows (MoE combine): each row summed in the switches from its own
// contributors and delivered to its own destination, and the order of the steps around that round.
//
// Ranks publish the rows they are the destination of; the leader reserves one group per destination on every
// one-tier plane all ranks share, with a slot budget from the switch's free pool, and hands the plan out; every
// rank numbers every destination's chunks the same way (row order, least-loaded plane) (comm_rows_plan.h) and sends
// its contributions in the batch's one global order (deadlock-free with the switches' in-order slots). Chunks a
// destination did not receive are summed there from point-to-point stores of their contributors' pieces
// (comm_rows_recovery.h).
#include <algorithm>
#include <sstream>

#include "comm_op.h"
#include "comm_plan.h"
#include "comm_round.h"
#include "comm_rows_plan.h"
#include "comm_rows_recovery.h"

namespace ifec::workloads {

namespace {

class ReduceRowsOp : public CommOp {
 public:
  ReduceRowsOp(Communicator& c, BatchReduceArgs a, Communicator::Done done)
      : CommOp(c, std::move(done)),
        a_(std::move(a)),
        chunks_(c, a_),
        recovery_(c, a_, chunks_, a_.scratch_window != 0 ? a_.scratch_window : common::kRowScratchWindow) {
    res_.algo = "in-fabric batch reduction";
  }

 protected:
  void start() override {
    if (a_.row_elements == 0) {
      fail("batch reduction: row_elements is 0");
      return;
    }
    gather(RowBook::encode(a_.mine), [this](Gathered g) { learn_rows(g); });
  }

  bool on_remote_write(int peer, uint16_t window, uint64_t offset, uint64_t len) override {
    if (!recovery_.claim(window, offset, len)) {
      return false;
    }
    if (recovery_.all_in()) {
      defer([this] { maybe_sum(); });
    }
    return true;
  }

  void on_routes_changed() override {
    for (const auto& red : {contrib_, recv_}) {
      if (red) {
        give_up_lost_planes(comm_, *red, all_planes(comm_));
      }
    }
  }

  std::string describe_stuck() const override {
    std::ostringstream os;
    os << "batch reduction: " << (contrib_ ? contrib_->pending() : 0) << " contribution(s) and "
       << (recv_ ? recv_->pending() : 0) << " result chunk(s) pending; fallback: " << recovery_.describe();
    return os.str();
  }

 private:
  // ---- plan: every destination's rows, then the leader's groups ----

  void learn_rows(const Gathered& g) {
    if (const std::string err = rows_.learn(comm_, a_, chunks_, g); !err.empty()) {
      fail("batch reduction: " + err);
      return;
    }
    share_plan(
        comm_, weak_from_this(),
        [this](std::vector<uint8_t> mine, std::function<void(Gathered)> fn) { gather(std::move(mine), std::move(fn)); },
        reserved_, [this](PlanBuilder::Then then) { plan_rows(comm_, a_, rows_, std::move(then)); },
        "batch reduction plan", [this](const Plan& p) { on_plan(p); });
  }

  void on_plan(const Plan& plan) {
    res_.data_start_ns = now();  // the control plane's part (the leader's reservations) ends here
    plan_ = plan;
    places_.number(comm_, plan_, rows_, chunks_);
    post();
  }

  // ---- the round: two reductions on the agent, each finishing on its own ----

  // This rank's contributions (toward other destinations' groups) and the results it receives (its own group).
  void post() {
    const double slowest = plan_.planes.empty() ? 1 : my_plane_gbps(comm_, plan_.planes[0].plane);
    endpoint::EchReduceSpec base = reduce_spec(comm_, rows_group_op(a_), a_.source_window);
    fit_ech_timing(base.timing, static_cast<double>(comm_.options().ifec.row_window) * (chunks_.chunk_bytes() + 100),
                   slowest, base.timing.initial_rto_ns);
    rto_ = base.timing.initial_rto_ns;
    endpoint::EchReduceSpec out = contributions(base);
    endpoint::EchReduceSpec in = receives(base);
    contrib_ = comm_.endpoint().ech().reduce(std::move(out));
    recv_ = comm_.endpoint().ech().reduce(std::move(in));
    on_routes_changed();
    contrib_->on_done([this] { contributions_done(); });
    recv_->on_done([this] { receives_done(); });
  }

  // The lane of destination d's group on the plan's plane `pi`.
  uint32_t lane(Lanes& lanes, int pi, int d) const {
    const PlanePlan& pp = plan_.planes[pi];
    return lanes.lane(pp.plane, rows_group(plan_.group, d), pp.budget);
  }

  // Contributions in the batch's one global order: (row index, destination, chunk).
  endpoint::EchReduceSpec contributions(const endpoint::EchReduceSpec& base) const {
    endpoint::EchReduceSpec out = base;
    out.shared_window = comm_.options().ifec.row_window;
    Lanes lanes(comm_, out);
    std::vector<RowContribution> mine = a_.contribute;
    std::sort(mine.begin(), mine.end(), [](const RowContribution& x, const RowContribution& y) {
      return x.index != y.index ? x.index < y.index : x.destination < y.destination;
    });
    for (const RowContribution& rc : mine) {
      const RowBook::Contribution* row = rows_.contribution(rc.destination, rc.index);
      for (uint32_t k = 0; k < chunks_.per_row; ++k) {
        const ChunkPlace& cp = places_.at(row->position, k);
        if (cp.plane < 0) {
          continue;  // no plane: point to point after the fabric phase
        }
        endpoint::EchChunk ch;
        ch.lane = lane(lanes, cp.plane, rc.destination);
        ch.seq = cp.seq;
        ch.elements = static_cast<uint16_t>(chunks_.elements(k));
        ch.expected = static_cast<uint8_t>(row->contributors);
        ch.source_offset = rc.source_offset + uint64_t{k} * chunks_.chunk_bytes();
        ch.reth_va = uint64_t{rc.index} * chunks_.row_bytes + uint64_t{k} * chunks_.chunk_bytes();
        out.chunks.push_back(ch);
      }
    }
    return out;
  }

  endpoint::EchReduceSpec receives(const endpoint::EchReduceSpec& base) {
    endpoint::EchReduceSpec in = base;
    Lanes lanes(comm_, in);
    uint32_t position = 0;  // among this rank's rows with contributors
    for (const RowIn& row : rows_.mine()) {
      if (row.contributors.empty()) {
        continue;
      }
      for (uint32_t k = 0; k < chunks_.per_row; ++k) {
        const ChunkPlace& cp = places_.at(position, k);
        if (cp.plane < 0) {
          continue;
        }
        endpoint::EchChunk ch;
        ch.lane = lane(lanes, cp.plane, comm_.rank());
        ch.seq = cp.seq;
        ch.elements = static_cast<uint16_t>(chunks_.elements(k));
        ch.contribute = false;
        ch.receive = true;
        in.chunks.push_back(ch);
        received_.push_back({row.index, k});
      }
      ++position;
    }
    return in;
  }

  // Every rank's contributions were accepted (or given up): results still on their way (the switches resend lost
  // ones) get a little while, then the rest is summed point to point.
  void contributions_done() {
    contributed_ns_ = event_time();
    gather({}, [this](Gathered g) {
      std::weak_ptr<CommOp> w = weak_from_this();
      comm_.clock().schedule(now() + 4 * rto_, [this, w] {
        if (auto op = w.lock(); op && !finished() && recv_ && !recv_->done()) {
          recv_->give_up_all("no result within the grace after every contribution was accepted");
        }
      });
      all_contributed_ = true;
      maybe_recover();
    });
  }

  void receives_done() {
    received_ns_ = event_time();
    receives_done_ = true;
    maybe_recover();
  }

  // ---- recovery: chunks a destination did not receive, summed there from point-to-point pieces ----

  void maybe_recover() {
    if (!all_contributed_ || !receives_done_ || recovering_) {
      return;
    }
    recovering_ = true;
    res_.data_end_ns = std::max(contributed_ns_, received_ns_);  // what follows (the report) is the control plane's
    gather(encode_undelivered(comm_, rows_, chunks_, places_, *recv_, received_,
                              contrib_->anomalies() + recv_->anomalies()),
           [this](Gathered g) { recover(g); });
  }

  void recover(const Gathered& g) {
    reserved_.release(comm_);
    const uint64_t total = recovery_.learn(g, res_.anomalies);
    if (total == 0) {
      succeed();
      return;
    }
    res_.fell_back = true;
    res_.fallback_chunks = recovery_.mine();
    res_.fallback_reason = plan_.planes.empty() ? (plan_.no_plane.empty() ? "no plane" : plan_.no_plane)
                                                : "chunks the fabric did not deliver (timeouts, lost results, "
                                                  "anomalies, planes that lost a path)";
    res_.faults.push_back(
        std::to_string(total) + " chunks (" + std::to_string(res_.fallback_chunks) +
        " of this rank's) summed at their destination from point-to-point stores: " + res_.fallback_reason);
    const uint64_t scratch_bytes = recovery_.collect();
    std::weak_ptr<CommOp> alive = weak_from_this();
    comm_.allocate_window(recovery_.scratch(), scratch_bytes, [this, alive](const std::string& err) {
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

  void send_pieces() {
    recovery_.send([this](const endpoint::OpHandle& h) {
      watch(h, [this](bool ok, const std::string& error) {
        if (!ok) {
          fail("batch reduction fallback store: " + error);
          return;
        }
        recovery_.stored();
        maybe_sum();
      });
    });
    maybe_sum();
  }

  void maybe_sum() {
    if (recovery_.ready()) {
      recovery_.sum();
      succeed();
    }
  }

  BatchReduceArgs a_;
  RowChunks chunks_;
  RowBook rows_;
  PieceRecovery recovery_;
  Plan plan_;
  ChunkPlaces places_;
  Reservations reserved_;  // leader: the destinations' groups
  std::shared_ptr<endpoint::EchReduction> contrib_;
  std::shared_ptr<endpoint::EchReduction> recv_;
  std::vector<RowChunk> received_;  // recv_'s chunk i: (row index, chunk)
  common::TimeNs rto_ = 0;
  bool all_contributed_ = false;
  bool receives_done_ = false;
  bool recovering_ = false;
  common::TimeNs contributed_ns_ = 0;  // when this rank's contributions were all accepted (or given up)
  common::TimeNs received_ns_ = 0;     // when its results all arrived (or were given up)
};

}  // namespace

std::shared_ptr<CommOp> make_reduce_rows_op(Communicator& c, BatchReduceArgs a, Communicator::Done done) {
  return std::make_shared<ReduceRowsOp>(c, std::move(a), std::move(done));
}

}  // namespace ifec::workloads
