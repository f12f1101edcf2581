// A collective point's row: filled from a result and a check (either driver), printed as nccl-tests does (plus
// wire bytes per plane, fallbacks and faults) and as JSON.
#include <cstdio>
#include <cstring>
#include <sstream>

#include "ifec/common/json.h"
#include "ifec/testbed/collective_point.h"

namespace ifec::testbed {

using workloads::collective_name;

double busbw_factor(Collective kind, int members) {
  return kind == Collective::kAllReduce ? 2.0 * (members - 1) / members : 1.0;
}

void record_result(CollectiveRow& row, const workloads::CollectiveResult& res, int members) {
  row.ok = res.ok;
  row.ran = res.algo;
  row.fell_back = res.fell_back;
  row.fallback_chunks = res.fallback_chunks;
  row.anomalies = res.anomalies;
  row.faults.insert(row.faults.end(), res.faults.begin(), res.faults.end());
  row.time_us = (res.end_ns - res.start_ns) / 1e3;
  row.data_start_ns = res.data_start_ns ? res.data_start_ns : res.start_ns;
  row.data_end_ns = res.data_end_ns ? res.data_end_ns : res.end_ns;
  row.data_us = (row.data_end_ns - row.data_start_ns) / 1e3;
  row.algbw_gbs = row.time_us > 0 ? row.point.bytes / (row.time_us * 1e3) : 0;
  row.busbw_gbs = row.algbw_gbs * busbw_factor(row.point.kind, members);
}

namespace {

// An all-gather's outputs: block b of every one is member b's input block b, bit for bit.
OutputCheck check_gathered(const CollectivePoint& p, int n, uint64_t count,
                           const std::vector<const uint8_t*>& outputs) {
  OutputCheck c;
  const size_t es = workloads::element_size(p.dtype);
  std::vector<uint8_t> want;
  for (int b = 0; b < n; ++b) {
    const uint64_t lo = count * b / n;
    const uint64_t len = count * (b + 1) / n - lo;
    want.resize(len * es);
    collective_input(p, b, len, want.data(), lo);
    for (const uint8_t* out : outputs) {
      for (uint64_t i = 0; i < len; ++i) {
        c.wrong += std::memcmp(out + (lo + i) * es, want.data() + i * es, es) != 0;
      }
    }
  }
  return c;
}

}  // namespace

void record_check(CollectiveRow& row, int members, bool rounds_per_step, const std::vector<const uint8_t*>& outputs,
                  int source, int first_member) {
  OutputCheck chk;
  const uint64_t count = row.count;
  if (row.point.kind == workloads::Collective::kAllGather) {
    chk = check_gathered(row.point, members, count, outputs);
  } else if (row.point.kind == workloads::Collective::kReduceScatter) {
    for (size_t i = 0; i < outputs.size(); ++i) {  // member m holds its block m reduced
      const uint64_t m = first_member + i;
      const OutputCheck one = check_outputs(row.point, members, count, rounds_per_step, {outputs[i]}, source,
                                            count * m / members, count * (m + 1) / members);
      chk.wrong += one.wrong;
      chk.max_rel_error = std::max(chk.max_rel_error, one.max_rel_error);
    }
  } else {
    chk = check_outputs(row.point, members, count, rounds_per_step, outputs, source);
  }
  row.wrong = chk.wrong;
  row.max_rel_error = chk.max_rel_error;
  if (row.wrong > 0) {
    row.ok = false;  // a wrong result is never reported as ok
    row.error = std::to_string(row.wrong) + " elements differ from the fp64 reference beyond the rounding bound";
  }
}

std::string rows_header() {
  char line[320];
  std::snprintf(line, sizeof(line), "#%13s %12s %6s %6s %5s %11s %8s %8s %7s %10s %9s  %s\n", "size(B)", "count",
                "type", "redop", "algo", "time(us)", "algbw", "busbw", "#wrong", "max_err", "fallback",
                "wire MB sent per plane (all members)");
  return std::string(line) +
         "#                                                   (GB/s)   (GB/s)                    (chunks)  [driver: "
         "sim]\n";
}

std::string row_text(const CollectiveRow& r) {
  std::ostringstream planes;
  for (size_t q = 0; q < r.plane_tx_bytes.size(); ++q) {
    planes << (q ? " " : "") << std::fixed;
    planes.precision(1);
    planes << r.plane_tx_bytes[q] / 1e6;
  }
  char line[400];
  if (!r.ok && r.wrong == 0) {
    std::snprintf(line, sizeof(line), " %13llu  FAILED: %s\n", static_cast<unsigned long long>(r.point.bytes),
                  r.error.c_str());
    return line;
  }
  std::snprintf(line, sizeof(line), " %13llu %12llu %6s %6s %7s %11.2f %8.2f %8.2f %7llu %10.2e %9llu  %s%s\n",
                static_cast<unsigned long long>(r.point.bytes), static_cast<unsigned long long>(r.count),
                common::ech_dtype_name(r.point.dtype), common::ech_redop_name(r.point.op),
                r.ran.empty() ? workloads::algo_name(r.point.algo) : r.ran.c_str(), r.time_us, r.algbw_gbs, r.busbw_gbs,
                static_cast<unsigned long long>(r.wrong), r.max_rel_error,
                static_cast<unsigned long long>(r.fallback_chunks), r.modelled ? "(modelled) " : "",
                r.modelled ? "" : planes.str().c_str());
  std::string out = line;
  const std::string asked = workloads::algo_name(r.point.algo);
  if (!r.ran.empty() && r.ran != asked && asked != "best") {
    out +=
        "#   " + asked + " does not run " + workloads::collective_name(r.point.kind) + ": " + r.ran + " ran instead\n";
  }
  if (r.point.elided_payloads) {
    out += "#   timing only: payloads elided, nothing computed or checked (#wrong and max_err do not apply)\n";
  }
  if (r.wrong > 0) {
    out += "#   WRONG: " + r.error + "\n";
  }
  for (const std::string& f : r.faults) {
    out += "#   fault: " + f + "\n";
  }
  return out;
}

std::string simulator_text(const CollectiveRow& r) {
  char line[300];
  std::snprintf(line, sizeof(line),
                "#   simulator: %llu frame-hops, %llu events in %.2f s wall (%.2f M frame-hops/s on %s); the "
                "point took %.2f s with inputs, fp64 reference and checks\n",
                static_cast<unsigned long long>(r.frame_hops), static_cast<unsigned long long>(r.sim_events),
                r.sim_seconds, r.sim_seconds > 0 ? r.frame_hops / r.sim_seconds / 1e6 : 0.0,
                r.partitions.empty() ? "one core" : "the partitions' threads", r.wall_seconds);
  if (r.partitions.empty()) {
    return line;
  }
  return line + ("#   partitioned: " + r.partitions + ", " + std::to_string(r.windows) + " windows\n");
}

void add_retries(common::JsonObject& o, const CollectiveRow& r) {
  o.add("resent", r.resent).add("resent_bytes", r.resent_bytes).add("ifec_retransmissions", r.ifec_retransmissions);
  o.add("ifec_busy_naks", r.ifec_busy_naks).add("ifec_duplicate_results", r.ifec_duplicate_results);
  o.add("host_stall_us", r.host_stall_us).add("host_cpu_us", r.host_cpu_us);
}

std::string row_json(const CollectiveRow& r, const std::string& topology, const std::string& driver) {
  common::JsonObject o;
  o.add("driver", driver).add("topology", topology).add("collective", collective_name(r.point.kind));
  o.add("algo", workloads::algo_name(r.point.algo)).add("ran", r.ran).add("size", r.point.bytes).add("count", r.count);
  o.add("type", common::ech_dtype_name(r.point.dtype)).add("redop", common::ech_redop_name(r.point.op));
  o.add("ok", r.ok).add("time_us", r.time_us).add("algbw_gbs", r.algbw_gbs).add("busbw_gbs", r.busbw_gbs);
  o.add("data_us", r.data_us).add("data_start_ns", r.data_start_ns).add("data_end_ns", r.data_end_ns);
  o.add("wrong", r.wrong).add("max_rel_error", r.max_rel_error).add("fallback_chunks", r.fallback_chunks);
  o.add("fell_back", r.fell_back).add("anomalies", r.anomalies).add("modelled", r.modelled).add("loss", r.point.loss);
  o.add("timing_only", r.point.elided_payloads).add("partitions", r.partitions).add("windows", r.windows);
  o.add("plane_tx_bytes", r.plane_tx_bytes).add("plane_rx_bytes", r.plane_rx_bytes);
  std::vector<uint64_t> ids, up, down;  // per member link: topology id, bytes the GPU sent, bytes it received
  for (const auto& l : r.gpu_links) {
    ids.push_back(l[0]);
    up.push_back(l[1]);
    down.push_back(l[2]);
  }
  common::JsonObject turns;
  turns.add("group", r.turns.group).add("stripe", r.turns.stripe).add("multicast", r.turns.multicast);
  o.add("turns", turns);
  o.add("gpu_link_ids", ids).add("gpu_link_up_bytes", up).add("gpu_link_down_bytes", down);
  o.add("frames_lost", r.frames_lost).add("frames_lost_link_down", r.frames_lost_link_down);
  o.add("faults", r.faults).add("wall_seconds", r.wall_seconds).add("sim_seconds", r.sim_seconds);
  o.add("sim_events", r.sim_events).add("frame_hops", r.frame_hops);
  add_retries(o, r);
  if (!r.ok) {
    o.add("error", r.error);
  }
  return o.str();
}

}  // namespace ifec::testbed
