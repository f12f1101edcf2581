// MoE points: each variant on a fresh simulated fabric, per-phase times and bytes, and their printed forms.
#include "ifec/testbed/moe_bench.h"

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <sstream>

#include "ifec/common/checks.h"
#include "ifec/common/json.h"
#include "ifec/testbed/cluster.h"

namespace ifec::testbed {

using namespace workloads;  // the MoE layer math (moe.h) this driver moves through the fabric

double MoeBenchRow::dispatch_gbs() const {
  return dispatch_us > 0 ? dispatch_logical_bytes / static_cast<double>(point.ep) / (dispatch_us * 1e3) : 0;
}
double MoeBenchRow::combine_gbs() const {
  return combine_us > 0 ? combine_logical_bytes / static_cast<double>(point.ep) / (combine_us * 1e3) : 0;
}

std::vector<MoeBenchRow> run_moe_point(const MoeBenchConfig& cfg, const MoePoint& p,
                                       const std::vector<MoeVariant>& variants) {
  cfg.model.validate();
  IFEC_CHECK(p.ep >= 1 && p.ep <= cfg.topo.num_gpus(),
             "MoE point: EP size " << p.ep << " outside 1.." << cfg.topo.num_gpus() << " (the topology's GPUs)");
  IFEC_CHECK(cfg.model.experts % p.ep == 0,
             "MoE point: EP size " << p.ep << " does not divide " << cfg.model.experts << " experts");
  IFEC_CHECK(p.tokens >= 1, "MoE point: tokens per rank " << p.tokens << " (need at least 1)");
  IFEC_CHECK(p.mode == "normal" || p.mode == "ll" || p.mode == "scaled" || p.mode == "sweep",
             "MoE point: mode '" << p.mode << "' (expected normal, ll, scaled or sweep)");
  IFEC_CHECK(cfg.run_inter >= 1, "MoE point: run_inter " << cfg.run_inter);
  const int64_t sim_tokens = cfg.token_cap > 0 ? std::min(p.tokens, cfg.token_cap) : p.tokens;
  const double scale = static_cast<double>(p.tokens) / static_cast<double>(sim_tokens);
  MoeConfig run = cfg.model;
  run.inter = cfg.run_inter;
  const auto dtype = cfg.bf16 ? torch::kBFloat16 : torch::kFloat32;
  const MoeWeights w = make_weights(run, cfg.seed, dtype);
  torch::manual_seed(static_cast<uint64_t>(cfg.seed) * 7919 + 17);
  const at::Tensor x = torch::randn({p.ep * sim_tokens, run.hidden}).to(dtype);
  at::Tensor ref;
  if (cfg.compute) {
    ref = reference_forward(x, w, run);
  }
  const double esize = cfg.bf16 ? 2 : 4;
  std::vector<MoeBenchRow> rows;
  for (MoeVariant v : variants) {
    const auto t0 = std::chrono::steady_clock::now();
    ClusterOptions o;
    o.fabric.lb = switchemu::LoadBalance::kPerPacket;
    o.fabric.seed = cfg.seed;
    o.endpoint.ordering = endpoint::Ordering::kWeak;
    Cluster c(cfg.topo, o);
    MoeFabricOptions fo;
    fo.compute = cfg.compute;
    const MoeFabricResult r = run_moe_fabric(c, v, run, w, x, p.ep, cfg.profile, fo);
    IFEC_CHECK(r.ok, "MoE " << moe_variant_name(v) << " at EP " << p.ep << ", " << sim_tokens
                            << " tokens per rank: " << r.error);
    MoeBenchRow row;
    row.point = p;
    row.variant = moe_variant_name(v);
    row.simulated_tokens = sim_tokens;
    row.scaled = scale != 1.0;
    row.dispatch_us = r.dispatch_us * scale;
    row.combine_us = r.combine_us * scale;
    // Expert compute at the costed width and the full token count: each rank's expert histogram scaled.
    const int64_t per_rank = cfg.model.experts / p.ep;
    for (int d = 0; d < p.ep; ++d) {
      std::vector<int64_t> mine;
      for (int64_t e = d * per_rank; e < (d + 1) * per_rank; ++e) {
        mine.push_back(static_cast<int64_t>(std::llround(r.tokens_per_expert[e] * scale)));
      }
      row.compute_us = std::max(row.compute_us, 1e6 * expert_compute_seconds(mine, cfg.model, cfg.profile, esize));
    }
    row.total_us = row.dispatch_us + row.compute_us + row.combine_us;
    row.dispatch_logical_bytes = static_cast<int64_t>(std::llround(r.dispatch_logical_bytes * scale));
    row.combine_logical_bytes = static_cast<int64_t>(std::llround(r.combine_logical_bytes * scale));
    auto scaled = [&](uint64_t b) { return static_cast<uint64_t>(std::llround(b * scale)); };
    row.dispatch_wire_bytes = scaled(r.dispatch_wire_bytes);
    row.combine_wire_bytes = scaled(r.combine_wire_bytes);
    for (uint64_t b : r.dispatch_wire_per_plane) {
      row.dispatch_wire_per_plane.push_back(scaled(b));
    }
    for (uint64_t b : r.combine_wire_per_plane) {
      row.combine_wire_per_plane.push_back(scaled(b));
    }
    row.fallback_chunks = r.fallback_chunks;
    row.faults = r.faults;
    if (cfg.compute) {
      row.max_rel_error = moe_max_rel_error(r.output, ref);
      row.tolerance = moe_tolerance(dtype);
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

std::string moe_rows_header() {
  char buf[512];
  std::snprintf(buf, sizeof buf, "#%-7s %4s %6s %-10s %12s %9s %12s %9s %12s %12s %11s %11s %11s %11s", "mode", "EP",
                "tokens", "variant", "dispatch(us)", "disp GB/s", "combine(us)", "comb GB/s", "experts(us)",
                "total(us)", "disp log MB", "disp wire MB", "comb log MB", "comb wire MB");
  return buf;
}

std::string moe_row_text(const MoeBenchRow& r) {
  char buf[512];
  std::snprintf(
      buf, sizeof buf, " %-7s %4d %6lld %-10s %12.1f %9.1f %12.1f %9.1f %12.1f %12.1f %11.1f %11.1f %11.1f %11.1f%s",
      r.point.mode.c_str(), r.point.ep, static_cast<long long>(r.point.tokens), r.variant.c_str(), r.dispatch_us,
      r.dispatch_gbs(), r.combine_us, r.combine_gbs(), r.compute_us, r.total_us, r.dispatch_logical_bytes / 1e6,
      r.dispatch_wire_bytes / 1e6, r.combine_logical_bytes / 1e6, r.combine_wire_bytes / 1e6,
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
  o.add("dispatch_gbs", r.dispatch_gbs()).add("combine_gbs", r.combine_gbs());
  o.add("dispatch_logical_bytes", r.dispatch_logical_bytes).add("dispatch_wire_bytes", r.dispatch_wire_bytes);
  o.add("combine_logical_bytes", r.combine_logical_bytes).add("combine_wire_bytes", r.combine_wire_bytes);
  o.add("dispatch_wire_per_plane", r.dispatch_wire_per_plane).add("combine_wire_per_plane", r.combine_wire_per_plane);
  o.add("fallback_chunks", r.fallback_chunks).add("max_rel_error", r.max_rel_error).add("tolerance", r.tolerance);
  o.add("ok", r.ok()).add("faults", r.faults).add("wall_seconds", r.wall_seconds);
  return o;
}

}  // namespace ifec::testbed
