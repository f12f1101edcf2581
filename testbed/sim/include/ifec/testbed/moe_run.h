// A MoE point run by the simulated driver: each communication variant on a fresh fabric with the same tokens,
// routing and weights, the experts' time from the GPU model at the costed width, rows per variant (moe_rows.h).
// Used by `./ifec bench moe` (through the bench library's sweep), `./ifec demo` (the Python package) and tests.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ifec/routing/topology.h"
#include "ifec/testbed/moe_fabric.h"
#include "ifec/testbed/moe_rows.h"
#include "ifec/workloads/moe.h"

namespace ifec::testbed {

struct MoeRunConfig {
  routing::Topology topo;     // the fabric (default in callers: the 64 x 4 SuperPoD)
  std::string topology_name;  // for the records
  MoeConfig model;            // routing shape (hidden, experts, groups, topk) and the costed expert width (inter)
  int64_t run_inter = 8;      // expert width actually run on the CPU when `compute` (the costed one is model.inter)
  bool bf16 = true;           // rows travel in bf16 (else fp32)
  bool compute = false;       // run the experts and check the output against the reference (else timing mode)
  // Timing mode on a fabric whose frames carry headers and lengths only (FabricOptions::elided_payloads): the same
  // times and bytes, no window memory touched; rows say "timing only". Not with `compute`.
  bool elided_payloads = false;
  int gpus_per_node = 8;      // the gate's groups follow nodes of this many GPUs past EP 64 (workloads::node_limited)
  bool fp8_dispatch = false;  // dispatch rows in FP8 (E4M3 + a scale per 128 channels), combine in the row type
  // Also the layer as two overlapped micro-batches: DeepEP's schedule (MoeRow::overlap_us) and communication under
  // communication (MoeRow::overlap2_us, run_moe_two_batches).
  bool overlap = false;
  int64_t token_cap = 0;  // simulate at most this many tokens per rank, scaling times and bytes (0: none)
  GpuProfile profile;
  uint64_t seed = 1;
  // The live daemons' timers (RC and in-fabric retransmission: live_timing.h), to compare with a live fabric.
  bool live_timing = false;
  // The carried state the EP ranks start each variant from (stripe rotors, multicast PSNs, the communicators' group
  // turn): a live row's, so the same frames take the same planes. Empty: a fresh fabric's.
  Turns start;
  int threads = 0;  // ClusterOptions::threads: 0 one event loop, N partitioned on N threads (the same rows for any N)
  int gpu_groups = 0;   // ClusterOptions::gpu_groups (0: one per thread; the same rows for any grouping)
  int leaf_groups = 0;  // FabricOptions::leaf_groups: the switches by plane (0) or by plane and leaf group
  // Every fabric spread over MPI processes (ClusterOptions::processes): rank 0 runs the points and returns the rows,
  // the others serve its fabrics and return none.
  const Processes* processes = nullptr;
  std::function<void(const std::string&)> progress;  // one line per finished variant
};

// Throws common::Error naming what is wrong with point `p` under `cfg` (EP size, tokens, mode, model shape).
void validate_moe_point(const MoeRunConfig& cfg, const MoePoint& p);

// The bytes a point's data takes at the least: the tokens drawn, the router's scores, the experts' weights at the
// width run, and the windows' rows (unless elided; one shared copy in the timing mode, a window per GPU computed).
// validate_moe_point refuses a point whose estimate exceeds 3/4 of this machine's memory, before any allocation.
double moe_point_data_bytes(const MoeRunConfig& cfg, const MoePoint& p);

// Runs `variants` at `p` (same tokens, routing and weights for each). Throws ifec::common::Error on bad input
// (EP size above the topology's GPUs or not dividing the experts, tokens < 1) or a phase that fails.
std::vector<MoeRow> run_moe_point(const MoeRunConfig& cfg, const MoePoint& p, const std::vector<MoeVariant>& variants);

}  // namespace ifec::testbed
