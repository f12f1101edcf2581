// MoE points from Python (built only with LibTorch): results as JSON text, as the other measurement bindings.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <thread>

#include "ifec/common/checks.h"
#include "ifec/testbed/moe_bench.h"
#include "register.h"

namespace py = pybind11;
using namespace ifec;

namespace ifec::bindings {

namespace {

testbed::MoeRunConfig moe_config(const routing::Topology& topo, int64_t hidden, int64_t experts, int64_t topk,
                                 int64_t inter, int64_t run_inter, bool bf16, bool compute, int64_t token_cap,
                                 uint64_t seed, const std::string& gpu_profile, bool fp8_dispatch, bool overlap) {
  testbed::MoeRunConfig cfg;
  cfg.topo = topo;
  cfg.topology_name = topo.name;
  cfg.model.hidden = hidden;
  cfg.model.experts = experts;
  cfg.model.topk = topk;
  cfg.model.inter = inter;
  cfg.run_inter = run_inter;
  cfg.bf16 = bf16;
  cfg.compute = compute;
  cfg.token_cap = token_cap;
  cfg.seed = seed;
  cfg.fp8_dispatch = fp8_dispatch;
  cfg.overlap = overlap;
  if (!gpu_profile.empty()) {
    cfg.profile = workloads::load_gpu_profile(gpu_profile);
  }
  return cfg;
}

std::vector<testbed::MoeVariant> moe_variants(const std::vector<std::string>& variants) {
  std::vector<testbed::MoeVariant> vs;
  for (const auto& v : variants) {
    vs.push_back(testbed::parse_moe_variant(v));
  }
  IFEC_CHECK(!vs.empty(), "run_moe: no variants");
  return vs;
}

std::string rows_json(const std::vector<testbed::MoeRow>& rows, const std::string& topology) {
  std::string json = "[";
  for (size_t i = 0; i < rows.size(); ++i) {
    json += (i ? "," : "") + testbed::moe_row_record(rows[i], topology).str();
  }
  return json + "]";
}

std::string run_moe_json(const routing::Topology& topo, const std::string& mode, int ep, int64_t tokens,
                         const std::vector<std::string>& variants, int64_t hidden, int64_t experts, int64_t topk,
                         int64_t inter, int64_t run_inter, bool bf16, bool compute, int64_t token_cap, uint64_t seed,
                         const std::string& gpu_profile, bool fp8_dispatch, bool overlap, bool elided_payloads,
                         int threads, bool live_timing, const pybind11::dict& turns, int gpu_groups, int leaf_groups) {
  testbed::MoeRunConfig cfg = moe_config(topo, hidden, experts, topk, inter, run_inter, bf16, compute, token_cap, seed,
                                         gpu_profile, fp8_dispatch, overlap);
  cfg.elided_payloads = elided_payloads;
  cfg.threads = threads;
  cfg.gpu_groups = gpu_groups;
  cfg.leaf_groups = leaf_groups;
  cfg.live_timing = live_timing;
  cfg.start = turns_from(turns);
  const std::vector<testbed::MoeVariant> vs = moe_variants(variants);
  testbed::MoePoint p;
  p.mode = mode;
  p.ep = ep;
  p.tokens = tokens;
  return rows_json(interruptible([&] { return testbed::run_moe_point(cfg, p, vs); }), cfg.topology_name);
}

// Several EP sizes at once on `jobs` threads (0: every core): rows in (EP, variant) order, as a serial run's.
std::string run_moe_points_json(const routing::Topology& topo, const std::string& mode, const std::vector<int>& eps,
                                int64_t tokens, const std::vector<std::string>& variants, int64_t hidden,
                                int64_t experts, int64_t topk, int64_t inter, uint64_t seed,
                                const std::string& gpu_profile, bool fp8_dispatch, unsigned jobs) {
  const testbed::MoeRunConfig cfg =
      moe_config(topo, hidden, experts, topk, inter, 8, true, false, 0, seed, gpu_profile, fp8_dispatch, false);
  std::vector<testbed::MoePoint> points;
  for (int ep : eps) {
    points.push_back({mode, ep, tokens});
  }
  const unsigned threads = jobs > 0 ? jobs : std::max(1u, std::thread::hardware_concurrency());
  // No interrupt check here: the event loop's check is one per process, and these loops run on several threads.
  pybind11::gil_scoped_release release;
  return rows_json(testbed::run_moe_points(cfg, points, moe_variants(variants), threads, nullptr), cfg.topology_name);
}

workloads::GpuProfile profile_at(const std::string& path) {
  return path.empty() ? workloads::GpuProfile() : workloads::load_gpu_profile(path);
}

std::string gpu_profile_summary(const std::string& path) { return profile_at(path).summary(); }

// The model's microseconds for one rank: routed experts (tokens per local expert) under `kernel`, or one FFN chain
// (the shared expert) when tokens_per_expert has one entry and kernel is "chain".
double gpu_model_us(const std::string& path, const std::string& kernel, const std::vector<int64_t>& tokens_per_expert,
                    int64_t hidden, int64_t inter) {
  IFEC_CHECK(hidden >= 1 && inter >= 1, "gpu_model_us: hidden " << hidden << " and inter " << inter << " must be >= 1");
  for (int64_t t : tokens_per_expert) {
    IFEC_CHECK(t >= 0, "gpu_model_us: " << t << " tokens for an expert");
  }
  const workloads::GpuProfile p = profile_at(path);
  if (kernel == "chain") {
    IFEC_CHECK(tokens_per_expert.size() == 1, "gpu_model_us: a chain takes one row count");
    return 1e6 * workloads::ffn_chain_seconds(tokens_per_expert[0], hidden, inter, p, 2);
  }
  return 1e6 * workloads::routed_experts_seconds(tokens_per_expert, hidden, inter, p, 2,
                                                 workloads::parse_expert_kernel(kernel));
}

}  // namespace

void register_moe(py::module_& m) {
  m.attr("has_moe") = true;
  m.def("run_moe_json", &run_moe_json, py::arg("topology"), py::arg("mode"), py::arg("ep"), py::arg("tokens"),
        py::arg("variants"), py::arg("hidden") = 7168, py::arg("experts") = 256, py::arg("topk") = 8,
        py::arg("inter") = 2048, py::arg("run_inter") = 8, py::arg("bf16") = true, py::arg("compute") = false,
        py::arg("token_cap") = 0, py::arg("seed") = 1, py::arg("gpu_profile") = "", py::arg("fp8_dispatch") = false,
        py::arg("overlap") = false, py::arg("elided_payloads") = false, py::arg("threads") = 0,
        py::arg("live_timing") = false, py::arg("turns") = py::dict(), py::arg("gpu_groups") = 0,
        py::arg("leaf_groups") = 0,
        "One MoE point (DeepSeek-V3 routing) in each variant over the simulated fabric; rows as JSON text");
  m.def("run_moe_points_json", &run_moe_points_json, py::arg("topology"), py::arg("mode"), py::arg("eps"),
        py::arg("tokens"), py::arg("variants"), py::arg("hidden") = 7168, py::arg("experts") = 256, py::arg("topk") = 8,
        py::arg("inter") = 2048, py::arg("seed") = 1, py::arg("gpu_profile") = "", py::arg("fp8_dispatch") = false,
        py::arg("jobs") = 0,
        "MoE points at several EP sizes in timing mode, run on `jobs` threads (0: every core); rows as JSON text");
  m.def("gpu_profile_summary", &gpu_profile_summary, py::arg("path") = "",
        "One line naming the experts' GPU model (the built-in fitted H100, or the profile file at `path`)");
  m.def("gpu_model_us", &gpu_model_us, py::arg("path"), py::arg("kernel"), py::arg("tokens_per_expert"),
        py::arg("hidden") = 7168, py::arg("inter") = 2048,
        "The GPU model's time (us, bf16) of a rank's routed experts (kernel grouped|loop) or of one chain");
}

}  // namespace ifec::bindings
