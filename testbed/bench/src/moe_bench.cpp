// MoE sweeps on every core: each (point, variant) an independent run on its own fresh simulated fabric.
#include "ifec/testbed/moe_bench.h"

#include <algorithm>

#include "ifec/common/checks.h"
#include "ifec/common/heap.h"
#include "ifec/testbed/parallel.h"

namespace ifec::testbed {

using workloads::moe_variant_name;

std::vector<MoeRow> run_moe_points(const MoeRunConfig& cfg, const std::vector<MoePoint>& points,
                                   const std::vector<MoeVariant>& variants, unsigned jobs,
                                   const std::function<void(size_t, size_t, const std::string&)>& progress) {
  for (const MoePoint& p : points) {
    validate_moe_point(cfg, p);  // every point before any runs: a bad one costs no minutes of the others
  }
  const size_t nv = variants.size();
  std::vector<MoeRow> rows(points.size() * nv);
  std::vector<std::string> errors(rows.size());
  ParallelJobs pj;
  for (size_t i = 0; i < rows.size(); ++i) {
    pj.order.push_back(i);
  }
  auto work = [&](size_t i) { return static_cast<double>(points[i / nv].ep) * points[i / nv].tokens; };
  std::stable_sort(pj.order.begin(), pj.order.end(), [&](size_t a, size_t b) { return work(a) > work(b); });
  // The point's data (moe_point_data_bytes: the windows' rows above all), and every (token, rank) store waiting in an
  // endpoint's queues about 3 KB of state (an EP 64 x 4096-token run: about 9 GB estimated, near 8 GB measured).
  pj.need = [&](size_t i) {
    const MoePoint& p = points[i / nv];
    const auto pairs = static_cast<uint64_t>(p.ep) * static_cast<uint64_t>(p.tokens * cfg.model.topk);
    return static_cast<uint64_t>(moe_point_data_bytes(cfg, p)) + pairs * 3072;
  };
  pj.budget = common::memory_budget_bytes(12ULL << 30);
  pj.label = [&](size_t i) {
    const MoePoint& p = points[i / nv];
    return p.mode + " EP " + std::to_string(p.ep) + " " + moe_variant_name(variants[i % nv]);
  };
  MoeRunConfig quiet = cfg;
  quiet.progress = nullptr;
  pj.run = [&](size_t i) {
    try {
      std::vector<MoeRow> got = run_moe_point(quiet, points[i / nv], {variants[i % nv]});
      if (!got.empty()) {  // none on a process that serves rank 0's fabrics
        rows[i] = std::move(got[0]);
      }
    } catch (const std::exception& e) {
      errors[i] = e.what();
    }
  };
  pj.progress = progress;
  const bool spread = cfg.processes != nullptr && cfg.processes->size > 1;
  run_parallel(pj, spread ? 1 : jobs);  // over processes, every process takes the points in one order
  for (const std::string& e : errors) {
    IFEC_CHECK(e.empty(), e);
  }
  if (spread && cfg.processes->rank != 0) {
    return {};
  }
  return rows;
}

}  // namespace ifec::testbed
