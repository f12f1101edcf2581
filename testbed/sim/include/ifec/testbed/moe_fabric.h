// The MoE layer's dispatch and combine moved through the simulated fabric as memory transactions: token rows are
// stored into the expert ranks' symmetric receive windows, experts run there (LibTorch), and the weighted outputs
// are stored back into the source ranks' windows and summed. Three variants: one message per (token, expert)
// (DeepEP low-latency style), one per (token, rank) with the rank-local reduction (DeepEP normal style), and IFEC:
// each token row leaves its source once as compact-ECH multicast to the token's ranks, and the ranks' output rows
// are summed in the switches (batch reduction, "expected contributors" = the token's remote ranks) on their way
// back to the source.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ifec/testbed/cluster.h"
#include "ifec/testbed/harness.h"
#include "ifec/workloads/moe.h"
#include "ifec/workloads/moe_plan.h"

namespace ifec::testbed {

using workloads::GpuProfile;
using workloads::MoeConfig;
using workloads::MoeWeights;

using workloads::moe_variant_name;
using workloads::MoeVariant;
using workloads::parse_moe_variant;

struct MoeFabricOptions {
  // false: the timing mode for large points. Tokens are routed and every row crosses the fabric as usual, but the
  // experts do not run and `output` is left undefined; times and bytes are the same because the simulated fabric
  // does not depend on payload values. Each window is then one memory every GPU shares (Cluster::allocate_window
  // `shared`), so a 64-rank point at 4096 tokens fits in memory; the values rows carry are meaningless.
  bool compute = true;
  // Timing mode only: the width of a row on the wire when x is narrower (x then only feeds the gate: routing
  // statistics do not depend on the model width, the bytes moved do). 0: x's width, cfg.hidden.
  int64_t row_hidden = 0;
  // Dispatch rows travel as FP8 (E4M3 + a scale per 128 channels, quantize_fp8_rows) and are dequantised before the
  // experts; combine rows stay in x's type.
  bool fp8_dispatch = false;
  common::TimeNs phase_limit_ns = 10'000'000'000ULL;  // simulated time a phase may take before it is an error
  bool live_timing = false;  // the communicators' in-fabric timers are the live daemons' (live_timing.h)
  int first_group = -1;      // the communicators' first in-fabric group (IfecOptions::first_group; -1: its default)
};

// One phase (dispatch or combine) as the fabric saw it.
struct MoePhase {
  double us = 0;  // simulated: first store posted to the last one acknowledged
  // The data path (CollectiveResult::data_start_ns / data_end_ns merged: the last rank's start to the last rank's
  // end; an in-fabric phase's plan and report are the control plane's), simulated ns.
  common::TimeNs data_start_ns = 0;
  common::TimeNs data_end_ns = 0;
  uint64_t wire_bytes = 0;               // frame bytes the GPUs sent during the phase (headers, ACKs included)
  std::vector<uint64_t> wire_per_plane;  // the GPUs' frame bytes per plane
  endpoint::Endpoint::Resent resent;     // of wire_bytes: the GPUs' packets sent again (RC and ECH)
  // The line-rate bound: the busiest GPU's bytes one way (sent or received, with the per-frame wire overhead) over
  // its access rate, i.e. the phase's time if that GPU's ports ran at line rate the whole time, every plane alike.
  double bound_us = 0;
};

struct MoeFabricResult {
  bool ok = false;
  std::string error;
  MoePhase dispatch;
  MoePhase combine;
  int64_t dispatch_logical_bytes = 0;  // token rows that cross the fabric (rank-local copies excluded)
  int64_t combine_logical_bytes = 0;
  uint64_t fallback_chunks = 0;  // IFEC: chunks/packets the fabric did not serve, finished point to point
  std::string fallback_reason;
  std::vector<std::string>
      faults;                // IFEC: what the batch operations met (planes given up, rows finished point to point)
  IfecStats ifec;            // IFEC: the in-fabric operations' counters (retransmissions, busy NAKs, duplicates)
  int64_t routed_pairs = 0;  // (token, expert) pairs
  std::vector<int64_t> tokens_per_expert;  // the plan's histogram, for cost models with other shapes
  at::Tensor output;  // fp32 [ranks * tokens_per_rank, hidden]: the layer output, rank r's tokens at rows r*T..
};

// A phase of a schedule: when it started and ended, from the layer's start (simulated us).
struct MoeScheduledPhase {
  double start_us = 0;
  double end_us = 0;
  double us() const { return end_us - start_us; }
};

struct MoeTwoBatchResult {
  bool ok = false;
  std::string error;
  double us = 0;  // the layer: the first dispatch posted to the last combine done (simulated)
  MoeScheduledPhase dispatch[2];
  MoeScheduledPhase combine[2];
  uint64_t fallback_chunks = 0;
  std::vector<std::string> faults;
  at::Tensor output;  // as MoeFabricResult::output (compute mode)
};

// Runs one MoE layer over `cluster`'s first `ranks` GPUs (EP size), each holding tokens_per_rank rows of x
// (x: [ranks * tokens_per_rank, hidden], fp32 or bf16; rows travel in x's dtype, dispatch rows in FP8 if asked). The
// IFEC variant falls back to point-to-point where the fabric cannot serve (its combine: one-tier planes only).
// Expert e lives on rank owner_rank(e). Results are returned, not written back into x.
MoeFabricResult run_moe_fabric(Cluster& cluster, MoeVariant variant, const MoeConfig& cfg, const MoeWeights& w,
                               const at::Tensor& x, int ranks, const MoeFabricOptions& opts = {});

// The same layer as two micro-batches (each rank's first and second half of its tokens), with communication under
// communication: a dispatch stream (dispatch 0, then dispatch 1), a compute stream (the experts of micro-batch 0,
// then 1, each once its rows are in; `experts_us[h]` of simulated time each, LibTorch at once in compute mode) and a
// combine stream (combine 0, then 1, each once its experts are done). So micro-batch 1's dispatch runs on the
// fabric beside micro-batch 0's combine whenever the experts do not cover it (with zero expert time from the
// moment dispatch 0 ends): multicast leaves the senders' transmit direction free, in-fabric reduction the
// receivers' receive direction. DeepEP's schedule (workloads::two_micro_batch_time) has one communication stream
// instead. The streams are two communicators per endpoint (Cluster::communicators' `stream`), each micro-batch its
// own windows. Throws common::Error as run_moe_fabric, or for fewer than 2 tokens per rank or a negative time.
MoeTwoBatchResult run_moe_two_batches(Cluster& cluster, MoeVariant variant, const MoeConfig& cfg, const MoeWeights& w,
                                      const at::Tensor& x, int ranks, const double experts_us[2],
                                      const MoeFabricOptions& opts = {});

}  // namespace ifec::testbed
