// MoE points on the simulated driver: each variant on a fresh fabric, per-phase times and bytes, the experts
// modelled.
#include "ifec/testbed/moe_run.h"

#include <torch/torch.h>

#include <chrono>
#include <iomanip>
#include <optional>
#include <sstream>

#include "ifec/common/checks.h"
#include "ifec/common/heap.h"
#include "ifec/testbed/cluster.h"
#include "ifec/testbed/collective_run.h"
#include "ifec/testbed/live_timing.h"

namespace ifec::testbed {

using namespace workloads;  // the MoE layer math (moe.h) this driver moves through the fabric

namespace {

// Timing mode: x only feeds the gate, so it is this wide (a 64 x 4096-token x at the full 7168 would be 3.8 GB).
// The gate's logits are N(0, 1) at any width (weights N(0, 1/width), inputs N(0, 1)), and the load over ranks is
// close to the full width's (busiest of 64 ranks 1.22x the mean at 1024 and at 7168, in a 65,536-token check);
// the rows on the wire are full width.
constexpr int64_t kRouteHidden = 1024;

// What every variant of a point shares: the weights run (or only routed), x, and the reference when computed.
struct PointInputs {
  MoeConfig run;
  MoeWeights w;
  at::Tensor x;
  at::Tensor ref;
  at::ScalarType dtype;
  MoeFabricOptions opts;
};

PointInputs make_inputs(const MoeRunConfig& cfg, const MoePoint& p, int64_t tokens) {
  PointInputs in;
  in.run = node_limited(cfg.model, p.ep, cfg.gpus_per_node);
  in.run.inter = cfg.run_inter;
  in.opts.compute = cfg.compute;
  in.opts.fp8_dispatch = cfg.fp8_dispatch;
  in.opts.live_timing = cfg.live_timing;
  if (!cfg.compute) {
    in.run.hidden = kRouteHidden;
    in.opts.row_hidden = cfg.model.hidden;
  }
  in.dtype = cfg.bf16 ? torch::kBFloat16 : torch::kFloat32;
  in.w = make_weights(in.run, cfg.seed, in.dtype);
  // A generator of its own, not the global one: runs of a sweep draw their x on several threads at once.
  in.x = draw_tokens(cfg.seed, p.ep * tokens, in.run.hidden, in.dtype);
  if (cfg.compute) {
    // FP8: the experts see the dequantised rows the sources sent; the gate and the shared expert see x.
    const at::Tensor expert_x =
        cfg.fp8_dispatch ? dequantize_fp8_rows(quantize_fp8_rows(in.x), in.run.hidden).to(in.dtype) : at::Tensor();
    in.ref = reference_forward(in.x, in.w, in.run, gate(in.x, in.w, in.run), expert_x);
  }
  return in;
}

ClusterOptions cluster_options(const MoeRunConfig& cfg) {
  ClusterOptions o;
  o.fabric.lb = switchemu::LoadBalance::kPerPacket;
  o.fabric.seed = cfg.seed;
  o.fabric.elided_payloads = cfg.elided_payloads;
  o.threads = cfg.threads;
  o.gpu_groups = cfg.gpu_groups;
  o.fabric.leaf_groups = cfg.leaf_groups;
  o.processes = cfg.processes;
  if (cfg.processes != nullptr && cfg.processes->size > 1) {
    o.threads = std::max(o.threads, 1);
  }
  o.endpoint.ordering = endpoint::Ordering::kWeak;
  if (cfg.live_timing) {
    apply_live_timing(o.endpoint, cfg.topo);
  }
  return o;
}

// `started`, when given, gets the carried state the EP ranks started from (MoeRunConfig::start where it is set).
MoeFabricResult run_variant(const MoeRunConfig& cfg, const MoePoint& p, const PointInputs& in, const at::Tensor& x,
                            MoeVariant v, bool compute, Turns* started = nullptr) {
  std::optional<routing::Topology> live;  // the switches' in-fabric timers too, when live_timing
  if (cfg.live_timing) {
    apply_live_timing(live.emplace(cfg.topo).params.ifec);
  }
  Cluster c(live ? *live : cfg.topo, cluster_options(cfg));
  const Turns turns = start_turns(c, cfg.start, p.ep);
  if (started != nullptr) {
    *started = turns;
  }
  MoeFabricOptions fo = in.opts;
  fo.compute = compute;
  fo.first_group = turns.group;
  MoeFabricResult r = run_moe_fabric(c, v, in.run, in.w, x, p.ep, fo);
  IFEC_CHECK(r.ok, "MoE " << moe_variant_name(v) << " at EP " << p.ep << ", " << x.size(0) / p.ep
                          << " tokens per rank: " << r.error);
  return r;
}

// The slowest rank's routed experts at the costed width, each rank's histogram scaled to the point's tokens.
double experts_us(const MoeRunConfig& cfg, const MoePoint& p, const MoeFabricResult& r, double scale) {
  const int64_t per_rank = cfg.model.experts / p.ep;
  const double esize = cfg.bf16 ? 2 : 4;
  double us = 0;
  for (int d = 0; d < p.ep; ++d) {
    std::vector<int64_t> mine;
    for (int64_t e = d * per_rank; e < (d + 1) * per_rank; ++e) {
      mine.push_back(static_cast<int64_t>(std::llround(r.tokens_per_expert[e] * scale)));
    }
    us = std::max(us, 1e6 * expert_compute_seconds(mine, cfg.model, cfg.profile, esize));
  }
  return us;
}

// The layer as two micro-batches (each rank's first and second half of its tokens), two schedules: DeepEP's
// production one (one communication stream: each half's phases simulated on a fresh fabric, then
// two_micro_batch_time) and communication under communication (run_moe_two_batches: both halves on one fabric, a
// half's dispatch beside the other's combine), with the same modelled experts.
struct Overlaps {
  double one_stream_us = 0;
  double two_streams_us = 0;
};
Overlaps overlapped_us(const MoeRunConfig& cfg, const MoePoint& p, const PointInputs& in, MoeVariant v, double scale) {
  const int64_t tokens = in.x.size(0) / p.ep;
  IFEC_CHECK(tokens >= 2, "MoE overlap: " << tokens << " tokens per rank cannot split into two micro-batches");
  const at::Tensor per_rank = in.x.view({p.ep, tokens, in.x.size(1)});
  double d[2], e[2], c[2];
  for (int h = 0; h < 2; ++h) {
    const int64_t first = h == 0 ? 0 : tokens / 2;
    const int64_t n = h == 0 ? tokens / 2 : tokens - tokens / 2;
    const at::Tensor half = per_rank.narrow(1, first, n).reshape({p.ep * n, in.x.size(1)});
    const MoeFabricResult r = run_variant(cfg, p, in, half, v, false);
    d[h] = r.dispatch.us * scale;
    c[h] = r.combine.us * scale;
    e[h] = experts_us(cfg, p, r, scale);
  }
  Overlaps o;
  o.one_stream_us = two_micro_batch_time(d, e, c);
  // Simulated at the simulated tokens, so the experts' full-size time shrinks by the same ratio as the fabric's.
  const double e_sim[2] = {e[0] / scale, e[1] / scale};
  Cluster cluster(cfg.topo, cluster_options(cfg));
  MoeFabricOptions fo = in.opts;
  fo.compute = false;
  const MoeTwoBatchResult r = run_moe_two_batches(cluster, v, in.run, in.w, in.x, p.ep, e_sim, fo);
  IFEC_CHECK(r.ok, "MoE " << moe_variant_name(v) << " at EP " << p.ep << ", two micro-batches: " << r.error);
  o.two_streams_us = r.us * scale;
  return o;
}

}  // namespace

void validate_moe_point(const MoeRunConfig& cfg, const MoePoint& p) {
  cfg.model.validate();
  IFEC_CHECK(p.ep >= 1 && p.ep <= cfg.topo.num_gpus(),
             "MoE point: EP size " << p.ep << " outside 1.." << cfg.topo.num_gpus() << " (the topology's GPUs)");
  IFEC_CHECK(cfg.model.experts % p.ep == 0,
             "MoE point: EP size " << p.ep << " does not divide " << cfg.model.experts << " experts");
  IFEC_CHECK(p.tokens >= 1, "MoE point: tokens per rank " << p.tokens << " (need at least 1)");
  IFEC_CHECK(p.mode == "normal" || p.mode == "ll" || p.mode == "scaled" || p.mode == "sweep",
             "MoE point: mode '" << p.mode << "' (expected normal, ll, scaled or sweep)");
  IFEC_CHECK(cfg.run_inter >= 1, "MoE point: run_inter " << cfg.run_inter);
  IFEC_CHECK(cfg.token_cap >= 0,  // a negative cap was taken for none
             "MoE point: token_cap " << cfg.token_cap << " (0: every token, N >= 1: at most N per rank)");
  IFEC_CHECK(!cfg.compute || !cfg.elided_payloads,
             "MoE point: the experts need the rows' values, and elided payloads carry none (the timing mode only)");
  node_limited(cfg.model, p.ep, cfg.gpus_per_node);  // throws naming an EP that is not whole nodes
  if (cfg.fp8_dispatch) {
    fp8_row_bytes(cfg.model.hidden);  // throws naming a hidden that is not a multiple of 128
  }
  Cluster::check_options(cfg.topo, cluster_options(cfg));  // --gpu-groups, --leaf-groups: before any run
  // The data lives in the process that runs the GPUs (rank 0 under mpirun): the planes' ranks hold none of it.
  const bool holds_data = cfg.processes == nullptr || cfg.processes->rank == 0;
  const double need = holds_data ? moe_point_data_bytes(cfg, p) : 0;
  const auto physical = static_cast<double>(common::physical_memory_bytes());
  IFEC_CHECK(physical == 0 || need <= physical * 0.75,
             "MoE point: EP " << p.ep << " x " << p.tokens << " tokens per rank, hidden " << cfg.model.hidden << ", "
                              << cfg.model.experts << " experts, top-" << cfg.model.topk
                              << (cfg.compute ? ", run_inter " + std::to_string(cfg.run_inter) : std::string())
                              << " needs about " << std::fixed << std::setprecision(1) << need / (1 << 30)
                              << " GiB for its data; "
                              << "the limit is 3/4 of this machine's " << static_cast<uint64_t>(physical / (1 << 30))
                              << " GiB");
}

double moe_point_data_bytes(const MoeRunConfig& cfg, const MoePoint& p) {
  const double tokens = static_cast<double>(cfg.token_cap > 0 ? std::min(p.tokens, cfg.token_cap) : p.tokens);
  const double ep = p.ep;
  const double experts = static_cast<double>(cfg.model.experts);
  const double run_hidden = static_cast<double>(cfg.compute ? cfg.model.hidden : kRouteHidden);
  const double element = cfg.bf16 ? 2 : 4;
  const double x = ep * tokens * run_hidden * element;
  const double scores = ep * tokens * experts * 4;
  // Three matrices an expert (the shared one too), drawn in fp32 and kept in the run's dtype.
  const double weights = (experts + 1) * run_hidden * static_cast<double>(cfg.run_inter) * 3 * (4 + element);
  // About 3 x tokens x top-k x 1.5 rows of 2 bytes per element held by the windows.
  const double rows = cfg.elided_payloads ? 0
                                          : 4.5 * tokens * static_cast<double>(cfg.model.topk) *
                                                (cfg.compute ? ep : 1) * static_cast<double>(cfg.model.hidden) * 2;
  return x + scores + weights + rows;
}

std::vector<MoeRow> run_moe_point(const MoeRunConfig& cfg, const MoePoint& p, const std::vector<MoeVariant>& variants) {
  validate_moe_point(cfg, p);
  if (cfg.processes != nullptr && cfg.processes->size > 1 && cfg.processes->rank != 0) {
    // A process of planes only: the fabrics rank 0 makes, in its order (a variant's, then with overlap its two
    // halves' and the two micro-batches'), each served until rank 0 is done with it.
    for (size_t i = 0; i < variants.size() * (cfg.overlap ? 4 : 1); ++i) {
      Cluster c(cfg.topo, cluster_options(cfg));
      c.serve();
    }
    return {};
  }
  const int64_t sim_tokens = cfg.token_cap > 0 ? std::min(p.tokens, cfg.token_cap) : p.tokens;
  const double scale = static_cast<double>(p.tokens) / static_cast<double>(sim_tokens);
  const PointInputs in = make_inputs(cfg, p, sim_tokens);
  std::vector<MoeRow> rows;
  for (MoeVariant v : variants) {
    const auto t0 = std::chrono::steady_clock::now();
    MoeRow row;
    const MoeFabricResult r = run_variant(cfg, p, in, in.x, v, cfg.compute, &row.turns);
    row.point = p;
    row.variant = moe_variant_name(v);
    row.simulated_tokens = sim_tokens;
    row.scaled = scale != 1.0;
    row.fp8_dispatch = cfg.fp8_dispatch;
    row.elided_payloads = cfg.elided_payloads;
    row.gate_groups = in.run.groups;
    row.line_gbs = cfg.topo.gpu_access_gbps(0) / 8;
    row.dispatch_us = r.dispatch.us * scale;
    row.combine_us = r.combine.us * scale;
    row.dispatch_data_start_ns = r.dispatch.data_start_ns;
    row.dispatch_data_end_ns =
        r.dispatch.data_start_ns + std::llround((r.dispatch.data_end_ns - r.dispatch.data_start_ns) * scale);
    row.combine_data_start_ns = r.combine.data_start_ns;
    row.combine_data_end_ns =
        r.combine.data_start_ns + std::llround((r.combine.data_end_ns - r.combine.data_start_ns) * scale);
    row.dispatch_bound_us = r.dispatch.bound_us * scale;
    row.combine_bound_us = r.combine.bound_us * scale;
    row.compute_us = experts_us(cfg, p, r, scale);
    row.total_us = row.dispatch_us + row.compute_us + row.combine_us;
    if (cfg.overlap) {
      const Overlaps o = overlapped_us(cfg, p, in, v, scale);
      row.overlap_us = o.one_stream_us;
      row.overlap2_us = o.two_streams_us;
    }
    row.dispatch_logical_bytes = static_cast<int64_t>(std::llround(r.dispatch_logical_bytes * scale));
    row.combine_logical_bytes = static_cast<int64_t>(std::llround(r.combine_logical_bytes * scale));
    auto scaled = [&](uint64_t b) { return static_cast<uint64_t>(std::llround(b * scale)); };
    row.dispatch_wire_bytes = scaled(r.dispatch.wire_bytes);
    row.combine_wire_bytes = scaled(r.combine.wire_bytes);
    for (uint64_t b : r.dispatch.wire_per_plane) {
      row.dispatch_wire_per_plane.push_back(scaled(b));
    }
    for (uint64_t b : r.combine.wire_per_plane) {
      row.combine_wire_per_plane.push_back(scaled(b));
    }
    row.dispatch_resent = r.dispatch.resent.frames;
    row.dispatch_resent_bytes = r.dispatch.resent.bytes;
    row.combine_resent = r.combine.resent.frames;
    row.combine_resent_bytes = r.combine.resent.bytes;
    row.fallback_chunks = r.fallback_chunks;
    row.faults = r.faults;
    row.ifec_retransmissions = r.ifec.retransmissions;
    row.ifec_busy_naks = r.ifec.busy_naks;
    row.ifec_duplicate_results = r.ifec.duplicate_results;
    if (cfg.compute) {
      row.max_rel_error = moe_max_rel_error(r.output, in.ref);
      row.tolerance = moe_tolerance(in.dtype);
    }
    row.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (cfg.progress) {
      std::ostringstream os;
      os << "  " << p.mode << " EP " << p.ep << " " << p.tokens << " tokens/rank: " << row.variant << " done ("
         << static_cast<int>(row.wall_seconds) << " s wall" << (row.scaled ? ", scaled from " : "")
         << (row.scaled ? std::to_string(sim_tokens) + " simulated" : "") << ")";
      cfg.progress(os.str());
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace ifec::testbed
