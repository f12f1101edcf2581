// `./ifec bench scale`: the simulator at thousands of GPUs. Each scenario (a fabric, a traffic pattern, real or
// elided payloads) runs in a child process of its own, so that its peak memory is its own (the kernel's maximum
// resident set of the child), and reports what the targets are stated in: GPUs, links, events,
// frame-hops per second per core, threads and speedup, peak memory and the bytes per GPU of the routing and flow
// state, and the setup and simulation times apart.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ifec/testbed/raw_traffic.h"

namespace ifec::testbed {

struct ScaleScenario {
  std::string topo_path;
  Pattern pattern = Pattern::kPermutation;
  uint64_t bytes = 2 << 20;  // per GPU (permutation) or per ordered pair (all-to-all)
  bool elided_payloads = false;
  int group = 0;        // make_flows' expert-parallel groups (0: one group of every GPU)
  int threads = 1;      // SimOptions::threads: N one partition per plane on N threads; 0 one event loop
  int processes = 0;    // > 1: under mpirun -np processes (threads each, at least 1), figures from its JSON report
  int leaf_groups = 0;  // SimOptions::leaf_groups: K >= 1 partitions per plane and leaf group (raw traffic)
  // "ring", "best", "ifec", ...: an AllReduce of `bytes` per GPU with this algorithm (workloads::parse_algo) over
  // every GPU, on one event loop (threads 0) or partitioned on `threads`; "": raw traffic of `pattern`
  std::string allreduce;
  // Targets this scenario is measured against (0: none): peak bytes at most, frame-hops/s at least, and the
  // speedup over the same scenario on one thread at least.
  double target_peak_bytes = 0;
  double target_rate = 0;
  double target_speedup = 0;
  double target_seconds = 0;  // setup and simulation together, at most
  // "fat-tree-2048x8.yaml permutation 2 MiB/GPU real" (one thread), "... in groups of 256", "..., 2 threads",
  // "..., one event loop", "..., mpirun -np 2", "..., 2 threads, 2 leaf groups"
  std::string describe() const;
  std::string traffic() const;  // the same without the threads
};

struct ScaleRow {
  ScaleScenario scenario;
  std::string topology;
  int gpus = 0;
  int links = 0;
  int switches = 0;
  uint64_t events = 0;
  uint64_t frame_hops = 0;
  double setup_seconds = 0;
  double sim_seconds = 0;
  uint64_t peak_bytes = 0;       // the child's maximum resident set
  uint64_t sim_page_faults = 0;  // fresh pages touched while simulating (SimRun::sim_page_faults; 0: not counted)
  uint64_t routing_bytes = 0;    // Fabric::routing_bytes()
  uint64_t traffic_bytes = 0;    // RawTraffic::memory_bytes()
  uint64_t link_bytes = 0;       // Fabric::link_bytes(): links and switch ports
  bool complete = false;         // every byte delivered
  bool one_loop = false;         // ran on one event loop (threads 0, or a fabric whose planes cannot run apart)
  std::string error;             // why the child failed ("" when it ran)
  double speedup = 0;            // rate over the same traffic's on one thread (scale_table fills it; 0: none)
  // A scenario with a speedup target (measure_speedup): the same traffic on one thread (one process) run just
  // before it, its speedup's base, and what as many threads of plain arithmetic got over one just before that:
  // the cores the host gave this VM then (0: not measured).
  double paired_one_rate = 0;
  double host_parallelism = 0;
  std::vector<double> pair_speedups;  // every alternated pair's ratio, ascending (the row is the median's pair)
  // An AllReduce scenario's outcome: "ran tree: 57.18 us simulated, busbw 146.7 GB/s" ("" for raw traffic)
  std::string result;
  double rate() const { return sim_seconds > 0 ? frame_hops / sim_seconds : 0; }  // frame-hops/s
};

// The scenarios, from `topo_dir`: the 64 x 4 all-to-all, the 1,024-GPU SUN and the 2,048-GPU fat tree's
// permutation of 2 MiB per GPU, real and elided (the 2,048-GPU real one carries the memory and rate targets), the
// 64 x 4 all-to-all and the 2,048-GPU permutation again on one thread, two, and two MPI processes (the speedup
// targets; under mpirun the peak is the largest process's and the bytes per GPU are not reported), and, unless
// quick, the 2,048-GPU all-to-all of 4 KiB per pair and within expert-parallel groups of 256 (64 KiB, elided), and
// AllReduce of 4 MiB over the 1,024-GPU SUN, ring, best and in-fabric, elided, and DeepSeek-V3's 16,384-GPU fabric's
// permutation of 2 MiB per GPU, elided (its targets: 5 minutes, 12 GB). Also a one-plane 1,024-GPU fat tree's
// permutation on one thread and on two threads with two leaf groups (more partitions than its one plane gives),
// and elided on one thread and two processes with two leaf groups.
std::vector<ScaleScenario> scale_scenarios(const std::string& topo_dir, bool quick);

// Runs `s` in a child process (progress lines on stderr from the child every 2 s); a scenario over processes runs
// `mpirun -np N cli sim ... --json` there (`cli`: the ifec-cli program). A child that fails, throws or is killed
// gives a row with `error` set; the parent goes on.
ScaleRow measure_scale(const ScaleScenario& s, bool progress, const std::string& cli = "");

// A scenario with a speedup target, measured in pairs: how many cores the host gives now (host_parallelism), then
// kSpeedupPairs times the same traffic on one thread (one process) and `s` itself; the row is the pair of the median
// ratio, its speedup over that pair's one-thread run, not one measured minutes earlier (on a shared VM the second
// core comes and goes: plain arithmetic on two threads has measured anywhere from 0.76x to 2.05x one thread within
// a minute).
inline constexpr int kSpeedupPairs = 3;
ScaleRow measure_speedup(const ScaleScenario& s, bool progress, const std::string& cli = "");
// Of rows measured as pairs (each with its paired_one_rate > 0), the one of the median speedup, with every pair's
// speedup in pair_speedups, ascending.
ScaleRow median_pair(std::vector<ScaleRow> pairs);

// `threads` threads of plain arithmetic at once against one (the median of three tries): 2.0 on two free cores.
double host_parallelism(int threads);

// One line per row under a header naming the columns, then the AllReduce rows' outcomes, then one line per target:
// measured, target, met or not.
// Fills each threaded row's speedup from its paired one-thread run (measure_speedup), else from the one-thread row
// of the same traffic.
// With `fresh_page_ns` (common::fresh_page_ns, measured once by the caller), also what this machine charges for a
// fresh page and, beside a rate target, the simulation's rate without its first touches (an estimate).
std::string scale_table(std::vector<ScaleRow>& rows, double fresh_page_ns = 0);

}  // namespace ifec::testbed
