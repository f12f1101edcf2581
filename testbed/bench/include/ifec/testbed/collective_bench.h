// `./ifec bench collectives` and every sweep of collective points: independent points on every core, each what a
// serial run_collective_point gives.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ifec/routing/topology.h"
#include "ifec/testbed/collective_point.h"

namespace ifec::testbed {

// Independent points on `jobs` threads, the largest first; a point whose windows and check (about 2 x bytes x
// GPUs) would not fit beside the running ones' waits for them. Rows in the order of `points`, each what a serial
// run_collective_point gives (a point's failure is its row's error). `progress(done, total, running)` after each.
std::vector<CollectiveRow> run_collective_points(
    const routing::Topology& topo, const std::vector<CollectivePoint>& points, unsigned jobs,
    const std::function<void(size_t done, size_t total, const std::string& running)>& progress = {});

}  // namespace ifec::testbed
