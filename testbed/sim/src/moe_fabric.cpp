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

}  // namespace

MoeFabricResult run_moe_fabric(Cluster& c, MoeVariant variant, const MoeConfig& cfg, const MoeWeights& w,
                               const at::Tensor& x_in, int ranks, const MoeFabricOptions& opts) {
  cfg.validate();
  IFEC_CHECK(ranks >= 1 && ranks <= c.size(), "EP size " << ranks << " outside 1.." << c.size());
  IFEC_CHECK(variant != MoeVariant::kIfec || ranks <= 64,
             "EP size " << ranks << ": the IFEC variant's compact ECH bitmaps hold 64 ranks");
  IFEC_CHECK(x_in.dim() == 2 && x_in.size(1) == cfg.hidden && x_in.size(0) % ranks == 0 && x_in.size(0) > 0,
             "x must be [ranks * tokens, " << cfg.hidden << "], got " << x_in.sizes());
  IFEC_CHECK(x_in.scalar_type() == torch::kFloat32 || x_in.scalar_type() == torch::kBFloat16,
             "x must be fp32 or bf16, got " << x_in.scalar_type());
  IFEC_CHECK(opts.row_hidden == 0 || !opts.compute,
             "MoE: rows of width " << opts.row_hidden << " wider than x's " << cfg.hidden << " need the timing mode");
  const at::Tensor x = x_in.contiguous();
  const int64_t tokens = x.size(0) / ranks;
  const int64_t H = opts.row_hidden > 0 ? opts.row_hidden : cfg.hidden;
  const int64_t esize = x.element_size();
  const int64_t row = H * esize;
  const common::TimeNs limit = opts.phase_limit_ns;
  MoeFabricResult res;

  // Routing happens where the tokens are; every rank then knows its deliveries (DeepEP's notify step) and plans
  // its own part (moe_plan.h).
  const RoutingPlan plan = gate(x.to(torch::kFloat32), w, cfg);
  const RouteTable table = to_route_table(plan);
  const DispatchLists lists = build_dispatch_lists(table, cfg.experts, ranks);
  res.routed_pairs = table.tokens * table.topk;
  const bool ifec = variant == MoeVariant::kIfec;
  const auto row_type = x.scalar_type();
  const common::EchDtype dtype = row_type == torch::kBFloat16 ? common::EchDtype::kBf16 : common::EchDtype::kFp32;
  std::vector<MoeRankPlan> plans;
  for (int r = 0; r < ranks; ++r) {
    plans.push_back(
        plan_moe_rank(variant, table, lists, r, tokens, static_cast<uint64_t>(row), dtype, {}, opts.fp8_dispatch));
    res.dispatch_logical_bytes += plans.back().dispatch_logical_bytes;
    res.combine_logical_bytes += plans.back().combine_logical_bytes;
  }
  for (const auto& [id, bytes] : plans[0].windows) {
    c.allocate_window(id, bytes, 1, !opts.compute);
  }
  if (opts.compute) {
    // Each rank's own rows as they leave it: x's type, or FP8 rows with their scales.
    const at::Tensor sent = opts.fp8_dispatch ? quantize_fp8_rows(x) : x;
    const auto drow = static_cast<int64_t>(plans[0].dispatch_row_bytes);
    for (int r = 0; r < ranks; ++r) {
      std::memcpy(c.window_data(r, plans[r].input_window) + plans[r].input_offset,
                  static_cast<const uint8_t*>(sent.data_ptr()) + r * tokens * drow, tokens * drow);
    }
  }
  std::unique_ptr<IfecCollectives> coll;
  if (ifec) {
    coll = std::make_unique<IfecCollectives>(c);
  }
  auto cleanup = [&] {
    if (coll) {
      res.ifec = coll->stats();
    }
    coll.reset();
    for (const auto& [id, bytes] : plans[0].windows) {
      c.free_window(id);
    }
  };
  // Each phase: every GPU's part (GPUs past the EP ranks take part with nothing to do).
  auto parts = [&](auto pick) {
    using Args = std::decay_t<decltype(pick(plans[0]))>;
    std::vector<Args> out;
    for (const MoeRankPlan& p : plans) {
      out.push_back(pick(p));
    }
    out.resize(c.size(), idle_part(out[0]));
    return out;
  };
  auto note = [&res](const char* phase, const CollectiveResult& r) {
    res.fallback_chunks += r.fallback_chunks;
    if (r.fell_back) {
      res.fallback_reason += (res.fallback_reason.empty() ? "" : "; ") + (phase + (": " + r.fallback_reason));
    }
    for (const std::string& f : r.faults) {
      res.faults.push_back(phase + (": " + f));
    }
    return r.ok ? std::string() : phase + (": " + r.error);
  };

  // ---- Dispatch ----
  {
    PhaseMeter meter(c, ranks);
    const std::string err =
        ifec ? note("dispatch",
                    coll->multicast_rows(parts([](const MoeRankPlan& p) { return p.dispatch_multicast; }), limit))
             : note("dispatch", run_put_rows(c, parts([](const MoeRankPlan& p) { return p.dispatch_put; }), limit));
    if (!err.empty()) {
      res.error = err;
      cleanup();
      return res;
    }
    meter.finish(&res.dispatch);
  }

  // ---- Expert compute on every rank (LibTorch; its time is the caller's to model from tokens_per_expert) ----
  res.tokens_per_expert = tokens_per_expert(table, cfg.experts);
  std::vector<at::Tensor> out_rows(ranks);
  if (opts.compute) {  // (timing mode: the shared output window is zeros already)
    for (int d = 0; d < ranks; ++d) {
      const auto n = static_cast<int64_t>(plans[d].recv_offsets.size());
      out_rows[d] = moe_expert_rows(plans[d], c.window_data(d, plans[d].ids.recv), lists, w, cfg, row_type);
      std::memcpy(c.window_data(d, plans[d].ids.output), out_rows[d].data_ptr(), n * row);
    }
  }

  // ---- Combine ----
  {
    PhaseMeter meter(c, ranks);
    const std::string err =
        ifec ? note("combine", coll->reduce_rows(parts([](const MoeRankPlan& p) { return p.combine_reduce; }), limit))
             : note("combine", run_put_rows(c, parts([](const MoeRankPlan& p) { return p.combine_put; }), limit));
    if (!err.empty()) {
      res.error = err;
      cleanup();
      return res;
    }
    meter.finish(&res.combine);
  }

  // Each source sums its tokens' rows (unused slots are zero; IFEC: plus its own rank's part) and adds the shared
  // expert.
  if (opts.compute) {
    std::vector<at::Tensor> ys;
    for (int s = 0; s < ranks; ++s) {
      const at::Tensor routed =
          moe_routed_output(plans[s], c.window_data(s, plans[s].ids.combine), out_rows[s], H, row_type);
      ys.push_back(shared_expert_forward(x.narrow(0, s * tokens, tokens), w) + routed);
    }
    res.output = torch::cat(ys, 0);
  }
  cleanup();
  res.ok = true;
  return res;
}

}  // namespace ifec::testbed
