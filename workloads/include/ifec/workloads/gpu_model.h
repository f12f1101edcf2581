// The GPU compute-cost model of the MoE experts (docs/gpu-model.md): a GEMM launch costs
//   Tc = flops / (peak * mma_fraction),  Tm = fixed + bytes / (hbm * mem_fraction),  t = (Tc^p + Tm^p)^(1/p)
// (a smooth max: streaming weights and tensor-core work overlap imperfectly), where flops count each problem's rows
// rounded up to the tile, bytes are every participating expert's weights plus the activations that spill out of L2.
// Routed experts run either as one grouped launch per GEMM over all local experts (torch._grouped_mm, DeepEP's
// deployments) or as one GEMM chain per expert (a loop); the shared expert is one chain. The two kinds of kernel
// have their own fractions, fixed costs and overlap exponent. The defaults are fitted
// to DeepSeek-V3 expert timings measured on an H100 (every measured row within 10%); a profile file (YAML or
// JSON) replaces them, and `python3 -m ifec.gpu_profile` writes one from a measurement on whatever GPU it finds.
// Plain C++ (no LibTorch): the simulator's timing layer and the benches use it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ifec::workloads {

enum class ExpertKernel : uint8_t { kGrouped, kLoop };
const char* expert_kernel_name(ExpertKernel k);
ExpertKernel parse_expert_kernel(const std::string& name);  // "grouped" | "loop"; throws naming the value

struct GpuProfile {
  std::string name = "H100 SXM 80GB HBM3 (fitted to measured DeepSeek-V3 expert timings)";
  double tflops = 989;                 // peak dense TFLOP/s at the element type used (bf16)
  double hbm_gbs = 3350;               // HBM GB/s (1e9 bytes)
  double mma_fraction = 0.664;         // achieved fraction of the tensor-core peak (657 TFLOP/s) by a grouped launch
  double mma_fraction_chain = 0.664;   // ... by a chain's GEMM (a file that sets only mma_fraction sets both)
  double mem_fraction_grouped = 0.84;  // ... of HBM bandwidth by a grouped launch over many experts (2.81 TB/s)
  double mem_fraction_chain = 0.43;    // ... by one expert's small-M GEMM, too few tiles to fill the SMs (1.44 TB/s)
  double grouped_launch_us = 25;       // fixed cost of one grouped launch
  double chain_gemm_us = 5;            // fixed cost of one GEMM of a chain
  double loop_call_us = 136;           // once per routed-experts loop (per-expert bookkeeping)
  double overlap_p = 3.9;              // the smooth max's exponent: at Tc = Tm a launch takes 2^(1/p) x either
  double overlap_p_chain = 3.9;        // ... of a chain's GEMM (a file that sets only overlap_p sets both)
  double l2_bytes = 50e6;              // activations up to this stay in L2 (no HBM traffic)
  int64_t tile_m = 64;                 // rows of a GEMM tile: a problem's rows are rounded up to it
  ExpertKernel kernel = ExpertKernel::kGrouped;  // how the routed experts run
  std::string source = "built in";               // where the profile came from (a file's path), for the rows' headers

  void validate() const;        // throws common::Error naming the bad field and value
  std::string summary() const;  // one line: name, peaks, fractions, kernel, source
};

// The profile in `path` (YAML or JSON: the fields above, any subset; unknown fields and bad values are errors
// naming them and the file).
GpuProfile load_gpu_profile(const std::string& path);
// The same text load_gpu_profile reads (a comment line first).
std::string gpu_profile_yaml(const GpuProfile& p, const std::string& comment = "");

// One GEMM launch over problems [rows_e x k] x [k x n] (one per expert with rows_e > 0, each its own weights).
double gemm_launch_seconds(const std::vector<int64_t>& rows, int64_t n, int64_t k, bool grouped, const GpuProfile& p,
                           double bytes_per_element);
// One SwiGLU FFN (gate, up, down: three single-problem launches and the gated product) on `rows` rows.
double ffn_chain_seconds(int64_t rows, int64_t hidden, int64_t inter, const GpuProfile& p, double bytes_per_element);
// A rank's routed experts, tokens_per_expert its local experts' counts (zeros cost nothing), by p.kernel.
double routed_experts_seconds(const std::vector<int64_t>& tokens_per_expert, int64_t hidden, int64_t inter,
                              const GpuProfile& p, double bytes_per_element);
double routed_experts_seconds(const std::vector<int64_t>& tokens_per_expert, int64_t hidden, int64_t inter,
                              const GpuProfile& p, double bytes_per_element, ExpertKernel kernel);
// `pairs` (token, expert) pairs spread as evenly as whole rows allow over `experts` experts.
std::vector<int64_t> even_spread(int64_t pairs, int64_t experts);

}  // namespace ifec::workloads
