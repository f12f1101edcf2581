// The MoE layer measured at a point (EP size, tokens per rank) in each communication variant on a freshly built
// simulated fabric: per-phase times (dispatch and combine simulated, expert compute from the GPU profile at the
// real expert width), logical and wire bytes, bandwidths; rows for the terminal, CSV and JSON. Used by
// `./ifec bench moe`, `./ifec demo` (through the Python package) and the tests.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ifec/common/json.h"
#include "ifec/routing/topology.h"
#include "ifec/testbed/moe_fabric.h"
#include "ifec/workloads/moe.h"

namespace ifec::testbed {

struct MoePoint {
  std::string mode = "normal";  // label: "normal" (DeepEP's 4096 tokens), "ll" (128 tokens), "scaled", ...
  int ep = 8;                   // EP ranks = GPUs 0..ep-1 of the topology
  int64_t tokens = 4096;        // tokens per rank
};

struct MoeBenchConfig {
  routing::Topology topo;     // the fabric (default in callers: the 64 x 4 SuperPoD)
  std::string topology_name;  // for the records
  MoeConfig model;            // routing shape (hidden, experts, groups, topk) and the costed expert width (inter)
  int64_t run_inter = 8;      // expert width actually run on the CPU when `compute` (the costed one is model.inter)
  bool bf16 = true;           // rows travel in bf16 (else fp32)
  bool compute = false;       // run the experts and check the output against the reference (else timing mode)
  bool fp8_dispatch = false;  // dispatch rows in FP8 (E4M3 + a scale per 128 channels), combine in the row type
  bool overlap = false;       // also the layer as two overlapped micro-batches (MoeBenchRow::overlap_us)
  int64_t token_cap = 0;      // simulate at most this many tokens per rank, scaling times and bytes (0: none)
  GpuProfile profile;
  uint64_t seed = 1;
  std::function<void(const std::string&)> progress;  // one line per finished variant
};

struct MoeBenchRow {
  MoePoint point;
  std::string variant;
  int64_t simulated_tokens = 0;  // per rank; below point.tokens when scaled
  bool scaled = false;           // times and bytes scaled from simulated_tokens (bandwidth-bound assumption)
  double dispatch_us = 0;
  double combine_us = 0;
  // The line-rate bound of each phase (MoePhase::bound_us): the busiest GPU's bytes one way at its access rate
  // (0: not measured, e.g. the live driver).
  double dispatch_bound_us = 0;
  double combine_bound_us = 0;
  double compute_us = 0;                 // modelled: the slowest rank's routed experts at the costed width
  std::string compute_source = "model";  // or how it was measured (the live driver: LibTorch on the host's CPU)
  double total_us = 0;                   // dispatch + compute + combine (no overlap)
  // Two micro-batches overlapped (workloads::two_micro_batch_time on each half's simulated phases); -1: not run.
  double overlap_us = -1;
  bool fp8_dispatch = false;
  double line_gbs = 0;  // a GPU's access rate, GB/s (all planes): what the fractions of line rate are of
  int64_t dispatch_logical_bytes = 0;
  int64_t combine_logical_bytes = 0;
  uint64_t dispatch_wire_bytes = 0;
  uint64_t combine_wire_bytes = 0;
  std::vector<uint64_t> dispatch_wire_per_plane;
  std::vector<uint64_t> combine_wire_per_plane;
  uint64_t fallback_chunks = 0;
  // IFEC: contributions/packets sent again after a timeout, refused by a busy switch slot, results seen twice.
  uint64_t ifec_retransmissions = 0;
  uint64_t ifec_busy_naks = 0;
  uint64_t ifec_duplicate_results = 0;
  std::vector<std::string> faults;  // what the variant's batch operations met, one line each
  double max_rel_error = -1;        // against the single-process reference when computed (else -1)
  double tolerance = 0;             // the largest max_rel_error that is right: one rounding of the row type per sum
  double wall_seconds = 0;
  // False when the output was computed and differs from the reference beyond the tolerance: never reported as ok.
  bool ok() const { return max_rel_error < 0 || max_rel_error <= tolerance; }
  // Logical bytes per rank / time, GB/s (1e9): DeepEP's per-GPU bandwidth convention.
  double dispatch_gbs() const;
  double combine_gbs() const;
  // Those as fractions of line_gbs (0 when it is unknown).
  double dispatch_line_fraction() const { return line_gbs > 0 ? dispatch_gbs() / line_gbs : 0; }
  double combine_line_fraction() const { return line_gbs > 0 ? combine_gbs() / line_gbs : 0; }
};

// Throws common::Error naming what is wrong with point `p` under `cfg` (EP size, tokens, mode, model shape).
void validate_moe_point(const MoeBenchConfig& cfg, const MoePoint& p);

// Runs `variants` at `p` (same tokens, routing and weights for each). Throws ifec::common::Error on bad input
// (EP size above the topology's GPUs or not dividing the experts, tokens < 1) or a phase that fails.
std::vector<MoeBenchRow> run_moe_point(const MoeBenchConfig& cfg, const MoePoint& p,
                                       const std::vector<MoeVariant>& variants);

// Every point in every variant as independent runs on `jobs` threads (parallel.h), largest first: rows in
// (point, variant) order, each what run_moe_point gives serially. progress(done, total, running) after each run.
// Throws the first run's error once all have finished.
std::vector<MoeBenchRow> run_moe_points(const MoeBenchConfig& cfg, const std::vector<MoePoint>& points,
                                        const std::vector<MoeVariant>& variants, unsigned jobs,
                                        const std::function<void(size_t, size_t, const std::string&)>& progress);

std::string moe_rows_header();
std::string moe_row_text(const MoeBenchRow& r);
// The row as a report record: its JSON (.str(), what the Python package parses) and CSV (.csv_row()) forms.
common::JsonObject moe_row_record(const MoeBenchRow& r, const std::string& topology, const std::string& driver = "sim");

}  // namespace ifec::testbed
