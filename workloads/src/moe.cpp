// DeepSeek-V3 MoE layer math: gate, SwiGLU experts, reference forward, per-rank compute, dispatch lists, cost model.
#include "ifec/workloads/moe.h"

// Per-op headers instead of <ATen/ATen.h>: this TU compiles in about half the time.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <utility>

#include "ifec/common/checks.h"
#include "ifec/common/numeric.h"

namespace ifec::workloads {

namespace {

// Copies a host vector into a tensor that owns its storage (from_blob alone would alias the vector).
at::Tensor long_tensor(const std::vector<int64_t>& v) {
  if (v.empty()) return at::zeros({0}, at::TensorOptions().dtype(at::kLong));  // data() may be null
  return at::from_blob(const_cast<int64_t*>(v.data()), {static_cast<int64_t>(v.size())}, at::kLong).clone();
}
at::Tensor float_tensor(const std::vector<float>& v) {
  return at::from_blob(const_cast<float*>(v.data()), {static_cast<int64_t>(v.size())}, at::kFloat).clone();
}

std::string shape_str(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

void check_tokens(const at::Tensor& x, const MoeConfig& cfg, const char* what) {
  IFEC_CHECK(x.defined() && x.dim() == 2 && x.size(1) == cfg.hidden,
             what << " must be [tokens, hidden=" << cfg.hidden << "], got " << shape_str(x));
}

void check_weights(const MoeWeights& w, const MoeConfig& cfg) {
  const auto expect = [](const at::Tensor& t, std::vector<int64_t> shape, const char* name) {
    IFEC_CHECK(t.defined() && t.sizes() == at::IntArrayRef(shape),
               "MoeWeights." << name << " must be " << at::IntArrayRef(shape) << ", got " << shape_str(t));
  };
  expect(w.gate_weight, {cfg.experts, cfg.hidden}, "gate_weight");
  expect(w.gate_bias, {cfg.experts}, "gate_bias");
  expect(w.w1, {cfg.experts, cfg.inter, cfg.hidden}, "w1");
  expect(w.w3, {cfg.experts, cfg.inter, cfg.hidden}, "w3");
  expect(w.w2, {cfg.experts, cfg.hidden, cfg.inter}, "w2");
  expect(w.shared_w1, {cfg.shared_inter(), cfg.hidden}, "shared_w1");
  expect(w.shared_w3, {cfg.shared_inter(), cfg.hidden}, "shared_w3");
  expect(w.shared_w2, {cfg.hidden, cfg.shared_inter()}, "shared_w2");
}

// Runs every expert on its rows of `in` and adds weight * output into `out` (fp32) at `out_rows`. `items` are
// (in row, out row, expert, weight); experts run in ascending order, so each out row sums its terms in expert order.
struct Item {
  int64_t in_row;
  int64_t out_row;
  int64_t expert;
  float weight;
};
void run_experts(const at::Tensor& in, std::vector<Item> items, const MoeWeights& w, const MoeConfig& cfg,
                 at::Tensor& out) {
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.expert < b.expert; });
  size_t i = 0;
  while (i < items.size()) {
    const int64_t e = items[i].expert;
    IFEC_CHECK(e >= 0 && e < cfg.experts, "expert id " << e << " out of range [0, " << cfg.experts << ")");
    std::vector<int64_t> in_rows, out_rows;
    std::vector<float> wts;
    for (; i < items.size() && items[i].expert == e; ++i) {
      in_rows.push_back(items[i].in_row);
      out_rows.push_back(items[i].out_row);
      wts.push_back(items[i].weight);
    }
    const at::Tensor y = swiglu(in.index_select(0, long_tensor(in_rows)), w.w1[e], w.w2[e], w.w3[e]);
    out.index_add_(0, long_tensor(out_rows), y.to(at::kFloat) * float_tensor(wts).unsqueeze(1));
  }
}

std::vector<int64_t> rows_tokens(const DispatchLists& lists, Granularity g, int r) {
  std::vector<int64_t> tokens;
  if (g == Granularity::kPerExpert) {
    for (const auto& d : lists.per_expert[r]) tokens.push_back(d.token);
  } else {
    for (const auto& d : lists.per_rank[r]) tokens.push_back(d.token);
  }
  return tokens;
}

void check_cost_args(const MoeConfig& cfg, const GpuProfile& p, double bytes_per_element) {
  cfg.validate();
  p.validate();
  IFEC_CHECK(bytes_per_element > 0, "bytes_per_element must be > 0, got " << bytes_per_element);
}

}  // namespace

void MoeConfig::validate() const {
  IFEC_CHECK(hidden > 0, "MoeConfig.hidden must be > 0, got " << hidden);
  IFEC_CHECK(inter > 0, "MoeConfig.inter must be > 0, got " << inter);
  // The GPU model's limits, named before a point runs (its compute time is modelled after the fabric's run).
  IFEC_CHECK(hidden <= kMaxModelWidth && inter <= kMaxModelWidth,
             "MoeConfig.hidden " << hidden << " and inter " << inter << " must each be at most " << kMaxModelWidth);
  IFEC_CHECK(experts > 0, "MoeConfig.experts must be > 0, got " << experts);
  IFEC_CHECK(groups > 0, "MoeConfig.groups must be > 0, got " << groups);
  IFEC_CHECK(experts % groups == 0,
             "MoeConfig.experts=" << experts << " must be divisible by MoeConfig.groups=" << groups);
  // Group scores are the sum of each group's top-2 scores, so a group needs two experts.
  IFEC_CHECK(groups == 1 || experts_per_group() >= 2,
             "MoeConfig.groups=" << groups << " leaves " << experts_per_group() << " expert(s) per group; need >= 2");
  IFEC_CHECK(topk_groups >= 1 && topk_groups <= groups,
             "MoeConfig.topk_groups=" << topk_groups << " must be in [1, groups=" << groups << "]");
  IFEC_CHECK(topk >= 1 && topk <= topk_groups * experts_per_group(),
             "MoeConfig.topk=" << topk << " must be in [1, " << topk_groups * experts_per_group()
                               << "] (the experts in topk_groups=" << topk_groups << " groups of "
                               << experts_per_group() << ")");
  IFEC_CHECK(shared_experts >= 0, "MoeConfig.shared_experts must be >= 0, got " << shared_experts);
  IFEC_CHECK(std::isfinite(route_scale) && route_scale > 0,
             "MoeConfig.route_scale must be finite and > 0, got " << route_scale);
}

MoeConfig node_limited(const MoeConfig& cfg, int ranks, int gpus_per_node) {
  IFEC_CHECK(ranks >= 1 && gpus_per_node >= 1,
             "node-limited routing: " << ranks << " ranks, " << gpus_per_node << " GPUs per node (need >= 1 each)");
  const int64_t nodes = ranks / gpus_per_node;
  MoeConfig out = cfg;
  if (nodes > cfg.groups) {
    IFEC_CHECK(ranks % gpus_per_node == 0 && cfg.experts % nodes == 0,
               "node-limited routing: " << ranks << " ranks are not whole nodes of " << gpus_per_node
                                        << " GPUs, each holding an equal share of " << cfg.experts << " experts");
    out.groups = nodes;
  }
  out.validate();
  return out;
}

MoeWeights MoeWeights::to(at::ScalarType dtype) const {
  MoeWeights m;
  m.gate_weight = gate_weight.to(dtype);
  m.gate_bias = gate_bias.to(at::kFloat);
  m.w1 = w1.to(dtype);
  m.w3 = w3.to(dtype);
  m.w2 = w2.to(dtype);
  m.shared_w1 = shared_w1.to(dtype);
  m.shared_w3 = shared_w3.to(dtype);
  m.shared_w2 = shared_w2.to(dtype);
  return m;
}

MoeWeights make_weights(const MoeConfig& cfg, uint64_t seed, at::ScalarType dtype) {
  cfg.validate();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  // Draw order is part of the determinism contract: changing it changes every seed's weights.
  const auto normal = [&](std::vector<int64_t> shape, double std_dev) { return at::randn(shape, gen, f32) * std_dev; };
  const double h = static_cast<double>(cfg.hidden);
  MoeWeights w;
  w.gate_weight = normal({cfg.experts, cfg.hidden}, 1 / std::sqrt(h));
  w.gate_bias = normal({cfg.experts}, 0.01);
  w.w1 = normal({cfg.experts, cfg.inter, cfg.hidden}, 1 / std::sqrt(h));
  w.w3 = normal({cfg.experts, cfg.inter, cfg.hidden}, 1 / std::sqrt(h));
  w.w2 = normal({cfg.experts, cfg.hidden, cfg.inter}, 1 / std::sqrt(static_cast<double>(cfg.inter)));
  const int64_t si = cfg.shared_inter();
  w.shared_w1 = normal({si, cfg.hidden}, 1 / std::sqrt(h));
  w.shared_w3 = normal({si, cfg.hidden}, 1 / std::sqrt(h));
  w.shared_w2 = normal({cfg.hidden, si}, si > 0 ? 1 / std::sqrt(static_cast<double>(si)) : 0.0);
  return dtype == at::kFloat ? w : w.to(dtype);
}

at::Tensor draw_tokens(uint64_t seed, int64_t rows, int64_t hidden, at::ScalarType dtype, int64_t first,
                       int64_t count) {
  count = count < 0 ? rows - first : count;
  IFEC_CHECK(rows >= 1 && hidden >= 1 && first >= 0 && count >= 1 && first + count <= rows,
             "tokens: rows " << first << ".." << first + count - 1 << " of " << rows << " (hidden " << hidden << ")");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed * 7919 + 17);
  if (rows <= kDrawBlock) {  // one draw: the same tokens at every smaller point
    const at::Tensor all = at::randn({rows, hidden}, gen);
    return count == rows ? all.to(dtype) : all.narrow(0, first, count).to(dtype).clone();
  }
  // In blocks straight into the row type (EP 256 x 4096 tokens: 2 GB of bf16, not 4 GB of fp32 first).
  at::Tensor x = at::empty({count, hidden}, at::TensorOptions().dtype(dtype));
  for (int64_t at = 0; at < first + count; at += kDrawBlock) {
    const int64_t n = std::min(kDrawBlock, rows - at);
    const at::Tensor block = at::randn({n, hidden}, gen);
    const int64_t lo = std::max(at, first);
    const int64_t hi = std::min(at + n, first + count);
    if (lo < hi) {
      x.narrow(0, lo - first, hi - lo).copy_(block.narrow(0, lo - at, hi - lo));
    }
  }
  return x;
}

RoutingPlan route_scores(const at::Tensor& scores, const at::Tensor& bias, const MoeConfig& cfg) {
  cfg.validate();
  IFEC_CHECK(scores.defined() && scores.dim() == 2 && scores.size(1) == cfg.experts,
             "scores must be [tokens, experts=" << cfg.experts << "], got " << shape_str(scores));
  IFEC_CHECK(bias.defined() && bias.dim() == 1 && bias.size(0) == cfg.experts,
             "gate bias must be [experts=" << cfg.experts << "], got " << shape_str(bias));
  const int64_t t = scores.size(0);
  const at::Tensor original = scores.to(at::kFloat);
  // Out of place, so `original` keeps the unbiased scores: the bias steers selection but never the weights.
  at::Tensor choice = original + bias.to(at::kFloat);
  if (cfg.groups > 1) {
    at::Tensor grouped = choice.view({t, cfg.groups, cfg.experts_per_group()});
    const at::Tensor group_scores = std::get<0>(grouped.topk(2, -1)).sum(-1);
    const at::Tensor keep = std::get<1>(group_scores.topk(cfg.topk_groups, -1));
    const at::Tensor drop = at::ones({t, cfg.groups}, at::TensorOptions().dtype(at::kBool)).scatter_(1, keep, false);
    choice = grouped.masked_fill(drop.unsqueeze(-1), -std::numeric_limits<float>::infinity()).flatten(1);
  }
  RoutingPlan plan;
  plan.expert_ids = std::get<1>(choice.topk(cfg.topk, -1));
  at::Tensor wts = original.gather(1, plan.expert_ids);
  plan.weights = wts / wts.sum(-1, /*keepdim=*/true) * cfg.route_scale;
  return plan;
}

RoutingPlan gate(const at::Tensor& x, const MoeWeights& w, const MoeConfig& cfg) {
  cfg.validate();
  check_tokens(x, cfg, "x");
  IFEC_CHECK(
      w.gate_weight.defined() && w.gate_weight.sizes() == at::IntArrayRef({cfg.experts, cfg.hidden}),
      "MoeWeights.gate_weight must be [" << cfg.experts << ", " << cfg.hidden << "], got " << shape_str(w.gate_weight));
  const at::Tensor logits = x.to(at::kFloat).matmul(w.gate_weight.to(at::kFloat).t());
  return route_scores(logits.sigmoid(), w.gate_bias, cfg);
}

at::Tensor swiglu(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& w3) {
  IFEC_CHECK(x.dim() == 2 && w1.dim() == 2 && w3.sizes() == w1.sizes() && w2.dim() == 2 && w1.size(1) == x.size(1) &&
                 w2.size(0) == x.size(1) && w2.size(1) == w1.size(0),
             "swiglu shapes: x " << shape_str(x) << ", w1 " << shape_str(w1) << ", w3 " << shape_str(w3) << ", w2 "
                                 << shape_str(w2) << " (want x [n, h], w1/w3 [i, h], w2 [h, i])");
  return (at::silu(x.matmul(w1.t())) * x.matmul(w3.t())).matmul(w2.t());
}

at::Tensor shared_expert_forward(const at::Tensor& x, const MoeWeights& w) {
  if (w.shared_w1.size(0) == 0) return at::zeros({x.size(0), x.size(1)}, at::TensorOptions().dtype(at::kFloat));
  return swiglu(x, w.shared_w1, w.shared_w2, w.shared_w3).to(at::kFloat);
}

at::Tensor reference_forward(const at::Tensor& x, const MoeWeights& w, const MoeConfig& cfg) {
  return reference_forward(x, w, cfg, gate(x, w, cfg));
}

at::Tensor reference_forward(const at::Tensor& x, const MoeWeights& w, const MoeConfig& cfg, const RoutingPlan& plan,
                             const at::Tensor& expert_x) {
  cfg.validate();
  check_tokens(x, cfg, "x");
  const at::Tensor& xe = expert_x.defined() ? expert_x : x;
  IFEC_CHECK(xe.sizes() == x.sizes(), "expert_x must be the shape of x " << shape_str(x) << ", got " << shape_str(xe));
  check_weights(w, cfg);
  IFEC_CHECK(plan.expert_ids.sizes() == at::IntArrayRef({x.size(0), cfg.topk}) &&
                 plan.weights.sizes() == plan.expert_ids.sizes(),
             "plan must be [tokens=" << x.size(0) << ", topk=" << cfg.topk << "], got expert_ids "
                                     << shape_str(plan.expert_ids) << ", weights " << shape_str(plan.weights));
  // Mirrors DeepSeek-V3's MoE.forward: loop over experts, find (token, slot) pairs with tensor ops, accumulate.
  // Kept independent of the dispatch-list code path so the distributed test compares two implementations.
  at::Tensor y = at::zeros({x.size(0), cfg.hidden}, at::TensorOptions().dtype(at::kFloat));
  const at::Tensor ids = plan.expert_ids.to(at::kLong);
  const at::Tensor wts = plan.weights.to(at::kFloat).contiguous();
  for (int64_t e = 0; e < cfg.experts; ++e) {
    const at::Tensor where = ids.eq(e).nonzero();  // [n, 2]: (token, slot)
    if (where.size(0) == 0) continue;
    const at::Tensor tok = where.select(1, 0).contiguous();
    const at::Tensor slot = where.select(1, 1).contiguous();
    const at::Tensor out = swiglu(xe.index_select(0, tok), w.w1[e], w.w2[e], w.w3[e]).to(at::kFloat);
    y.index_add_(0, tok, out * wts.view(-1).index_select(0, tok * cfg.topk + slot).unsqueeze(1));
  }
  return shared_expert_forward(x, w) + y;
}

int64_t fp8_row_bytes(int64_t hidden) {
  IFEC_CHECK(hidden > 0 && hidden % kFp8Block == 0, "FP8 rows: hidden " << hidden << " is not a positive multiple of "
                                                                        << kFp8Block << " (one scale per block)");
  return hidden + 4 * (hidden / kFp8Block);
}

at::Tensor quantize_fp8_rows(const at::Tensor& x) {
  IFEC_CHECK(x.dim() == 2, "FP8 rows: x must be [n, hidden], got " << shape_str(x));
  const int64_t n = x.size(0);
  const int64_t hidden = x.size(1);
  const int64_t bytes = fp8_row_bytes(hidden);
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor out = at::empty({n, bytes}, at::TensorOptions().dtype(at::kByte));
  const float* src = xf.data_ptr<float>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  for (int64_t r = 0; r < n; ++r) {
    const float* row = src + r * hidden;
    uint8_t* q = dst + r * bytes;
    for (int64_t b = 0; b < hidden / kFp8Block; ++b) {
      float amax = 1e-4f;
      for (int64_t i = b * kFp8Block; i < (b + 1) * kFp8Block; ++i) {
        amax = std::max(amax, std::fabs(row[i]));
      }
      const float scale = amax / common::kFp8E4m3Max;
      for (int64_t i = b * kFp8Block; i < (b + 1) * kFp8Block; ++i) {
        q[i] = common::float_to_fp8_e4m3(row[i] / scale);
      }
      std::memcpy(q + hidden + 4 * b, &scale, 4);
    }
  }
  return out;
}

at::Tensor dequantize_fp8_rows(const at::Tensor& packed, int64_t hidden) {
  const int64_t bytes = fp8_row_bytes(hidden);
  IFEC_CHECK(packed.dim() == 2 && packed.size(1) == bytes && packed.scalar_type() == at::kByte,
             "FP8 rows: packed rows must be uint8 [n, " << bytes << "], got " << shape_str(packed));
  const at::Tensor p = packed.contiguous();
  const int64_t n = p.size(0);
  at::Tensor out = at::empty({n, hidden}, at::TensorOptions().dtype(at::kFloat));
  const uint8_t* src = p.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* q = src + r * bytes;
    for (int64_t b = 0; b < hidden / kFp8Block; ++b) {
      float scale = 0;
      std::memcpy(&scale, q + hidden + 4 * b, 4);
      for (int64_t i = b * kFp8Block; i < (b + 1) * kFp8Block; ++i) {
        dst[r * hidden + i] = common::fp8_e4m3_to_float(q[i]) * scale;
      }
    }
  }
  return out;
}

std::vector<int64_t> RouteTable::row(int64_t token) const {
  IFEC_CHECK(token >= 0 && token < tokens, "token " << token << " out of range [0, " << tokens << ")");
  return {expert_ids.begin() + token * topk, expert_ids.begin() + (token + 1) * topk};
}

RouteTable to_route_table(const RoutingPlan& plan) {
  IFEC_CHECK(plan.expert_ids.defined() && plan.expert_ids.dim() == 2 && plan.weights.defined() &&
                 plan.weights.sizes() == plan.expert_ids.sizes(),
             "plan must hold expert_ids and weights of one shape [T, topk], got "
                 << shape_str(plan.expert_ids) << " and " << shape_str(plan.weights));
  RouteTable t;
  t.tokens = plan.expert_ids.size(0);
  t.topk = plan.expert_ids.size(1);
  const at::Tensor ids = plan.expert_ids.to(at::kLong).contiguous();
  const at::Tensor wts = plan.weights.to(at::kFloat).contiguous();
  t.expert_ids.assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
  t.weights.assign(wts.data_ptr<float>(), wts.data_ptr<float>() + wts.numel());
  return t;
}

int owner_rank(int64_t expert, int64_t experts, int ranks) {
  IFEC_CHECK(ranks > 0, "ranks must be > 0, got " << ranks);
  IFEC_CHECK(experts > 0 && experts % ranks == 0,
             "experts=" << experts << " must be a positive multiple of ranks=" << ranks);
  IFEC_CHECK(expert >= 0 && expert < experts, "expert " << expert << " out of range [0, " << experts << ")");
  return static_cast<int>(expert / (experts / ranks));
}

std::vector<int> ranks_of_token(const std::vector<int64_t>& expert_ids, int64_t experts, int ranks) {
  std::vector<int> out;
  for (int64_t e : expert_ids) out.push_back(owner_rank(e, experts, ranks));
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

DispatchLists build_dispatch_lists(const RouteTable& table, int64_t experts, int ranks) {
  IFEC_CHECK(static_cast<int64_t>(table.expert_ids.size()) == table.tokens * table.topk &&
                 table.weights.size() == table.expert_ids.size(),
             "RouteTable sizes disagree: tokens=" << table.tokens << " topk=" << table.topk << " expert_ids="
                                                  << table.expert_ids.size() << " weights=" << table.weights.size());
  DispatchLists lists;
  lists.ranks = ranks;
  lists.tokens = table.tokens;
  lists.per_expert.resize(ranks > 0 ? ranks : 0);
  lists.per_rank.resize(ranks > 0 ? ranks : 0);
  for (int64_t t = 0; t < table.tokens; ++t) {
    // Slots in plan order; a rank's RankDelivery is opened by the token's first slot on that rank.
    std::map<int, RankDelivery> by_rank;
    for (int64_t k = 0; k < table.topk; ++k) {
      const int64_t e = table.expert(t, k);
      const int r = owner_rank(e, experts, ranks);
      lists.per_expert[r].push_back({t, k, e, table.weight(t, k)});
      RankDelivery& d = by_rank[r];
      d.token = t;
      d.slots.push_back(k);
      d.experts.push_back(e);
      d.weights.push_back(table.weight(t, k));
    }
    for (auto& [r, d] : by_rank) lists.per_rank[r].push_back(std::move(d));
  }
  return lists;
}

DispatchVolume dispatch_volume(const DispatchLists& lists, Granularity g, int64_t hidden, int64_t elem_bytes) {
  IFEC_CHECK(hidden > 0, "hidden must be > 0, got " << hidden);
  IFEC_CHECK(elem_bytes > 0, "elem_bytes must be > 0, got " << elem_bytes);
  DispatchVolume v;
  for (int r = 0; r < lists.ranks; ++r) {
    const int64_t n = g == Granularity::kPerExpert ? static_cast<int64_t>(lists.per_expert[r].size())
                                                   : static_cast<int64_t>(lists.per_rank[r].size());
    v.messages.push_back(n);
    v.bytes.push_back(n * hidden * elem_bytes);
    v.total_messages += n;
    v.total_bytes += n * hidden * elem_bytes;
  }
  return v;
}

std::vector<int64_t> traffic_matrix(const DispatchLists& lists, Granularity g, const std::vector<int>& token_src,
                                    int64_t hidden, int64_t elem_bytes) {
  IFEC_CHECK(static_cast<int64_t>(token_src.size()) == lists.tokens,
             "token_src has " << token_src.size() << " entries, the lists cover " << lists.tokens << " tokens");
  IFEC_CHECK(hidden > 0 && elem_bytes > 0, "hidden=" << hidden << " and elem_bytes=" << elem_bytes << " must be > 0");
  const int n = lists.ranks;
  std::vector<int64_t> m(static_cast<size_t>(n) * n, 0);
  for (int dst = 0; dst < n; ++dst) {
    for (int64_t t : rows_tokens(lists, g, dst)) {
      const int src = token_src[t];
      IFEC_CHECK(src >= 0 && src < n, "token_src[" << t << "]=" << src << " out of range [0, " << n << ")");
      m[static_cast<size_t>(src) * n + dst] += hidden * elem_bytes;
    }
  }
  return m;
}

at::Tensor gather_rows(const at::Tensor& x, const std::vector<ExpertDelivery>& recv) {
  std::vector<int64_t> rows;
  for (const auto& d : recv) rows.push_back(d.token);
  return x.index_select(0, long_tensor(rows));
}

at::Tensor gather_rows(const at::Tensor& x, const std::vector<RankDelivery>& recv) {
  std::vector<int64_t> rows;
  for (const auto& d : recv) rows.push_back(d.token);
  return x.index_select(0, long_tensor(rows));
}

at::Tensor expert_outputs_for_rank(const at::Tensor& recv_x, const std::vector<ExpertDelivery>& recv,
                                   const MoeWeights& w, const MoeConfig& cfg) {
  cfg.validate();
  check_tokens(recv_x, cfg, "recv_x");
  check_weights(w, cfg);
  IFEC_CHECK(recv_x.size(0) == static_cast<int64_t>(recv.size()),
             "recv_x has " << recv_x.size(0) << " rows for " << recv.size() << " deliveries");
  std::vector<Item> items;
  for (size_t i = 0; i < recv.size(); ++i) {
    items.push_back({static_cast<int64_t>(i), static_cast<int64_t>(i), recv[i].expert, recv[i].weight});
  }
  at::Tensor out = at::zeros({recv_x.size(0), cfg.hidden}, at::TensorOptions().dtype(at::kFloat));
  run_experts(recv_x, std::move(items), w, cfg, out);
  return out;
}

at::Tensor expert_outputs_for_rank(const at::Tensor& recv_x, const std::vector<RankDelivery>& recv, const MoeWeights& w,
                                   const MoeConfig& cfg) {
  cfg.validate();
  check_tokens(recv_x, cfg, "recv_x");
  check_weights(w, cfg);
  IFEC_CHECK(recv_x.size(0) == static_cast<int64_t>(recv.size()),
             "recv_x has " << recv_x.size(0) << " rows for " << recv.size() << " deliveries");
  std::vector<Item> items;
  for (size_t i = 0; i < recv.size(); ++i) {
    IFEC_CHECK(recv[i].experts.size() == recv[i].weights.size(), "delivery " << i << " has " << recv[i].experts.size()
                                                                             << " experts and "
                                                                             << recv[i].weights.size() << " weights");
    for (size_t j = 0; j < recv[i].experts.size(); ++j) {
      items.push_back({static_cast<int64_t>(i), static_cast<int64_t>(i), recv[i].experts[j], recv[i].weights[j]});
    }
  }
  at::Tensor out = at::zeros({recv_x.size(0), cfg.hidden}, at::TensorOptions().dtype(at::kFloat));
  run_experts(recv_x, std::move(items), w, cfg, out);
  return out;
}

at::Tensor combine(const std::vector<at::Tensor>& rank_outputs, const DispatchLists& lists, Granularity g,
                   int64_t hidden, const std::vector<int>& rank_order) {
  const int n = lists.ranks;
  IFEC_CHECK(static_cast<int>(rank_outputs.size()) == n,
             "combine got " << rank_outputs.size() << " rank outputs for " << n << " ranks");
  std::vector<int> order = rank_order;
  if (order.empty()) {
    for (int r = 0; r < n; ++r) order.push_back(r);
  }
  std::vector<int> seen(n, 0);
  for (int r : order) {
    IFEC_CHECK(r >= 0 && r < n && seen[r]++ == 0,
               "rank_order must be a permutation of 0.." << n - 1 << "; bad entry " << r);
  }
  IFEC_CHECK(static_cast<int>(order.size()) == n,
             "rank_order has " << order.size() << " entries for " << n << " ranks");
  at::Tensor y = at::zeros({lists.tokens, hidden}, at::TensorOptions().dtype(at::kFloat));
  for (int r : order) {
    const std::vector<int64_t> tokens = rows_tokens(lists, g, r);
    const at::Tensor& out = rank_outputs[r];
    IFEC_CHECK(
        out.defined() && out.dim() == 2 && out.size(0) == static_cast<int64_t>(tokens.size()) && out.size(1) == hidden,
        "rank " << r << " output must be [" << tokens.size() << ", " << hidden << "], got " << shape_str(out));
    if (tokens.empty()) continue;
    y.index_add_(0, long_tensor(tokens), out.to(at::kFloat));
  }
  return y;
}

double expert_compute_seconds(const std::vector<int64_t>& tokens_per_expert, const MoeConfig& cfg,
                              const GpuProfile& profile, double bytes_per_element) {
  check_cost_args(cfg, profile, bytes_per_element);
  return routed_experts_seconds(tokens_per_expert, cfg.hidden, cfg.inter, profile, bytes_per_element);
}

double expert_compute_seconds(int64_t pairs, int64_t active_experts, const MoeConfig& cfg, const GpuProfile& profile,
                              double bytes_per_element) {
  check_cost_args(cfg, profile, bytes_per_element);
  IFEC_CHECK(pairs >= 0, "pairs must be >= 0, got " << pairs);
  IFEC_CHECK(
      active_experts >= (pairs > 0 ? 1 : 0) && active_experts <= pairs,
      "active_experts=" << active_experts << " must be in [" << (pairs > 0 ? 1 : 0) << ", pairs=" << pairs << "]");
  return routed_experts_seconds(even_spread(pairs, active_experts), cfg.hidden, cfg.inter, profile, bytes_per_element);
}

double shared_expert_compute_seconds(int64_t tokens, const MoeConfig& cfg, const GpuProfile& profile,
                                     double bytes_per_element) {
  check_cost_args(cfg, profile, bytes_per_element);
  IFEC_CHECK(tokens >= 0, "tokens must be >= 0, got " << tokens);
  if (tokens == 0 || cfg.shared_inter() == 0) return 0;
  return ffn_chain_seconds(tokens, cfg.hidden, cfg.shared_inter(), profile, bytes_per_element);
}

double two_micro_batch_time(const double dispatch[2], const double experts[2], const double combine[2]) {
  const double d1 = dispatch[0];                    // comm: D1
  const double d2 = d1 + dispatch[1];               // comm: D2 right after
  const double e1 = d1 + experts[0];                // compute: E1 once D1 is in
  const double c1 = std::max(d2, e1) + combine[0];  // comm: C1 after D2 (the stream) and E1 (its input)
  const double e2 = std::max(e1, d2) + experts[1];  // compute: E2 after E1 (the stream) and D2 (its input)
  return std::max(c1, e2) + combine[1];             // comm: C2 after C1 and E2
}

std::vector<int64_t> tokens_per_expert(const RouteTable& table, int64_t experts) {
  IFEC_CHECK(experts > 0, "experts must be > 0, got " << experts);
  std::vector<int64_t> counts(experts, 0);
  for (int64_t e : table.expert_ids) {
    IFEC_CHECK(e >= 0 && e < experts, "expert id " << e << " out of range [0, " << experts << ")");
    ++counts[e];
  }
  return counts;
}

}  // namespace ifec::workloads
