// MoE points: each variant on a fresh simulated fabric, per-phase times and bytes, and their printed forms.
#include "ifec/testbed/moe_bench.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <sstream>

#include "ifec/common/checks.h"
#include "ifec/common/json.h"
#include "ifec/testbed/cluster.h"
#include "ifec/testbed/parallel.h"

namespace ifec::testbed {

using namespace workloads;  // the MoE layer math (moe.h) this driver moves through the fabric

double MoeBenchRow::dispatch_gbs() const {
  return dispatch_us > 0 ? dispatch_logical_bytes / static_cast<double>(point.ep) / (dispatch_us * 1e3) : 0;
}
double MoeBenchRow::combine_gbs() const {
  return combine_us > 0 ? combine_logical_bytes / static_cast<double>(point.ep) / (combine_us * 1e3) : 0;
}

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

PointInputs make_inputs(const MoeBenchConfig& cfg, const MoePoint& p, int64_t tokens) {
  PointInputs in;
  in.run = cfg.model;
  in.run.inter = cfg.run_inter;
  in.opts.compute = cfg.compute;
  in.opts.fp8_dispatch = cfg.fp8_dispatch;
  if (!cfg.compute) {
    in.run.hidden = kRouteHidden;
    in.opts.row_hidden = cfg.model.hidden;
  }
  in.dtype = cfg.bf16 ? torch::kBFloat16 : torch::kFloat32;
  in.w = make_weights(in.run, cfg.seed, in.dtype);
  // A generator of its own, not the global one: runs of a sweep draw their x on several threads at once.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(cfg.seed) * 7919 + 17);
  in.x = torch::randn({p.ep * tokens, in.run.hidden}, gen).to(in.dtype);
  if (cfg.compute) {
    // FP8: the experts see the dequantised rows the sources sent; the gate and the shared expert see x.
    const at::Tensor expert_x =
        cfg.fp8_dispatch ? dequantize_fp8_rows(quantize_fp8_rows(in.x), in.run.hidden).to(in.dtype) : at::Tensor();
    in.ref = reference_forward(in.x, in.w, in.run, gate(in.x, in.w, in.run), expert_x);
  }
  return in;
}

MoeFabricResult run_variant(const MoeBenchConfig& cfg, const MoePoint& p, const PointInputs& in, const at::Tensor& x,
                            MoeVariant v, bool compute) {
  ClusterOptions o;
  o.fabric.lb = switchemu::LoadBalance::kPerPacket;
  o.fabric.seed = cfg.seed;
  o.endpoint.ordering = endpoint::Ordering::kWeak;
  Cluster c(cfg.topo, o);
  MoeFabricOptions fo = in.opts;
  fo.compute = compute;
  MoeFabricResult r = run_moe_fabric(c, v, in.run, in.w, x, p.ep, fo);
  IFEC_CHECK(r.ok, "MoE " << moe_variant_name(v) << " at EP " << p.ep << ", " << x.size(0) / p.ep
                          << " tokens per rank: " << r.error);
  return r;
}

// The slowest rank's routed experts at the costed width, each rank's histogram scaled to the point's tokens.
double experts_us(const MoeBenchConfig& cfg, const MoePoint& p, const MoeFabricResult& r, double scale) {
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

// The layer as two micro-batches (each rank's first and second half of its tokens), overlapped as DeepEP's
// production schedule does: each half's phases simulated on a fresh fabric, then two_micro_batch_time.
double overlapped_us(const MoeBenchConfig& cfg, const MoePoint& p, const PointInputs& in, MoeVariant v, double scale) {
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
  return two_micro_batch_time(d, e, c);
}

}  // namespace

void validate_moe_point(const MoeBenchConfig& cfg, const MoePoint& p) {
  cfg.model.validate();
  IFEC_CHECK(p.ep >= 1 && p.ep <= cfg.topo.num_gpus(),
             "MoE point: EP size " << p.ep << " outside 1.." << cfg.topo.num_gpus() << " (the topology's GPUs)");
  IFEC_CHECK(cfg.model.experts % p.ep == 0,
             "MoE point: EP size " << p.ep << " does not divide " << cfg.model.experts << " experts");
  IFEC_CHECK(p.tokens >= 1, "MoE point: tokens per rank " << p.tokens << " (need at least 1)");
  IFEC_CHECK(p.mode == "normal" || p.mode == "ll" || p.mode == "scaled" || p.mode == "sweep",
             "MoE point: mode '" << p.mode << "' (expected normal, ll, scaled or sweep)");
  IFEC_CHECK(cfg.run_inter >= 1, "MoE point: run_inter " << cfg.run_inter);
  if (cfg.fp8_dispatch) {
    fp8_row_bytes(cfg.model.hidden);  // throws naming a hidden that is not a multiple of 128
  }
}

std::vector<MoeBenchRow> run_moe_point(const MoeBenchConfig& cfg, const MoePoint& p,
                                       const std::vector<MoeVariant>& variants) {
  validate_moe_point(cfg, p);
  const int64_t sim_tokens = cfg.token_cap > 0 ? std::min(p.tokens, cfg.token_cap) : p.tokens;
  const double scale = static_cast<double>(p.tokens) / static_cast<double>(sim_tokens);
  const PointInputs in = make_inputs(cfg, p, sim_tokens);
  std::vector<MoeBenchRow> rows;
  for (MoeVariant v : variants) {
    const auto t0 = std::chrono::steady_clock::now();
    const MoeFabricResult r = run_variant(cfg, p, in, in.x, v, cfg.compute);
    MoeBenchRow row;
    row.point = p;
    row.variant = moe_variant_name(v);
    row.simulated_tokens = sim_tokens;
    row.scaled = scale != 1.0;
    row.fp8_dispatch = cfg.fp8_dispatch;
    row.line_gbs = cfg.topo.gpu_access_gbps(0) / 8;
    row.dispatch_us = r.dispatch.us * scale;
    row.combine_us = r.combine.us * scale;
    row.dispatch_bound_us = r.dispatch.bound_us * scale;
    row.combine_bound_us = r.combine.bound_us * scale;
    row.compute_us = experts_us(cfg, p, r, scale);
    row.total_us = row.dispatch_us + row.compute_us + row.combine_us;
    if (cfg.overlap) {
      row.overlap_us = overlapped_us(cfg, p, in, v, scale);
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

std::vector<MoeBenchRow> run_moe_points(const MoeBenchConfig& cfg, const std::vector<MoePoint>& points,
                                        const std::vector<MoeVariant>& variants, unsigned jobs,
                                        const std::function<void(size_t, size_t, const std::string&)>& progress) {
  for (const MoePoint& p : points) {
    validate_moe_point(cfg, p);  // every point before any runs: a bad one costs no minutes of the others
  }
  const size_t nv = variants.size();
  std::vector<MoeBenchRow> rows(points.size() * nv);
  std::vector<std::string> errors(rows.size());
  ParallelJobs pj;
  for (size_t i = 0; i < rows.size(); ++i) {
    pj.order.push_back(i);
  }
  auto work = [&](size_t i) { return static_cast<double>(points[i / nv].ep) * points[i / nv].tokens; };
  std::stable_sort(pj.order.begin(), pj.order.end(), [&](size_t a, size_t b) { return work(a) > work(b); });
  // The windows (shared in the timing mode: one copy) hold about 3 x tokens x top-k x 1.5 rows of 2 bytes per
  // element (computed runs: a window per GPU), and every (token, rank) store waiting in an endpoint's queues about
  // 3 KB of state: one EP 64 x 4096-token run peaks near 8 GB.
  pj.need = [&](size_t i) {
    const MoePoint& p = points[i / nv];
    const auto pairs = static_cast<uint64_t>(p.ep) * static_cast<uint64_t>(p.tokens * cfg.model.topk);
    const auto rows_held = static_cast<uint64_t>(4.5 * p.tokens * cfg.model.topk * (cfg.compute ? p.ep : 1));
    return rows_held * static_cast<uint64_t>(cfg.model.hidden) * 2 + pairs * 3072;
  };
  pj.budget = host_memory_budget();
  pj.label = [&](size_t i) {
    const MoePoint& p = points[i / nv];
    return p.mode + " EP " + std::to_string(p.ep) + " " + moe_variant_name(variants[i % nv]);
  };
  MoeBenchConfig quiet = cfg;
  quiet.progress = nullptr;
  pj.run = [&](size_t i) {
    try {
      rows[i] = run_moe_point(quiet, points[i / nv], {variants[i % nv]}).at(0);
    } catch (const std::exception& e) {
      errors[i] = e.what();
    }
  };
  pj.progress = progress;
  run_parallel(pj, jobs);
  for (const std::string& e : errors) {
    IFEC_CHECK(e.empty(), e);
  }
  return rows;
}

std::string moe_rows_header() {
  char buf[512];
  std::snprintf(buf, sizeof buf, "#%-7s %4s %6s %-10s %12s %7s %5s %5s %12s %7s %5s %5s %11s %11s %11s %9s %9s  %s",
                "mode", "EP", "tokens", "variant", "dispatch(us)", "GB/s", "line", "bound", "combine(us)", "GB/s",
                "line", "bound", "experts(us)", "total(us)", "overlap(us)", "disp MB", "comb MB",
                "wire MB per plane (disp+comb)");
  return buf;
}

std::string moe_row_text(const MoeBenchRow& r) {
  auto pct = [](double f) { return static_cast<int>(std::lround(100 * f)); };
  auto of_bound = [](double bound, double us) { return us > 0 ? bound / us : 0.0; };
  std::string planes;
  for (size_t p = 0; p < r.dispatch_wire_per_plane.size(); ++p) {
    char b[32];
    std::snprintf(b, sizeof b, "%s%.0f", p ? "/" : "",
                  (r.dispatch_wire_per_plane[p] + r.combine_wire_per_plane.at(p)) / 1e6);
    planes += b;
  }
  char overlap[32] = "-";
  if (r.overlap_us >= 0) {
    std::snprintf(overlap, sizeof overlap, "%.1f", r.overlap_us);
  }
  char buf[640];
  std::snprintf(buf, sizeof buf,
                " %-7s %4d %6lld %-10s %12.1f %7.1f %4d%% %4d%% %12.1f %7.1f %4d%% %4d%% %11.1f %11.1f %11s %9.1f "
                "%9.1f  %s%s",
                r.point.mode.c_str(), r.point.ep, static_cast<long long>(r.point.tokens), r.variant.c_str(),
                r.dispatch_us, r.dispatch_gbs(), pct(r.dispatch_line_fraction()),
                pct(of_bound(r.dispatch_bound_us, r.dispatch_us)), r.combine_us, r.combine_gbs(),
                pct(r.combine_line_fraction()), pct(of_bound(r.combine_bound_us, r.combine_us)), r.compute_us,
                r.total_us, overlap, r.dispatch_wire_bytes / 1e6, r.combine_wire_bytes / 1e6, planes.c_str(),
                r.scaled ? ("  (scaled from " + std::to_string(r.simulated_tokens) + ")").c_str() : "");
  std::string line = buf;
  if (!r.ok()) {
    char err[160];
    std::snprintf(err, sizeof err, "  WRONG: max error %.3g above tolerance %.3g", r.max_rel_error, r.tolerance);
    line += err;
  }
  for (const std::string& f : r.faults) {
    line += "\n#   " + r.variant + " fault: " + f;
  }
  return line;
}

common::JsonObject moe_row_record(const MoeBenchRow& r, const std::string& topology, const std::string& driver) {
  common::JsonObject o;
  o.add("driver", driver).add("topology", topology).add("mode", r.point.mode).add("ep", r.point.ep);
  o.add("tokens", r.point.tokens).add("variant", r.variant).add("simulated_tokens", r.simulated_tokens);
  o.add("scaled", r.scaled).add("dispatch_us", r.dispatch_us).add("combine_us", r.combine_us);
  o.add("compute_us", r.compute_us).add("compute_source", r.compute_source).add("total_us", r.total_us);
  o.add("overlap_us", r.overlap_us).add("fp8_dispatch", r.fp8_dispatch);
  o.add("dispatch_gbs", r.dispatch_gbs()).add("combine_gbs", r.combine_gbs()).add("line_gbs", r.line_gbs);
  o.add("dispatch_line_fraction", r.dispatch_line_fraction()).add("combine_line_fraction", r.combine_line_fraction());
  o.add("dispatch_bound_us", r.dispatch_bound_us).add("combine_bound_us", r.combine_bound_us);
  o.add("dispatch_logical_bytes", r.dispatch_logical_bytes).add("dispatch_wire_bytes", r.dispatch_wire_bytes);
  o.add("combine_logical_bytes", r.combine_logical_bytes).add("combine_wire_bytes", r.combine_wire_bytes);
  o.add("dispatch_wire_per_plane", r.dispatch_wire_per_plane).add("combine_wire_per_plane", r.combine_wire_per_plane);
  o.add("ifec_retransmissions", r.ifec_retransmissions).add("ifec_busy_naks", r.ifec_busy_naks);
  o.add("ifec_duplicate_results", r.ifec_duplicate_results);
  o.add("fallback_chunks", r.fallback_chunks).add("max_rel_error", r.max_rel_error).add("tolerance", r.tolerance);
  o.add("ok", r.ok()).add("faults", r.faults).add("wall_seconds", r.wall_seconds);
  return o;
}

}  // namespace ifec::testbed
