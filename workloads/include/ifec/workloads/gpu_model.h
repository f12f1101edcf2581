// The GPU compute-cost model of the MoE experts (docs/gpu-model.md). A GEMM launch computes output tiles, one per
// CTA at a time, in waves over the GPU's SMs:
//   Tc = sum over waves of tile flops / (per-SM tensor rate with that wave's busy SMs)
//        (full waves at the power-limited rate, a partial last wave faster by up to clock_boost),
//   Tm = fixed + bytes / min(hbm * mem_fraction, min(tiles, sms) * cta_gbs),   t = (Tc^p + Tm^p)^(1/p)
// (a smooth max: streaming weights and tensor-core work overlap imperfectly), where bytes are every participating
// expert's weights plus the activations that spill out of L2. A launch with fewer tiles than SMs leaves tensor cores
// idle and draws only what its CTAs can stream; the tile is the kernel's (torch._grouped_mm's SM90 choice).
// Routed experts run either as one grouped launch per GEMM over all local experts (torch._grouped_mm, DeepEP's
// deployments) or as one GEMM chain per expert (a loop); the shared expert is one chain. Gate and up are one
// launch. The two kinds of kernel have their own tensor fractions, per-CTA rates, fixed costs and overlap exponent;
// HBM's achievable fraction is the chip's. The defaults are fitted to DeepSeek-V3 expert timings measured on H100s
// (every row within 10%); a profile file (YAML or JSON) replaces them, and `python3 -m ifec.gpu_profile` writes one
// from a measurement on whatever GPU it finds.
// Plain C++ (no LibTorch): the simulator's timing layer and the benches use it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ifec::workloads {

enum class ExpertKernel : uint8_t { kGrouped, kLoop };
const char* expert_kernel_name(ExpertKernel k);
ExpertKernel parse_expert_kernel(const std::string& name);  // "grouped" | "loop"; throws naming the value

struct GpuProfile {
  std::string name = "H100 SXM 80GB HBM3 (fitted to measured DeepSeek-V3 expert timings)";
  double tflops = 989;                 // peak dense TFLOP/s at the element type used (bf16)
  double hbm_gbs = 3350;               // HBM GB/s (1e9 bytes)
  int64_t sms = 132;                   // streaming multiprocessors: a wave of tiles is one per SM
  double mma_fraction = 0.615;         // achieved fraction of the tensor-core peak per SM in a full wave, grouped
  double clock_boost = 1.267;          // per-SM tensor rate with one SM busy over that in a full wave (clocks)
  double mem_fraction = 0.8381;        // achievable fraction of HBM bandwidth (2.81 TB/s), any kernel
  double cta_gbs = 134.3;              // GB/s one CTA of a grouped launch can stream (binds nowhere on the H100)
  double grouped_launch_us = 15.52;    // fixed cost of one grouped launch (setup, ramp, tail)
  double overlap_p = 4.311;            // the smooth max's exponent: at Tc = Tm a launch takes 2^(1/p) x either
  double mma_fraction_chain = 0.5918;  // ... of a chain's GEMM (cuBLAS; a file that sets only mma_fraction sets both)
  double cta_gbs_chain = 100;          // ... of a chain's GEMM (64 x 128 tiles; unfitted: binds nowhere on the H100)
  double chain_gemm_us = 4.371;        // fixed cost of one GEMM of a chain
  double overlap_p_chain = 2.391;      // ... of a chain's GEMM (a file that sets only overlap_p sets both)
  double loop_call_us = 0.1935;        // once per routed-experts loop (bookkeeping beyond the chains)
  double l2_bytes = 50e6;              // activations up to this stay in L2 (no HBM traffic)
  ExpertKernel kernel = ExpertKernel::kGrouped;  // how the routed experts run
  std::string source = "built in";               // where the profile came from (a file's path), for the rows' headers

  void validate() const;        // throws common::Error naming the bad field and value
  std::string summary() const;  // one line: name, peaks, fractions, kernel, source
};

// The widths (hidden, inter) and the rows of one GEMM problem the model takes: beyond them its tile and byte counts
// overflow (an inter of 2^62 came out as 0 us). gemm_launch_seconds, ffn_chain_seconds and routed_experts_seconds
// throw common::Error naming a value outside them.
inline constexpr int64_t kMaxModelWidth = int64_t{1} << 30;
inline constexpr int64_t kMaxModelRows = int64_t{1} << 40;

// The profile in `path` (YAML or JSON: the fields above, any subset; unknown fields and bad values are errors
// naming them and the file).
GpuProfile load_gpu_profile(const std::string& path);
// The same text load_gpu_profile reads (a comment line first).
std::string gpu_profile_yaml(const GpuProfile& p, const std::string& comment = "");

// The output tile (rows, columns) one CTA computes: a grouped launch's is torch._grouped_mm's SM90 choice, 64 x 128
// where the experts (all of them, empty ones too) average 128 rows or fewer, else 128 x 256; a chain's 64 x 128.
std::pair<int64_t, int64_t> tile_shape(const std::vector<int64_t>& rows, int64_t n, bool grouped);
// One GEMM launch over problems [rows_e x k] x [k x n] (one per expert with rows_e > 0, each its own weights).
double gemm_launch_seconds(const std::vector<int64_t>& rows, int64_t n, int64_t k, bool grouped, const GpuProfile& p,
                           double bytes_per_element);
// One SwiGLU FFN (gate and up as one launch of n = 2 x inter, down, the gated product) on `rows` rows.
double ffn_chain_seconds(int64_t rows, int64_t hidden, int64_t inter, const GpuProfile& p, double bytes_per_element);
// A rank's routed experts, tokens_per_expert its local experts' counts (zeros cost nothing), by p.kernel.
double routed_experts_seconds(const std::vector<int64_t>& tokens_per_expert, int64_t hidden, int64_t inter,
                              const GpuProfile& p, double bytes_per_element);
double routed_experts_seconds(const std::vector<int64_t>& tokens_per_expert, int64_t hidden, int64_t inter,
                              const GpuProfile& p, double bytes_per_element, ExpertKernel kernel);
// `pairs` (token, expert) pairs spread as evenly as whole rows allow over `experts` experts.
std::vector<int64_t> even_spread(int64_t pairs, int64_t experts);

}  // namespace ifec::workloads
