// `./ifec bench moe`: MoE points in every variant as independent runs on every core (parallel.h), largest first.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ifec/testbed/moe_run.h"

namespace ifec::testbed {

// Every point in every variant as independent runs on `jobs` threads (parallel.h), largest first: rows in
// (point, variant) order, each what run_moe_point gives serially. progress(done, total, running) after each run.
// Throws the first run's error once all have finished.
std::vector<MoeRow> run_moe_points(const MoeRunConfig& cfg, const std::vector<MoePoint>& points,
                                   const std::vector<MoeVariant>& variants, unsigned jobs,
                                   const std::function<void(size_t, size_t, const std::string&)>& progress);

}  // namespace ifec::testbed
