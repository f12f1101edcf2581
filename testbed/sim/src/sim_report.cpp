// Runs raw traffic on the sim driver and reports what happened, in the units and with the caveats it was measured.
#include "ifec/testbed/sim_report.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <sstream>

#include "ifec/common/checks.h"
#include "ifec/common/json.h"
#include "ifec/common/sim.h"
#include "ifec/testbed/fabric.h"

namespace ifec::testbed {

using common::TimeNs;

TimeNs parse_time(const std::string& text) {
  size_t idx = 0;
  double v = 0;
  try {
    v = std::stod(text, &idx);
  } catch (const std::exception&) {
    IFEC_FAIL("bad time '" << text << "': expected a number with ns, us, ms or s");
  }
  const std::string unit = text.substr(idx);
  double scale = 1;
  if (unit.empty() || unit == "ns") {
    scale = 1;
  } else if (unit == "us") {
    scale = 1e3;
  } else if (unit == "ms") {
    scale = 1e6;
  } else if (unit == "s") {
    scale = 1e9;
  } else {
    IFEC_FAIL("bad time unit '" << unit << "' in '" << text << "': expected ns, us, ms or s");
  }
  IFEC_CHECK(v >= 0 && std::isfinite(v), "time '" << text << "' must be >= 0");
  return static_cast<TimeNs>(std::llround(v * scale));
}

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

bool all_digits(const std::string& s) { return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos; }

// A whole number in a selector, at most 9 digits (std::stoi cannot overflow); throws naming the selector.
int selector_number(const std::string& digits, const std::string& selector, const char* what) {
  IFEC_CHECK(all_digits(digits),
             "link selector '" << selector << "': " << what << " '" << digits << "' is not a number");
  IFEC_CHECK(digits.size() <= 9, "link selector '" << selector << "': " << what << " " << digits << " is too large");
  return std::stoi(digits);
}

int prefixed_number(const std::string& s, const std::string& prefix, const std::string& selector) {
  IFEC_CHECK(s.rfind(prefix, 0) == 0 && all_digits(s.substr(prefix.size())),
             "link selector '" << selector << "': expected '" << prefix << "N', got '" << s << "'");
  return selector_number(s.substr(prefix.size()), selector, prefix.c_str());
}

}  // namespace

std::vector<int> resolve_links(const routing::Topology& topo, const std::string& selector) {
  if (all_digits(selector)) {
    const int id = selector_number(selector, selector, "link id");
    IFEC_CHECK(id < static_cast<int>(topo.links.size()), "link id " << id << " outside 0.." << topo.links.size() - 1);
    return {id};
  }
  const std::vector<std::string> parts = split(selector, ':');
  IFEC_CHECK(parts.size() == 2 || parts.size() == 3,
             "link selector '" << selector << "': expected ID, NODE:NODE[:SUB] or GPU:planeP[:subS]");
  const int a = topo.find_node(parts[0]);
  IFEC_CHECK(a >= 0, "link selector '" << selector << "': unknown node '" << parts[0] << "'");
  std::vector<int> out;
  if (parts[1].rfind("plane", 0) == 0) {
    const int plane = prefixed_number(parts[1], "plane", selector);
    IFEC_CHECK(plane < topo.num_planes,
               "link selector '" << selector << "': plane " << plane << " outside 0.." << topo.num_planes - 1);
    const int sub = parts.size() == 3 ? prefixed_number(parts[2], "sub", selector) : -1;
    for (int l : topo.links_of(a)) {
      const routing::Link& lk = topo.links[l];
      if (lk.plane == plane && (sub < 0 || lk.subport == sub)) {
        out.push_back(l);
      }
    }
  } else {
    const int b = topo.find_node(parts[1]);
    IFEC_CHECK(b >= 0, "link selector '" << selector << "': unknown node '" << parts[1] << "'");
    int sub = -1;
    if (parts.size() == 3) {
      sub = selector_number(parts[2], selector, "sub-link");
    }
    for (int l : topo.links_of(a)) {
      const routing::Link& lk = topo.links[l];
      if ((lk.a == b || lk.b == b) && (sub < 0 || lk.subport == sub)) {
        out.push_back(l);
      }
    }
  }
  IFEC_CHECK(!out.empty(), "link selector '" << selector << "' matches no link");
  return out;
}

LinkEvent parse_link_event(const routing::Topology& topo, const std::string& text, bool up) {
  const size_t at = text.rfind('@');
  IFEC_CHECK(at != std::string::npos && at > 0 && at + 1 < text.size(),
             "link event '" << text << "': expected LINK@TIME, e.g. gpu5:plane2:sub0@10us");
  LinkEvent e;
  e.spec = text;
  e.links = resolve_links(topo, text.substr(0, at));
  e.at = parse_time(text.substr(at + 1));
  e.up = up;
  return e;
}

SimRun run_sim(const routing::Topology& topo, const SimOptions& opts) {
  const auto wall0 = std::chrono::steady_clock::now();
  common::EventLoop loop;
  testbed::FabricOptions fo;
  fo.lb = opts.lb;
  fo.pfc = opts.pfc;
  fo.seed = opts.seed;
  testbed::Fabric fabric(loop, topo, fo);
  RawTraffic traffic(fabric, make_flows(opts.pattern, fabric.num_gpus(), opts.bytes, opts.seed, opts.incast_target),
                     opts.verify_icrc);
  for (const LinkEvent& e : opts.events) {
    for (int l : e.links) {
      fabric.schedule_link_state(l, e.up, e.at);
    }
  }
  traffic.start(0);
  // Run in slices so long runs report progress; the slices do not change the simulation.
  const TimeNs slice = 50'000;
  auto last_print = wall0;
  uint64_t offered = 0;
  for (const FlowSpec& f : make_flows(opts.pattern, fabric.num_gpus(), opts.bytes, opts.seed, opts.incast_target)) {
    offered += f.bytes;
  }
  while (!loop.idle()) {
    loop.run(loop.now() + slice);
    const auto now = std::chrono::steady_clock::now();
    if (opts.progress && now - last_print > std::chrono::seconds(2)) {
      last_print = now;
      const TrafficResult r = traffic.result();
      std::fprintf(stderr, "sim: t=%.1f us simulated, %.1f%% of %.1f MB delivered, %.1f s wall\n", loop.now() / 1e3,
                   100.0 * r.payload_bytes_delivered / std::max<uint64_t>(1, offered), offered / 1e6,
                   std::chrono::duration<double>(now - wall0).count());
    }
  }
  SimRun run;
  run.topology = topo.name;
  run.options = opts;
  run.traffic = traffic.result();
  run.switches = fabric.switch_totals();
  run.events = loop.events_run();
  run.fare_converged_ns = fabric.last_converged_ns();
  run.fare_rounds = fabric.fare_rounds_run();
  const double elapsed = static_cast<double>(std::max<TimeNs>(1, run.traffic.completion_ns));
  double gpu_util_sum = 0;
  int gpu_dirs = 0;
  for (size_t l = 0; l < topo.links.size(); ++l) {
    const common::Link& link = fabric.link(static_cast<int>(l));
    const routing::Link& tl = topo.links[l];
    for (int side = 0; side < 2; ++side) {
      const common::PortCounters& c = link.end(side).counters();
      run.link_drops += c.dropped_link_down;
      LinkUtilization u;
      u.link = static_cast<int>(l);
      u.from = side == 0 ? tl.a : tl.b;
      u.to = side == 0 ? tl.b : tl.a;
      u.utilization = static_cast<double>(c.busy_ps) / 1000.0 / elapsed;
      u.frames = c.tx_frames;
      run.frame_hops += c.tx_frames;
      run.max_link_utilization = std::max(run.max_link_utilization, u.utilization);
      if (topo.nodes[u.from].kind == routing::NodeKind::kGpu) {
        gpu_util_sum += u.utilization;
        ++gpu_dirs;
      }
      run.links.push_back(u);
    }
  }
  run.mean_gpu_link_utilization = gpu_dirs ? gpu_util_sum / gpu_dirs : 0;
  std::vector<int> touched;
  for (const LinkEvent& e : opts.events) {
    for (int l : e.links) {
      for (int node : {topo.links[l].a, topo.links[l].b}) {
        const int g = topo.nodes[node].gpu_index;
        if (g >= 0 && std::find(touched.begin(), touched.end(), g) == touched.end()) {
          touched.push_back(g);
        }
      }
    }
  }
  for (int g : touched) {
    GpuPlaneBytes b;
    b.gpu = g;
    b.sent.assign(topo.num_planes, 0);
    b.received.assign(topo.num_planes, 0);
    for (int other = 0; other < fabric.num_gpus(); ++other) {
      for (int p = 0; p < topo.num_planes && other != g; ++p) {
        b.sent[p] += traffic.sent_bytes(g, other, p);
        b.received[p] += traffic.received_bytes(other, g, p);
      }
    }
    run.event_gpus.push_back(b);
  }
  for (int s = 0; s < fabric.num_switches(); ++s) {
    const switchemu::Switch& sw = fabric.switch_at(s);
    for (int p = 0; p < sw.num_ports(); ++p) {
      if (sw.counters(p).rx_frames > 0 || sw.counters(p).tx_frames > 0) {
        run.ports.push_back(PortReport{sw.config().name, p, sw.counters(p)});
      }
    }
  }
  run.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return run;
}

namespace {}  // namespace

namespace {

common::JsonObject port_json(const PortReport& pr) {
  const switchemu::SwitchPortCounters& c = pr.counters;
  common::JsonObject o;
  o.add("switch", pr.switch_name).add("port", pr.port).add("rx_frames", c.rx_frames).add("rx_bytes", c.rx_bytes);
  o.add("tx_frames", c.tx_frames).add("tx_bytes", c.tx_bytes).add("pause_sent", c.pause_sent);
  o.add("resume_sent", c.resume_sent).add("pause_received", c.pause_received);
  o.add("malformed_drops", c.malformed_drops).add("no_route_drops", c.no_route_drops);
  o.add("link_down_drops", c.link_down_drops);
  std::vector<common::JsonObject> queues;
  for (size_t q = 0; q < c.queues.size(); ++q) {
    const switchemu::QueueCounters& qc = c.queues[q];
    if (qc.enqueued_frames == 0 && qc.drops == 0) {
      continue;
    }
    common::JsonObject j;
    j.add("priority", q).add("enqueued_frames", qc.enqueued_frames).add("tx_frames", qc.tx_frames);
    j.add("tx_bytes", qc.tx_bytes).add("drops", qc.drops).add("ecn_marks", qc.ecn_marks);
    j.add("high_water_bytes", qc.high_water_bytes);
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
  o.add("incomplete_flows", t.incomplete_flows).add("completion_ns", t.completion_ns);
  o.add("goodput_gbps", t.goodput_gbps).add("line_rate_gbps", t.line_rate_gbps);
  o.add("goodput_fraction", t.line_rate_gbps > 0 ? t.goodput_gbps / t.line_rate_gbps : 0.0);
  o.add("payload_efficiency", t.payload_efficiency).add("payload_bytes_offered", t.payload_bytes_offered);
  o.add("payload_bytes_delivered", t.payload_bytes_delivered).add("frame_bytes_sent", t.frame_bytes_sent);
  o.add("wire_bytes_sent", t.wire_bytes_sent).add("packets_sent", t.packets_sent);
  o.add("packets_delivered", t.packets_delivered).add("plane_bytes", t.plane_bytes);
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
  o << "topology " << r.topology << ", traffic " << pattern_name(r.options.pattern) << ", " << r.options.bytes
    << " B per flow x " << t.flows << " flows, lb per-" << switchemu::load_balance_name(r.options.lb) << ", PFC "
    << (r.options.pfc ? "on" : "off") << ", seed " << r.options.seed << "  [driver: sim; times are simulated]\n";
  o << "completion        " << t.completion_ns / 1000.0 << " us" << (t.complete ? "" : "  (INCOMPLETE)") << "\n";
  o << "goodput           " << t.goodput_gbps << " Gb/s of " << t.line_rate_gbps << " Gb/s line rate ("
    << 100.0 * t.goodput_gbps / std::max(1e-9, t.line_rate_gbps) << "%)\n";
  o << "header overhead   payload is " << 100.0 * t.payload_efficiency
    << "% of wire bytes (Eth+IPv4+UDP+BTH+RETH+ICRC + preamble/FCS/IFG)\n";
  o << "delivered         " << t.payload_bytes_delivered << " of " << t.payload_bytes_offered << " payload bytes, "
    << t.incomplete_flows << " incomplete flows\n";
  o << "plane bytes      ";
  for (size_t i = 0; i < t.plane_bytes.size(); ++i) {
    o << " p" << i << "=" << t.plane_bytes[i];
  }
  o << "\n";
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
    << " s wall (" << (r.wall_seconds > 0 ? r.frame_hops / r.wall_seconds / 1e6 : 0.0)
    << " M frame-hops/s on one core)\n";
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
