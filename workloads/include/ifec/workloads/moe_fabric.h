// The MoE layer's dispatch and combine moved through the simulated fabric as memory transactions: token rows are
// stored into the expert ranks' symmetric receive windows, experts run there (LibTorch), and the weighted outputs
// are stored back into the source ranks' windows and summed. Two DeepEP-style granularities so far: one message per
// (token, expert) (low-latency style) and one per (token, rank) with the rank-local reduction (normal style).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ifec/workloads/cluster.h"
#include "ifec/workloads/moe.h"

namespace ifec::workloads {

enum class MoeVariant : uint8_t { kPerExpert, kPerRank };
const char* moe_variant_name(MoeVariant v);

struct MoeFabricResult {
  bool ok = false;
  std::string error;
  double dispatch_us = 0;              // simulated: first store posted to the last one acknowledged
  double combine_us = 0;               // simulated, likewise
  double compute_us = 0;               // modelled from the GPU profile (the slowest rank), not measured
  int64_t dispatch_logical_bytes = 0;  // token rows that cross the fabric (rank-local copies excluded)
  int64_t combine_logical_bytes = 0;
  uint64_t dispatch_wire_bytes = 0;  // frame bytes the GPUs sent during the phase (headers, ACKs included)
  uint64_t combine_wire_bytes = 0;
  at::Tensor output;  // fp32 [ranks * tokens_per_rank, hidden]: the layer output, rank r's tokens at rows r*T..
};

// Runs one MoE layer over `cluster`'s first `ranks` GPUs (EP size), each holding tokens_per_rank rows of x
// (x: [ranks * tokens_per_rank, hidden], fp32 or bf16; rows travel in x's dtype). Expert e lives on rank
// owner_rank(e). Results are returned, not written back into x.
MoeFabricResult run_moe_fabric(Cluster& cluster, MoeVariant variant, const MoeConfig& cfg, const MoeWeights& w,
                               const at::Tensor& x, int ranks, const GpuProfile& profile = {});

}  // namespace ifec::workloads
