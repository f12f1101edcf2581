// The MoE layer through the simulated fabric equals the single-process LibTorch reference in every variant (per
// expert, per rank, IFEC multicast + in-switch combine), and the variants move the bytes they should.
#include <gtest/gtest.h>
#include <torch/torch.h>

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
