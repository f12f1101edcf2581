// Sweeps of collective points on every core (parallel.h), each point on its own fresh simulated fabric.
#include "ifec/testbed/collective_bench.h"

#include <algorithm>
#include <sstream>

#include "ifec/testbed/collective_run.h"
#include "ifec/testbed/parallel.h"

namespace ifec::testbed {

std::vector<CollectiveRow> run_collective_points(
    const routing::Topology& topo, const std::vector<CollectivePoint>& points, unsigned jobs,
    const std::function<void(size_t done, size_t total, const std::string& running)>& progress) {
  std::vector<CollectiveRow> rows(points.size());
  ParallelJobs pj;
  for (size_t i = 0; i < points.size(); ++i) {
    pj.order.push_back(i);
  }
  std::stable_sort(pj.order.begin(), pj.order.end(),
                   [&](size_t a, size_t b) { return points[a].bytes > points[b].bytes; });
  const uint64_t gpus = static_cast<uint64_t>(topo.num_gpus());
  // Two windows per GPU (buffer, scratch); the check works in small blocks.
  pj.need = [&](size_t i) { return 2 * gpus * std::max<uint64_t>(points[i].bytes, 4096) + (1 << 20); };
  pj.budget = point_memory_budget();  // a smaller machine runs fewer points at once
  pj.label = [&](size_t i) {
    std::ostringstream os;
    os << points[i].bytes << " B " << workloads::algo_name(points[i].algo);
    return os.str();
  };
  pj.run = [&](size_t i) {
    try {
      rows[i] = run_collective_point(topo, points[i]);
    } catch (const std::exception& e) {
      rows[i].point = points[i];
      rows[i].ok = false;
      rows[i].error = e.what();
    }
  };
  pj.progress = progress;
  run_parallel(pj, jobs);
  return rows;
}

}  // namespace ifec::testbed
