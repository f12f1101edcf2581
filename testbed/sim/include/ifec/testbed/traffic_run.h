// `./ifec sim --traffic`: raw RoCEv2 flows run over a fresh simulated fabric, with link events, and what the run
// left in the fabric's counters (per link, per switch port, per GPU that an event touched). The report of a run is
// the bench library's (sim_report.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ifec/routing/topology.h"
#include "ifec/switchemu/switch.h"
#include "ifec/testbed/link_events.h"
#include "ifec/testbed/partitions.h"
#include "ifec/testbed/raw_traffic.h"

namespace ifec::testbed {

struct SimOptions {
  std::string topo_path;
  Pattern pattern = Pattern::kAllToAll;
  uint64_t bytes = 1 << 20;
  switchemu::LoadBalance lb = switchemu::LoadBalance::kPerPacket;
  bool pfc = true;
  uint64_t seed = 1;
  int incast_target = 0;
  int group = 0;  // make_flows' group: all-to-all or permutation within groups of this many GPUs (0: all)
  bool verify_icrc = true;
  bool progress = true;          // progress lines on stderr for long runs
  bool elided_payloads = false;  // FabricOptions::elided_payloads: the same run, frames without their payload bytes
  // N >= 1: one partition per plane on N threads (partitions.h), the same result whatever N; a thread runs its
  // partitions one after another between fabric-wide events, so only one plane's frames are in flight at once.
  // 0: one event loop for the whole fabric (the same result but for the order of events at the very time of a
  // link event; every frame of every plane in flight together).
  int threads = 1;
  // K >= 1: the partitions are per plane and leaf group, K of each plane's (FabricOptions::leaf_groups), for more
  // threads or processes than planes; the same result whatever K >= 1, the threads or processes (every
  // switch-to-switch link then sends through mailboxes: equal-time arrivals at a switch may run in another order
  // than with 0, one partition per plane). Needs threads >= 1.
  int leaf_groups = 0;
  const Processes* processes = nullptr;  // spread over MPI processes (threads >= 1 each); null: this process alone
  std::vector<LinkEvent> events;
};

struct LinkUtilization {
  int link = 0;
  int from = 0;  // node sending in this direction
  int to = 0;
  double utilization = 0;  // busy time / completion time
  uint64_t frames = 0;
};

// One switch port's counters at the end of a run (queues listed only when they carried traffic).
struct PortReport {
  std::string switch_name;
  int port = 0;
  switchemu::SwitchPortCounters counters;
};

// Payload bytes one GPU sent and received per plane: reported for the GPUs that link events touched.
struct GpuPlaneBytes {
  int gpu = 0;
  std::vector<uint64_t> sent;
  std::vector<uint64_t> received;
};

struct SimRun {
  std::string topology;
  std::string driver = "sim";
  SimOptions options;
  TrafficResult traffic;
  switchemu::SwitchTotals switches;
  uint64_t link_drops = 0;  // frames lost on links that went down
  std::vector<LinkUtilization> links;
  std::vector<PortReport> ports;
  std::vector<GpuPlaneBytes> event_gpus;
  double max_link_utilization = 0;
  double mean_gpu_link_utilization = 0;
  common::TimeNs fare_converged_ns = 0;
  int fare_rounds = 0;
  uint64_t events = 0;
  uint64_t frame_hops = 0;   // frames sent on any link, from a GPU or a switch
  double wall_seconds = 0;   // the whole run: setup, simulation and the report's collection
  double setup_seconds = 0;  // building the fabric (switches, FARE's rounds to convergence) and the flows
  double sim_seconds = 0;    // the event loop alone, from the first frame to the last byte delivered
  // Pages faulted in during the simulation: fresh memory touched the first time (common::minor_page_faults), mostly
  // the frames in flight at the run's peak; each costs what common::fresh_page_ns says on this machine.
  uint64_t sim_page_faults = 0;
  size_t routing_bytes = 0;  // Fabric::routing_bytes(): the RIB, the class table and every switch's FIB
  size_t link_bytes = 0;     // Fabric::link_bytes() at the end: links and switch ports (their queues' rings)
  size_t traffic_bytes = 0;  // RawTraffic::memory_bytes(): flows and their counters
  std::string partitions;    // PlanePartitions::describe() when opts.threads > 0
  uint64_t windows = 0;      // the partitions' windows (PlanePartitions::windows_run)
  std::string cut_off;       // cut_off_gpus(): GPUs the link events left with no fabric link, "" for none
};

// Runs the flows of `opts` to completion (progress lines on stderr every 2 s of wall time when opts.progress).
SimRun run_sim(const routing::Topology& topo, const SimOptions& opts);

}  // namespace ifec::testbed
