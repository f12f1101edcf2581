// MoE dispatch / expert compute / combine over the simulated fabric: every rank's communicator runs its part of
// each phase, point-to-point row stores (per expert, per rank) or IFEC multicast and in-switch reduction.
#include "ifec/testbed/moe_fabric.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "ifec/common/checks.h"
#include "ifec/testbed/harness.h"

namespace ifec::testbed {

using namespace workloads;  // the MoE layer math (moe.h) this driver moves through the fabric

namespace {

// What the first `ranks` GPUs' ports have carried: frame bytes sent per plane, and per GPU the bytes each way on
// the wire (frame bytes + the per-frame overhead) for the line-rate bound.
struct PortTotals {
  std::vector<uint64_t> tx_per_plane;
  std::vector<uint64_t> tx_wire, rx_wire;  // per GPU
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
  }
  return t;
}

struct PhaseMeter {
  Cluster& c;
  int ranks;
  common::TimeNs t0;
  PortTotals before;
  PhaseMeter(Cluster& cluster, int n)
      : c(cluster), ranks(n), t0(cluster.loop().now()), before(gpu_totals(cluster, n)) {}
  void finish(MoePhase* out) const {
    out->us = (c.loop().now() - t0) / 1e3;
    const PortTotals after = gpu_totals(c, ranks);
    out->wire_per_plane.assign(after.tx_per_plane.size(), 0);
    out->wire_bytes = 0;
    for (size_t p = 0; p < after.tx_per_plane.size(); ++p) {
      out->wire_per_plane[p] = after.tx_per_plane[p] - before.tx_per_plane[p];
      out->wire_bytes += out->wire_per_plane[p];
    }
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
  IFEC_CHECK(variant != MoeVariant::kIfec || ranks <= 64,
             "EP size " << ranks << ": the IFEC variant's compact ECH bitmaps hold 64 ranks");
  IFEC_CHECK(x.dim() == 2 && x.size(1) == cfg.hidden && x.size(0) % ranks == 0 && x.size(0) > 0,
             "x must be [ranks * tokens, " << cfg.hidden << "], got " << x.sizes());
  IFEC_CHECK(x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16,
             "x must be fp32 or bf16, got " << x.scalar_type());
  IFEC_CHECK(!opts.compute || !c.fabric().options().elided_payloads,
             "MoE: the experts need the rows, and this fabric's payloads are elided: the timing mode only");
  IFEC_CHECK(opts.row_hidden == 0 || !opts.compute,
             "MoE: rows of width " << opts.row_hidden << " wider than x's " << cfg.hidden << " need the timing mode");
}

// One MoE layer over the cluster's first `ranks` GPUs: routing and every rank's plan, then dispatch, the experts
// and combine, each phase measured; the outputs summed at their sources.
class MoeLayerRun {
 public:
  MoeLayerRun(Cluster& c, MoeVariant variant, const MoeConfig& cfg, const MoeWeights& w, const at::Tensor& x, int ranks,
              const MoeFabricOptions& opts)
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
    plan(variant);
  }

  MoeFabricResult run() {
    const common::TimeNs limit = opts_.phase_limit_ns;
    const bool dispatched = phase("dispatch", &res_.dispatch, [&] {
      return ifec_ ? coll_->multicast_rows(parts([](const MoeRankPlan& p) { return p.dispatch_multicast; }), limit)
                   : run_put_rows(c_, parts([](const MoeRankPlan& p) { return p.dispatch_put; }), limit);
    });
    if (dispatched) {
      experts();
      const bool combined = phase("combine", &res_.combine, [&] {
        return ifec_ ? coll_->reduce_rows(parts([](const MoeRankPlan& p) { return p.combine_reduce; }), limit)
                     : run_put_rows(c_, parts([](const MoeRankPlan& p) { return p.combine_put; }), limit);
      });
      if (combined) {
        outputs();
        res_.ok = true;
      }
    }
    cleanup();
    return std::move(res_);
  }

 private:
  // Routing happens where the tokens are; every rank then knows its deliveries (DeepEP's notify step) and plans
  // its own part (moe_plan.h). Windows are allocated and each rank's rows written where its plan reads them.
  void plan(MoeVariant variant) {
    const RoutingPlan routing = gate(x_.to(torch::kFloat32), w_, cfg_);
    table_ = to_route_table(routing);
    lists_ = build_dispatch_lists(table_, cfg_.experts, ranks_);
    res_.routed_pairs = table_.tokens * table_.topk;
    const common::EchDtype dtype = row_type_ == torch::kBFloat16 ? common::EchDtype::kBf16 : common::EchDtype::kFp32;
    for (int r = 0; r < ranks_; ++r) {
      plans_.push_back(plan_moe_rank(variant, table_, lists_, r, tokens_, static_cast<uint64_t>(row_), dtype, {},
                                     opts_.fp8_dispatch));
      res_.dispatch_logical_bytes += plans_.back().dispatch_logical_bytes;
      res_.combine_logical_bytes += plans_.back().combine_logical_bytes;
    }
    for (const auto& [id, bytes] : plans_[0].windows) {
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
    if (ifec_) {
      coll_ = std::make_unique<IfecCollectives>(c_);
    }
  }

  // Every GPU's part of a phase (GPUs past the EP ranks take part with nothing to do).
  template <typename Pick, typename Args = std::decay_t<std::invoke_result_t<Pick, const MoeRankPlan&>>>
  std::vector<Args> parts(Pick pick) {
    std::vector<Args> out;
    for (const MoeRankPlan& p : plans_) {
      out.push_back(pick(p));
    }
    out.resize(c_.size(), idle_part(out[0]));
    return out;
  }

  // Runs one phase, measured; its fallbacks and faults noted. False (res_.error set) when it failed.
  template <typename Op>
  bool phase(const char* name, MoePhase* out, Op op) {
    PhaseMeter meter(c_, ranks_);
    const CollectiveResult r = op();
    res_.fallback_chunks += r.fallback_chunks;
    if (r.fell_back) {
      res_.fallback_reason += (res_.fallback_reason.empty() ? "" : "; ") + (name + (": " + r.fallback_reason));
    }
    for (const std::string& f : r.faults) {
      res_.faults.push_back(name + (": " + f));
    }
    if (!r.ok) {
      res_.error = name + (": " + r.error);
      return false;
    }
    meter.finish(out);
    return true;
  }

  // Expert compute on every rank (LibTorch; its time is the caller's to model from tokens_per_expert). In the
  // timing mode the shared output window is zeros already.
  void experts() {
    res_.tokens_per_expert = tokens_per_expert(table_, cfg_.experts);
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
  // expert.
  void outputs() {
    if (!opts_.compute) {
      return;
    }
    std::vector<at::Tensor> ys;
    for (int s = 0; s < ranks_; ++s) {
      const at::Tensor routed =
          moe_routed_output(plans_[s], c_.window_data(s, plans_[s].ids.combine), out_rows_[s], hidden_, row_type_);
      ys.push_back(shared_expert_forward(x_.narrow(0, s * tokens_, tokens_), w_) + routed);
    }
    res_.output = torch::cat(ys, 0);
  }

  void cleanup() {
    if (coll_) {
      res_.ifec = coll_->stats();
    }
    coll_.reset();
    for (const auto& [id, bytes] : plans_[0].windows) {
      c_.free_window(id);
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
  std::unique_ptr<IfecCollectives> coll_;
  std::vector<at::Tensor> out_rows_;
  MoeFabricResult res_;
};

}  // namespace

MoeFabricResult run_moe_fabric(Cluster& c, MoeVariant variant, const MoeConfig& cfg, const MoeWeights& w,
                               const at::Tensor& x, int ranks, const MoeFabricOptions& opts) {
  validate_moe_args(c, variant, cfg, x, ranks, opts);
  return MoeLayerRun(c, variant, cfg, w, x, ranks, opts).run();
}

}  // namespace ifec::testbed
