// This rank's part of an in-fabric reduction (reduce, allreduce, barrier): what a round is, and the order of the
// steps around it (docs/ifec-engine.md "Rounds, lost planes and what the endpoints finish themselves").
//
// Each round: the leader (rank 0) picks the planes every rank can use, reserves a group on each through the control
// plane (comm_ifec_plan.h) and hands the plan to everyone over the bootstrap; each rank spreads the round's chunks
// over the plan's planes by weight (every rank computes the same assignment) and contributes through its ECH agent;
// each rank reports which chunks it received; then a rank lacking a result another holds gets a copy from it, and
// chunks nobody received go to the next round, or, after the last one, to the endpoint path from untouched inputs
// (comm_ifec_recovery.h). The exchanges between rounds travel out of band (the bootstrap): the simulator charges
// them no fabric time.
#include <algorithm>
#include <sstream>

#include "comm_ifec_plan.h"
#include "comm_ifec_recovery.h"
#include "comm_op.h"
#include "comm_plan.h"
#include "comm_round.h"
#include "ifec/common/swrr.h"

namespace ifec::workloads {

namespace {

class IfecReduceOp : public CommOp {
 public:
  IfecReduceOp(Communicator& c, const CollArgs& a, Communicator::Done done)
      : CommOp(c, std::move(done)), a_(a), chunks_(c, a), copies_(c, a_, chunks_), path_(c, a_, chunks_) {
    res_.algo = std::string("in-fabric ") + collective_name(a.kind);
    for (uint32_t k = 0; k < chunks_.count(); ++k) {
      todo_.push_back(k);
    }
  }

 protected:
  void start() override { next_round(); }

  bool on_remote_write(int peer, uint16_t window, uint64_t offset, uint64_t len) override {
    if (claim({peer, window, offset, len})) {
      return true;
    }
    if (window != a_.window && window != a_.scratch_window) {
      return false;  // not this operation's buffers: the next operation's
    }
    held_.hold({peer, window, offset, len});
    return true;
  }

  void on_routes_changed() override {
    if (red_) {
      give_up_lost_planes(comm_, *red_, plan_.plane_ids());
    }
  }

  std::string describe_stuck() const override {
    std::ostringstream os;
    os << "in-fabric " << collective_name(a_.kind) << " round " << round_;
    if (red_) {
      os << ": " << red_->pending() << " chunk(s) pending";
    }
    if (path_.running()) {
      os << "; endpoint path: " << path_.describe_stuck();
    }
    return os.str();
  }

 private:
  // The leader plans the round; every rank learns the plan.
  void next_round() {
    red_.reset();
    if (todo_.empty()) {
      succeed_with_stats();
      return;
    }
    if (++round_ > comm_.options().ifec.max_rounds) {
      finish_on_endpoint_path("still unfinished after " + std::to_string(round_ - 1) + " rounds");
      return;
    }
    share_plan(
        comm_, weak_from_this(),
        [this](std::vector<uint8_t> mine, std::function<void(Gathered)> fn) { gather(std::move(mine), std::move(fn)); },
        reserved_, [this](PlanBuilder::Then then) { plan_ifec_round(comm_, a_, chunks_, std::move(then)); },
        "in-fabric plan", [this](const Plan& p) { on_plan(p); });
  }

  void on_plan(const Plan& plan) {
    if (round_ == 1) {
      res_.data_start_ns = now();  // the control plane's part ends here
    }
    plan_ = plan;
    if (plan.planes.empty()) {
      finish_on_endpoint_path(plan.no_plane.empty() ? "no plane reaches every rank through IFEC switches"
                                                    : plan.no_plane);
      return;
    }
    if (!plan.no_plane.empty()) {
      res_.faults.push_back("round " + std::to_string(round_) + ": not in the fabric on " + plan.no_plane);
    }
    if (round_ > 1) {
      std::string planes;
      for (const PlanePlan& pp : plan.planes) {
        planes += (planes.empty() ? "" : ",") + std::to_string(pp.plane);
      }
      res_.faults.push_back("round " + std::to_string(round_) + ": " + std::to_string(todo_.size()) +
                            " chunks redone in the fabric on plane(s) " + planes);
    }
    held_.clear();  // every rank starts this round: nothing earlier is still on its way to be claimed
    red_ = comm_.endpoint().ech().reduce(round_spec(plan));
    on_routes_changed();  // a plane may already be lost here
    red_->on_done([this] { round_done(); });
  }

  // The round's chunks (the spec's chunk t is todo_[t]) spread over the plan's planes by weight.
  endpoint::EchReduceSpec round_spec(const Plan& plan) const {
    endpoint::EchReduceSpec s = reduce_spec(comm_, ifec_group_op(a_), a_.window);
    Lanes lanes(comm_, s);
    std::vector<uint32_t> lane_of;  // plan plane -> lane
    std::vector<double> weights;
    double slowest = 0;
    for (const PlanePlan& pp : plan.planes) {
      // A member's window is half the slot budget, so the slot its next chunk needs is already free: it sends chunk
      // j + W once chunk j's result came, every member contributed chunk j only after acknowledging chunk j - W's
      // result (its window), on the same link, and slot (j + W) mod 2W last held chunk j - W (frames not reordered
      // on the way). With three quarters, a member slow to acknowledge (a loaded host, a slow link) held the slot,
      // and each early contribution drew an RNR NAK and went again (live 4 MiB AllReduce: 112-692 a run).
      lane_of.push_back(lanes.lane(pp.plane, plan.group, std::max<uint32_t>(1, pp.budget / 2)));
      weights.push_back(pp.weight);
      slowest = slowest > 0 ? std::min(slowest, pp.weight) : pp.weight;
    }
    // Every rank contributes and receives at its own rate (no fan-in): four slot budgets' drain time (eight
    // windows') is a safe first timeout here, before round trips are measured, unless the hosts add delays of their
    // own (IfecOptions::reduce_initial_rto_ns).
    const common::TimeNs first = comm_.options().ifec.reduce_initial_rto_ns;
    fit_ech_timing(s.timing,
                   plan.planes[0].budget * static_cast<double>(chunks_.per_chunk() * chunks_.element_bytes() + 100),
                   slowest, first > 0 ? first : s.timing.min_rto_ns);
    common::SmoothWrr wrr(weights);
    std::vector<uint32_t> next_seq(plan.planes.size(), 0);
    for (uint32_t k : todo_) {
      const int l = wrr.next();
      endpoint::EchChunk c;
      c.lane = lane_of[l];
      c.seq = next_seq[l]++;
      c.elements = chunks_.elements(k);
      c.contribute = true;
      c.source_offset = a_.offset + chunks_.offset(k);
      c.reth_va = chunks_.offset(k);
      c.receive = chunks_.needs_result(comm_.rank());
      s.chunks.push_back(c);
    }
    return s;
  }

  // This round is over here: tell everyone which chunks arrived, what was given up and why.
  void round_done() {
    res_.data_end_ns = event_time();  // the last result's arrival; what follows (the report) is the control plane's
    copies_.forget_incoming();
    gather(encode_report(report_round(*red_, chunks_, comm_.rank(), comm_.size())), [this](Gathered g) { resolve(g); });
  }

  // Every rank's report read alike: copies posted and awaited, chunks nobody received left for the next round.
  void resolve(const Gathered& g) {
    reserved_.release(comm_);
    const RoundResolution r = resolve_round(g, todo_, chunks_);
    res_.anomalies += r.anomalies;
    res_.fallback_chunks += r.copies.size();
    const std::vector<endpoint::OpHandle> out = copies_.start(r.copies);
    if (const std::string line = r.faults(round_); !line.empty()) {
      res_.faults.push_back(line);
    }
    todo_ = r.redo;
    replay_held();
    for (const endpoint::OpHandle& h : out) {
      watch(h, [this](bool ok, const std::string& error) {
        if (!ok) {
          fail("copying a result to a rank that lost it: " + error);
          return;
        }
        copies_.stored();
        maybe_next_round();
      });
    }
    maybe_next_round();
  }

  // True when a store belongs to what this rank now waits for: the endpoint path's receives, or a result copy.
  bool claim(const Communicator::Arrival& s) {
    if (path_.running()) {
      return path_.on_remote_write(s.peer, s.window, s.offset, s.len);
    }
    if (!copies_.claim(s.peer, s.window, s.offset, s.len)) {
      return false;
    }
    if (copies_.all_in()) {
      defer([this] { maybe_next_round(); });
    }
    return true;
  }

  // Offers the held stores again (after this rank learned what to expect); those still unclaimed stay held.
  void replay_held() {
    held_.replay([this](const Communicator::Arrival& s) { return claim(s); });
  }

  void maybe_next_round() {
    if (copies_.settled() && !advancing_) {
      advancing_ = true;
      defer([this] {
        advancing_ = false;
        next_round();
      });
    }
  }

  void finish_on_endpoint_path(const std::string& why) {
    reserved_.release(comm_);
    if (todo_.empty()) {
      succeed_with_stats();
      return;
    }
    res_.fell_back = true;
    res_.fallback_reason = why;
    res_.faults.push_back("endpoint path for " + std::to_string(todo_.size()) + " chunks: " + why);
    res_.fallback_chunks += path_.plan(todo_);
    next_range();
  }

  void next_range() {
    const bool started = path_.run_next([this](bool ok, const std::string& error) {
      if (!ok) {
        fail(error);
        return;
      }
      defer([this] { next_range(); });
    });
    if (!started) {
      todo_.clear();
      succeed_with_stats();
      return;
    }
    replay_held();
  }

  void succeed_with_stats() {
    res_.fell_back = res_.fell_back || res_.fallback_chunks > 0;
    held_.pass_on([this](const Communicator::Arrival& s) { pass_on(s.peer, s.window, s.offset, s.len); });
    succeed();
  }

  CollArgs a_;
  IfecChunks chunks_;
  ResultCopies copies_;
  EndpointPath path_;
  HeldStores held_;
  Reservations reserved_;  // leader: the round's groups
  std::vector<uint32_t> todo_;
  int round_ = 0;
  Plan plan_;
  std::shared_ptr<endpoint::EchReduction> red_;
  bool advancing_ = false;
};

}  // namespace

std::shared_ptr<CommOp> make_ifec_reduce_op(Communicator& c, const CollArgs& a, Communicator::Done done) {
  return std::make_shared<IfecReduceOp>(c, a, std::move(done));
}

}  // namespace ifec::workloads
