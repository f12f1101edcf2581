// The MoE layer through the simulated fabric equals the single-process LibTorch reference in every variant (per
// expert, per rank, IFEC multicast + in-switch combine), and the variants move the bytes they should.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <string>
#include <utility>
#include <vector>

#include "ifec/common/checks.h"
#include "ifec/testbed/moe_fabric.h"

using namespace ifec;
using testbed::MoeVariant;

namespace {

workloads::MoeConfig small_config() {
  workloads::MoeConfig cfg;
  cfg.hidden = 64;  // the real 7168 x 2048 experts do not fit a CPU test; routing is the real 256 / top-8
  cfg.inter = 32;
  return cfg;
}

double max_rel_error(const at::Tensor& got, const at::Tensor& ref) {
  return ((got - ref).abs().max() / ref.abs().max()).item<double>();
}

}  // namespace

class MoeFabric : public testing::TestWithParam<std::tuple<MoeVariant, int, bool>> {};

TEST_P(MoeFabric, EqualsTheReference) {
  const auto [variant, ranks, bf16] = GetParam();
  const workloads::MoeConfig cfg = small_config();
  const auto dtype = bf16 ? torch::kBFloat16 : torch::kFloat32;
  const workloads::MoeWeights w = workloads::make_weights(cfg, 3, dtype);
  torch::manual_seed(5);
  const at::Tensor x = torch::randn({ranks * 16, cfg.hidden}).to(dtype);
  testbed::ClusterOptions o;
  o.endpoint.ordering = endpoint::Ordering::kWeak;
  o.fabric.loss = 0.01;  // the transport repairs it; the result must not change
  testbed::Cluster c(routing::make_superpod(ranks, 2), o);
  const auto r = testbed::run_moe_fabric(c, variant, cfg, w, x, ranks);
  ASSERT_TRUE(r.ok) << r.error;
  const at::Tensor ref = workloads::reference_forward(x, w, cfg);
  // fp32: rows travel and sum exactly as the reference up to summation order (1e-5). bf16: outputs are cast to
  // bf16 for the combine rows, as DeepEP does, so one bf16 rounding per row (2e-2 of the largest output); IFEC
  // adds one more rounding when the switch casts its fp32 sum back to bf16, still well inside 2e-2.
  EXPECT_LT(max_rel_error(r.output, ref), bf16 ? 2e-2 : 1e-5);
  EXPECT_GT(r.dispatch.us, 0);
  EXPECT_GT(r.combine.us, 0);
  if (variant != MoeVariant::kIfec) {
    EXPECT_GT(r.dispatch.wire_bytes, static_cast<uint64_t>(r.dispatch_logical_bytes)) << "headers and ACKs on top";
  }  // IFEC's source sends a row once for all its ranks: compared in IfecSendsEachTokenOnceAndSumsInTheSwitches
}

INSTANTIATE_TEST_SUITE_P(Variants, MoeFabric,
                         testing::Combine(testing::Values(MoeVariant::kPerExpert, MoeVariant::kPerRank,
                                                          MoeVariant::kIfec),
                                          testing::Values(8, 16), testing::Bool()),
                         [](const auto& info) {
                           return std::string(testbed::moe_variant_name(std::get<0>(info.param))) + "_ep" +
                                  std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_bf16" : "_fp32");
                         });

TEST(MoeFabric, PerRankMovesFewerBytesThanPerExpert) {
  const workloads::MoeConfig cfg = small_config();
  const workloads::MoeWeights w = workloads::make_weights(cfg, 4);
  torch::manual_seed(6);
  const at::Tensor x = torch::randn({8 * 32, cfg.hidden});
  int64_t bytes[2];
  for (int v = 0; v < 2; ++v) {
    testbed::Cluster c(routing::make_superpod(8, 2), {});
    const auto r = testbed::run_moe_fabric(c, v == 0 ? MoeVariant::kPerExpert : MoeVariant::kPerRank, cfg, w, x, 8);
    ASSERT_TRUE(r.ok) << r.error;
    bytes[v] = r.dispatch_logical_bytes;
  }
  EXPECT_LT(bytes[1], bytes[0]) << "de-duplicating per rank sends a token once per rank, not once per expert";
}

TEST(MoeFabric, IfecSendsEachTokenOnceAndSumsInTheSwitches) {
  const workloads::MoeConfig cfg = small_config();
  const workloads::MoeWeights w = workloads::make_weights(cfg, 4);
  torch::manual_seed(7);
  const at::Tensor x = torch::randn({16 * 32, cfg.hidden});
  testbed::MoeFabricResult r[2];
  for (int v = 0; v < 2; ++v) {
    testbed::Cluster c(routing::make_superpod(16, 2), {});
    r[v] = testbed::run_moe_fabric(c, v == 0 ? MoeVariant::kPerRank : MoeVariant::kIfec, cfg, w, x, 16);
    ASSERT_TRUE(r[v].ok) << r[v].error;
    EXPECT_EQ(r[v].fallback_chunks, 0u) << r[v].fallback_reason;
  }
  // The same rows are delivered, but an IFEC token leaves its GPU once instead of once per destination rank, and
  // each rank's combine row is one contribution into the switch instead of a store to the source.
  EXPECT_EQ(r[0].dispatch_logical_bytes, r[1].dispatch_logical_bytes);
  EXPECT_EQ(r[0].combine_logical_bytes, r[1].combine_logical_bytes);
  EXPECT_LT(r[1].dispatch.wire_bytes * 2, r[0].dispatch.wire_bytes);
  EXPECT_LT(r[1].dispatch.us, r[0].dispatch.us);
  EXPECT_LT(max_rel_error(r[1].output, r[0].output), 1e-5);
  ASSERT_EQ(r[1].dispatch.wire_per_plane.size(), 2u);
  EXPECT_EQ(r[1].dispatch.wire_per_plane[0] + r[1].dispatch.wire_per_plane[1], r[1].dispatch.wire_bytes);
}

// Past 64 ranks (EP 128, two experts per GPU, node-limited routing): rows multicast with ECH v2 (sources and
// destinations past GPU 63) and summed in 128-member groups on switches configured for them equal the reference
// with nothing sent point to point; on switches of 64-member groups the combine is refused there, falls back, and
// still equals it.
TEST(MoeFabric, IfecPast64RanksEqualsTheReference) {
  const int ranks = 128;
  const workloads::MoeConfig cfg = workloads::node_limited(small_config(), ranks, 8);
  ASSERT_EQ(cfg.groups, 16);
  const workloads::MoeWeights w = workloads::make_weights(cfg, 3);
  torch::manual_seed(13);
  const at::Tensor x = torch::randn({ranks * 4, cfg.hidden});
  const at::Tensor ref = workloads::reference_forward(x, w, cfg);
  testbed::ClusterOptions o;
  o.endpoint.ordering = endpoint::Ordering::kWeak;
  for (const uint32_t members : {128u, 64u}) {
    routing::Topology t = routing::make_superpod(ranks, 2);
    t.params.ifec.max_group_members = members;
    testbed::Cluster c(t, o);
    const auto r = testbed::run_moe_fabric(c, MoeVariant::kIfec, cfg, w, x, ranks);
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_LT(max_rel_error(r.output, ref), 1e-5) << members << "-member groups";
    if (members == 128) {
      EXPECT_EQ(r.fallback_chunks, 0u) << r.fallback_reason;
      EXPECT_GT(r.ifec.multicast_packets, 0u);
    } else {
      EXPECT_GT(r.fallback_chunks, 0u);
      EXPECT_NE(r.fallback_reason.find("has 128 members, expected 2..64"), std::string::npos) << r.fallback_reason;
    }
  }
}

// DeepEP's FP8 dispatch: rows leave as E4M3 + scales, are dequantised before the experts, and combine stays bf16.
// Reference: the single-process layer whose experts see the same dequantised rows (the gate and the shared expert
// see x), within the bf16 tolerance; the quantisation itself is what separates it from the plain bf16 layer.
TEST(MoeFabric, Fp8DispatchEqualsTheReferenceOnTheDequantisedRows) {
  workloads::MoeConfig cfg = small_config();
  cfg.hidden = 256;  // two 128-channel blocks per row
  const workloads::MoeWeights w = workloads::make_weights(cfg, 3, torch::kBFloat16);
  torch::manual_seed(8);
  const at::Tensor x = (torch::randn({8 * 16, cfg.hidden}) * torch::rand({8 * 16, 1}) * 4).to(torch::kBFloat16);
  const at::Tensor xq =
      workloads::dequantize_fp8_rows(workloads::quantize_fp8_rows(x), cfg.hidden).to(torch::kBFloat16);
  const at::Tensor ref = workloads::reference_forward(x, w, cfg, workloads::gate(x, w, cfg), xq);
  const at::Tensor plain = workloads::reference_forward(x, w, cfg);
  testbed::MoeFabricOptions fo;
  fo.fp8_dispatch = true;
  for (MoeVariant v : {MoeVariant::kPerExpert, MoeVariant::kPerRank, MoeVariant::kIfec}) {
    testbed::ClusterOptions o;
    o.endpoint.ordering = endpoint::Ordering::kWeak;
    testbed::Cluster c(routing::make_superpod(8, 2), o);
    const auto r = testbed::run_moe_fabric(c, v, cfg, w, x, 8, fo);
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_LT(max_rel_error(r.output, ref), 2e-2) << testbed::moe_variant_name(v);
    EXPECT_LT(max_rel_error(r.output, plain), 0.1) << "E4M3 keeps 3 mantissa bits: a few % of the bf16 layer";
    // Each dispatched row is 256 E4M3 bytes + 2 fp32 scales; combine rows stay 256 bf16 elements.
    EXPECT_EQ(r.dispatch_logical_bytes % (256 + 8), 0);
    EXPECT_EQ(r.dispatch_logical_bytes / (256 + 8), r.combine_logical_bytes / 512) << testbed::moe_variant_name(v);
  }
  testbed::Cluster c(routing::make_superpod(8, 2), {});
  cfg.hidden = 64;  // not a whole block: refused, naming it
  const workloads::MoeWeights w64 = workloads::make_weights(cfg, 3, torch::kBFloat16);
  try {
    testbed::run_moe_fabric(c, MoeVariant::kPerRank, cfg, w64, torch::randn({8 * 4, 64}).to(torch::kBFloat16), 8, fo);
    ADD_FAILURE() << "hidden 64 accepted for FP8 rows";
  } catch (const common::Error& e) {
    EXPECT_NE(std::string(e.what()).find("hidden 64"), std::string::npos) << e.what();
  }
}

// The timing mode (no experts run, one shared window per id, rows as wide as asked) moves the same frames at the
// same simulated times as the computed run: the fabric never looks at payload values.
TEST(MoeFabric, TimingModeTakesTheComputedRunsTimesAndBytes) {
  const workloads::MoeConfig cfg = small_config();
  const workloads::MoeWeights w = workloads::make_weights(cfg, 4, torch::kBFloat16);
  torch::manual_seed(9);
  const at::Tensor x = torch::randn({8 * 32, cfg.hidden}).to(torch::kBFloat16);
  for (MoeVariant v : {MoeVariant::kPerRank, MoeVariant::kIfec}) {
    // Computed, timing mode, timing mode with the payloads elided (frames of headers and lengths only).
    testbed::MoeFabricResult r[3];
    for (int run = 0; run < 3; ++run) {
      testbed::ClusterOptions co;
      co.fabric.elided_payloads = run == 2;
      testbed::Cluster c(routing::make_superpod(8, 2), co);
      testbed::MoeFabricOptions fo;
      fo.compute = run == 0;
      r[run] = testbed::run_moe_fabric(c, v, cfg, w, x, 8, fo);
      ASSERT_TRUE(r[run].ok) << r[run].error;
    }
    for (int run = 1; run < 3; ++run) {
      EXPECT_EQ(r[0].dispatch.us, r[run].dispatch.us) << testbed::moe_variant_name(v) << " run " << run;
      EXPECT_EQ(r[0].combine.us, r[run].combine.us) << testbed::moe_variant_name(v) << " run " << run;
      EXPECT_EQ(r[0].dispatch.wire_per_plane, r[run].dispatch.wire_per_plane) << " run " << run;
      EXPECT_EQ(r[0].combine.wire_per_plane, r[run].combine.wire_per_plane) << " run " << run;
    }
    EXPECT_FALSE(r[1].output.defined());
    // The bound is a lower bound: no phase beats its busiest GPU's bytes at line rate.
    EXPECT_GT(r[0].dispatch.bound_us, 0);
    EXPECT_LE(r[0].dispatch.bound_us, r[0].dispatch.us);
    EXPECT_LE(r[0].combine.bound_us, r[0].combine.us);
  }
}

namespace {

// Each rank's first or second half of its tokens: micro-batch h of x ([ranks * tokens, hidden]).
at::Tensor micro_batch(const at::Tensor& x, int ranks, int h) {
  const int64_t tokens = x.size(0) / ranks;
  const int64_t first = h == 0 ? 0 : tokens / 2;
  const int64_t n = h == 0 ? tokens / 2 : tokens - tokens / 2;
  return x.view({ranks, tokens, x.size(1)}).narrow(1, first, n).reshape({ranks * n, x.size(1)});
}

// Bytes every cable carried, both directions, by cable id (`per_gpu`: summed over each GPU's cables, all planes).
// A cable's sub-links share its frames by per-packet weighted round robin, whose turns depend on the order frames
// come in, so per sub-link the bytes move and per cable they do not.
std::vector<uint64_t> cable_bytes(testbed::Cluster& c, bool per_gpu = false) {
  std::vector<uint64_t> out;
  const routing::Topology& topo = c.fabric().topology();
  for (size_t l = 0; l < topo.links.size(); ++l) {
    const routing::Link& tl = topo.links[l];
    const int gpu = topo.nodes[tl.a].kind == routing::NodeKind::kGpu ? tl.a : tl.b;
    const size_t at = per_gpu ? static_cast<size_t>(gpu) : static_cast<size_t>(tl.cable);
    const common::Link& link = c.fabric().link(static_cast<int>(l));
    out.resize(std::max(out.size(), at + 1), 0);
    out[at] += link.end(0).counters().tx_bytes + link.end(1).counters().tx_bytes;
  }
  return out;
}

}  // namespace

// Communication under communication: with no expert time, micro-batch 1's dispatch and micro-batch 0's combine
// start together when dispatch 0 ends and share the fabric. Together they take no longer than one after the other
// and no less than either alone (each measured on a fresh fabric), and every GPU's cables carry exactly the bytes of
// the four phases run separately; IFEC's every cable (the baselines' row stores take their turns in weak ordering's
// rotation over the planes in another order when the phases interleave: a GPU's bytes move between its planes).
TEST(MoeFabric, TwoMicroBatchesRunDispatchBesideCombine) {
  const workloads::MoeConfig cfg = small_config();
  const workloads::MoeWeights w = workloads::make_weights(cfg, 4, torch::kBFloat16);
  torch::manual_seed(11);
  const int ranks = 8;
  const at::Tensor x = torch::randn({ranks * 32, cfg.hidden}).to(torch::kBFloat16);
  testbed::MoeFabricOptions fo;
  fo.compute = false;
  fo.row_hidden = 2048;  // 4 KiB bf16 rows: the phases are bandwidth-bound
  const double no_experts[2] = {0, 0};
  testbed::ClusterOptions o;
  o.endpoint.ordering = endpoint::Ordering::kWeak;  // as the bench runs: sprayed packets are no sequence errors
  for (MoeVariant v : {MoeVariant::kPerExpert, MoeVariant::kPerRank, MoeVariant::kIfec}) {
    SCOPED_TRACE(testbed::moe_variant_name(v));
    double d[2], c[2];
    std::vector<uint64_t> separate, separate_gpu;
    for (int h = 0; h < 2; ++h) {
      testbed::Cluster cl(routing::make_superpod(ranks, 2), o);
      const auto r = testbed::run_moe_fabric(cl, v, cfg, w, micro_batch(x, ranks, h), ranks, fo);
      ASSERT_TRUE(r.ok) << r.error;
      d[h] = r.dispatch.us;
      c[h] = r.combine.us;
      for (bool gpu : {false, true}) {
        const std::vector<uint64_t> bytes = cable_bytes(cl, gpu);
        std::vector<uint64_t>& sum = gpu ? separate_gpu : separate;
        sum.resize(bytes.size(), 0);
        for (size_t l = 0; l < bytes.size(); ++l) {
          sum[l] += bytes[l];
        }
      }
    }
    testbed::Cluster cl(routing::make_superpod(ranks, 2), o);
    const auto r = testbed::run_moe_two_batches(cl, v, cfg, w, x, ranks, no_experts, fo);
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.fallback_chunks, 0u);
    EXPECT_EQ(r.dispatch[1].start_us, r.dispatch[0].end_us);
    EXPECT_EQ(r.combine[0].start_us, r.dispatch[0].end_us) << "no expert time: combine 0 beside dispatch 1";
    const double together = std::max(r.dispatch[1].end_us, r.combine[0].end_us) - r.combine[0].start_us;
    EXPECT_LE(together, d[1] + c[0]);
    EXPECT_GE(together, std::max(d[1], c[0]));
    EXPECT_LE(r.us, d[0] + d[1] + c[0] + c[1]);
    EXPECT_EQ(cable_bytes(cl, true), separate_gpu) << "the same frames, only at other times";
    if (v == MoeVariant::kIfec) {
      EXPECT_EQ(cable_bytes(cl), separate) << "and on the same cables";
    }
  }
}

// In compute mode the two micro-batches' outputs, back in token order, are the single-process layer, with the
// experts' time on the clock or not.
TEST(MoeFabric, TwoMicroBatchesEqualTheReference) {
  const workloads::MoeConfig cfg = small_config();
  const workloads::MoeWeights w = workloads::make_weights(cfg, 3);
  torch::manual_seed(12);
  const int ranks = 8;
  const at::Tensor x = torch::randn({ranks * 10, cfg.hidden});
  const at::Tensor ref = workloads::reference_forward(x, w, cfg);
  testbed::ClusterOptions o;
  o.endpoint.ordering = endpoint::Ordering::kWeak;
  for (MoeVariant v : {MoeVariant::kPerExpert, MoeVariant::kPerRank, MoeVariant::kIfec}) {
    for (const double e : {0.0, 3.0}) {
      const double experts_us[2] = {e, e / 3};
      testbed::Cluster cl(routing::make_superpod(ranks, 2), o);
      const auto r = testbed::run_moe_two_batches(cl, v, cfg, w, x, ranks, experts_us);
      ASSERT_TRUE(r.ok) << r.error;
      EXPECT_LT(max_rel_error(r.output, ref), 1e-5) << testbed::moe_variant_name(v) << ", experts " << e << " us";
      EXPECT_GE(r.combine[0].start_us, r.dispatch[0].end_us + e) << "combine 0 waits for its experts";
    }
  }
  testbed::Cluster cl(routing::make_superpod(ranks, 2), o);
  const double bad[2] = {-1, 0};
  EXPECT_THROW(testbed::run_moe_two_batches(cl, MoeVariant::kIfec, cfg, w, x, ranks, bad), common::Error);
  const double none[2] = {0, 0};
  EXPECT_THROW(testbed::run_moe_two_batches(cl, MoeVariant::kIfec, cfg, w, x.narrow(0, 0, ranks), ranks, none),
               common::Error);
}

// The layer under 1% loss on a cluster of each of `clusters` (named): the first run equals the reference, and every
// other run is the first bit for bit (outputs, phase times, bytes per plane and on every cable). Appends each
// cluster's partitions, described, to `described`.
void expect_the_same_layer_on_each(const routing::Topology& topo, MoeVariant v, const workloads::MoeConfig& cfg,
                                   const workloads::MoeWeights& w, const at::Tensor& x, const at::Tensor& ref,
                                   int ranks,
                                   const std::vector<std::pair<std::string, testbed::ClusterOptions>>& clusters,
                                   std::vector<std::string>* described = nullptr) {
  std::vector<testbed::MoeFabricResult> r;
  std::vector<std::vector<uint64_t>> cables;
  for (auto [name, o] : clusters) {
    o.fabric.loss = 0.01;
    testbed::Cluster c(topo, o);
    r.push_back(testbed::run_moe_fabric(c, v, cfg, w, x, ranks));
    ASSERT_TRUE(r.back().ok) << name << ": " << r.back().error;
    cables.push_back(cable_bytes(c));
    if (described != nullptr) described->push_back(c.partitions() ? c.partitions()->describe() : "one loop");
  }
  EXPECT_LT(max_rel_error(r[0].output, ref), 1e-5);
  for (size_t k = 1; k < r.size(); ++k) {
    SCOPED_TRACE(clusters[k].first + " against " + clusters[0].first);
    EXPECT_TRUE(torch::equal(r[0].output, r[k].output));
    EXPECT_EQ(r[0].dispatch.us, r[k].dispatch.us);
    EXPECT_EQ(r[0].combine.us, r[k].combine.us);
    EXPECT_EQ(r[0].dispatch.wire_per_plane, r[k].dispatch.wire_per_plane);
    EXPECT_EQ(r[0].combine.wire_per_plane, r[k].combine.wire_per_plane);
    EXPECT_EQ(cables[0], cables[k]);
  }
}

// Partitioned (a partition per plane and per GPU group), the layer under 1% loss is the same run on one thread and
// on two, whatever the GPUs' grouping (one group, one per thread, one per GPU or uneven ones): outputs bit for bit,
// phase times, bytes on every cable; and it still equals the reference. The same for the two micro-batches.
TEST(MoeFabric, PartitionedRunsAreTheSameOnOneThreadAndTwo) {
  const workloads::MoeConfig cfg = small_config();
  const workloads::MoeWeights w = workloads::make_weights(cfg, 3);
  torch::manual_seed(13);
  for (const int ranks : {8, 64}) {
    const routing::Topology topo = routing::make_superpod(ranks, ranks == 8 ? 2 : 4);
    const at::Tensor x = torch::randn({ranks * (ranks == 8 ? 16 : 4), cfg.hidden});
    const at::Tensor ref = workloads::reference_forward(x, w, cfg);
    // (threads, GPU groups): one group on one thread, one per thread on two, one per GPU (8) or 5 uneven ones (64)
    const std::pair<int, int> runs[3] = {{1, 1}, {2, 0}, {2, ranks == 8 ? 8 : 5}};
    auto options = [&](int k) {
      testbed::ClusterOptions o;
      o.endpoint.ordering = endpoint::Ordering::kWeak;
      o.threads = runs[k].first;
      o.gpu_groups = runs[k].second;
      return o;
    };
    for (MoeVariant v : {MoeVariant::kPerExpert, MoeVariant::kPerRank, MoeVariant::kIfec}) {
      SCOPED_TRACE(std::string(testbed::moe_variant_name(v)) + " EP " + std::to_string(ranks));
      std::vector<std::pair<std::string, testbed::ClusterOptions>> clusters;
      for (int k = 0; k < 3; ++k) {
        clusters.emplace_back(
            std::to_string(runs[k].second) + " GPU groups on " + std::to_string(runs[k].first) + " threads",
            options(k));
      }
      expect_the_same_layer_on_each(topo, v, cfg, w, x, ref, ranks, clusters);
      if (ranks > 8) {
        continue;
      }
      testbed::MoeTwoBatchResult two[3];
      const double experts_us[2] = {2, 1};
      for (int k = 0; k < 3; ++k) {
        testbed::Cluster c(topo, options(k));
        two[k] = testbed::run_moe_two_batches(c, v, cfg, w, x, ranks, experts_us);
        ASSERT_TRUE(two[k].ok) << two[k].error;
      }
      EXPECT_LT(max_rel_error(two[0].output, ref), 1e-5);
      for (int k = 1; k < 3; ++k) {
        EXPECT_TRUE(torch::equal(two[0].output, two[k].output)) << runs[k].second << " GPU groups";
        EXPECT_EQ(two[0].us, two[k].us) << runs[k].second << " GPU groups";
        EXPECT_EQ(two[0].combine[0].start_us, two[k].combine[0].start_us) << runs[k].second << " GPU groups";
      }
    }
  }
}

// The switches in leaf groups too (a two-tier fat tree, 1% loss): the same layer for every group count >= 1, thread
// count and GPU grouping, and still the reference's.
TEST(MoeFabric, LeafGroupsGiveTheSameLayerWhateverTheGroupsAndThreads) {
  const workloads::MoeConfig cfg = small_config();
  const workloads::MoeWeights w = workloads::make_weights(cfg, 3);
  torch::manual_seed(17);
  const int ranks = 16;
  const routing::Topology topo = routing::make_fat_tree(ranks, 2, 4, 2);
  const at::Tensor x = torch::randn({ranks * 8, cfg.hidden});
  const at::Tensor ref = workloads::reference_forward(x, w, cfg);
  const std::array<int, 3> runs[3] = {{1, 1, 1}, {2, 2, 0}, {2, 4, 5}};  // (threads, leaf groups, GPU groups)
  for (MoeVariant v : {MoeVariant::kPerExpert, MoeVariant::kIfec}) {
    SCOPED_TRACE(testbed::moe_variant_name(v));
    std::vector<std::pair<std::string, testbed::ClusterOptions>> clusters;
    for (const auto& [threads, leaf_groups, gpu_groups] : runs) {
      testbed::ClusterOptions o;
      o.endpoint.ordering = endpoint::Ordering::kWeak;
      o.threads = threads;
      o.fabric.leaf_groups = leaf_groups;
      o.gpu_groups = gpu_groups;
      clusters.emplace_back(std::to_string(leaf_groups) + " leaf groups on " + std::to_string(threads) + " threads", o);
    }
    std::vector<std::string> described;
    expect_the_same_layer_on_each(topo, v, cfg, w, x, ref, ranks, clusters, &described);
    ASSERT_EQ(described.size(), 3u);
    EXPECT_NE(described[1].find("GPUs 0-7, p0 leaves 0-1, p1 leaves 0-1 | GPUs 8-15, p0 leaves 2-3"), std::string::npos)
        << described[1];
    EXPECT_NE(described[2].find("p1 leaves 3"), std::string::npos) << described[2];
  }
}

TEST(MoeFabric, RejectsBadArgumentsNamingThem) {
  const workloads::MoeConfig cfg = small_config();
  const workloads::MoeWeights w = workloads::make_weights(cfg, 4);
  testbed::Cluster c(routing::make_superpod(8, 2), {});
  EXPECT_THROW(testbed::run_moe_fabric(c, MoeVariant::kIfec, cfg, w, torch::randn({8 * 4, cfg.hidden}), 9),
               common::Error);
  EXPECT_THROW(testbed::run_moe_fabric(c, MoeVariant::kIfec, cfg, w, torch::randn({7, cfg.hidden}), 8), common::Error);
  EXPECT_THROW(testbed::parse_moe_variant("sharp"), common::Error);
  EXPECT_EQ(testbed::parse_moe_variant("ifec"), MoeVariant::kIfec);
  // Still usable afterwards.
  const auto r = testbed::run_moe_fabric(c, MoeVariant::kIfec, cfg, w, torch::randn({8 * 4, cfg.hidden}), 8);
  EXPECT_TRUE(r.ok) << r.error;
}
