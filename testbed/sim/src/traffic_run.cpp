// Runs raw traffic on the simulated driver and collects what the fabric counted.
#include "ifec/testbed/traffic_run.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "ifec/common/checks.h"
#include "ifec/common/heap.h"
#include "ifec/common/sim.h"
#include "ifec/testbed/fabric.h"
#include "ifec/testbed/partitions.h"

namespace ifec::testbed {

using common::TimeNs;

namespace {

// Runs the loop (an EventLoop, or a fabric's PlanePartitions) empty in slices, so that long runs report progress;
// the slices do not change the simulation.
template <class Loop>
void run_with_progress(Loop& loop, const RawTraffic& traffic, const SimOptions& opts, int gpus,
                       std::chrono::steady_clock::time_point wall0) {
  const TimeNs slice = 50'000;
  auto last_print = wall0;
  uint64_t offered = 0;
  for (const FlowSpec& f : make_flows(opts.pattern, gpus, opts.bytes, opts.seed, opts.incast_target, opts.group)) {
    offered += f.bytes;
  }
  while (!loop.idle()) {
    // A slice at a time while events are dense; straight to the next one across empty time (a link event long
    // after the traffic ended is one step, not one per slice).
    loop.run(std::max(loop.now() + slice, loop.next_event_time()));
    const auto now = std::chrono::steady_clock::now();
    if (opts.progress && now - last_print > std::chrono::seconds(2)) {
      last_print = now;
      const TrafficResult r = traffic.result();
      const double wall = std::chrono::duration<double>(now - wall0).count();
      if (opts.processes != nullptr && opts.processes->size > 1) {  // this process's deliveries only (no collective)
        std::fprintf(stderr,
                     "sim: t=%.1f us simulated, %.1f MB delivered into rank %d's partitions (%.1f MB offered to all %d "
                     "ranks), %.1f s wall\n",
                     loop.now() / 1e3, r.payload_bytes_delivered / 1e6, opts.processes->rank, offered / 1e6,
                     opts.processes->size, wall);
      } else {
        std::fprintf(stderr, "sim: t=%.1f us simulated, %.1f%% of %.1f MB delivered, %.1f s wall\n", loop.now() / 1e3,
                     100.0 * r.payload_bytes_delivered / std::max<uint64_t>(1, offered), offered / 1e6, wall);
      }
    }
  }
}

// Per link direction: utilization over the run, frames; drops on links that went down; frame-hops.
void collect_links(SimRun& run, const Fabric& fabric, const routing::Topology& topo) {
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
}

// Bytes per plane each GPU that a link event touched sent and received (FARE's reweighting, seen from the GPU).
void collect_event_gpus(SimRun& run, const RawTraffic& traffic, const SimOptions& opts, const routing::Topology& topo) {
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
    for (int other = 0; other < topo.num_gpus(); ++other) {
      for (int p = 0; p < topo.num_planes && other != g; ++p) {
        b.sent[p] += traffic.sent_bytes(g, other, p);
        b.received[p] += traffic.received_bytes(other, g, p);
      }
    }
    run.event_gpus.push_back(b);
  }
}

// The run on a fabric built on `loop` (one event loop, or plane partitions): flows, link events, the run, the report.
template <class Loop>
SimRun run_on(Loop& loop, Fabric& fabric, const routing::Topology& topo, const SimOptions& opts,
              std::chrono::steady_clock::time_point wall0, std::vector<bool> active_planes = {}) {
  RawTraffic traffic(fabric,
                     make_flows(opts.pattern, fabric.num_gpus(), opts.bytes, opts.seed, opts.incast_target, opts.group),
                     opts.verify_icrc);
  if (opts.processes != nullptr) {
    traffic.spread_over_processes(std::move(active_planes), opts.processes->sum);
  }
  for (const LinkEvent& e : opts.events) {
    for (int l : e.links) {
      fabric.schedule_link_state(l, e.up, e.at);
    }
  }
  traffic.start(0);
  const uint64_t faults0 = common::minor_page_faults();
  const auto sim0 = std::chrono::steady_clock::now();
  run_with_progress(loop, traffic, opts, fabric.num_gpus(), wall0);
  if (opts.processes != nullptr) {
    traffic.merge(opts.processes->sum);
    fabric.merge_counters(opts.processes->sum);
  }
  SimRun run;
  run.sim_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - sim0).count();
  run.setup_seconds = std::chrono::duration<double>(sim0 - wall0).count();
  run.sim_page_faults = common::minor_page_faults() - faults0;
  run.routing_bytes = fabric.routing_bytes();
  run.link_bytes = fabric.link_bytes();
  run.traffic_bytes = traffic.memory_bytes();
  run.topology = topo.name;
  run.options = opts;
  run.traffic = traffic.result();
  run.switches = fabric.switch_totals();
  run.events = loop.events_run();
  run.fare_converged_ns = fabric.last_converged_ns();
  run.fare_rounds = fabric.fare_rounds_run();
  collect_links(run, fabric, topo);
  collect_event_gpus(run, traffic, opts, topo);
  for (int s = 0; s < fabric.num_switches(); ++s) {
    const switchemu::Switch& sw = fabric.switch_at(s);
    for (int p = 0; p < sw.num_ports(); ++p) {
      if (sw.counters(p).rx_frames > 0 || sw.counters(p).tx_frames > 0) {
        run.ports.push_back(PortReport{sw.config().name, p, sw.counters(p)});
      }
    }
  }
  return run;
}

FabricOptions fabric_options(const SimOptions& opts) {
  FabricOptions fo;
  fo.lb = opts.lb;
  fo.pfc = opts.pfc;
  fo.seed = opts.seed;
  fo.elided_payloads = opts.elided_payloads;
  fo.leaf_groups = opts.leaf_groups;
  return fo;
}

// One partition per plane (or per plane and leaf group) on opts.threads threads, in this process or spread over
// opts.processes.
SimRun run_partitioned(const routing::Topology& topo, const SimOptions& opts,
                       std::chrono::steady_clock::time_point wall0) {
  const Processes solo;
  const Processes& procs = opts.processes != nullptr ? *opts.processes : solo;
  const int planes = std::max(topo.num_planes, 1);
  const int groups = std::max(opts.leaf_groups, 1);
  // What the partitions are, for the count's error and describe(); a bad leaf-group count is named by Fabric.
  const int most = planes * groups;
  const std::string layout =
      opts.leaf_groups > 0 ? "one partition per plane and leaf group: " + std::to_string(planes) +
                                 (planes == 1 ? " plane x " : " planes x ") + std::to_string(groups)
                           : "one partition per plane, " + std::to_string(planes) +
                                 (planes == 1 ? " plane" : " planes") + "; --leaf-groups K splits each plane into K";
  IFEC_CHECK(
      opts.threads <= most && procs.size <= most,
      (opts.threads > most ? "--threads " + std::to_string(opts.threads) : std::to_string(procs.size) + " processes")
          << " outside 1.." << most << " (" << layout << ")");
  PlanePartitions parts(planes * groups, opts.threads, procs.rank, procs.size, 0,
                        opts.processes != nullptr ? opts.processes : nullptr);
  if (opts.leaf_groups > 0) {
    parts.set_partition_names(leaf_group_names(topo, opts.leaf_groups));
  }
  if (opts.progress) {
    std::fprintf(stderr, "sim: %s\n", parts.describe().c_str());
  }
  Fabric fabric(parts.control(), parts.plane_clocks(), topo, fabric_options(opts),
                [&parts](int from, int to, int source) { return parts.mailbox(from, to, source); });
  if (fabric.cross_partition_delay() != common::kForever) {
    parts.set_lookahead(fabric.cross_partition_delay());
    if (opts.progress) {
      std::fprintf(stderr, "sim: links through mailboxes (%s): lookahead %llu ns\n",
                   opts.leaf_groups > 0 ? "switch to switch, in-node" : "in-node",
                   static_cast<unsigned long long>(fabric.cross_partition_delay()));
    }
  }
  if (parts.spread()) {  // links between processes' partitions: their frames cross in the exchanges
    connect_processes(fabric, parts);
  }
  SimRun run;
  if (opts.processes == nullptr) {
    run = run_on(parts, fabric, topo, opts, wall0);
  } else {
    // Each slot of counters a process runs (RawTraffic::spread_over_processes): lane x groups + leaf group, a lane
    // a plane's NIC ports or (in-node links) the NVLink lane of its plane's GPUs; its partition plane x groups +
    // group.
    std::vector<bool> mine(static_cast<size_t>(planes) * (fabric.has_nvlink() ? 2 : 1) * groups);
    for (size_t slot = 0; slot < mine.size(); ++slot) {
      const int plane = static_cast<int>(slot / groups) % planes;
      mine[slot] = parts.owns(plane * groups + static_cast<int>(slot % groups));
    }
    run = run_on(parts, fabric, topo, opts, wall0, std::move(mine));
    // Every process ran the control events; the partitions' events are each process's own.
    std::vector<uint64_t> events = {parts.events_run() - parts.control_events()};
    procs.sum(events);
    run.events = events[0] + parts.control_events();
  }
  run.partitions = parts.describe();
  run.windows = parts.windows_run();
  return run;
}

}  // namespace

SimRun run_sim(const routing::Topology& topo, const SimOptions& opts) {
  check_link_events(opts.events);
  IFEC_CHECK(opts.leaf_groups == 0 || opts.threads >= 1,
             "--leaf-groups " << opts.leaf_groups << ": needs a partitioned run (--threads 1 or more)");
  const auto wall0 = std::chrono::steady_clock::now();
  SimRun run;
  if (opts.threads == 0) {
    common::EventLoop loop;
    Fabric fabric(loop, topo, fabric_options(opts));
    run = run_on(loop, fabric, topo, opts, wall0);
  } else {
    run = run_partitioned(topo, opts, wall0);
  }
  run.cut_off = cut_off_gpus(topo, opts.events);
  run.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return run;
}

}  // namespace ifec::testbed
