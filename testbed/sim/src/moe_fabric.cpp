// MoE dispatch / expert compute / combine over the simulated fabric: every rank's communicator runs its part of
// each phase, point-to-point row stores (per expert, per rank) or IFEC multicast and in-switch reduction.
#include "ifec/testbed/moe_fabric.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>

#include "ifec/common/checks.h"
#include "ifec/testbed/harness.h"
#include "ifec/testbed/live_timing.h"

namespace ifec::testbed {

using namespace workloads;  // the MoE layer math (moe.h) this driver moves through the fabric

namespace {

// What the first `ranks` GPUs' ports have carried: frame bytes sent per plane, and per GPU the bytes each way on
// the wire (frame bytes + the per-frame overhead) for the line-rate bound.
struct PortTotals {
  std::vector<uint64_t> tx_per_plane;
  std::vector<uint64_t> tx_wire, rx_wire;  // per GPU
  endpoint::Endpoint::Resent resent;       // the GPUs' packets sent again
};
PortTotals gpu_totals(Cluster& c, int ranks) {
  PortTotals t;
  t.tx_per_plane.assign(c.fabric().topology().num_planes, 0);
  for (int g = 0; g < ranks; ++g) {
    uint64_t tx = 0;
    uint64_t rx = 0;
    for (const auto& p : c.fabric().gpu_ports(g)) {
      const common::PortCounters& k = p.io->counters();
      const uint64_t overhead = p.io->overhead_bytes();
      t.tx_per_plane.at(p.plane) += k.tx_bytes;
      tx += k.tx_bytes + overhead * k.tx_frames;
      rx += k.rx_bytes + overhead * k.rx_frames;
    }
    t.tx_wire.push_back(tx);
    t.rx_wire.push_back(rx);
    const endpoint::Endpoint::Resent r = c.ep(g).resent();
    t.resent.frames += r.frames;
    t.resent.bytes += r.bytes;
  }
  return t;
}

struct PhaseMeter {
  Cluster& c;
  int ranks;
  common::TimeNs t0;
  PortTotals before;
  PhaseMeter(Cluster& cluster, int n) : c(cluster), ranks(n), t0(cluster.now()), before(gpu_totals(cluster, n)) {}
  // From the first rank's start to the last one's end: a partitioned run's steps may go past either (its
  // communicators' first initialisation waits for switch answers at a window's end).
  void finish(MoePhase* out, const CollectiveResult& r) const {
    out->us = (r.end_ns - std::max(t0, r.start_ns)) / 1e3;
    out->data_start_ns = std::max(t0, r.data_start_ns ? r.data_start_ns : r.start_ns);
    out->data_end_ns = r.data_end_ns ? r.data_end_ns : r.end_ns;
    const PortTotals after = gpu_totals(c, ranks);
    out->wire_per_plane.assign(after.tx_per_plane.size(), 0);
    out->wire_bytes = 0;
    for (size_t p = 0; p < after.tx_per_plane.size(); ++p) {
      out->wire_per_plane[p] = after.tx_per_plane[p] - before.tx_per_plane[p];
      out->wire_bytes += out->wire_per_plane[p];
    }
    out->resent = {after.resent.frames - before.resent.frames, after.resent.bytes - before.resent.bytes};
    out->bound_us = 0;
    for (int g = 0; g < ranks; ++g) {
      const uint64_t busiest = std::max(after.tx_wire[g] - before.tx_wire[g], after.rx_wire[g] - before.rx_wire[g]);
      out->bound_us = std::max(out->bound_us, busiest * 8.0 / (c.fabric().topology().gpu_access_gbps(g) * 1e3));
    }
  }
};

// A part with the same windows and nothing to send or receive (a GPU outside the EP ranks).
template <typename Args>
Args idle_part(Args a) {
  if constexpr (std::is_same_v<Args, BatchReduceArgs>) {
    a.mine.clear();
    a.contribute.clear();
  } else {
    a.rows.clear();
    a.incoming.clear();
  }
  return a;
}

void validate_moe_args(Cluster& c, MoeVariant variant, const MoeConfig& cfg, const at::Tensor& x, int ranks,
                       const MoeFabricOptions& opts) {
  cfg.validate();
  IFEC_CHECK(ranks >= 1 && ranks <= c.size(), "EP size " << ranks << " outside 1.." << c.size());
  IFEC_CHECK(x.dim() == 2 && x.size(1) == cfg.hidden && x.size(0) % ranks == 0 && x.size(0) > 0,
             "x must be [ranks * tokens, " << cfg.hidden << "], got " << x.sizes());
  IFEC_CHECK(x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16,
             "x must be fp32 or bf16, got " << x.scalar_type());
  IFEC_CHECK(!opts.compute || !c.fabric().options().elided_payloads,
             "MoE: the experts need the rows, and this fabric's payloads are elided: the timing mode only");
  IFEC_CHECK(opts.row_hidden == 0 || !opts.compute,
             "MoE: rows of width " << opts.row_hidden << " wider than x's " << cfg.hidden << " need the timing mode");
}

// One layer's worth of tokens (a whole layer, or one micro-batch of it) over the cluster's first `ranks` GPUs:
// routing and every rank's plan, its windows (allocated here, freed with it), the rows each rank sends, and the
// local steps around the phases: the experts after dispatch, the sum at the sources after combine.
class MoeBatch {
 public:
  MoeBatch(Cluster& c, MoeVariant variant, const MoeConfig& cfg, const MoeWeights& w, const at::Tensor& x, int ranks,
           const MoeFabricOptions& opts, const MoeWindows& ids)
      : c_(c),
        cfg_(cfg),
        w_(w),
        opts_(opts),
        x_(x.contiguous()),
        ranks_(ranks),
        tokens_(x_.size(0) / ranks),
        hidden_(opts.row_hidden > 0 ? opts.row_hidden : cfg.hidden),
        row_(hidden_ * x_.element_size()),
        ifec_(variant == MoeVariant::kIfec),
        row_type_(x_.scalar_type()) {
    plan(variant, ids);
  }
  ~MoeBatch() {
    for (const auto& [id, bytes] : windows_) {
      c_.free_window(id);
    }
  }
  MoeBatch(const MoeBatch&) = delete;
  MoeBatch& operator=(const MoeBatch&) = delete;

  bool ifec() const { return ifec_; }
  // Every GPU's part of a phase, moved out of the plans (a phase runs once); GPUs past the EP ranks take part with
  // nothing to do.
  template <typename Args>
  std::vector<Args> parts(Args MoeRankPlan::*part) {
    std::vector<Args> out;
    for (MoeRankPlan& p : plans_) {
      out.push_back(std::move(p.*part));
    }
    out.resize(c_.size(), idle_part(out[0]));
    return out;
  }

  // Expert compute on every rank (LibTorch; its time is the caller's to model from tokens_per_expert). In the
  // timing mode the shared output window is zeros already.
  void experts() {
    out_rows_.resize(ranks_);
    if (!opts_.compute) {
      return;
    }
    for (int d = 0; d < ranks_; ++d) {
      const auto n = static_cast<int64_t>(plans_[d].recv_offsets.size());
      out_rows_[d] = moe_expert_rows(plans_[d], c_.window_data(d, plans_[d].ids.recv), lists_, w_, cfg_, row_type_);
      std::memcpy(c_.window_data(d, plans_[d].ids.output), out_rows_[d].data_ptr(), n * row_);
    }
  }

  // Each source sums its tokens' rows (unused slots are zero; IFEC: plus its own rank's part) and adds the shared
  // expert: fp32 [ranks * tokens, hidden], or undefined in the timing mode.
  at::Tensor outputs() const {
    if (!opts_.compute) {
      return {};
    }
    std::vector<at::Tensor> ys;
    for (int s = 0; s < ranks_; ++s) {
      const at::Tensor routed =
          moe_routed_output(plans_[s], c_.window_data(s, plans_[s].ids.combine), out_rows_[s], hidden_, row_type_);
      ys.push_back(shared_expert_forward(x_.narrow(0, s * tokens_, tokens_), w_) + routed);
    }
    return torch::cat(ys, 0);
  }

  // What the plan says of the batch, into `res` (logical bytes, pairs, the experts' histogram).
  void describe(MoeFabricResult& res) const {
    res.routed_pairs = table_.tokens * table_.topk;
    res.dispatch_logical_bytes = dispatch_logical_;
    res.combine_logical_bytes = combine_logical_;
    res.tokens_per_expert = tokens_per_expert(table_, cfg_.experts);
  }

 private:
  // Routing happens where the tokens are; every rank then knows its deliveries (DeepEP's notify step) and plans
  // its own part (moe_plan.h). Windows are allocated and each rank's rows written where its plan reads them.
  void plan(MoeVariant variant, const MoeWindows& ids) {
    route();
    lists_ = build_dispatch_lists(table_, cfg_.experts, ranks_);
    const common::EchDtype dtype = row_type_ == torch::kBFloat16 ? common::EchDtype::kBf16 : common::EchDtype::kFp32;
    plans_ =
        plan_moe_ranks(variant, table_, lists_, tokens_, static_cast<uint64_t>(row_), dtype, ids, opts_.fp8_dispatch);
    for (const MoeRankPlan& p : plans_) {
      dispatch_logical_ += p.dispatch_logical_bytes;
      combine_logical_ += p.combine_logical_bytes;
    }
    windows_ = plans_[0].windows;
    for (const auto& [id, bytes] : windows_) {
      c_.allocate_window(id, bytes, 1, !opts_.compute);
    }
    if (opts_.compute) {
      // Each rank's own rows as they leave it: x's type, or FP8 rows with their scales.
      const at::Tensor sent = opts_.fp8_dispatch ? quantize_fp8_rows(x_) : x_;
      const auto drow = static_cast<int64_t>(plans_[0].dispatch_row_bytes);
      for (int r = 0; r < ranks_; ++r) {
        std::memcpy(c_.window_data(r, plans_[r].input_window) + plans_[r].input_offset,
                    static_cast<const uint8_t*>(sent.data_ptr()) + r * tokens_ * drow, tokens_ * drow);
      }
    }
  }

  // The gate on every token: in blocks past kRouteBlock tokens (a token's routing is its own row's; the blocks keep
  // the fp32 copy of x and the gate's [tokens, experts] scores at a block's size: 8 GB less at EP 256), in one
  // piece up to it, as before.
  void route() {
    static constexpr int64_t kRouteBlock = int64_t{1} << 18;
    const int64_t n = x_.size(0);
    if (n <= kRouteBlock) {
      table_ = to_route_table(gate(x_.to(torch::kFloat32), w_, cfg_));
      return;
    }
    for (int64_t at = 0; at < n; at += kRouteBlock) {
      const RouteTable part =
          to_route_table(gate(x_.narrow(0, at, std::min(kRouteBlock, n - at)).to(torch::kFloat32), w_, cfg_));
      table_.tokens += part.tokens;
      table_.topk = part.topk;
      table_.expert_ids.insert(table_.expert_ids.end(), part.expert_ids.begin(), part.expert_ids.end());
      table_.weights.insert(table_.weights.end(), part.weights.begin(), part.weights.end());
    }
  }

  Cluster& c_;
  const MoeConfig& cfg_;
  const MoeWeights& w_;
  const MoeFabricOptions& opts_;
  const at::Tensor x_;
  const int ranks_;
  const int64_t tokens_;
  const int64_t hidden_;  // of a row on the wire
  const int64_t row_;     // bytes
  const bool ifec_;
  const at::ScalarType row_type_;
  RouteTable table_;
  DispatchLists lists_;
  std::vector<MoeRankPlan> plans_;
  std::vector<std::pair<uint16_t, uint64_t>> windows_;
  int64_t dispatch_logical_ = 0;
  int64_t combine_logical_ = 0;
  std::vector<at::Tensor> out_rows_;
};

// Notes a phase's fallbacks and faults in `res`; false (res.error set) when it failed.
bool note_phase(const char* name, const CollectiveResult& r, MoeFabricResult& res) {
  res.fallback_chunks += r.fallback_chunks;
  if (r.fell_back) {
    res.fallback_reason += (res.fallback_reason.empty() ? "" : "; ") + (name + (": " + r.fallback_reason));
  }
  for (const std::string& f : r.faults) {
    res.faults.push_back(name + (": " + f));
  }
  if (!r.ok) {
    res.error = name + (": " + r.error);
  }
  return r.ok;
}

// One MoE layer: dispatch, the experts and combine, one after the other, each phase measured.
class MoeLayerRun {
 public:
  MoeLayerRun(Cluster& c, MoeVariant variant, const MoeConfig& cfg, const MoeWeights& w, const at::Tensor& x, int ranks,
              const MoeFabricOptions& opts)
      : c_(c), ranks_(ranks), opts_(opts), batch_(c, variant, cfg, w, x, ranks, opts, {}) {
    if (batch_.ifec()) {
      coll_ = std::make_unique<IfecCollectives>(c_);
    }
  }

  MoeFabricResult run() {
    const common::TimeNs limit = opts_.phase_limit_ns;
    batch_.describe(res_);
    const bool dispatched = phase("dispatch", &res_.dispatch, [&] {
      return coll_ ? coll_->multicast_rows(batch_.parts(&MoeRankPlan::dispatch_multicast), limit)
                   : run_put_rows(c_, batch_.parts(&MoeRankPlan::dispatch_put), limit);
    });
    if (dispatched) {
      batch_.experts();
      const bool combined = phase("combine", &res_.combine, [&] {
        return coll_ ? coll_->reduce_rows(batch_.parts(&MoeRankPlan::combine_reduce), limit)
                     : run_put_rows(c_, batch_.parts(&MoeRankPlan::combine_put), limit);
      });
      if (combined) {
        res_.output = batch_.outputs();
        res_.ok = true;
      }
    }
    if (coll_) {
      res_.ifec = coll_->stats();
    }
    return std::move(res_);
  }

 private:
  // Runs one phase, measured. False (res_.error set) when it failed.
  template <typename Op>
  bool phase(const char* name, MoePhase* out, Op op) {
    PhaseMeter meter(c_, ranks_);
    const CollectiveResult r = op();
    if (!note_phase(name, r, res_)) {
      return false;
    }
    meter.finish(out, r);
    return true;
  }

  Cluster& c_;
  const int ranks_;
  const MoeFabricOptions& opts_;
  MoeBatch batch_;
  std::unique_ptr<IfecCollectives> coll_;
  MoeFabricResult res_;
};

// Every GPU's communicator of `stream` starts its part of a phase now; `done` gets the merged result, as an event
// once the last rank finished.
template <typename Args>
void start_phase(Cluster& c, int stream, std::vector<Args> parts, void (Communicator::*op)(Args, Communicator::Done),
                 const MoeFabricOptions& opts, std::function<void(CollectiveResult)> done) {
  std::vector<int> gpus(c.size());
  std::iota(gpus.begin(), gpus.end(), 0);
  workloads::CommOptions o;
  o.limit_ns = opts.phase_limit_ns;
  if (opts.live_timing) {
    apply_live_timing(o.ifec);
  }
  if (opts.first_group >= 0) {
    o.ifec.first_group = static_cast<uint16_t>(opts.first_group);
  }
  struct Join {
    std::vector<CollectiveResult> results;
    size_t left = 0;
  };
  auto join = std::make_shared<Join>();
  join->results.resize(gpus.size());
  join->left = gpus.size();
  const std::vector<Communicator*> comms = c.communicators(gpus, o, stream);
  for (size_t r = 0; r < comms.size(); ++r) {
    (comms[r]->*op)(std::move(parts[r]), [join, r, gpus, done](CollectiveResult res) {
      join->results[r] = std::move(res);
      if (--join->left == 0) {
        done(merge_results(join->results, gpus, true));
      }
    });
  }
}

// The layer as two micro-batches with a dispatch stream and a combine stream (see run_moe_two_batches).
class TwoBatchRun {
 public:
  TwoBatchRun(Cluster& c, MoeVariant variant, const MoeConfig& cfg, const MoeWeights& w, const at::Tensor& x, int ranks,
              const double experts_us[2], const MoeFabricOptions& opts)
      : c_(c), ranks_(ranks), opts_(opts), experts_ns_{to_ns(experts_us[0]), to_ns(experts_us[1])} {
    const int64_t tokens = x.size(0) / ranks;
    const at::Tensor per_rank = x.view({ranks, tokens, x.size(1)});
    for (int h = 0; h < 2; ++h) {
      first_[h] = h == 0 ? 0 : tokens / 2;
      count_[h] = h == 0 ? tokens / 2 : tokens - tokens / 2;
      const at::Tensor half = per_rank.narrow(1, first_[h], count_[h]).reshape({ranks * count_[h], x.size(1)});
      const MoeWindows ids{static_cast<uint16_t>(40 + 4 * h), static_cast<uint16_t>(41 + 4 * h),
                           static_cast<uint16_t>(42 + 4 * h), static_cast<uint16_t>(43 + 4 * h)};
      batch_[h] = std::make_unique<MoeBatch>(c, variant, cfg, w, half, ranks, opts, ids);
    }
  }

  MoeTwoBatchResult run() {
    // Both streams' communicators exist before anything starts (making them runs the clock).
    std::vector<int> gpus(c_.size());
    std::iota(gpus.begin(), gpus.end(), 0);
    c_.communicators(gpus, {}, 0);
    c_.communicators(gpus, {}, 1);
    t0_ = c_.now();
    start_dispatch(0);
    const common::TimeNs deadline = t0_ + 4 * opts_.phase_limit_ns;
    c_.run_until([this] { return finished() || !res_.error.empty(); }, deadline);
    if (res_.error.empty() && !finished()) {
      res_.error = "the two micro-batches did not finish within " + std::to_string(4 * opts_.phase_limit_ns / 1000) +
                   " us of simulated time";
    }
    res_.ok = res_.error.empty();
    if (res_.ok) {
      res_.us = std::max(res_.combine[0].end_us, res_.combine[1].end_us);
      res_.output = output();
    }
    return std::move(res_);
  }

 private:
  static common::TimeNs to_ns(double us) { return static_cast<common::TimeNs>(std::llround(std::max(0.0, us) * 1e3)); }
  double since_start() const { return (c_.now() - t0_) / 1e3; }
  double since_start(const CollectiveResult& r) const { return (static_cast<double>(r.end_ns) - t0_) / 1e3; }
  bool finished() const { return combined_[0] && combined_[1]; }

  // Dispatches on stream 0, one after the other.
  void start_dispatch(int h) {
    res_.dispatch[h].start_us = since_start();
    MoeBatch& b = *batch_[h];
    auto done = [this, h](CollectiveResult r) { dispatched(h, r); };
    if (b.ifec()) {
      start_phase(c_, 0, b.parts(&MoeRankPlan::dispatch_multicast), &Communicator::multicast_rows, opts_, done);
    } else {
      start_phase(c_, 0, b.parts(&MoeRankPlan::dispatch_put), &Communicator::put_rows, opts_, done);
    }
  }

  void dispatched(int h, const CollectiveResult& r) {
    res_.dispatch[h].end_us = since_start(r);
    if (!note(h == 0 ? "dispatch 0" : "dispatch 1", r)) {
      return;
    }
    dispatched_[h] = true;
    if (h == 0) {
      start_dispatch(1);
    }
    maybe_compute();
  }

  // The compute stream: micro-batch h's experts once its rows are in and the previous experts are done; their
  // modelled time on the clock, LibTorch (compute mode) at once.
  void maybe_compute() {
    const int h = computing_ + 1;
    if (h > 1 || computing_busy_ || !dispatched_[h]) {
      return;
    }
    computing_ = h;
    computing_busy_ = true;
    batch_[h]->experts();
    c_.at(c_.now() + experts_ns_[h], [this, h] {
      computing_busy_ = false;
      ready_[h] = true;
      maybe_combine();
      maybe_compute();
    });
  }

  // Combines on stream 1, one after the other, each once its experts are done: beside a dispatch still running.
  void maybe_combine() {
    const int h = combining_ + 1;
    if (h > 1 || combining_busy_ || !ready_[h]) {
      return;
    }
    combining_ = h;
    combining_busy_ = true;
    res_.combine[h].start_us = since_start();
    MoeBatch& b = *batch_[h];
    auto done = [this, h](CollectiveResult r) { combined(h, r); };
    if (b.ifec()) {
      start_phase(c_, 1, b.parts(&MoeRankPlan::combine_reduce), &Communicator::reduce_rows, opts_, done);
    } else {
      start_phase(c_, 1, b.parts(&MoeRankPlan::combine_put), &Communicator::put_rows, opts_, done);
    }
  }

  void combined(int h, const CollectiveResult& r) {
    res_.combine[h].end_us = since_start(r);
    combining_busy_ = false;
    if (note(h == 0 ? "combine 0" : "combine 1", r)) {
      combined_[h] = true;
      maybe_combine();
    }
  }

  bool note(const char* name, const CollectiveResult& r) {
    MoeFabricResult notes;
    const bool ok = note_phase(name, r, notes);
    res_.fallback_chunks += notes.fallback_chunks;
    res_.faults.insert(res_.faults.end(), notes.faults.begin(), notes.faults.end());
    if (!ok && res_.error.empty()) {
      res_.error = notes.error;
    }
    return ok;
  }

  // The micro-batches' outputs back in token order: rank r's first half, then its second.
  at::Tensor output() const {
    const at::Tensor y[2] = {batch_[0]->outputs(), batch_[1]->outputs()};
    if (!y[0].defined()) {
      return {};
    }
    std::vector<at::Tensor> rows;
    for (int r = 0; r < ranks_; ++r) {
      for (int h = 0; h < 2; ++h) {
        rows.push_back(y[h].narrow(0, r * count_[h], count_[h]));
      }
    }
    return torch::cat(rows, 0);
  }

  Cluster& c_;
  const int ranks_;
  const MoeFabricOptions& opts_;
  const common::TimeNs experts_ns_[2];
  int64_t first_[2] = {0, 0};
  int64_t count_[2] = {0, 0};
  std::unique_ptr<MoeBatch> batch_[2];
  common::TimeNs t0_ = 0;
  bool dispatched_[2] = {false, false};
  bool ready_[2] = {false, false};  // experts done
  bool combined_[2] = {false, false};
  int computing_ = -1;  // the last micro-batch whose experts started
  bool computing_busy_ = false;
  int combining_ = -1;  // the last micro-batch whose combine started
  bool combining_busy_ = false;
  MoeTwoBatchResult res_;
};

}  // namespace

MoeFabricResult run_moe_fabric(Cluster& c, MoeVariant variant, const MoeConfig& cfg, const MoeWeights& w,
                               const at::Tensor& x, int ranks, const MoeFabricOptions& opts) {
  validate_moe_args(c, variant, cfg, x, ranks, opts);
  return MoeLayerRun(c, variant, cfg, w, x, ranks, opts).run();
}

MoeTwoBatchResult run_moe_two_batches(Cluster& c, MoeVariant variant, const MoeConfig& cfg, const MoeWeights& w,
                                      const at::Tensor& x, int ranks, const double experts_us[2],
                                      const MoeFabricOptions& opts) {
  validate_moe_args(c, variant, cfg, x, ranks, opts);
  IFEC_CHECK(x.size(0) / ranks >= 2,
             "MoE two micro-batches: " << x.size(0) / ranks << " tokens per rank cannot split into two");
  IFEC_CHECK(
      std::isfinite(experts_us[0]) && std::isfinite(experts_us[1]) && experts_us[0] >= 0 && experts_us[1] >= 0,
      "MoE two micro-batches: experts' times " << experts_us[0] << " and " << experts_us[1] << " us (need >= 0)");
  return TwoBatchRun(c, variant, cfg, w, x, ranks, experts_us, opts).run();
}

}  // namespace ifec::testbed
