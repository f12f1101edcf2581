// MoE layer math: gate on hand-set scores, validation messages, sharding and dispatch lists on a hand plan, the
// reference against a naive per-token loop, dispatch -> per-rank experts -> combine against the reference, cost model.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "ifec/common/checks.h"
#include "ifec/workloads/moe.h"

using namespace ifec::workloads;
using ifec::common::Error;

namespace {

at::Tensor floats(std::vector<float> v, std::vector<int64_t> shape) {
  return at::from_blob(v.data(), shape, at::kFloat).clone();
}

// max |a - b| / max |b|: one number per comparison, insensitive to where the output happens to be near zero.
double rel_err(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor fa = a.to(at::kFloat);
  const at::Tensor fb = b.to(at::kFloat);
  return (fa - fb).abs().max().item<double>() / fb.abs().max().item<double>();
}

at::Tensor random_tokens(int64_t t, int64_t hidden, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn({t, hidden}, gen, at::TensorOptions().dtype(at::kFloat));
}

// Small layer with DeepSeek-V3's routing shape (256 experts, 8 groups, top-4 groups, top-8) but tiny experts.
MoeConfig small_config() {
  MoeConfig c;
  c.hidden = 64;
  c.inter = 32;
  return c;
}

// 16 experts in 4 groups of 4, top-2 groups, top-4 experts.
MoeConfig tiny_config() {
  MoeConfig c;
  c.hidden = 8;
  c.inter = 4;
  c.experts = 16;
  c.groups = 4;
  c.topk_groups = 2;
  c.topk = 4;
  return c;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

std::vector<int64_t> ids_row(const RoutingPlan& p, int64_t t) { return to_route_table(p).row(t); }

// Hand-set scores: group top-2 sums G0 1.10, G1 1.15, G2 0.75, G3 0.74 (zero bias), so G1 and G0 are kept and
// expert 12 (0.70, the third-best score overall) is excluded because its group is not.
const std::vector<float> kHandScores = {0.95f, 0.05f, 0.10f, 0.15f,   // G0
                                        0.60f, 0.55f, 0.50f, 0.20f,   // G1
                                        0.30f, 0.35f, 0.40f, 0.25f,   // G2
                                        0.70f, 0.02f, 0.03f, 0.04f};  // G3

// One test process per TEST costs ~1 s of LibTorch start-up under ctest, so related checks share a TEST.
TEST(MoeGate, HandSetScoresPickKnownGroupsAndExperts) {
  const MoeConfig cfg = tiny_config();
  const RoutingPlan p = route_scores(floats(kHandScores, {1, 16}), at::zeros({16}), cfg);
  EXPECT_EQ(ids_row(p, 0), (std::vector<int64_t>{0, 4, 5, 6}));
  const RouteTable t = to_route_table(p);
  const double sum = 0.95 + 0.60 + 0.55 + 0.50;
  EXPECT_NEAR(t.weight(0, 0), 0.95 / sum * 2.5, 1e-6);
  EXPECT_NEAR(t.weight(0, 1), 0.60 / sum * 2.5, 1e-6);
  EXPECT_NEAR(t.weight(0, 2), 0.55 / sum * 2.5, 1e-6);
  EXPECT_NEAR(t.weight(0, 3), 0.50 / sum * 2.5, 1e-6);

  // The bias steers selection but not the weights: +0.5 on expert 13 lifts G3 to 0.70 + 0.52 = 1.22 (top group), G1
  // stays second, G0 drops out. Biased choice order: 12 (0.70), 4 (0.60), 5 (0.55), 13 (0.52); the weights still use
  // the unbiased 0.02 of expert 13.
  std::vector<float> bias(16, 0.0f);
  bias[13] = 0.5f;
  const RoutingPlan pb = route_scores(floats(kHandScores, {1, 16}), floats(bias, {16}), cfg);
  EXPECT_EQ(ids_row(pb, 0), (std::vector<int64_t>{12, 4, 5, 13}));
  const RouteTable tb = to_route_table(pb);
  const double sum_b = 0.70 + 0.60 + 0.55 + 0.02;
  EXPECT_NEAR(tb.weight(0, 0), 0.70 / sum_b * 2.5, 1e-6);
  EXPECT_NEAR(tb.weight(0, 3), 0.02 / sum_b * 2.5, 1e-6);
}

// Plain-loop gate, written from the DeepSeek-V3 description, for random inputs.
void naive_route(const std::vector<float>& s, const std::vector<float>& bias, const MoeConfig& c,
                 std::vector<int64_t>& ids, std::vector<double>& w) {
  const int64_t epg = c.experts / c.groups;
  std::vector<double> b(c.experts);
  for (int64_t e = 0; e < c.experts; ++e) b[e] = static_cast<double>(s[e]) + bias[e];
  std::vector<std::pair<double, int64_t>> gs;
  for (int64_t g = 0; g < c.groups; ++g) {
    std::vector<double> v(b.begin() + g * epg, b.begin() + (g + 1) * epg);
    std::sort(v.rbegin(), v.rend());
    gs.push_back({v[0] + v[1], g});
  }
  std::sort(gs.rbegin(), gs.rend());
  std::vector<std::pair<double, int64_t>> cand;
  for (int64_t i = 0; i < c.topk_groups; ++i) {
    for (int64_t e = gs[i].second * epg; e < (gs[i].second + 1) * epg; ++e) cand.push_back({b[e], e});
  }
  std::sort(cand.rbegin(), cand.rend());
  ids.clear();
  w.clear();
  double sum = 0;
  for (int64_t k = 0; k < c.topk; ++k) {
    ids.push_back(cand[k].second);
    w.push_back(s[cand[k].second]);
    sum += s[cand[k].second];
  }
  for (double& x : w) x = x / sum * c.route_scale;
}

TEST(MoeGate, RandomTokensMatchPlainLoopsAndInvariants) {
  const MoeConfig cfg = small_config();
  const MoeWeights w = make_weights(cfg, 7);
  const at::Tensor x = random_tokens(64, cfg.hidden, 8);
  const RouteTable t = to_route_table(gate(x, w, cfg));
  const at::Tensor scores = x.matmul(w.gate_weight.t()).sigmoid().contiguous();
  const std::vector<float> bias(w.gate_bias.data_ptr<float>(), w.gate_bias.data_ptr<float>() + cfg.experts);
  ASSERT_EQ(t.tokens, 64);
  ASSERT_EQ(t.topk, 8);
  for (int64_t i = 0; i < t.tokens; ++i) {
    const std::vector<float> s(scores[i].data_ptr<float>(), scores[i].data_ptr<float>() + cfg.experts);
    std::vector<int64_t> ids;
    std::vector<double> wt;
    naive_route(s, bias, cfg, ids, wt);
    EXPECT_EQ(t.row(i), ids) << "token " << i;
    double sum = 0;
    std::set<int64_t> groups;
    for (int64_t k = 0; k < t.topk; ++k) {
      EXPECT_NEAR(t.weight(i, k), wt[k], 1e-5);
      sum += t.weight(i, k);
      groups.insert(t.expert(i, k) / cfg.experts_per_group());
    }
    EXPECT_NEAR(sum, cfg.route_scale, 1e-5);
    EXPECT_LE(static_cast<int64_t>(groups.size()), cfg.topk_groups) << "token " << i;
    const std::vector<int64_t> row = t.row(i);
    EXPECT_EQ(std::set<int64_t>(row.begin(), row.end()).size(), row.size()) << "duplicate expert, token " << i;
  }
}

TEST(MoeConfig, DefaultsAreDeepSeekV3AndErrorsNameTheValue) {
  const MoeConfig c;
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.hidden, 7168);
  EXPECT_EQ(c.inter, 2048);
  EXPECT_EQ(c.experts, 256);
  EXPECT_EQ(c.experts_per_group(), 32);
  EXPECT_EQ(c.shared_inter(), 2048);

  const auto err = [](auto mutate) {
    MoeConfig c;
    mutate(c);
    return error_of([&] { c.validate(); });
  };
  EXPECT_NE(err([](MoeConfig& c) { c.experts = 250; }).find("experts=250"), std::string::npos);
  EXPECT_NE(err([](MoeConfig& c) { c.topk_groups = 9; }).find("topk_groups=9"), std::string::npos);
  EXPECT_NE(err([](MoeConfig& c) { c.topk = 129; }).find("topk=129"), std::string::npos);
  EXPECT_NE(err([](MoeConfig& c) { c.topk = 0; }).find("topk=0"), std::string::npos);
  EXPECT_NE(err([](MoeConfig& c) { c.hidden = 0; }).find("hidden must be > 0, got 0"), std::string::npos);
  EXPECT_NE(err([](MoeConfig& c) { c.groups = 256; }).find("groups=256"), std::string::npos);
  EXPECT_NE(err([](MoeConfig& c) { c.route_scale = -1; }).find("route_scale"), std::string::npos);
  EXPECT_NE(err([](MoeConfig& c) { c.shared_experts = -1; }).find("shared_experts"), std::string::npos);
  const MoeConfig cfg = tiny_config();
  EXPECT_NE(error_of([&] {
              route_scores(at::zeros({2, 15}), at::zeros({16}), cfg);
            }).find("experts=16"),
            std::string::npos);
}

// Node-limited routing at EP 256 (32 nodes of 8 GPUs, one expert per GPU): the gate's groups are the nodes, so a
// token's ranks lie in at most 4 nodes; at EP 64 (a group is a node already) nothing changes.
TEST(MoeConfig, NodeLimitedGroupsAreTheNodes) {
  const MoeConfig cfg = small_config();
  const MoeConfig at64 = node_limited(cfg, 64, 8);
  EXPECT_EQ(at64.groups, 8);
  EXPECT_EQ(at64.topk_groups, 4);
  const MoeConfig at256 = node_limited(cfg, 256, 8);
  EXPECT_EQ(at256.groups, 32);
  EXPECT_EQ(at256.topk_groups, 4);
  const MoeWeights w = make_weights(at256, 7);
  const RouteTable t = to_route_table(gate(random_tokens(512, cfg.hidden, 9), w, at256));
  size_t most = 0;
  for (int64_t i = 0; i < t.tokens; ++i) {
    std::set<int> nodes;
    for (int r : ranks_of_token(t.row(i), at256.experts, 256)) {
      nodes.insert(r / 8);
    }
    EXPECT_LE(nodes.size(), 4u) << "token " << i;
    most = std::max(most, nodes.size());
  }
  EXPECT_EQ(most, 4u) << "some token uses all 4 of its nodes";
  EXPECT_NE(error_of([&] { node_limited(cfg, 100, 8); }).find("100 ranks are not whole nodes of 8"), std::string::npos);
}

TEST(MoeWeights, DeterministicScaledAndCastable) {
  const MoeConfig cfg = small_config();
  const MoeWeights a = make_weights(cfg, 1);
  const MoeWeights b = make_weights(cfg, 1);
  const MoeWeights c = make_weights(cfg, 2);
  EXPECT_TRUE(a.w1.equal(b.w1));
  EXPECT_TRUE(a.shared_w2.equal(b.shared_w2));
  EXPECT_FALSE(a.w1.equal(c.w1));
  EXPECT_EQ(a.w2.sizes(), at::IntArrayRef({256, 64, 32}));
  EXPECT_EQ(a.shared_w1.sizes(), at::IntArrayRef({32, 64}));
  // N(0, 1/fan_in): the expert output of N(0, 1) inputs stays O(1).
  EXPECT_NEAR(a.w1.std().item<double>() * std::sqrt(64.0), 1.0, 0.02);
  const MoeWeights h = make_weights(cfg, 1, at::kBFloat16);
  EXPECT_EQ(h.w1.scalar_type(), at::kBFloat16);
  EXPECT_EQ(h.gate_bias.scalar_type(), at::kFloat);
  EXPECT_TRUE(h.w2.equal(a.w2.to(at::kBFloat16)));
  const at::Tensor y = reference_forward(random_tokens(32, cfg.hidden, 3), a, cfg);
  const double rms = y.pow(2).mean().sqrt().item<double>();
  EXPECT_GT(rms, 0.1);
  EXPECT_LT(rms, 10.0);
}

TEST(MoeExpert, SwigluMatchesHandComputation) {
  // x = [1, 2]; w1 = [[1, 0], [0, 1]], w3 = [[1, 1], [0, -1]], w2 = [[1, 0], [2, 1]].
  // h = silu([1, 2]) * [3, -2] = [0.731059 * 3, 1.761594 * -2]; y = w2 h = [h0, 2 h0 + h1].
  const at::Tensor y = swiglu(floats({1, 2}, {1, 2}), floats({1, 0, 0, 1}, {2, 2}), floats({1, 0, 2, 1}, {2, 2}),
                              floats({1, 1, 0, -1}, {2, 2}));
  const double silu1 = 1 / (1 + std::exp(-1.0));
  const double silu2 = 2 / (1 + std::exp(-2.0));
  const double h0 = silu1 * 3;
  const double h1 = silu2 * -2;
  EXPECT_NEAR(y[0][0].item<double>(), h0, 1e-6);
  EXPECT_NEAR(y[0][1].item<double>(), 2 * h0 + h1, 1e-6);
  EXPECT_NE(error_of([] {
              swiglu(at::zeros({1, 3}), at::zeros({2, 2}), at::zeros({2, 2}), at::zeros({2, 2}));
            }).find("swiglu shapes"),
            std::string::npos);
}

TEST(MoeReference, MatchesPerTokenLoop) {
  const MoeConfig cfg = tiny_config();
  const MoeWeights w = make_weights(cfg, 11);
  const at::Tensor x = random_tokens(6, cfg.hidden, 12);
  const RoutingPlan plan = gate(x, w, cfg);
  const RouteTable t = to_route_table(plan);
  const at::Tensor y = reference_forward(x, w, cfg, plan);
  for (int64_t i = 0; i < t.tokens; ++i) {
    const at::Tensor xi = x.narrow(0, i, 1);
    at::Tensor want = swiglu(xi, w.shared_w1, w.shared_w2, w.shared_w3);
    for (int64_t k = 0; k < t.topk; ++k) {
      const int64_t e = t.expert(i, k);
      want = want + swiglu(xi, w.w1[e], w.w2[e], w.w3[e]) * t.weight(i, k);
    }
    EXPECT_LT(rel_err(y.narrow(0, i, 1), want), 1e-5) << "token " << i;
  }
  EXPECT_TRUE(reference_forward(x, w, cfg).equal(y));
}

// Hand plan: 8 experts over 4 ranks (2 each), 2 tokens, topk 3.
//   token 0 -> experts 5, 1, 4 (ranks 2, 0, 2); token 1 -> experts 0, 7, 1 (ranks 0, 3, 0).
RouteTable hand_table() {
  RouteTable t;
  t.tokens = 2;
  t.topk = 3;
  t.expert_ids = {5, 1, 4, 0, 7, 1};
  t.weights = {0.5f, 0.3f, 0.2f, 0.6f, 0.25f, 0.15f};
  return t;
}

TEST(MoeSharding, OwnerRankRanksOfTokenAndDispatchListsOnHandPlan) {
  EXPECT_EQ(owner_rank(0, 256, 8), 0);
  EXPECT_EQ(owner_rank(31, 256, 8), 0);
  EXPECT_EQ(owner_rank(32, 256, 8), 1);
  EXPECT_EQ(owner_rank(255, 256, 16), 15);
  EXPECT_EQ(owner_rank(255, 256, 1), 0);
  EXPECT_NE(error_of([] { owner_rank(3, 256, 6); }).find("ranks=6"), std::string::npos);
  EXPECT_NE(error_of([] { owner_rank(256, 256, 8); }).find("expert 256"), std::string::npos);
  EXPECT_EQ(ranks_of_token({3, 40, 33, 255, 0}, 256, 8), (std::vector<int>{0, 1, 7}));

  const DispatchLists l = build_dispatch_lists(hand_table(), 8, 4);
  ASSERT_EQ(l.per_expert.size(), 4u);
  const auto key = [](const std::vector<ExpertDelivery>& v) {
    std::vector<std::vector<int64_t>> out;
    for (const auto& d : v) out.push_back({d.token, d.slot, d.expert});
    return out;
  };
  using V = std::vector<std::vector<int64_t>>;
  EXPECT_EQ(key(l.per_expert[0]), (V{{0, 1, 1}, {1, 0, 0}, {1, 2, 1}}));
  EXPECT_EQ(key(l.per_expert[1]), V{});
  EXPECT_EQ(key(l.per_expert[2]), (V{{0, 0, 5}, {0, 2, 4}}));
  EXPECT_EQ(key(l.per_expert[3]), (V{{1, 1, 7}}));
  EXPECT_FLOAT_EQ(l.per_expert[3][0].weight, 0.25f);

  ASSERT_EQ(l.per_rank[0].size(), 2u);
  EXPECT_EQ(l.per_rank[0][0].token, 0);
  EXPECT_EQ(l.per_rank[0][0].experts, (std::vector<int64_t>{1}));
  EXPECT_EQ(l.per_rank[0][1].token, 1);
  EXPECT_EQ(l.per_rank[0][1].slots, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(l.per_rank[0][1].experts, (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(l.per_rank[1].empty());
  ASSERT_EQ(l.per_rank[2].size(), 1u);
  EXPECT_EQ(l.per_rank[2][0].experts, (std::vector<int64_t>{5, 4}));
  EXPECT_EQ(l.per_rank[2][0].weights, (std::vector<float>{0.5f, 0.2f}));
  ASSERT_EQ(l.per_rank[3].size(), 1u);
  EXPECT_EQ(l.per_rank[3][0].token, 1);

  // hidden 4, 2-byte elements: 8 bytes per row.
  const DispatchVolume ve = dispatch_volume(l, Granularity::kPerExpert, 4, 2);
  EXPECT_EQ(ve.messages, (std::vector<int64_t>{3, 0, 2, 1}));
  EXPECT_EQ(ve.bytes, (std::vector<int64_t>{24, 0, 16, 8}));
  EXPECT_EQ(ve.total_messages, 6);
  EXPECT_EQ(ve.total_bytes, 48);
  const DispatchVolume vr = dispatch_volume(l, Granularity::kPerRank, 4, 2);
  EXPECT_EQ(vr.messages, (std::vector<int64_t>{2, 0, 1, 1}));
  EXPECT_EQ(vr.total_bytes, 32);

  // Token 0 lives on rank 0, token 1 on rank 3.
  const std::vector<int64_t> me = traffic_matrix(l, Granularity::kPerExpert, {0, 3}, 4, 2);
  std::vector<int64_t> want(16, 0);
  want[0 * 4 + 0] = 8;   // t0 -> expert 1
  want[0 * 4 + 2] = 16;  // t0 -> experts 5, 4
  want[3 * 4 + 0] = 16;  // t1 -> experts 0, 1
  want[3 * 4 + 3] = 8;   // t1 -> expert 7
  EXPECT_EQ(me, want);
  const std::vector<int64_t> mr = traffic_matrix(l, Granularity::kPerRank, {0, 3}, 4, 2);
  EXPECT_EQ(mr[0 * 4 + 2], 8);
  EXPECT_EQ(mr[3 * 4 + 0], 8);
  EXPECT_EQ(std::accumulate(mr.begin(), mr.end(), int64_t{0}), 32);

  const std::vector<int64_t> hist = tokens_per_expert(hand_table(), 8);
  EXPECT_EQ(hist, (std::vector<int64_t>{1, 2, 0, 0, 1, 1, 0, 1}));
}

// dispatch -> per-rank experts -> combine, in process, for one granularity; the layer output.
at::Tensor distributed_forward(const at::Tensor& x, const MoeWeights& w, const MoeConfig& cfg, const RoutingPlan& plan,
                               int ranks, Granularity g, const std::vector<int>& order) {
  const DispatchLists lists = build_dispatch_lists(to_route_table(plan), cfg.experts, ranks);
  std::vector<at::Tensor> outs;
  for (int r = 0; r < ranks; ++r) {
    if (g == Granularity::kPerExpert) {
      outs.push_back(expert_outputs_for_rank(gather_rows(x, lists.per_expert[r]), lists.per_expert[r], w, cfg));
    } else {
      outs.push_back(expert_outputs_for_rank(gather_rows(x, lists.per_rank[r]), lists.per_rank[r], w, cfg));
    }
  }
  return shared_expert_forward(x, w) + combine(outs, lists, g, cfg.hidden, order);
}

std::vector<int> shuffled_ranks(int ranks, uint32_t seed) {
  std::vector<int> order(ranks);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

// Tolerances, as max|err| / max|ref|:
//   fp32: 1e-5. The composition only reorders fp32 sums (rank order, per-rank reduction), so the difference is a
//         few ulps of the output (1.3e-7 observed).
//   bf16: 2e-2 against the fp32 reference on the same values (bf16 inputs and weights upcast). Experts run in
//         bf16 (each GEMM output and the SwiGLU product rounded to 8 mantissa bits, ~4e-3 each; 4.1e-3 observed);
//         routing is identical because the gate always runs in fp32. Against the bf16 reference: 1e-5, as for fp32
//         (7e-8 observed), since each expert sees the same bf16 rows either way.
TEST(MoeDistributed, ComposeEqualsReferenceFp32AndCombineOrderIsReproducible) {
  const MoeConfig cfg = small_config();
  const MoeWeights w = make_weights(cfg, 21);
  const at::Tensor x = random_tokens(96, cfg.hidden, 22);
  const RoutingPlan plan = gate(x, w, cfg);
  const at::Tensor ref = reference_forward(x, w, cfg, plan);
  for (int ranks : {1, 8, 16}) {
    for (Granularity g : {Granularity::kPerExpert, Granularity::kPerRank}) {
      const at::Tensor y = distributed_forward(x, w, cfg, plan, ranks, g, shuffled_ranks(ranks, ranks));
      EXPECT_LT(rel_err(y, ref), 1e-5) << "ranks " << ranks << " granularity " << static_cast<int>(g);
    }
  }

  // One expert per rank and 2 tokens: most ranks receive nothing and must still compose.
  const at::Tensor x2 = x.narrow(0, 0, 2);
  const RoutingPlan plan2 = gate(x2, w, cfg);
  EXPECT_LT(rel_err(distributed_forward(x2, w, cfg, plan2, 256, Granularity::kPerRank, {}),
                    reference_forward(x2, w, cfg, plan2)),
            1e-5);

  // A given combine order always gives the same bits; a bad order is named.
  const std::vector<int> order = shuffled_ranks(8, 5);
  const at::Tensor a = distributed_forward(x, w, cfg, plan, 8, Granularity::kPerExpert, order);
  const at::Tensor b = distributed_forward(x, w, cfg, plan, 8, Granularity::kPerExpert, order);
  EXPECT_TRUE(a.equal(b));
  const DispatchLists l = build_dispatch_lists(to_route_table(plan), cfg.experts, 8);
  std::vector<at::Tensor> outs(8);
  EXPECT_NE(error_of([&] {
              combine(outs, l, Granularity::kPerExpert, cfg.hidden, {0, 1, 2, 3, 4, 5, 6, 6});
            }).find("bad entry 6"),
            std::string::npos);
}

TEST(MoeDistributed, ComposeEqualsReferenceBf16) {
  const MoeConfig cfg = small_config();
  const MoeWeights wb = make_weights(cfg, 31, at::kBFloat16);
  const at::Tensor xb = random_tokens(96, cfg.hidden, 32).to(at::kBFloat16);
  const MoeWeights wf = wb.to(at::kFloat);
  const at::Tensor xf = xb.to(at::kFloat);
  const RoutingPlan plan_b = gate(xb, wb, cfg);
  const RoutingPlan plan_f = gate(xf, wf, cfg);
  ASSERT_TRUE(plan_b.expert_ids.equal(plan_f.expert_ids));
  const at::Tensor ref = reference_forward(xf, wf, cfg, plan_f);
  const at::Tensor ref_b = reference_forward(xb, wb, cfg, plan_b);
  EXPECT_LT(rel_err(ref_b, ref), 2e-2);
  for (int ranks : {1, 8, 16}) {
    for (Granularity g : {Granularity::kPerExpert, Granularity::kPerRank}) {
      const at::Tensor y = distributed_forward(xb, wb, cfg, plan_b, ranks, g, {});
      EXPECT_LT(rel_err(y, ref), 2e-2) << "ranks " << ranks << " granularity " << static_cast<int>(g);
      // Against the bf16 reference only the fp32 accumulation order differs.
      EXPECT_LT(rel_err(y, ref_b), 1e-5) << "ranks " << ranks << " granularity " << static_cast<int>(g);
    }
  }
}

// FP8 rows against the definition: scale = block amax / 448, each element the nearest E4M3 value of x / scale
// (relative error at most 2^-4 for normals, 2^-10 x scale below them), the block maximum exact.
TEST(MoeFp8, RowsQuantiseAndDequantiseWithinE4m3Rounding) {
  EXPECT_EQ(fp8_row_bytes(7168), 7168 + 56 * 4);
  EXPECT_THROW(fp8_row_bytes(100), ifec::common::Error);
  const int64_t rows = 5, H = 384;
  const float mags[rows] = {1e-3f, 0.1f, 1.0f, 30.0f, 1e3f};  // row r's values are N(0, 1) x mags[r]
  std::mt19937 gen(11);
  std::normal_distribution<float> nd;
  std::vector<float> xs(rows * H);
  for (size_t i = 0; i < xs.size(); ++i) {
    xs[i] = nd(gen) * mags[i / H];
  }
  const at::Tensor x = at::from_blob(xs.data(), {rows, H}, at::kFloat).clone();
  const at::Tensor q = quantize_fp8_rows(x);
  ASSERT_EQ(q.sizes(), at::IntArrayRef({rows, H + 12}));
  const at::Tensor dq = dequantize_fp8_rows(q, H).contiguous();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < 3; ++b) {
      float amax = 0;
      for (int64_t i = b * 128; i < (b + 1) * 128; ++i) {
        amax = std::max(amax, std::fabs(xs[r * H + i]));
      }
      float scale = 0;
      std::memcpy(&scale, q.data_ptr<uint8_t>() + r * (H + 12) + H + 4 * b, 4);
      EXPECT_FLOAT_EQ(scale, std::max(amax, 1e-4f) / 448.0f);
      for (int64_t i = b * 128; i < (b + 1) * 128; ++i) {
        const float v = xs[r * H + i];
        const float got = dq.data_ptr<float>()[r * H + i];
        EXPECT_LE(std::fabs(got - v), std::max(std::fabs(v) / 16, scale / 1024) * 1.0001f)
            << "row " << r << " element " << i << ": " << v << " -> " << got;
        if (std::fabs(v) == amax) {
          EXPECT_NEAR(std::fabs(got), amax, amax * 1e-6) << "the block maximum maps to 448 exactly";
        }
      }
    }
  }
}

TEST(MoeCost, TwoMicroBatchScheduleOverlapsOnlyCommunicationWithCompute) {
  // Compute-bound: D1 + E1 + E2 + C2 (dispatch 2 and combine 1 hide under the experts).
  const double d[2] = {10, 10}, e[2] = {50, 50}, c[2] = {10, 10};
  EXPECT_DOUBLE_EQ(two_micro_batch_time(d, e, c), 10 + 50 + 50 + 10);
  // Communication-bound: the comm stream never idles: D1 + D2 + C1 + C2 when the experts fit in between.
  const double d2[2] = {40, 40}, e2[2] = {5, 5}, c2[2] = {30, 30};
  EXPECT_DOUBLE_EQ(two_micro_batch_time(d2, e2, c2), 40 + 40 + 30 + 30);
  // Mixed, by hand: D1 [0,20], D2 [20,50], E1 [20,60], C1 [60,85], E2 [60,70], C2 [85,100].
  const double d3[2] = {20, 30}, e3[2] = {40, 10}, c3[2] = {25, 15};
  EXPECT_DOUBLE_EQ(two_micro_batch_time(d3, e3, c3), 100);
  // Never worse than running the halves back to back, never better than the busier stream.
  EXPECT_LE(two_micro_batch_time(d3, e3, c3), 20 + 30 + 40 + 10 + 25 + 15);
  EXPECT_GE(two_micro_batch_time(d3, e3, c3), std::max(20 + 30 + 25 + 15, 40 + 10));
}

TEST(MoeCost, TheMoeConfigWrappersAreTheGpuModel) {
  const MoeConfig cfg;  // DeepSeek-V3: h 7168, i 2048
  const GpuProfile p;   // the fitted H100 profile (gpu_model.h; its own tests check it against measurements)
  // A rank's histogram, zeros included, costs what its non-empty experts do under the profile's kernel.
  EXPECT_DOUBLE_EQ(expert_compute_seconds(std::vector<int64_t>{100, 0, 50}, cfg, p, 2),
                   routed_experts_seconds({100, 50}, 7168, 2048, p, 2));
  // Totals only: the pairs spread evenly.
  EXPECT_DOUBLE_EQ(expert_compute_seconds(32 * 4096, 32, cfg, p, 2),
                   routed_experts_seconds(std::vector<int64_t>(32, 4096), 7168, 2048, p, 2));
  // Compute bound at 4096 rows per expert: within the smooth max (and the partial last wave) of the tensor-core time.
  const double tc = 3 * 2.0 * 32 * 4096 * 7168 * 2048 / (989e12 * p.mma_fraction);
  EXPECT_GT(expert_compute_seconds(32 * 4096, 32, cfg, p, 2), tc);
  EXPECT_LT(expert_compute_seconds(32 * 4096, 32, cfg, p, 2), 1.1 * tc);
  EXPECT_EQ(expert_compute_seconds(std::vector<int64_t>(32, 0), cfg, p, 2), 0.0);
  EXPECT_DOUBLE_EQ(shared_expert_compute_seconds(4096, cfg, p, 2), ffn_chain_seconds(4096, 7168, 2048, p, 2));
  GpuProfile bad;
  bad.mma_fraction = 1.5;
  EXPECT_NE(error_of([&] { expert_compute_seconds(10, 1, cfg, bad, 2); }).find("mma_fraction"), std::string::npos);
  EXPECT_NE(error_of([&] { expert_compute_seconds(10, 11, cfg, p, 2); }).find("active_experts=11"), std::string::npos);
}

}  // namespace

namespace ifec::workloads {
namespace {

// A live rank draws its own block of the tokens the simulator draws for every rank: the same values, in one draw
// and past kDrawBlock rows (drawn in blocks), and a range outside the rows is an error naming it.
TEST(MoeTokens, ARanksBlockIsItsSliceOfEveryRanksTokens) {
  const at::Tensor all = draw_tokens(7, 4 * 32, 64, at::kBFloat16);
  ASSERT_EQ(all.sizes(), (std::vector<int64_t>{128, 64}));
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_TRUE(at::equal(draw_tokens(7, 128, 64, at::kBFloat16, rank * 32, 32), all.narrow(0, rank * 32, 32)));
  }
  EXPECT_FALSE(at::equal(draw_tokens(8, 128, 64, at::kBFloat16, 0, 32), all.narrow(0, 0, 32))) << "the seed counts";
  const int64_t rows = kDrawBlock + 100;  // blocked: one column keeps it small
  const at::Tensor big = draw_tokens(3, rows, 1, at::kFloat);
  EXPECT_TRUE(at::equal(draw_tokens(3, rows, 1, at::kFloat, kDrawBlock - 10, 50), big.narrow(0, kDrawBlock - 10, 50)));
  EXPECT_TRUE(at::equal(draw_tokens(3, rows, 1, at::kFloat, rows - 5, -1), big.narrow(0, rows - 5, 5)));
  EXPECT_NEAR(big.mean().item<double>(), 0.0, 0.01);
  EXPECT_THROW(draw_tokens(3, 128, 64, at::kFloat, 100, 29), common::Error);
}

}  // namespace
}  // namespace ifec::workloads
