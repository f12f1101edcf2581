// The GPU compute-cost model (gpu_model.h, docs/gpu-model.md).
#include "ifec/workloads/gpu_model.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "ifec/common/checks.h"
#include "ifec/common/files.h"
#include "ifec/common/names.h"

namespace ifec::workloads {

namespace {

constexpr common::Name<ExpertKernel> kExpertKernelNames[] = {
    {ExpertKernel::kGrouped, "grouped"},
    {ExpertKernel::kLoop, "loop"},
};
constexpr common::Vocabulary kExpertKernels("expert kernel", kExpertKernelNames);

}  // namespace

const char* expert_kernel_name(ExpertKernel k) { return kExpertKernels.name(k); }
ExpertKernel parse_expert_kernel(const std::string& name) { return kExpertKernels.parse(name); }

void GpuProfile::validate() const {
  auto positive = [&](const char* field, double v) {
    IFEC_CHECK(std::isfinite(v) && v > 0, "GPU profile '" << name << "': " << field << " must be > 0, got " << v);
  };
  auto fraction = [&](const char* field, double v) {
    IFEC_CHECK(v > 0 && v <= 1, "GPU profile '" << name << "': " << field << " must be in (0, 1], got " << v);
  };
  auto exponent = [&](const char* field, double v) {
    IFEC_CHECK(std::isfinite(v) && v >= 1, "GPU profile '" << name << "': " << field << " must be >= 1, got " << v);
  };
  auto non_negative = [&](const char* field, double v) {
    IFEC_CHECK(std::isfinite(v) && v >= 0, "GPU profile '" << name << "': " << field << " must be >= 0, got " << v);
  };
  positive("tflops", tflops);
  positive("hbm_gbs", hbm_gbs);
  IFEC_CHECK(sms >= 1 && sms <= 1024, "GPU profile '" << name << "': sms must be in 1..1024, got " << sms);
  IFEC_CHECK(clock_boost >= 1 && clock_boost <= 4,
             "GPU profile '" << name << "': clock_boost must be in [1, 4], got " << clock_boost);
  fraction("mma_fraction", mma_fraction);
  fraction("mma_fraction_chain", mma_fraction_chain);
  fraction("mem_fraction", mem_fraction);
  positive("cta_gbs", cta_gbs);
  positive("cta_gbs_chain", cta_gbs_chain);
  non_negative("grouped_launch_us", grouped_launch_us);
  non_negative("chain_gemm_us", chain_gemm_us);
  non_negative("loop_call_us", loop_call_us);
  exponent("overlap_p", overlap_p);
  exponent("overlap_p_chain", overlap_p_chain);
  non_negative("l2_bytes", l2_bytes);
}

std::string GpuProfile::summary() const {
  std::ostringstream os;
  os << name << ": " << sms << " SMs, " << tflops << " TFLOP/s x " << mma_fraction << " (x" << clock_boost
     << " with few SMs busy)";
  if (mma_fraction_chain != mma_fraction) os << " grouped / " << mma_fraction_chain << " per-expert GEMM";
  os << ", " << hbm_gbs << " GB/s x " << mem_fraction << ", " << cta_gbs << " GB/s per CTA grouped / " << cta_gbs_chain
     << " per-expert GEMM, " << expert_kernel_name(kernel) << " experts [" << source << "]";
  return os.str();
}

namespace {

// The fields as name -> member, one list for the loader and the writer.
template <typename F>
void for_each_number(GpuProfile& p, F fn) {
  fn("tflops", p.tflops);
  fn("hbm_gbs", p.hbm_gbs);
  fn("mma_fraction", p.mma_fraction);
  fn("mma_fraction_chain", p.mma_fraction_chain);
  fn("clock_boost", p.clock_boost);
  fn("mem_fraction", p.mem_fraction);
  fn("cta_gbs", p.cta_gbs);
  fn("cta_gbs_chain", p.cta_gbs_chain);
  fn("grouped_launch_us", p.grouped_launch_us);
  fn("chain_gemm_us", p.chain_gemm_us);
  fn("loop_call_us", p.loop_call_us);
  fn("overlap_p", p.overlap_p);
  fn("overlap_p_chain", p.overlap_p_chain);
  fn("l2_bytes", p.l2_bytes);
}

}  // namespace

GpuProfile load_gpu_profile(const std::string& path) {
  const std::string text = common::read_regular_file(path, "GPU profile (YAML or JSON)");
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    IFEC_FAIL("GPU profile " << path << ": line " << e.mark.line + 1 << ": " << e.msg);
  }
  IFEC_CHECK(root.IsMap(), "GPU profile " << path << ": expected a map of fields (tflops: 989, ...)");
  GpuProfile p;
  p.source = path;
  const bool chain_own_mma = root["mma_fraction_chain"].IsDefined();
  const bool chain_own_overlap = root["overlap_p_chain"].IsDefined();
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    bool known = false;
    try {
      if (key == "name") {
        p.name = kv.second.as<std::string>();
        known = true;
      } else if (key == "kernel") {
        p.kernel = parse_expert_kernel(kv.second.as<std::string>());
        known = true;
      } else if (key == "sms") {
        p.sms = kv.second.as<int64_t>();
        known = true;
      } else {
        for_each_number(p, [&](const char* name, double& v) {
          if (key == name) {
            v = kv.second.as<double>();
            known = true;
          }
        });
      }
    } catch (const YAML::Exception&) {
      IFEC_FAIL("GPU profile " << path << ": " << key << ": '" << kv.second.as<std::string>("?")
                               << "' is not a valid value");
    }
    IFEC_CHECK(key != "mem_fraction_grouped" && key != "mem_fraction_chain" && key != "tile_m",
               "GPU profile " << path << ": '" << key
                              << "' belongs to the model before occupancy (docs/gpu-model.md): HBM is mem_fraction, a "
                                 "kernel's streaming rate cta_gbs / cta_gbs_chain per CTA, tiles the kernel's own; "
                                 "refit with python3 -m ifec.gpu_profile --fit-only TABLE");
    IFEC_CHECK(known, "GPU profile " << path << ": unknown field '" << key << "'");
  }
  if (!chain_own_mma) p.mma_fraction_chain = p.mma_fraction;  // one kernel-wide value, as before the split
  if (!chain_own_overlap) p.overlap_p_chain = p.overlap_p;
  try {
    p.validate();
  } catch (const std::exception& e) {
    IFEC_FAIL(path << ": " << e.what());
  }
  return p;
}

std::string gpu_profile_yaml(const GpuProfile& p, const std::string& comment) {
  std::ostringstream os;
  os.precision(6);
  if (!comment.empty()) {
    os << "# " << comment << "\n";
  }
  os << "name: \"" << p.name << "\"\n";
  GpuProfile copy = p;
  for_each_number(copy, [&](const char* name, double& v) { os << name << ": " << v << "\n"; });
  os << "sms: " << p.sms << "\nkernel: " << expert_kernel_name(p.kernel) << "\n";
  return os.str();
}

std::pair<int64_t, int64_t> tile_shape(const std::vector<int64_t>& rows, int64_t n, bool grouped) {
  int64_t total = 0;
  for (int64_t m : rows) total += m;
  const bool large = grouped && total > 128 * static_cast<int64_t>(rows.size()) && n > 128;
  return large ? std::pair<int64_t, int64_t>{128, 256} : std::pair<int64_t, int64_t>{64, 128};
}

double gemm_launch_seconds(const std::vector<int64_t>& rows, int64_t n, int64_t k, bool grouped, const GpuProfile& p,
                           double bytes_per_element) {
  IFEC_CHECK(n >= 1 && n <= 2 * kMaxModelWidth && k >= 1 && k <= 2 * kMaxModelWidth,
             "a GEMM of " << n << " columns and depth " << k << " (each 1.." << 2 * kMaxModelWidth << ")");
  const auto [tile_rows, tile_cols] = tile_shape(rows, n, grouped);
  int64_t tiles = 0;
  int64_t experts = 0;
  double activations = 0;
  for (int64_t m : rows) {
    IFEC_CHECK(m >= 0 && m <= kMaxModelRows, "a GEMM problem of " << m << " rows (0.." << kMaxModelRows << ")");
    if (m == 0) continue;
    ++experts;
    tiles += (m + tile_rows - 1) / tile_rows * ((n + tile_cols - 1) / tile_cols);
    activations += static_cast<double>(m) * static_cast<double>(k + n) * bytes_per_element;
  }
  if (tiles == 0) return 0;
  // Tensor cores: waves of tiles over the SMs, each busy SM at its share of the sustained rate, which rises as fewer
  // SMs are busy (the clock is power-limited under a full wave): full waves, then the partial last one.
  const double tile_flops = 2.0 * static_cast<double>(tile_rows * tile_cols) * static_cast<double>(k);
  const double sm_flops =
      p.tflops * 1e12 * (grouped ? p.mma_fraction : p.mma_fraction_chain) / static_cast<double>(p.sms);
  const double tile_s = tile_flops / sm_flops;
  const int64_t last = tiles % p.sms;
  const double idle = 1 - static_cast<double>(last) / static_cast<double>(p.sms);
  const double tc =
      static_cast<double>(tiles / p.sms) * tile_s + (last > 0 ? tile_s / (1 + (p.clock_boost - 1) * idle) : 0.0);
  // HBM: every expert's weights and the activations beyond L2, at what the streaming CTAs can draw.
  const double bytes =
      static_cast<double>(experts) * static_cast<double>(n) * static_cast<double>(k) * bytes_per_element +
      std::max(0.0, activations - p.l2_bytes);
  const double streaming = static_cast<double>(std::min(tiles, p.sms)) * (grouped ? p.cta_gbs : p.cta_gbs_chain);
  const double gbs = std::min(p.hbm_gbs * p.mem_fraction, streaming);
  const double tm = (grouped ? p.grouped_launch_us : p.chain_gemm_us) * 1e-6 + bytes / (gbs * 1e9);
  const double q = grouped ? p.overlap_p : p.overlap_p_chain;
  const double hi = std::max(tc, tm);  // (tc^q + tm^q)^(1/q), scaled so that no power underflows
  return hi * std::pow(std::pow(tc / hi, q) + std::pow(tm / hi, q), 1.0 / q);
}

namespace {

void check_widths(int64_t hidden, int64_t inter) {
  IFEC_CHECK(hidden >= 1 && hidden <= kMaxModelWidth && inter >= 1 && inter <= kMaxModelWidth,
             "GPU model: hidden " << hidden << " and inter " << inter << " must each be 1.." << kMaxModelWidth);
}

// The gated product silu(gate) * up: written and read once beyond L2, at the achievable HBM rate.
double swiglu_seconds(int64_t rows, int64_t inter, const GpuProfile& p, double bytes_per_element) {
  const double bytes = 3.0 * static_cast<double>(rows) * static_cast<double>(inter) * bytes_per_element;
  return std::max(0.0, bytes - p.l2_bytes) / (p.hbm_gbs * 1e9 * p.mem_fraction);
}

}  // namespace

double ffn_chain_seconds(int64_t rows, int64_t hidden, int64_t inter, const GpuProfile& p, double bytes_per_element) {
  check_widths(hidden, inter);
  if (rows == 0) return 0;
  const std::vector<int64_t> m{rows};
  return gemm_launch_seconds(m, 2 * inter, hidden, false, p, bytes_per_element) +
         gemm_launch_seconds(m, hidden, inter, false, p, bytes_per_element) +
         swiglu_seconds(rows, inter, p, bytes_per_element);
}

double routed_experts_seconds(const std::vector<int64_t>& tokens_per_expert, int64_t hidden, int64_t inter,
                              const GpuProfile& p, double bytes_per_element, ExpertKernel kernel) {
  check_widths(hidden, inter);
  int64_t rows = 0;
  for (size_t e = 0; e < tokens_per_expert.size(); ++e) {
    IFEC_CHECK(tokens_per_expert[e] >= 0, "tokens_per_expert[" << e << "]=" << tokens_per_expert[e] << " < 0");
    IFEC_CHECK(tokens_per_expert[e] <= kMaxModelRows - rows, "tokens_per_expert[" << e << "]=" << tokens_per_expert[e]
                                                                                  << ": the experts' rows exceed "
                                                                                  << kMaxModelRows);
    rows += tokens_per_expert[e];
  }
  if (rows == 0) return 0;
  if (kernel == ExpertKernel::kLoop) {
    double t = p.loop_call_us * 1e-6;
    for (int64_t m : tokens_per_expert) {
      t += ffn_chain_seconds(m, hidden, inter, p, bytes_per_element);
    }
    return t;
  }
  return gemm_launch_seconds(tokens_per_expert, 2 * inter, hidden, true, p, bytes_per_element) +
         gemm_launch_seconds(tokens_per_expert, hidden, inter, true, p, bytes_per_element) +
         swiglu_seconds(rows, inter, p, bytes_per_element);
}

double routed_experts_seconds(const std::vector<int64_t>& tokens_per_expert, int64_t hidden, int64_t inter,
                              const GpuProfile& p, double bytes_per_element) {
  return routed_experts_seconds(tokens_per_expert, hidden, inter, p, bytes_per_element, p.kernel);
}

std::vector<int64_t> even_spread(int64_t pairs, int64_t experts) {
  IFEC_CHECK(experts >= (pairs > 0 ? 1 : 0) && pairs >= 0,
             "cannot spread " << pairs << " pairs over " << experts << " experts");
  std::vector<int64_t> out(static_cast<size_t>(experts), experts > 0 ? pairs / experts : 0);
  for (int64_t e = 0; e < (experts > 0 ? pairs % experts : 0); ++e) {
    ++out[static_cast<size_t>(e)];
  }
  return out;
}

}  // namespace ifec::workloads
