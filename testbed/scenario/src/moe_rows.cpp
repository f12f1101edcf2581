// MoE rows: bandwidths, the terminal table and the report record.
#include "ifec/testbed/moe_rows.h"

#include <cmath>
#include <cstdio>

namespace ifec::testbed {

double MoeRow::dispatch_gbs() const {
  return dispatch_us > 0 ? dispatch_logical_bytes / static_cast<double>(point.ep) / (dispatch_us * 1e3) : 0;
}
double MoeRow::combine_gbs() const {
  return combine_us > 0 ? combine_logical_bytes / static_cast<double>(point.ep) / (combine_us * 1e3) : 0;
}

std::string moe_rows_header() {
  char buf[512];
  std::snprintf(
      buf, sizeof buf, "#%-7s %4s %6s %-10s %12s %7s %5s %5s %12s %7s %5s %5s %11s %11s %11s %12s %9s %9s  %s", "mode",
      "EP", "tokens", "variant", "dispatch(us)", "GB/s", "line", "bound", "combine(us)", "GB/s", "line", "bound",
      "experts(us)", "total(us)", "overlap(us)", "overlap2(us)", "disp MB", "comb MB", "wire MB per plane (disp+comb)");
  return buf;
}

std::string moe_row_text(const MoeRow& r) {
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
  char overlap2[32] = "-";
  if (r.overlap2_us >= 0) {
    std::snprintf(overlap2, sizeof overlap2, "%.1f", r.overlap2_us);
  }
  char buf[640];
  std::snprintf(buf, sizeof buf,
                " %-7s %4d %6lld %-10s %12.1f %7.1f %4d%% %4d%% %12.1f %7.1f %4d%% %4d%% %11.1f %11.1f %11s %12s "
                "%9.1f %9.1f  %s%s",
                r.point.mode.c_str(), r.point.ep, static_cast<long long>(r.point.tokens), r.variant.c_str(),
                r.dispatch_us, r.dispatch_gbs(), pct(r.dispatch_line_fraction()),
                pct(of_bound(r.dispatch_bound_us, r.dispatch_us)), r.combine_us, r.combine_gbs(),
                pct(r.combine_line_fraction()), pct(of_bound(r.combine_bound_us, r.combine_us)), r.compute_us,
                r.total_us, overlap, overlap2, r.dispatch_wire_bytes / 1e6, r.combine_wire_bytes / 1e6, planes.c_str(),
                r.scaled ? ("  (scaled from " + std::to_string(r.simulated_tokens) + ")").c_str() : "");
  std::string line = buf;
  if (r.elided_payloads) {
    line += "\n#   timing only: payloads elided (frames of headers and lengths), nothing computed or checked";
  }
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

common::JsonObject moe_row_record(const MoeRow& r, const std::string& topology, const std::string& driver) {
  common::JsonObject o;
  o.add("driver", driver).add("topology", topology).add("mode", r.point.mode).add("ep", r.point.ep);
  o.add("tokens", r.point.tokens).add("variant", r.variant).add("simulated_tokens", r.simulated_tokens);
  o.add("scaled", r.scaled).add("dispatch_us", r.dispatch_us).add("combine_us", r.combine_us);
  o.add("dispatch_data_us", r.dispatch_data_us()).add("combine_data_us", r.combine_data_us());
  o.add("dispatch_data_start_ns", r.dispatch_data_start_ns).add("dispatch_data_end_ns", r.dispatch_data_end_ns);
  o.add("combine_data_start_ns", r.combine_data_start_ns).add("combine_data_end_ns", r.combine_data_end_ns);
  common::JsonObject turns;
  turns.add("group", r.turns.group).add("stripe", r.turns.stripe).add("multicast", r.turns.multicast);
  o.add("turns", turns);
  o.add("compute_us", r.compute_us).add("compute_source", r.compute_source).add("total_us", r.total_us);
  o.add("overlap_us", r.overlap_us).add("overlap2_us", r.overlap2_us).add("fp8_dispatch", r.fp8_dispatch);
  o.add("payload", r.elided_payloads ? "elided" : "real").add("timing_only", r.elided_payloads);
  o.add("gate_groups", r.gate_groups);
  o.add("dispatch_gbs", r.dispatch_gbs()).add("combine_gbs", r.combine_gbs()).add("line_gbs", r.line_gbs);
  o.add("dispatch_line_fraction", r.dispatch_line_fraction()).add("combine_line_fraction", r.combine_line_fraction());
  o.add("dispatch_bound_us", r.dispatch_bound_us).add("combine_bound_us", r.combine_bound_us);
  o.add("dispatch_logical_bytes", r.dispatch_logical_bytes).add("dispatch_wire_bytes", r.dispatch_wire_bytes);
  o.add("combine_logical_bytes", r.combine_logical_bytes).add("combine_wire_bytes", r.combine_wire_bytes);
  o.add("dispatch_wire_per_plane", r.dispatch_wire_per_plane).add("combine_wire_per_plane", r.combine_wire_per_plane);
  o.add("dispatch_resent", r.dispatch_resent).add("dispatch_resent_bytes", r.dispatch_resent_bytes);
  o.add("combine_resent", r.combine_resent).add("combine_resent_bytes", r.combine_resent_bytes);
  o.add("dispatch_host_stall_us", r.dispatch_host_stall_us).add("combine_host_stall_us", r.combine_host_stall_us);
  o.add("dispatch_host_cpu_us", r.dispatch_host_cpu_us).add("combine_host_cpu_us", r.combine_host_cpu_us);
  o.add("ifec_retransmissions", r.ifec_retransmissions).add("ifec_busy_naks", r.ifec_busy_naks);
  o.add("ifec_duplicate_results", r.ifec_duplicate_results);
  o.add("fallback_chunks", r.fallback_chunks).add("max_rel_error", r.max_rel_error).add("tolerance", r.tolerance);
  o.add("ok", r.ok()).add("faults", r.faults).add("wall_seconds", r.wall_seconds);
  return o;
}

}  // namespace ifec::testbed
