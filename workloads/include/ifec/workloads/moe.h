// DeepSeek-V3 MoE layer math on LibTorch (CPU): gate, SwiGLU experts, the single-process reference, the
// per-rank pieces a distributed dispatch/combine composes, expert sharding and dispatch lists, and a compute-cost
// model for the timing layer.
//
// Only <ATen/core/Tensor.h> is pulled in here (at::Tensor is torch::Tensor, at::ScalarType is torch::Dtype) so
// that including this header costs a few seconds of compile time, not the ~17 s of <torch/torch.h>. The sharding,
// dispatch-list and cost-model parts are plain C++ so the communication layer needs no tensor ops.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "ifec/workloads/gpu_model.h"

namespace ifec::workloads {

// Defaults are DeepSeek-V3 (671B): 256 routed experts + 1 shared, 8 active per token, node-limited routing over
// 8 groups keeping the best 4, sigmoid scores scaled by 2.5 after normalisation.
struct MoeConfig {
  int64_t hidden = 7168;       // model dim
  int64_t inter = 2048;        // moe_inter_dim: each routed expert's intermediate width
  int64_t experts = 256;       // routed experts
  int64_t groups = 8;          // expert groups (n_expert_groups)
  int64_t topk_groups = 4;     // groups a token may use (n_limited_groups)
  int64_t topk = 8;            // routed experts per token (n_activated_experts)
  int64_t shared_experts = 1;  // shared experts, fused into one MLP of width inter * shared_experts
  double route_scale = 2.5;    // multiplies the normalised routing weights

  int64_t experts_per_group() const { return experts / groups; }
  int64_t shared_inter() const { return inter * shared_experts; }
  // Throws ifec::common::Error naming the bad field and value.
  void validate() const;
};

// DeepSeek-V3's node-limited routing: a token reaches the experts of at most topk_groups groups, and its groups are
// the nodes of its deployment (8 groups of 32 experts = 8 nodes of 8 GPUs at EP 64, 4 experts per GPU). At an EP
// spanning more nodes than `cfg.groups` (EP 256: 32 nodes of 8 GPUs, one expert per GPU) the groups follow the nodes:
// groups = ranks / gpus_per_node (32 groups of 8 experts, a node's), topk_groups kept (4), so a token still reaches at
// most 4 nodes. Otherwise (EP 64 and below: a group spans a node or more) `cfg` unchanged. Throws
// ifec::common::Error naming ranks that are not whole nodes sharing the experts equally (past cfg.groups nodes).
MoeConfig node_limited(const MoeConfig& cfg, int ranks, int gpus_per_node);

// Weights of one layer. Routed experts are stacked on dim 0 so expert e is w1[e] ([inter, hidden]), w3[e]
// ([inter, hidden]) and w2[e] ([hidden, inter]), as nn.Linear stores them (out x in).
struct MoeWeights {
  at::Tensor gate_weight;  // [experts, hidden]
  at::Tensor gate_bias;    // [experts] fp32: aux-loss-free balancing bias, used for selection only
  at::Tensor w1;           // [experts, inter, hidden]
  at::Tensor w3;           // [experts, inter, hidden]
  at::Tensor w2;           // [experts, hidden, inter]
  at::Tensor shared_w1;    // [shared_inter, hidden]
  at::Tensor shared_w3;    // [shared_inter, hidden]
  at::Tensor shared_w2;    // [hidden, shared_inter]

  // The same values in another dtype (gate_bias stays fp32).
  MoeWeights to(at::ScalarType dtype) const;
};

// Deterministic for a given seed (and LibTorch build): N(0, 1/fan_in) weights so activations stay O(1) with
// N(0, 1) inputs; gate bias N(0, 0.01^2). Values are drawn in fp32 and then cast, so make_weights(cfg, s, kBFloat16)
// equals make_weights(cfg, s).to(kBFloat16). Memory is ~3 * experts * hidden * inter elements: the full DeepSeek-V3
// shape is ~45 GB in fp32, so tests use small hidden/inter.
MoeWeights make_weights(const MoeConfig& cfg, uint64_t seed, at::ScalarType dtype = at::kFloat);

// The layer's input: `rows` tokens (every rank's, rank r's the r-th block) of N(0, 1) values in `dtype`, a function of
// (seed, rows, hidden) only, drawn from a generator of their own (not the global one). Rows first..first+count-1 of
// it (count -1: to the end), holding at most kDrawBlock rows of fp32 at a time past that many: a live rank draws
// its own block of the tokens the simulator draws for all of its ranks.
inline constexpr int64_t kDrawBlock = int64_t{1} << 18;
at::Tensor draw_tokens(uint64_t seed, int64_t rows, int64_t hidden, at::ScalarType dtype, int64_t first = 0,
                       int64_t count = -1);

// The gate's decision for T tokens.
struct RoutingPlan {
  at::Tensor expert_ids;  // [T, topk] int64, in topk order of the biased scores (best first)
  at::Tensor weights;     // [T, topk] fp32, each row sums to route_scale
};

// DeepSeek-V3 Gate.forward with sigmoid scores: selection uses scores + bias, restricted to the topk_groups groups
// whose top-2 biased scores sum highest; weights are the unbiased scores at the chosen experts, normalised per
// token and times route_scale. The logits are computed in fp32 whatever the dtype of x and the gate weight, so
// the same values route the same way in every precision.
RoutingPlan gate(const at::Tensor& x, const MoeWeights& w, const MoeConfig& cfg);
// The part of gate() after the sigmoid: `scores` [T, experts] (already sigmoid'ed), `bias` [experts]. Exposed so
// tests can hand-set scores.
RoutingPlan route_scores(const at::Tensor& scores, const at::Tensor& bias, const MoeConfig& cfg);

// One SwiGLU MLP: w2 (silu(w1 x) * (w3 x)), x [n, hidden] -> [n, hidden], computed in the dtype of its inputs.
at::Tensor swiglu(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& w3);
// The shared expert on every token, returned as fp32 [T, hidden].
at::Tensor shared_expert_forward(const at::Tensor& x, const MoeWeights& w);

// Single-process layer, y = shared(x) + sum_k weight_k * expert_{id_k}(x), returned as fp32 [T, hidden]:
// experts run in the dtype of x and the weights, contributions are accumulated in fp32.
at::Tensor reference_forward(const at::Tensor& x, const MoeWeights& w, const MoeConfig& cfg);
// The same for a given plan (so a distributed run and the reference share one routing decision). `expert_x`, when
// defined, is what the routed experts see instead of x (FP8 dispatch: the dequantised rows); the shared expert and
// the gate always see x.
at::Tensor reference_forward(const at::Tensor& x, const MoeWeights& w, const MoeConfig& cfg, const RoutingPlan& plan,
                             const at::Tensor& expert_x = {});

// ---- FP8 dispatch (DeepEP's): rows travel as E4M3 with one fp32 scale per 128 channels ----

inline constexpr int64_t kFp8Block = 128;
// Bytes of one FP8 row on the wire: `hidden` E4M3 bytes, then hidden / 128 fp32 scales (little endian). Throws
// ifec::common::Error unless hidden is a positive multiple of 128.
int64_t fp8_row_bytes(int64_t hidden);
// x [n, hidden] (any float type) -> uint8 [n, fp8_row_bytes(hidden)]. Block b of a row is stored as
// e4m3(x / s_b) with s_b = max(max |x| over the block, 1e-4) / 448, DeepEP's per-token cast.
at::Tensor quantize_fp8_rows(const at::Tensor& x);
// uint8 [n, fp8_row_bytes(hidden)] -> fp32 [n, hidden]: e4m3 value x its block's scale.
at::Tensor dequantize_fp8_rows(const at::Tensor& packed, int64_t hidden);

// ---- Plain C++: routing table, sharding, dispatch lists (no tensor ops needed by callers) ----

// A RoutingPlan copied out of its tensors, row-major [tokens, topk].
struct RouteTable {
  int64_t tokens = 0;
  int64_t topk = 0;
  std::vector<int64_t> expert_ids;  // tokens * topk
  std::vector<float> weights;       // tokens * topk

  int64_t expert(int64_t token, int64_t slot) const { return expert_ids[token * topk + slot]; }
  float weight(int64_t token, int64_t slot) const { return weights[token * topk + slot]; }
  std::vector<int64_t> row(int64_t token) const;  // the token's expert ids
};
RouteTable to_route_table(const RoutingPlan& plan);

// Rank holding `expert` when `experts` are split into equal contiguous blocks over `ranks` (expert / (experts /
// ranks)); throws if experts is not divisible by ranks or expert is out of range.
int owner_rank(int64_t expert, int64_t experts, int ranks);
// Destination ranks of one token's expert ids: deduplicated, ascending.
std::vector<int> ranks_of_token(const std::vector<int64_t>& expert_ids, int64_t experts, int ranks);

// DeepEP low-latency granularity: one message per (token, expert).
struct ExpertDelivery {
  int64_t token = 0;
  int64_t slot = 0;  // column of the plan
  int64_t expert = 0;
  float weight = 0;  // gate weight; travels with the token (DeepEP sends topk weights along)
};
// DeepEP normal granularity: one message per (token, rank), carrying that rank's experts for the token.
struct RankDelivery {
  int64_t token = 0;
  std::vector<int64_t> slots;    // ascending slot order
  std::vector<int64_t> experts;  // experts[i] is plan column slots[i]
  std::vector<float> weights;
};

enum class Granularity : uint8_t { kPerExpert, kPerRank };

// What every destination rank receives. Lists are in token order, then slot order.
struct DispatchLists {
  int ranks = 0;
  int64_t tokens = 0;
  std::vector<std::vector<ExpertDelivery>> per_expert;  // [dst rank]
  std::vector<std::vector<RankDelivery>> per_rank;      // [dst rank]
};
DispatchLists build_dispatch_lists(const RouteTable& table, int64_t experts, int ranks);

// Logical payload volume of dispatch (combine moves the same rows back): each message is one token row of
// hidden * elem_bytes bytes. Metadata (ids, weights) is not counted; routing/transport overheads are the fabric's.
struct DispatchVolume {
  std::vector<int64_t> messages;  // [dst rank]
  std::vector<int64_t> bytes;     // [dst rank]
  int64_t total_messages = 0;
  int64_t total_bytes = 0;
};
DispatchVolume dispatch_volume(const DispatchLists& lists, Granularity g, int64_t hidden, int64_t elem_bytes);
// Bytes from source rank to destination rank, row-major [src * ranks + dst], given each token's source rank
// (token_src.size() == tokens). Diagonal entries are rank-local copies that do not cross the fabric.
std::vector<int64_t> traffic_matrix(const DispatchLists& lists, Granularity g, const std::vector<int>& token_src,
                                    int64_t hidden, int64_t elem_bytes);

// ---- Per-rank compute and combine, the pieces a distributed implementation composes ----

// Rows of x a rank receives, in list order: x[token] for every delivery.
at::Tensor gather_rows(const at::Tensor& x, const std::vector<ExpertDelivery>& recv);
at::Tensor gather_rows(const at::Tensor& x, const std::vector<RankDelivery>& recv);
// Per (token, expert) delivery: row i = weight_i * expert_{expert_i}(recv_x[i]), fp32 [recv.size(), hidden].
at::Tensor expert_outputs_for_rank(const at::Tensor& recv_x, const std::vector<ExpertDelivery>& recv,
                                   const MoeWeights& w, const MoeConfig& cfg);
// Per (token, rank) delivery: row i = sum_j weight_ij * expert_{experts_ij}(recv_x[i]), the rank-local reduction
// DeepEP normal mode does before combine; fp32 [recv.size(), hidden].
at::Tensor expert_outputs_for_rank(const at::Tensor& recv_x, const std::vector<RankDelivery>& recv, const MoeWeights& w,
                                   const MoeConfig& cfg);
// Sums the ranks' output rows (rank_outputs[r] from expert_outputs_for_rank with lists' g-granularity list of r)
// into fp32 [tokens, hidden], visiting ranks in rank_order (e.g. arrival order; empty = 0..ranks-1) and each
// rank's rows in list order, so a given order always gives the same bits. The layer output is
// shared_expert_forward(x) + combine(...).
at::Tensor combine(const std::vector<at::Tensor>& rank_outputs, const DispatchLists& lists, Granularity g,
                   int64_t hidden, const std::vector<int>& rank_order = {});

// ---- Compute-cost model ----

// The experts' time on a GPU comes from gpu_model.h (a fitted per-launch model; GpuProfile). Per rank: ranks run in
// parallel, so a layer's expert time is the max over ranks. tokens_per_expert holds the counts of the rank's experts
// (any order; zeros cost nothing); the routed experts run as the profile's kernel (grouped or a loop).
double expert_compute_seconds(const std::vector<int64_t>& tokens_per_expert, const MoeConfig& cfg,
                              const GpuProfile& profile, double bytes_per_element);
// Same with only totals known: `pairs` (token, expert) pairs spread evenly over `active_experts` experts.
double expert_compute_seconds(int64_t pairs, int64_t active_experts, const MoeConfig& cfg, const GpuProfile& profile,
                              double bytes_per_element);
// The shared expert on `tokens` tokens of one rank (width shared_inter): one GEMM chain.
double shared_expert_compute_seconds(int64_t tokens, const MoeConfig& cfg, const GpuProfile& profile,
                                     double bytes_per_element);
// DeepEP's production schedule of two micro-batches (halves of a rank's tokens), one communication stream and one
// compute stream: dispatch 1, dispatch 2 while experts 1 run, combine 1 once both are done while experts 2 run,
// combine 2. Phases of one stream never overlap each other, so communication overlaps only compute. Returns the
// layer's time from the phases' own times (any unit): index 0 is the first micro-batch.
double two_micro_batch_time(const double dispatch[2], const double experts[2], const double combine[2]);

// Tokens routed to each expert [experts] (a histogram of the plan); slice a rank's block for expert_compute_seconds.
std::vector<int64_t> tokens_per_expert(const RouteTable& table, int64_t experts);

}  // namespace ifec::workloads
