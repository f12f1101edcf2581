// One rank's part of an MoE layer's dispatch and combine, planned from the layer's routing table (every rank holds
// the whole table after DeepEP's notify step): the windows it needs, the rows it sends and receives in each phase,
// where its received rows sit, and the local steps around them (expert outputs from the received rows, the final
// sum of the combined rows). Shared by the simulated driver (testbed/sim: every rank's plan on one event loop) and
// the live one (ifec-hostd: its own rank's, in its own process).
//
// Three communication variants: one message per (token, expert) (DeepEP low-latency style), one per (token, rank)
// with the rank-local reduction (DeepEP normal style), and IFEC: each token row leaves its source once as
// compact-ECH multicast to the token's ranks, and the ranks' output rows are summed in the switches on their way
// back to the source (the source adds its own rank's part locally).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ifec/common/protocol.h"
#include "ifec/workloads/communicator.h"
#include "ifec/workloads/moe.h"

namespace ifec::workloads {

enum class MoeVariant : uint8_t { kPerExpert, kPerRank, kIfec };
const char* moe_variant_name(MoeVariant v);  // "per_expert", "per_rank", "ifec"
// Parses a name as above; throws ifec::common::Error naming the bad value.
MoeVariant parse_moe_variant(const std::string& name);

// Rows a rank of the baselines keeps posted (BatchPutArgs::rows_ahead), as DeepEP's normal kernels send through
// bounded per-peer buffers: kMoeRowsInFlight spread over its destinations, at least 16 each. A rank of an EP 256
// layer holds 255 x 17 rows in its NIC's queues, not its 32 K (8 M rows for the layer: 20 GB of transport state).
// Enough to keep every QP busy while earlier rows are acknowledged: the figures equal posting every row at once at
// EP 16 (2048 tokens), within 0.4% at EP 64 (1024 tokens: 66 rows per destination).
inline constexpr uint32_t kMoeRowsInFlight = 4096;
uint32_t moe_rows_ahead(int ranks);

// Window ids of one layer (a driver running consecutive layers may rotate them).
struct MoeWindows {
  uint16_t recv = 40;     // dispatch receive rows (IFEC: [source rank][token] rows, a symmetric layout)
  uint16_t combine = 41;  // combine rows at the source: [token][slot] (stores) or [token] (IFEC)
  uint16_t input = 42;    // each rank's own tokens (stores)
  uint16_t output = 43;   // each expert rank's output rows (stores: sent back; IFEC: the contributions)
};

struct MoeRankPlan {
  MoeVariant variant = MoeVariant::kPerRank;
  int rank = 0;
  int ranks = 1;
  int64_t tokens = 0;  // per rank
  int64_t topk = 1;
  uint64_t row_bytes = 0;           // a combine row (and a dispatch row unless FP8): hidden elements of the row type
  bool fp8_dispatch = false;        // dispatch rows are FP8 (fp8_row_bytes), dequantised before the experts
  uint64_t dispatch_row_bytes = 0;  // row_bytes, or fp8_row_bytes(hidden)
  MoeWindows ids;
  // (window, bytes) to allocate: the same sizes on every rank (symmetric windows, sized for the busiest rank).
  std::vector<std::pair<uint16_t, uint64_t>> windows;
  // Where this rank writes its own token rows ([tokens, hidden]) before dispatch.
  uint16_t input_window = 0;
  uint64_t input_offset = 0;
  BatchMulticastArgs dispatch_multicast;  // IFEC
  BatchPutArgs dispatch_put;              // the two baselines
  BatchReduceArgs combine_reduce;         // IFEC
  BatchPutArgs combine_put;               // the two baselines
  // This rank's deliveries (its dispatch list, in list order): where each row sits in the receive window, and for
  // IFEC the local token index of a delivery whose token is this rank's own (added locally, not sent), else -1.
  std::vector<uint64_t> recv_offsets;
  std::vector<int64_t> own_token;
  int64_t dispatch_logical_bytes = 0;  // rows this rank sends across the fabric (local copies excluded)
  int64_t combine_logical_bytes = 0;
};

// Plans rank `rank`'s part of the layer whose routing is `table` ([ranks * tokens_per_rank] tokens, rank r's tokens
// at rows r*T..) and whose dispatch lists are `lists` (build_dispatch_lists(table, experts, ranks)). Rows are
// `row_bytes` long, elements `dtype` (IFEC reduces them in the switches); with `fp8_dispatch` the dispatched rows
// are FP8 instead (quantize_fp8_rows: the hidden elements in E4M3 plus their scales). Throws ifec::common::Error on
// a rank outside the lists or a table that does not match them.
MoeRankPlan plan_moe_rank(MoeVariant v, const RouteTable& table, const DispatchLists& lists, int rank,
                          int64_t tokens_per_rank, uint64_t row_bytes, common::EchDtype dtype,
                          const MoeWindows& ids = {}, bool fp8_dispatch = false);

// Every rank's plan at once (rank r at index r): what plan_moe_rank gives for each, in one pass over the layer's
// deliveries (a driver holding every rank, the simulator's).
std::vector<MoeRankPlan> plan_moe_ranks(MoeVariant v, const RouteTable& table, const DispatchLists& lists,
                                        int64_t tokens_per_rank, uint64_t row_bytes, common::EchDtype dtype,
                                        const MoeWindows& ids = {}, bool fp8_dispatch = false);

// This rank's expert outputs, one row per delivery in list order, in `row_type` (the type combine rows travel in):
// per-expert rows are weighted single-expert outputs, per-rank and IFEC rows the rank-local sum over its experts.
// `recv` points at the receive window; FP8 rows are dequantised to `row_type` first (the experts run in it).
at::Tensor moe_expert_rows(const MoeRankPlan& plan, const uint8_t* recv, const DispatchLists& lists,
                           const MoeWeights& w, const MoeConfig& cfg, at::ScalarType row_type);
// The routed part of this rank's layer output, fp32 [tokens, hidden], from its combine window (`combined`) and, for
// IFEC, its own rows of `expert_rows` (moe_expert_rows) added locally. The layer output is shared_expert_forward(x)
// plus this.
at::Tensor moe_routed_output(const MoeRankPlan& plan, const uint8_t* combined, const at::Tensor& expert_rows,
                             int64_t hidden, at::ScalarType row_type);

// Largest relative error (max |out - ref| / max |ref|) that is still right for rows of `row_type`: bf16 rows round
// once per exchange and the experts run in bf16; fp32 only accumulates rounding.
double moe_tolerance(at::ScalarType row_type);
double moe_max_rel_error(const at::Tensor& out, const at::Tensor& ref);

}  // namespace ifec::workloads
