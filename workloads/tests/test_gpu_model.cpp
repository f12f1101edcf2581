// The GPU compute-cost model against what it was fitted to: DeepSeek-V3 expert timings measured on H100s (bf16,
// PyTorch 2.11, CUDA events; docs/gpu-model.md): the grouped kernel at 42 points, EP 8..256 x 32..4096 tokens
// (testbed/gpu-profiles/h100-sxm-graphs.json), the per-expert chains at the reference table's 12 (a loop of GEMM
// chains, and the shared expert), every number within 10%. Also launches by hand (waves, the streaming CTAs), the
// profile file (the shipped H100 one is the built-in default; bad files name the bad field) and the kernel choice.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

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

// The built-in table: the device machine's H100, every call replayed from a CUDA graph, medians of 6 runs.
std::vector<Measured> graphs_table() {
  std::vector<Measured> out;
  for (const YAML::Node& row : YAML::LoadFile(std::string(IFEC_GPU_PROFILE_DIR) + "/h100-sxm-graphs.json")) {
    out.push_back(
        {row[0].as<int>(), row[1].as<int64_t>(), row[2].as<double>(), row[3].as<double>(), row[4].as<double>()});
  }
  return out;
}

struct Modelled {
  double loop_us, grouped_us, shared_us;
};

Modelled model_of(const Measured& m, const GpuProfile& p) {
  const std::vector<int64_t> per_expert = even_spread(m.tokens * 8, 256 / m.ep);
  return {1e6 * routed_experts_seconds(per_expert, kHidden, kInter, p, 2, ExpertKernel::kLoop),
          1e6 * routed_experts_seconds(per_expert, kHidden, kInter, p, 2, ExpertKernel::kGrouped),
          1e6 * ffn_chain_seconds(m.tokens, kHidden, kInter, p, 2)};
}

TEST(GpuModel, ReproducesEveryMeasuredH100RowWithinTenPercent) {
  const GpuProfile p;  // the built-in profile is the fitted H100 one
  const std::vector<Measured> table = graphs_table();
  ASSERT_EQ(table.size(), 42u);
  double worst = 0;
  for (const Measured& m : table) {
    const Modelled t = model_of(m, p);
    for (const auto& [what, model, meas] :
         {std::tuple{"loop", t.loop_us, m.loop_us}, std::tuple{"grouped", t.grouped_us, m.grouped_us},
          std::tuple{"shared", t.shared_us, m.shared_us}}) {
      EXPECT_NEAR(model / meas, 1.0, 0.10) << "EP " << m.ep << ", " << m.tokens << " tokens/GPU, " << what << ": model "
                                           << model << " us, measured " << meas << " us";
      worst = std::max(worst, std::abs(model / meas - 1));
    }
  }
  std::printf("worst model/measured deviation over the 126 H100 numbers: %.1f%%\n", 100 * worst);
}

TEST(GpuModel, TheReferenceH100sGroupedTimesOutOfSample) {
  // Another H100's grouped times (the reference table, measured eagerly, not fitted): within 13% (EP 32 at 128
  // tokens: 326 us eager there, 297 replayed from a graph here, the host's launches). Its chains' times include the
  // host launching every kernel (the loop's 0.5-1.3 ms more at few tokens): not compared.
  const GpuProfile p;
  for (const Measured& m : kH100) {
    EXPECT_NEAR(model_of(m, p).grouped_us / m.grouped_us, 1.0, 0.13) << "EP " << m.ep << ", " << m.tokens << " tokens";
  }
}

TEST(GpuModel, TheModelPicksTheFasterKernelTheMeasurementsDo) {
  const GpuProfile p;
  int compared = 0;
  for (const Measured& m : graphs_table()) {
    if (std::abs(m.loop_us / m.grouped_us - 1) < 0.15) continue;  // too close to call within the model's 10%
    const Modelled t = model_of(m, p);
    EXPECT_EQ(t.grouped_us < t.loop_us, m.grouped_us < m.loop_us)
        << "EP " << m.ep << ", " << m.tokens << " tokens: measured loop " << m.loop_us << " / grouped " << m.grouped_us
        << " us, modelled " << t.loop_us << " / " << t.grouped_us;
    ++compared;
  }
  EXPECT_GE(compared, 15);  // the loop slower at EP 8-64 and few tokens, faster at EP 256 and 32-64 tokens
}

TEST(GpuModel, OneLaunchByHand) {
  GpuProfile p;
  p.overlap_p = 1e9;  // a hard max, to check the two terms alone
  // 32 experts x 32 rows (they average <= 128: 64 x 128 tiles), n 4096, k 7168, bf16; activations fit in L2.
  // Tiles 32 x 1 x 32 = 1024: 7 full waves over 132 SMs and one of 100 (32 SMs idle: a faster clock); 132
  // streaming CTAs draw more than HBM gives.
  const std::vector<int64_t> rows(32, 32);
  const double tile = (2.0 * 64 * 128 * 7168) / (989e12 * p.mma_fraction / 132);
  const double tc = 7 * tile + tile / (1 + (p.clock_boost - 1) * 32 / 132);
  const double tm = p.grouped_launch_us * 1e-6 + 32 * (4096.0 * 7168 * 2) / (3350e9 * p.mem_fraction);
  EXPECT_EQ(tile_shape(rows, 4096, true), (std::pair<int64_t, int64_t>{64, 128}));
  EXPECT_NEAR(gemm_launch_seconds(rows, 4096, 7168, true, p, 2), std::max(tc, tm), 1e-12);
  EXPECT_GT(tm, tc) << "a few rows per expert: streaming the weights bounds the launch";
  EXPECT_EQ(gemm_launch_seconds({0, 0}, 2048, 7168, true, p, 2), 0.0);
  p.overlap_p = 3.9;
  const double smooth = gemm_launch_seconds(rows, 4096, 7168, true, p, 2);
  EXPECT_GT(smooth, std::max(tc, tm));
  EXPECT_LT(smooth, tc + tm);
  EXPECT_EQ(even_spread(10, 4), (std::vector<int64_t>{3, 3, 2, 2}));
}

TEST(GpuModel, FewTilesLeaveSmsIdleAndDrawLessBandwidth) {
  GpuProfile p;
  p.overlap_p = 1e9;
  // One expert, 256 rows (EP 256 at 32 tokens/GPU): 128 x 256 tiles, 2 x 16 = 32 of them, one partial wave. Each
  // busy SM computes a whole tile at its share of the rate; 32 CTAs stream 32 x cta_gbs, not HBM's 2.8 TB/s.
  const std::vector<int64_t> one{256};
  EXPECT_EQ(tile_shape(one, 4096, true), (std::pair<int64_t, int64_t>{128, 256}));
  const double tc = (2.0 * 128 * 256 * 7168) / (989e12 * p.mma_fraction / 132) / (1 + (p.clock_boost - 1) * 100 / 132);
  const double tm = p.grouped_launch_us * 1e-6 + (4096.0 * 7168 * 2) / (32 * p.cta_gbs * 1e9);
  EXPECT_NEAR(gemm_launch_seconds(one, 4096, 7168, true, p, 2), std::max(tc, tm), 1e-12);
  // The same flops spread over the whole GPU would take about a quarter of the time.
  EXPECT_GT(tc, 3 * (32 * 2.0 * 128 * 256 * 7168) / (989e12 * p.mma_fraction));
  // A 133rd tile is a second wave, of one tile on one busy SM: the tensor time of 132 and of one tile boosted.
  p.grouped_launch_us = 0;
  p.cta_gbs = 1e6;  // streaming never bounds here
  p.mem_fraction = 1;
  p.hbm_gbs = 1e9;
  const std::vector<int64_t> full{128 * 132};  // 132 tiles of 128 x 256 at n 256
  const std::vector<int64_t> one_more{128 * 132 + 1};
  EXPECT_NEAR(gemm_launch_seconds(one_more, 256, 7168, true, p, 2) / gemm_launch_seconds(full, 256, 7168, true, p, 2),
              1 + 1 / (1 + (p.clock_boost - 1) * 131 / 132), 1e-9);
}

TEST(GpuModel, AChainsGemmHasItsOwnConstants) {
  GpuProfile p;
  p.overlap_p_chain = 1e9;  // a hard max for the chain only
  p.mma_fraction_chain = 0.5;
  // One expert, 4096 rows: a chain's GEMM keeps 64 x 128 tiles: 64 x 16 = 1024 at n 2048, 7 full waves and one of
  // 100. Activations 4096 x 9216 x 2 = 75 MB spill L2.
  const std::vector<int64_t> rows{4096};
  EXPECT_EQ(tile_shape(rows, 2048, false), (std::pair<int64_t, int64_t>{64, 128}));
  const double tile = (2.0 * 64 * 128 * 7168) / (989e12 * 0.5 / 132);
  const double tc = 7 * tile + tile / (1 + (p.clock_boost - 1) * 32 / 132);
  const double bytes = 2048.0 * 7168 * 2 + (4096.0 * (7168 + 2048) * 2 - 50e6);
  const double tm = p.chain_gemm_us * 1e-6 + bytes / std::min(3350e9 * p.mem_fraction, 132 * p.cta_gbs_chain * 1e9);
  EXPECT_NEAR(gemm_launch_seconds(rows, 2048, 7168, false, p, 2), std::max(tc, tm), 1e-12);
  EXPECT_EQ(tile_shape(rows, 2048, true), (std::pair<int64_t, int64_t>{128, 256}));  // grouped: its own tile
  EXPECT_LT(gemm_launch_seconds(rows, 2048, 7168, true, p, 2), tc);                  // and mma_fraction

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
  EXPECT_NE(bad("{\"tflops\": 900, \"sms\": 0}").find("sms must be in 1..1024, got 0"), std::string::npos);  // JSON
  EXPECT_NE(bad("cta_gbs: -1\n").find("cta_gbs must be > 0, got -1"), std::string::npos);
  EXPECT_NE(bad("clock_boost: 0.9\n").find("clock_boost must be in [1, 4], got 0.9"), std::string::npos);
  EXPECT_NE(bad("mem_fraction_chain: 0.43\n").find("'mem_fraction_chain' belongs to the model before occupancy"),
            std::string::npos);
  EXPECT_NE(bad("- a list\n").find("expected a map"), std::string::npos);
  EXPECT_EQ(error_of([] { load_gpu_profile("/nonexistent/profile.yaml"); }),
            "/nonexistent/profile.yaml: cannot open the GPU profile (YAML or JSON): No such file or directory");
  EXPECT_EQ(error_of([] { load_gpu_profile("/tmp"); }), "/tmp: is a directory, expected a GPU profile (YAML or JSON)");
}
