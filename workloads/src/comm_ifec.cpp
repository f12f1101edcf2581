// This rank's part of an in-fabric reduction (reduce, allreduce, barrier) and of a broadcast by compact-ECH
// multicast (docs/ifec-engine.md "Rounds, lost planes and what the endpoints finish themselves").
//
// Each round: the leader (rank 0) picks the planes every rank can use, reserves a group on each through the control
// plane and hands the plan to everyone over the bootstrap; each rank spreads the round's chunks over the plan's
// planes by weight (every rank computes the same assignment) and contributes through its ECH agent; each rank
// reports which chunks it received; then a rank lacking a result another holds gets a copy from it, and chunks
// nobody received go to the next round, or, after the last one, to the endpoint path (from untouched inputs).
// The exchanges between rounds travel out of band (the bootstrap): the simulator charges them no fabric time.
#include <algorithm>
#include <cstring>
#include <set>
#include <sstream>

#include "comm_op.h"
#include "comm_schedule.h"
#include "ifec/common/blob.h"
#include "ifec/common/checks.h"
#include "ifec/common/range_set.h"
#include "ifec/common/swrr.h"

namespace ifec::workloads {

namespace {

using common::BlobReader;
using common::BlobWriter;
using common::TimeNs;

common::EchOp ech_op(Collective c) {
  switch (c) {
    case Collective::kReduce:
      return common::EchOp::kReduce;
    case Collective::kBarrier:
      return common::EchOp::kBarrier;
    case Collective::kMulticast:
      return common::EchOp::kMulticast;
    default:
      return common::EchOp::kAllReduce;
  }
}

// A round's plan, as the leader decided it.
struct PlanePlan {
  int plane = 0;
  double weight = 0;  // Gb/s: the smallest path bandwidth from the leader to any rank on it
  uint32_t budget = 0;
};
struct Plan {
  uint16_t group = 0;
  std::vector<PlanePlan> planes;
  std::string no_plane;  // why each plane was not used ("" when all were)
};

std::vector<uint8_t> encode(const Plan& p) {
  BlobWriter w;
  w.put(p.group).put<uint32_t>(static_cast<uint32_t>(p.planes.size()));
  for (const PlanePlan& pp : p.planes) {
    w.put<int32_t>(pp.plane).put(pp.weight).put(pp.budget);
  }
  w.put_string(p.no_plane);
  return w.take();
}

Plan decode_plan(const std::vector<uint8_t>& bytes) {
  BlobReader r(bytes, "in-fabric plan");
  Plan p;
  p.group = r.get<uint16_t>();
  const uint32_t n = r.get<uint32_t>();
  for (uint32_t i = 0; i < n; ++i) {
    PlanePlan pp;
    pp.plane = r.get<int32_t>();
    pp.weight = r.get<double>();
    pp.budget = r.get<uint32_t>();
    p.planes.push_back(pp);
  }
  p.no_plane = r.get_string();
  return p;
}

// Joins asynchronous replies: `done` runs once every expected reply came (immediately when none are expected).
struct Join {
  int outstanding = 0;
  std::function<void()> done;
  void expect() { ++outstanding; }
  void arrived() {
    if (--outstanding == 0 && done) {
      done();
    }
  }
};

class IfecReduceOp : public CommOp {
 public:
  IfecReduceOp(Communicator& c, const CollArgs& a, Communicator::Done done) : CommOp(c, std::move(done)), a_(a) {
    res_.algo = std::string("in-fabric ") + collective_name(a.kind);
    const routing::Topology& topo = c.topology();
    esize_ = a.kind == Collective::kBarrier ? 4 : element_size(a.dtype);
    const uint32_t chunk_bytes = std::min<uint32_t>({topo.params.mtu, topo.params.ifec.slot_bytes, 4096});
    // fp32 partials of a two-tier plane must fit one packet: then every chunk holds chunk_bytes / 4 elements, so
    // a chunk means the same bytes on every plane and in every round.
    const bool fp32 = topo.params.ifec.upstream_fp32 && a.dtype != common::EchDtype::kInt32 && any_two_tier();
    epc_ = a.kind == Collective::kBarrier ? 1 : std::max<size_t>(1, chunk_bytes / (fp32 ? 4 : esize_));
    chunks_ = a.kind == Collective::kBarrier ? 1 : (a.count + epc_ - 1) / epc_;
    for (uint32_t k = 0; k < chunks_; ++k) {
      todo_.push_back(k);
    }
  }

 protected:
  void start() override { next_round(); }

  // Stores this rank cannot place yet are held: with ranks on their own clocks, a faster rank resolves a round
  // (and copies results here, or starts the endpoint path, or its next range) before this rank has.
  bool on_remote_write(int peer, uint16_t window, uint64_t offset, uint64_t len) override {
    if (claim(peer, window, offset, len)) {
      return true;
    }
    if (window != a_.window && window != a_.scratch_window) {
      return false;  // not this operation's buffers: the next operation's
    }
    held_.push_back({peer, window, offset, len});
    return true;
  }

  void on_routes_changed() override {
    if (!red_) {
      return;
    }
    for (const PlanePlan& pp : plan_.planes) {
      if (const std::string why = comm_.plane_problem(pp.plane); !why.empty()) {
        red_->give_up_plane(pp.plane, why);
      }
    }
  }

  std::string describe_stuck() const override {
    std::ostringstream os;
    os << "in-fabric " << collective_name(a_.kind) << " round " << round_;
    if (red_) {
      os << ": " << red_->pending() << " chunk(s) pending";
    }
    if (fallback_) {
      os << "; endpoint path: " << fallback_->describe_stuck();
    }
    return os.str();
  }

 private:
  bool any_two_tier() const {
    for (int p = 0; p < comm_.topology().num_planes; ++p) {
      std::set<int> leaves;
      for (int r = 0; r < comm_.size(); ++r) {
        leaves.insert(comm_.switch_node_of(r, p));
      }
      if (leaves.size() > 1) {
        return true;
      }
    }
    return false;
  }
  bool needs_result(int rank) const { return a_.kind != Collective::kReduce || rank == a_.root; }
  uint64_t chunk_offset(uint32_t k) const { return static_cast<uint64_t>(k) * epc_ * esize_; }
  uint16_t chunk_elements(uint32_t k) const {
    return a_.kind == Collective::kBarrier ? 0 : static_cast<uint16_t>(std::min<uint64_t>(epc_, a_.count - k * epc_));
  }

  // ------------------------------------------------------------------------------------------------ plan --

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
    auto share = [this](std::vector<uint8_t> mine) {
      gather(std::move(mine), [this](Gathered g) { on_plan(decode_plan(g.parts.at(0))); });
    };
    if (comm_.rank() != 0) {
      share({});
      return;
    }
    make_plan([share](const Plan& p) { share(encode(p)); });
  }

  // The leader: the planes every rank can use, a group reserved on each of their switches.
  void make_plan(std::function<void(const Plan&)> then) {
    auto plan = std::make_shared<Plan>();
    plan->group = group_id();
    auto join = std::make_shared<Join>();
    join->done = [plan, then] { then(*plan); };
    join->expect();
    for (int p = 0; p < comm_.topology().num_planes; ++p) {
      reserve_plane(p, plan, join);
    }
    join->arrived();
  }

  uint16_t group_id() {
    // Unique enough per switch and job: the leader's GPU in the high bits, a counter in the low ones; bit 15 marks
    // the spine groups of two-tier planes.
    return static_cast<uint16_t>(((comm_.gpu(0) & 0x3F) << 8) | (comm_.next_group() & 0xFF));
  }

  void note(Plan& plan, int plane, const std::string& why) {
    plan.no_plane += (plan.no_plane.empty() ? "" : "; ") + std::string("plane ") + std::to_string(plane) + ": " + why;
  }

  common::GroupMember member(int rank, bool local) const {
    endpoint::Endpoint& ep = comm_.endpoint();
    const int g = comm_.gpu(rank);
    const endpoint::WindowInfo* w = rank == comm_.rank() ? ep.memory().window(a_.window) : ep.peer_window(g, a_.window);
    common::GroupMember m;
    m.local = local;
    m.ip = comm_.topology().nodes[comm_.topology().gpu_node(g)].loopback;
    m.result_va = w != nullptr ? w->va + a_.offset : 0;
    m.rkey = w != nullptr ? w->rkey : 0;
    m.destination = needs_result(rank);
    return m;
  }

  void reserve_plane(int p, std::shared_ptr<Plan> plan, std::shared_ptr<Join> join) {
    const routing::Topology& topo = comm_.topology();
    const int n = comm_.size();
    std::vector<int> leaf(n);
    double w = -1;
    for (int r = 0; r < n; ++r) {
      leaf[r] = comm_.switch_node_of(r, p);
      if (r != comm_.rank()) {
        const double pw = comm_.endpoint().plane_weight(comm_.gpu(r), p);
        w = w < 0 ? pw : std::min(w, pw);
      }
    }
    std::string problem = comm_.plane_problem(p);
    if (std::count(leaf.begin(), leaf.end(), -1) > 0) {
      problem = "a rank has no link on it";
    }
    if (!problem.empty() || w <= 0) {
      note(*plan, p, problem.empty() ? "no path bandwidth" : problem);
      return;
    }
    std::vector<int> leaves = leaf;
    std::sort(leaves.begin(), leaves.end());
    leaves.erase(std::unique(leaves.begin(), leaves.end()), leaves.end());
    std::vector<std::pair<int, common::GroupReservation>> todo;  // (switch node, reservation)
    const uint16_t spine_group = static_cast<uint16_t>(plan->group | 0x8000);
    int spine = -1;
    if (leaves.size() > 1) {
      spine = pick_spine(p, leaves, plan->group);
      if (spine < 0) {
        note(*plan, p, "no spine reaches every rank's leaf");
        return;
      }
      common::GroupReservation r = base(spine_group);
      if (topo.params.ifec.upstream_fp32 && a_.dtype != common::EchDtype::kInt32) {
        r.dtype = common::EchDtype::kFp32;  // partials and the spine's result stay in fp32 until the leaves
      }
      for (int l : leaves) {
        common::GroupMember gm;
        gm.ip = topo.nodes[l].loopback;
        for (int rk = 0; rk < n; ++rk) {
          gm.destination = gm.destination || (leaf[rk] == l && needs_result(rk));
        }
        r.members.push_back(gm);  // result VA 0: the leaf reads the chunk offset from the RETH
      }
      todo.push_back({spine, r});
    }
    for (size_t li = 0; li < leaves.size(); ++li) {
      common::GroupReservation r = base(plan->group);
      for (int rk = 0; rk < n; ++rk) {
        r.members.push_back(member(rk, leaf[rk] == leaves[li]));
      }
      if (spine >= 0) {
        r.upstream_ip = topo.nodes[spine].loopback;
        r.upstream_group = spine_group;
        r.upstream_contributor = static_cast<uint16_t>(li);
        r.upstream_fp32 = topo.params.ifec.upstream_fp32;
      }
      todo.push_back({leaves[li], r});
    }
    // Every reservation of the plane must hold; any refusal releases the rest and moves its share elsewhere.
    auto state = std::make_shared<std::pair<int, std::string>>(static_cast<int>(todo.size()), "");
    auto made = std::make_shared<std::vector<std::pair<std::string, uint16_t>>>();
    join->expect();
    for (const auto& [node, r] : todo) {
      const std::string name = topo.nodes[node].name;
      const uint16_t id = r.group;
      comm_.control().reserve(
          name, r, [this, p, w, plan, join, state, made, name, id](const common::ControlStatus& st) {
            if (st) {
              state->second = st->message();
            } else {
              made->push_back({name, id});
            }
            if (--state->first > 0) {
              return;
            }
            if (!state->second.empty()) {
              for (const auto& [sw, g] : *made) {
                comm_.control().release(sw, comm_.options().ifec.job, g, [](const common::ControlStatus&) {});
              }
              note(*plan, p, state->second);
            } else {
              reserved_.insert(reserved_.end(), made->begin(), made->end());
              plan->planes.push_back({p, w, comm_.options().ifec.slots_per_plane});
            }
            join->arrived();
          });
    }
  }

  int pick_spine(int plane, const std::vector<int>& leaves, uint16_t group) const {
    const routing::Topology& topo = comm_.topology();
    std::vector<int> common_spines;
    for (size_t s = 0; s < topo.nodes.size(); ++s) {
      const routing::Node& nd = topo.nodes[s];
      if (nd.kind != routing::NodeKind::kSwitch || nd.plane != plane ||
          std::count(leaves.begin(), leaves.end(), static_cast<int>(s))) {
        continue;
      }
      bool all = true;
      for (int l : leaves) {
        bool linked = false;
        for (int link : topo.links_of(static_cast<int>(s))) {
          linked = linked || topo.peer(link, static_cast<int>(s)).first == l;
        }
        all = all && linked;
      }
      if (all) {
        common_spines.push_back(static_cast<int>(s));
      }
    }
    return common_spines.empty() ? -1 : common_spines[group % common_spines.size()];
  }

  common::GroupReservation base(uint16_t id) const {
    common::GroupReservation r;
    r.job = comm_.options().ifec.job;
    r.group = id;
    r.op = ech_op(a_.kind);
    r.dtype = a_.dtype;
    r.redop = a_.op;
    r.window = a_.window;
    r.slots = comm_.options().ifec.slots_per_plane;
    return r;
  }

  // ---------------------------------------------------------------------------------------------- round --

  void on_plan(const Plan& plan) {
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
    red_ = comm_.endpoint().ech().reduce(spec_for(plan));
    on_routes_changed();  // a plane may already be lost here
    red_->on_done([this] { round_done(); });
  }

  endpoint::EchReduceSpec spec_for(const Plan& plan) {
    const routing::Topology& topo = comm_.topology();
    endpoint::EchReduceSpec s;
    s.job = comm_.options().ifec.job;
    s.op = ech_op(a_.kind);
    s.dtype = a_.dtype;
    s.redop = a_.op;
    s.contributor = static_cast<uint16_t>(comm_.rank());
    s.source_window = a_.window;
    s.result_window = a_.window;
    s.timing = comm_.options().ifec.timing;
    double slowest = 0;
    std::vector<double> weights;
    for (const PlanePlan& pp : plan.planes) {
      endpoint::EchLane lane;
      lane.plane = pp.plane;
      lane.switch_ip = topo.nodes[comm_.switch_node_of(comm_.rank(), pp.plane)].loopback;
      lane.group = plan.group;
      lane.window = std::max<uint32_t>(1, pp.budget * 3 / 4);  // slack for the other members' ACKs (fewer RNR NAKs)
      s.lanes.push_back(lane);
      weights.push_back(pp.weight);
      slowest = slowest > 0 ? std::min(slowest, pp.weight) : pp.weight;
    }
    // Every rank contributes and receives at its own rate (no fan-in): four windows' drain time is a safe first
    // timeout here, before round trips are measured.
    fit_ech_timing(s.timing, plan.planes[0].budget * static_cast<double>(epc_ * esize_ + 100), slowest,
                   s.timing.min_rto_ns);
    common::SmoothWrr wrr(weights);
    std::vector<uint32_t> next_seq(plan.planes.size(), 0);
    chunk_index_.assign(todo_.size(), 0);
    for (size_t t = 0; t < todo_.size(); ++t) {
      const uint32_t k = todo_[t];
      const int l = wrr.next();
      endpoint::EchChunk c;
      c.lane = static_cast<uint32_t>(l);
      c.seq = next_seq[l]++;
      c.elements = chunk_elements(k);
      c.contribute = true;
      c.source_offset = a_.offset + chunk_offset(k);
      c.reth_va = chunk_offset(k);
      c.receive = needs_result(comm_.rank());
      chunk_index_[t] = static_cast<uint32_t>(s.chunks.size());
      s.chunks.push_back(c);
    }
    return s;
  }

  // This round is over here: tell everyone which chunks arrived, what was given up and why.
  void round_done() {
    copy_from_.clear();  // the last round's copies all landed; this round's are decided in resolve
    BlobWriter w;
    std::vector<uint8_t> has(todo_.size(), 0);
    uint32_t anomalies = 0;
    uint32_t given_up = 0;
    for (size_t t = 0; t < todo_.size(); ++t) {
      const endpoint::EchOutcome o = red_->outcome(chunk_index_[t]);
      has[t] = o == endpoint::EchOutcome::kDone && needs_result(comm_.rank());
      anomalies += o == endpoint::EchOutcome::kAnomaly;
      given_up += o == endpoint::EchOutcome::kGivenUp;
    }
    // Results that carried the anomaly flag (NaN/Inf met in the switch): counted once, by the first receiver.
    int first_receiver = 0;
    while (first_receiver < comm_.size() - 1 && !needs_result(first_receiver)) {
      ++first_receiver;
    }
    if (comm_.rank() == first_receiver) {
      anomalies += static_cast<uint32_t>(red_->flagged_results());
    }
    w.put_vector(has).put(anomalies).put(given_up);
    w.put<uint32_t>(static_cast<uint32_t>(red_->planes_given_up().size()));
    for (const auto& [p, why] : red_->planes_given_up()) {
      w.put<int32_t>(p).put_string(why);
    }
    gather(w.take(), [this](Gathered g) { resolve(g); });
  }

  void resolve(const Gathered& g) {
    release_reservations();
    const int n = comm_.size();
    std::vector<std::vector<uint8_t>> has(n);
    uint64_t anomalies = 0;
    uint64_t given_up = 0;
    std::map<int, std::string> lost;
    for (int r = 0; r < n; ++r) {
      BlobReader rd(g.parts[r], "rank " + std::to_string(r) + "'s round outcome");
      has[r] = rd.get_vector<uint8_t>();
      anomalies += rd.get<uint32_t>();
      given_up += rd.get<uint32_t>();
      for (uint32_t i = rd.get<uint32_t>(); i > 0; --i) {
        const int p = rd.get<int32_t>();
        lost.emplace(p, rd.get_string());
      }
    }
    res_.anomalies += anomalies;
    std::vector<uint32_t> redo;
    uint64_t copied = 0;
    copy_from_.clear();
    copies_in_.clear();
    copy_bytes_in_ = 0;
    std::vector<endpoint::OpHandle> out;
    for (size_t t = 0; t < todo_.size(); ++t) {
      int holder = -1;
      std::vector<int> lacking;
      for (int r = 0; r < n; ++r) {
        if (has[r][t]) {
          holder = holder < 0 ? r : holder;
        } else if (needs_result(r)) {
          lacking.push_back(r);
        }
      }
      if (lacking.empty()) {
        continue;
      }
      if (holder < 0) {
        redo.push_back(todo_[t]);
        continue;
      }
      if (a_.kind == Collective::kBarrier) {
        continue;  // the switch saw every rank arrive: the barrier is complete for all of them
      }
      res_.fallback_chunks++;
      copied += lacking.size();
      copy(todo_[t], holder, lacking, &out);
    }
    if (anomalies + given_up > 0 || !lost.empty()) {
      std::string line = "round " + std::to_string(round_) + ": ";
      for (const auto& [p, why] : lost) {
        line += "plane " + std::to_string(p) + " given up (" + why + "); ";
      }
      line += std::to_string(anomalies) + " anomaly notices (slot timeouts or released results), " +
              std::to_string(given_up) + " rank chunks given up; " + std::to_string(copied) +
              " results copied from a rank that had them; " + std::to_string(redo.size()) + " chunks nobody received";
      res_.faults.push_back(line);
    }
    todo_ = std::move(redo);
    replay_held();
    copies_out_ = out.size();
    for (auto& h : out) {
      watch(h, [this](bool ok, const std::string& error) {
        if (!ok) {
          fail("copying a result to a rank that lost it: " + error);
          return;
        }
        --copies_out_;
        maybe_next_round();
      });
    }
    maybe_next_round();
  }

  // Chunk k from `holder` to every rank in `lacking`: the holder stores, the others count what lands.
  void copy(uint32_t k, int holder, const std::vector<int>& lacking, std::vector<endpoint::OpHandle>* out) {
    const uint64_t off = chunk_offset(k);
    const uint64_t bytes = static_cast<uint64_t>(chunk_elements(k)) * esize_;
    endpoint::Endpoint& ep = comm_.endpoint();
    for (int r : lacking) {
      if (holder == comm_.rank()) {
        out->push_back(ep.store(comm_.gpu(r), a_.window, a_.offset + off,
                                ep.memory().window(a_.window)->data + a_.offset + off, bytes));
      } else if (r == comm_.rank()) {
        copy_from_[off] = comm_.gpu(holder);
        copy_bytes_in_ += bytes;
      }
    }
  }

  // True when a store belongs to what this rank now waits for: the endpoint path's receives, or a result copy.
  bool claim(int peer, uint16_t window, uint64_t offset, uint64_t len) {
    if (fallback_) {
      return fallback_->on_remote_write(peer, window, offset, len);
    }
    if (window != a_.window || offset < a_.offset) {
      return false;
    }
    auto it = copy_from_.find(offset - a_.offset);
    if (it == copy_from_.end() || it->second != peer) {
      return false;
    }
    copies_in_.insert(offset, len);
    if (copies_in_.bytes() == copy_bytes_in_) {
      defer([this] { maybe_next_round(); });
    }
    return true;
  }

  // Offers the held stores again (after this rank learned what to expect); those still unclaimed stay held.
  void replay_held() {
    std::vector<Held> h;
    h.swap(held_);
    for (const Held& x : h) {
      if (!claim(x.peer, x.window, x.offset, x.len)) {
        held_.push_back(x);
      }
    }
  }

  void maybe_next_round() {
    if (copies_out_ == 0 && copies_in_.bytes() == copy_bytes_in_ && !advancing_) {
      advancing_ = true;
      defer([this] {
        advancing_ = false;
        next_round();
      });
    }
  }

  void release_reservations() {
    for (const auto& [sw, g] : reserved_) {
      comm_.control().release(sw, comm_.options().ifec.job, g, [](const common::ControlStatus&) {});
    }
    reserved_.clear();
  }

  // What no round finished runs on the endpoint-based path from the ranks' untouched inputs, in contiguous runs.
  void finish_on_endpoint_path(const std::string& why) {
    release_reservations();
    if (todo_.empty()) {
      succeed_with_stats();
      return;
    }
    res_.fell_back = true;
    res_.fallback_reason = why;
    res_.faults.push_back("endpoint path for " + std::to_string(todo_.size()) + " chunks: " + why);
    ranges_.clear();
    for (size_t i = 0; i < todo_.size();) {
      size_t j = i + 1;
      while (j < todo_.size() && todo_[j] == todo_[j - 1] + 1) {
        ++j;
      }
      ranges_.push_back({todo_[i], todo_[j - 1] + 1});
      res_.fallback_chunks += todo_[j - 1] + 1 - todo_[i];
      i = j;
    }
    next_range();
  }

  void next_range() {
    fallback_.reset();
    if (ranges_.empty()) {
      todo_.clear();
      succeed_with_stats();
      return;
    }
    const auto [k, end] = ranges_.front();
    ranges_.erase(ranges_.begin());
    CollArgs sub = a_;
    if (a_.kind != Collective::kBarrier) {
      sub.offset = a_.offset + chunk_offset(k);
      sub.count = std::min<uint64_t>(a_.count, end * epc_) - k * epc_;
    }
    fallback_ = std::make_unique<schedule::Run>(comm_, schedule::build(comm_, sub, Algo::kRing));
    fallback_->start([this, k, end](bool ok, const std::string& error) {
      if (!ok) {
        fail("endpoint path for chunks " + std::to_string(k) + ".." + std::to_string(end - 1) + ": " + error);
        return;
      }
      defer([this] { next_range(); });
    });
    replay_held();
  }

  void succeed_with_stats() {
    res_.fell_back = res_.fell_back || res_.fallback_chunks > 0;
    for (const Held& h : held_) {
      pass_on(h.peer, h.window, h.offset, h.len);  // a peer already in the next operation on the same buffers
    }
    held_.clear();
    succeed();
  }

  CollArgs a_;
  size_t esize_ = 4;
  size_t epc_ = 1;
  uint32_t chunks_ = 0;
  std::vector<uint32_t> todo_;
  int round_ = 0;
  Plan plan_;
  std::shared_ptr<endpoint::EchReduction> red_;
  std::vector<uint32_t> chunk_index_;                       // todo position -> chunk of the round's spec
  std::vector<std::pair<std::string, uint16_t>> reserved_;  // leader: (switch, group) to release
  std::map<uint64_t, int> copy_from_;                       // chunk byte offset -> the GPU that sends it here
  common::RangeSet copies_in_;
  uint64_t copy_bytes_in_ = 0;
  size_t copies_out_ = 0;
  bool advancing_ = false;
  std::vector<std::pair<uint32_t, uint32_t>> ranges_;  // endpoint path: [first, end) chunk runs
  std::unique_ptr<schedule::Run> fallback_;
  struct Held {
    int peer;
    uint16_t window;
    uint64_t offset;
    uint64_t len;
  };
  std::vector<Held> held_;  // stores not yet claimed (see on_remote_write)
};

}  // namespace

std::shared_ptr<CommOp> make_ifec_reduce_op(Communicator& c, const CollArgs& a, Communicator::Done done) {
  return std::make_shared<IfecReduceOp>(c, a, std::move(done));
}

}  // namespace ifec::workloads
