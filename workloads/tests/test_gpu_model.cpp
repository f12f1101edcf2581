// The GPU compute-cost model against what it was fitted to: DeepSeek-V3 expert timings measured on an H100
// (bf16, PyTorch 2.11, CUDA events; the table of docs/gpu-model.md). Every row, routed experts as a loop of GEMM
// chains and as grouped GEMMs, and the shared expert, within 10%. Also one launch by hand, the profile file
// (the shipped H100 one is the built-in default; bad files name the bad field) and the kernel choice.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "ifec/common/checks.h"
#include "ifec/workloads/gpu_model.h"

using namespace ifec::workloads;

namespace {

constexpr int64_t kHidden = 7168;
constexpr int64_t kInter = 2048;

struct Measured {
  int ep;
  int64_t tokens;  // per GPU; x 8 (token, expert) pairs spread evenly over 256 / ep local experts
  double loop_us, grouped_us, shared_us;
};

// ../shared/references/h100-expert-timings.md (copied into docs/gpu-model.md).
const Measured kH100[] = {
    {8, 128, 2691.4, 1061.7, 81.1},   {8, 256, 2816.2, 1094.3, 71.1},    {8, 512, 2818.4, 1131.3, 94.9},
    {8, 4096, 4780.6, 4603.8, 591.8}, {16, 128, 1431.8, 570.6, 79.3},    {16, 256, 1369.4, 590.1, 70.5},
    {16, 512, 1261.8, 680.5, 94.5},   {16, 4096, 4150.7, 4536.0, 578.9}, {32, 128, 785.7, 326.0, 83.0},
    {32, 256, 722.3, 371.4, 72.7},    {32, 512, 771.8, 561.2, 93.8},     {32, 4096, 4471.6, 4699.8, 562.8},
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(GpuModel, ReproducesEveryMeasuredH100RowWithinTenPercent) {
  const GpuProfile p;  // the built-in profile is the fitted H100 one
  double worst = 0;
  for (const Measured& m : kH100) {
    const std::vector<int64_t> per_expert = even_spread(m.tokens * 8, 256 / m.ep);
    const double loop = 1e6 * routed_experts_seconds(per_expert, kHidden, kInter, p, 2, ExpertKernel::kLoop);
    const double grouped = 1e6 * routed_experts_seconds(per_expert, kHidden, kInter, p, 2, ExpertKernel::kGrouped);
    const double shared = 1e6 * ffn_chain_seconds(m.tokens, kHidden, kInter, p, 2);
    for (const auto& [what, model, meas] :
         {std::tuple{"loop", loop, m.loop_us}, std::tuple{"grouped", grouped, m.grouped_us},
          std::tuple{"shared", shared, m.shared_us}}) {
      EXPECT_NEAR(model / meas, 1.0, 0.10) << "EP " << m.ep << ", " << m.tokens << " tokens/GPU, " << what << ": model "
                                           << model << " us, measured " << meas << " us";
      worst = std::max(worst, std::abs(model / meas - 1));
    }
  }
  std::printf("worst model/measured deviation over the 36 H100 numbers: %.1f%%\n", 100 * worst);
}

TEST(GpuModel, TheModelPicksTheFasterKernelTheMeasurementsDo) {
  const GpuProfile p;
  for (const Measured& m : kH100) {
    if (m.tokens > 512) continue;  // at 4096 tokens the two are within 10% of each other, measured and modelled
    const std::vector<int64_t> per_expert = even_spread(m.tokens * 8, 256 / m.ep);
    EXPECT_LT(routed_experts_seconds(per_expert, kHidden, kInter, p, 2, ExpertKernel::kGrouped),
              routed_experts_seconds(per_expert, kHidden, kInter, p, 2, ExpertKernel::kLoop))
        << "EP " << m.ep << ", " << m.tokens << " tokens";
  }
}

TEST(GpuModel, OneLaunchByHand) {
  GpuProfile p;
  p.overlap_p = 1e9;  // a hard max, to check the two terms alone
  // 2 experts x 100 rows (tiles of 64 -> 128 rows each), n 2048, k 7168, bf16; activations fit in L2.
  const double flops = 2 * (2 * 128.0 * 2048 * 7168);
  const double bytes = 2 * (2048.0 * 7168 * 2);
  const double tc = flops / (989e12 * 0.664);
  const double tm = 25e-6 + bytes / (3350e9 * 0.84);
  EXPECT_NEAR(gemm_launch_seconds({100, 0, 100}, 2048, 7168, true, p, 2), std::max(tc, tm), 1e-12);
  EXPECT_GT(tm, tc) << "a few rows per expert: streaming the weights bounds the launch";
  EXPECT_EQ(gemm_launch_seconds({0, 0}, 2048, 7168, true, p, 2), 0.0);
  p.overlap_p = 3.9;
  const double smooth = gemm_launch_seconds({100, 100}, 2048, 7168, true, p, 2);
  EXPECT_GT(smooth, std::max(tc, tm));
  EXPECT_LT(smooth, tc + tm);
  EXPECT_EQ(even_spread(10, 4), (std::vector<int64_t>{3, 3, 2, 2}));
}

TEST(GpuModel, AChainsGemmHasItsOwnMatrixFractionAndOverlap) {
  GpuProfile p;
  p.overlap_p_chain = 1e9;  // a hard max for the chain only
  p.mma_fraction_chain = 0.5;
  // One expert, 4096 rows: tensor-core bound. n 2048, k 7168, bf16; activations 4096 x 9216 x 2 = 75 MB spill L2.
  const double flops = 2 * (4096.0 * 2048 * 7168);
  const double bytes = 2048.0 * 7168 * 2 + (4096.0 * (7168 + 2048) * 2 - 50e6);
  const double tc = flops / (989e12 * 0.5);
  const double tm = 5e-6 + bytes / (3350e9 * 0.43);
  EXPECT_NEAR(gemm_launch_seconds({4096}, 2048, 7168, false, p, 2), std::max(tc, tm), 1e-12);
  const double grouped_tc = flops / (989e12 * 0.664);  // the grouped launch keeps mma_fraction and overlap_p
  EXPECT_GT(gemm_launch_seconds({4096}, 2048, 7168, true, p, 2), grouped_tc);
  EXPECT_LT(gemm_launch_seconds({4096}, 2048, 7168, true, p, 2), tc);

  const std::string path = ::testing::TempDir() + "/one-fraction.yaml";  // a file with one value sets both
  std::ofstream(path) << "mma_fraction: 0.7\noverlap_p: 2.5\n";
  const GpuProfile q = load_gpu_profile(path);
  EXPECT_EQ(q.mma_fraction_chain, 0.7);
  EXPECT_EQ(q.overlap_p_chain, 2.5);
  std::ofstream(path) << "mma_fraction: 0.7\nmma_fraction_chain: 0.6\noverlap_p_chain: 0.5\n";
  EXPECT_NE(error_of([&] { load_gpu_profile(path); }).find("overlap_p_chain must be >= 1, got 0.5"), std::string::npos);
  std::ofstream(path) << "mma_fraction: 0.7\nmma_fraction_chain: 0.6\n";
  EXPECT_EQ(load_gpu_profile(path).mma_fraction_chain, 0.6);
}

TEST(GpuModel, TheShippedH100ProfileIsTheBuiltInOne) {
  const GpuProfile file = load_gpu_profile(std::string(IFEC_GPU_PROFILE_DIR) + "/h100-sxm.yaml");
  const GpuProfile builtin;
  EXPECT_EQ(file.name, builtin.name);
  EXPECT_EQ(gpu_profile_yaml(file), gpu_profile_yaml(builtin));
  EXPECT_EQ(file.source, std::string(IFEC_GPU_PROFILE_DIR) + "/h100-sxm.yaml");
}

TEST(GpuModel, ProfileFilesRoundTripAndBadOnesNameTheField) {
  const std::string path = ::testing::TempDir() + "/profile.yaml";
  GpuProfile p;
  p.name = "test GPU";
  p.tflops = 500;
  p.kernel = ExpertKernel::kLoop;
  std::ofstream(path) << gpu_profile_yaml(p, "written by a test");
  const GpuProfile q = load_gpu_profile(path);
  EXPECT_EQ(q.tflops, 500);
  EXPECT_EQ(q.kernel, ExpertKernel::kLoop);
  auto bad = [&](const std::string& text) {
    std::ofstream(path) << text;
    return error_of([&] { load_gpu_profile(path); });
  };
  EXPECT_NE(bad("tflops: 989\nmma_fraktion: 0.5\n").find("unknown field 'mma_fraktion'"), std::string::npos);
  EXPECT_NE(bad("mma_fraction: 1.5\n").find("mma_fraction must be in (0, 1], got 1.5"), std::string::npos);
  EXPECT_NE(bad("hbm_gbs: fast\n").find("hbm_gbs: 'fast' is not a valid value"), std::string::npos);
  EXPECT_NE(bad("kernel: cublas\n").find("expert kernel 'cublas'"), std::string::npos);
  EXPECT_NE(bad("{\"tflops\": 900, \"tile_m\": 0}").find("tile_m must be >= 1"), std::string::npos);  // JSON too
  EXPECT_NE(bad("- a list\n").find("expected a map"), std::string::npos);
  EXPECT_NE(error_of([] { load_gpu_profile("/nonexistent/profile.yaml"); }).find("cannot be read"), std::string::npos);
}
