// A MoE point as both drivers run it (EP size, tokens per rank) and the row it gives per communication variant:
// per-phase times, logical and wire bytes, bandwidths and fractions of line rate, what the in-fabric operations met;
// printed for the terminal, or as a report record (JSON and CSV). The simulated driver fills rows in
// testbed/sim (moe_run.h); a live ifec-hostd fills its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ifec/common/interfaces.h"
#include "ifec/common/json.h"
#include "ifec/testbed/collective_point.h"

namespace ifec::testbed {

struct MoePoint {
  std::string mode = "normal";  // label: "normal" (DeepEP's 4096 tokens), "ll" (128 tokens), "scaled", ...
  int ep = 8;                   // EP ranks = GPUs 0..ep-1 of the topology
  int64_t tokens = 4096;        // tokens per rank
};

struct MoeRow {
  MoePoint point;
  std::string variant;
  int64_t simulated_tokens = 0;  // per rank; below point.tokens when scaled
  bool scaled = false;           // times and bytes scaled from simulated_tokens (bandwidth-bound assumption)
  double dispatch_us = 0;
  double combine_us = 0;
  // Each phase's data path on the driver's clock (simulated ns, or live the machine's monotonic clock): from the
  // last rank's start of it to the last rank's end (an in-fabric phase's plan and report apart; a live rank's row:
  // its own); *_data_us the difference.
  common::TimeNs dispatch_data_start_ns = 0;
  common::TimeNs dispatch_data_end_ns = 0;
  common::TimeNs combine_data_start_ns = 0;
  common::TimeNs combine_data_end_ns = 0;
  Turns turns;  // the carried state the EP ranks started from (a live rank's row: its own)
  double dispatch_data_us() const { return (dispatch_data_end_ns - dispatch_data_start_ns) / 1e3; }
  double combine_data_us() const { return (combine_data_end_ns - combine_data_start_ns) / 1e3; }
  // The line-rate bound of each phase (MoePhase::bound_us): the busiest GPU's bytes one way at its access rate
  // (0: not measured, e.g. the live driver).
  double dispatch_bound_us = 0;
  double combine_bound_us = 0;
  double compute_us = 0;                 // modelled: the slowest rank's routed experts at the costed width
  std::string compute_source = "model";  // or how it was measured (the live driver: LibTorch on the host's CPU)
  double total_us = 0;                   // dispatch + compute + combine (no overlap)
  // Two micro-batches overlapped, DeepEP's schedule (one communication stream: workloads::two_micro_batch_time on
  // each half's simulated phases); -1: not run.
  double overlap_us = -1;
  // Two micro-batches with communication under communication (a dispatch stream beside a combine stream, both
  // halves on one fabric: testbed::run_moe_two_batches); -1: not run.
  double overlap2_us = -1;
  bool fp8_dispatch = false;
  bool elided_payloads = false;  // frames carried headers and lengths only: timing only, nothing computed or checked
  int64_t gate_groups = 0;       // the gate's expert groups (node-limited routing; 0: not recorded)
  double line_gbs = 0;           // a GPU's access rate, GB/s (all planes): what the fractions of line rate are of
  int64_t dispatch_logical_bytes = 0;
  int64_t combine_logical_bytes = 0;
  uint64_t dispatch_wire_bytes = 0;
  uint64_t combine_wire_bytes = 0;
  std::vector<uint64_t> dispatch_wire_per_plane;
  std::vector<uint64_t> combine_wire_per_plane;
  // Of the wire bytes: packets sent again (RC retransmissions, ECH contributions and multicast packets after a
  // timeout), how many and their frame bytes. A wall-clock run may take some the simulator does not.
  uint64_t dispatch_resent = 0;
  uint64_t dispatch_resent_bytes = 0;
  uint64_t combine_resent = 0;
  uint64_t combine_resent_bytes = 0;
  // Live: the latest this rank's event loop ran a timer during the phase (the daemon busy, or the host not running
  // it: EpollLoop::take_worst_late_ns); the merged row the worst rank's. 0 simulated.
  double dispatch_host_stall_us = 0;
  double combine_host_stall_us = 0;
  // Live: the CPU time this rank's event loop used during the phase (against the phase's time: busy or starved).
  double dispatch_host_cpu_us = 0;
  double combine_host_cpu_us = 0;
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

std::string moe_rows_header();
std::string moe_row_text(const MoeRow& r);
// The row as a report record: its JSON (.str(), what the Python package parses) and CSV (.csv_row()) forms.
common::JsonObject moe_row_record(const MoeRow& r, const std::string& topology, const std::string& driver = "sim");

}  // namespace ifec::testbed
