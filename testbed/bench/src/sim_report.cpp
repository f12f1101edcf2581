// The report of a raw-traffic run: what happened, in the units and with the caveats it was measured.
#include "ifec/testbed/sim_report.h"

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <sstream>

#include "ifec/common/json.h"

namespace ifec::testbed {

namespace {

// Every counter of the port (in its list's order), and of each queue that carried traffic.
common::JsonObject port_json(const PortReport& pr) {
  common::JsonObject o;
  o.add("switch", pr.switch_name).add("port", pr.port);
  pr.counters.for_each([&o](const char* name, uint64_t v) { o.add(name, v); });
  std::vector<common::JsonObject> queues;
  for (size_t q = 0; q < pr.counters.queues.size(); ++q) {
    const switchemu::QueueCounters& qc = pr.counters.queues[q];
    if (qc.enqueued_frames == 0 && qc.drops == 0) {
      continue;
    }
    common::JsonObject j;
    j.add("priority", q);
    qc.for_each([&j](const char* name, uint64_t v) { j.add(name, v); });
    queues.push_back(j);
  }
  return o.add("queues", queues);
}

}  // namespace

std::string to_json(const SimRun& r) {
  const TrafficResult& t = r.traffic;
  common::JsonObject o;
  o.add("driver", r.driver).add("topology", r.topology).add("traffic", pattern_name(r.options.pattern));
  o.add("bytes_per_flow", r.options.bytes).add("lb", switchemu::load_balance_name(r.options.lb));
  o.add("pfc", r.options.pfc).add("seed", r.options.seed).add("flows", t.flows).add("complete", t.complete);
  o.add("payload", r.options.elided_payloads ? "elided" : "real");
  if (r.options.group > 0) {
    o.add("group", r.options.group);
  }
  if (!r.partitions.empty()) {
    o.add("threads", r.options.threads).add("partitions", r.partitions);
    o.add("setup_seconds", r.setup_seconds).add("sim_seconds", r.sim_seconds);
    o.add("sim_page_faults", r.sim_page_faults);  // measured, like the seconds: not part of the run's result
  }
  o.add("incomplete_flows", t.incomplete_flows).add("completion_ns", t.completion_ns);
  if (!r.cut_off.empty()) {
    o.add("cut_off", r.cut_off);
  }
  o.add("goodput_gbps", t.goodput_gbps).add("line_rate_gbps", t.line_rate_gbps);
  o.add("goodput_fraction", t.line_rate_gbps > 0 ? t.goodput_gbps / t.line_rate_gbps : 0.0);
  o.add("payload_efficiency", t.payload_efficiency).add("payload_bytes_offered", t.payload_bytes_offered);
  o.add("payload_bytes_delivered", t.payload_bytes_delivered).add("frame_bytes_sent", t.frame_bytes_sent);
  o.add("wire_bytes_sent", t.wire_bytes_sent).add("packets_sent", t.packets_sent);
  o.add("packets_delivered", t.packets_delivered).add("plane_bytes", t.plane_bytes);
  if (t.nvlink_bytes > 0) {
    o.add("nvlink_bytes", t.nvlink_bytes).add("relayed_frames", t.relayed_frames);
  }
  o.add("drops", r.switches.drops + r.link_drops + t.rx_bad_frames).add("switch_drops", r.switches.drops);
  o.add("buffer_drops", r.switches.buffer_drops).add("link_drops", r.link_drops).add("nic_drops", t.nic_drops);
  o.add("rx_bad_frames", t.rx_bad_frames).add("ecn_marks", r.switches.ecn_marks);
  o.add("pfc_pauses", r.switches.pause_sent);
  o.add("pfc_pauses_received", r.switches.pause_received + t.pfc_pauses_at_nics);
  o.add("max_link_utilization", r.max_link_utilization);
  o.add("mean_gpu_link_utilization", r.mean_gpu_link_utilization).add("fare_rounds", r.fare_rounds);
  o.add("fare_converged_ns", r.fare_converged_ns).add("sim_events", r.events).add("wall_seconds", r.wall_seconds);
  o.add("frame_hops", r.frame_hops);
  std::vector<common::JsonObject> links, gpus, ports;
  for (const LinkUtilization& u : r.links) {
    links.push_back(
        common::JsonObject().add("link", u.link).add("from", u.from).add("to", u.to).add("util", u.utilization));
  }
  for (const GpuPlaneBytes& b : r.event_gpus) {
    gpus.push_back(
        common::JsonObject().add("gpu", b.gpu).add("sent_plane_bytes", b.sent).add("received_plane_bytes", b.received));
  }
  for (const PortReport& pr : r.ports) {
    ports.push_back(port_json(pr));
  }
  o.add("link_utilization", links).add("event_gpus", gpus).add("switch_ports", ports);
  return o.str();
}

std::string to_text(const SimRun& r) {
  const TrafficResult& t = r.traffic;
  std::ostringstream o;
  o << std::fixed << std::setprecision(2);
  o << "topology " << r.topology << ", traffic " << pattern_name(r.options.pattern)
    << (r.options.group > 0 ? " within groups of " + std::to_string(r.options.group) + " GPUs" : "") << ", "
    << r.options.bytes << " B per flow x " << t.flows << " flows, lb per-" << switchemu::load_balance_name(r.options.lb)
    << ", PFC " << (r.options.pfc ? "on" : "off") << ", seed " << r.options.seed
    << (r.options.elided_payloads ? ", payloads elided (timing only)" : "") << "  [driver: sim; times are simulated]\n";
  o << "completion        " << t.completion_ns / 1000.0 << " us" << (t.complete ? "" : "  (INCOMPLETE)") << "\n";
  o << "goodput           " << t.goodput_gbps << " Gb/s of " << t.line_rate_gbps << " Gb/s line rate ("
    << 100.0 * t.goodput_gbps / std::max(1e-9, t.line_rate_gbps) << "%)\n";
  o << "header overhead   payload is " << 100.0 * t.payload_efficiency
    << "% of wire bytes (Eth+IPv4+UDP+BTH+RETH+ICRC + preamble/FCS/IFG)\n";
  o << "delivered         " << t.payload_bytes_delivered << " of " << t.payload_bytes_offered << " payload bytes, "
    << t.incomplete_flows << " incomplete flows\n";
  if (!r.cut_off.empty()) {
    o << "cut off           " << r.cut_off << "\n";
  }
  o << "plane bytes      ";
  for (size_t i = 0; i < t.plane_bytes.size(); ++i) {
    o << " p" << i << "=" << t.plane_bytes[i];
  }
  o << "\n";
  if (t.nvlink_bytes > 0) {
    o << "in-node (NVLink)  " << t.nvlink_bytes << " frame bytes, " << t.relayed_frames
      << " frames forwarded for a node peer of another plane\n";
  }
  o << "link utilization  max " << 100.0 * r.max_link_utilization << "%, mean over GPU uplinks "
    << 100.0 * r.mean_gpu_link_utilization << "%\n";
  std::vector<LinkUtilization> top = r.links;
  std::sort(top.begin(), top.end(), [](const auto& a, const auto& b) { return a.utilization > b.utilization; });
  for (size_t i = 0; i < std::min<size_t>(4, top.size()); ++i) {
    o << "  busiest link " << top[i].link << " (node " << top[i].from << " -> " << top[i].to << ")  "
      << 100.0 * top[i].utilization << "%\n";
  }
  o << "drops             " << (r.switches.drops + r.link_drops + t.rx_bad_frames) << " (switch buffer "
    << r.switches.buffer_drops << ", other switch " << r.switches.drops - r.switches.buffer_drops << ", links "
    << r.link_drops << ", bad frames at NICs " << t.rx_bad_frames << ")\n";
  o << "ECN marks         " << r.switches.ecn_marks << "\n";
  o << "PFC pauses        " << r.switches.pause_sent << " sent by switches, "
    << r.switches.pause_received + t.pfc_pauses_at_nics << " received\n";
  o << "FARE              " << r.fare_rounds << " rounds after link events"
    << (r.fare_rounds ? ", converged at " + std::to_string(r.fare_converged_ns) + " ns" : std::string()) << "\n";
  for (const GpuPlaneBytes& b : r.event_gpus) {
    uint64_t st = 0;
    uint64_t rt = 0;
    for (size_t p = 0; p < b.sent.size(); ++p) {
      st += b.sent[p];
      rt += b.received[p];
    }
    o << "gpu" << b.gpu << " plane shares  sent";
    for (size_t p = 0; p < b.sent.size(); ++p) {
      o << " p" << p << "=" << 100.0 * b.sent[p] / std::max<uint64_t>(1, st) << "%";
    }
    o << "  received";
    for (size_t p = 0; p < b.received.size(); ++p) {
      o << " p" << p << "=" << 100.0 * b.received[p] / std::max<uint64_t>(1, rt) << "%";
    }
    o << "  (whole run, events included)\n";
  }
  o << "simulator         " << r.events << " events, " << r.frame_hops << " frame-hops in " << r.wall_seconds
    << " s wall (" << (r.wall_seconds > 0 ? r.frame_hops / r.wall_seconds / 1e6 : 0.0) << " M frame-hops/s "
    << (!r.partitions.empty() ? "on " + std::to_string(r.options.threads) + " thread(s): " + r.partitions
                              : std::string("on one core, one event loop"))
    << "; " << r.sim_page_faults << " fresh pages touched while simulating)\n";
  return o.str();
}

std::string counters_table(const SimRun& r) {
  std::ostringstream o;
  char line[256];
  std::snprintf(line, sizeof(line), "%-10s %5s %4s %12s %12s %10s %8s %8s %8s %12s\n", "switch", "port", "prio",
                "tx_frames", "tx_bytes", "drops", "ecn", "pause_tx", "pause_rx", "high_water");
  o << line;
  for (const PortReport& pr : r.ports) {
    for (size_t q = 0; q < pr.counters.queues.size(); ++q) {
      const switchemu::QueueCounters& qc = pr.counters.queues[q];
      if (qc.enqueued_frames == 0 && qc.drops == 0) {
        continue;
      }
      std::snprintf(line, sizeof(line), "%-10s %5d %4zu %12llu %12llu %10llu %8llu %8llu %8llu %12llu\n",
                    pr.switch_name.c_str(), pr.port, q, static_cast<unsigned long long>(qc.tx_frames),
                    static_cast<unsigned long long>(qc.tx_bytes), static_cast<unsigned long long>(qc.drops),
                    static_cast<unsigned long long>(qc.ecn_marks),
                    static_cast<unsigned long long>(pr.counters.pause_sent),
                    static_cast<unsigned long long>(pr.counters.pause_received),
                    static_cast<unsigned long long>(qc.high_water_bytes));
      o << line;
    }
  }
  return o.str();
}

}  // namespace ifec::testbed
