// Independent simulation runs on every core: one event loop per run, each on its own thread, started in a given
// order (largest first) and never more at once than a host-memory budget allows. What the benches' sweeps use
// (collective sizes, MoE points); each run's result is the one a serial run gives, since runs share nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ifec::testbed {

struct ParallelJobs {
  std::vector<size_t> order;                 // job indices, in the order to start them
  std::function<uint64_t(size_t)> need;      // host bytes a job takes while it runs
  uint64_t budget = 12ULL << 30;             // what the running jobs may take together (one always runs):
                                             // common::memory_budget_bytes() by default in the benches
  std::function<std::string(size_t)> label;  // for the progress line
  std::function<void(size_t)> run;           // runs job i; must not throw
  // After each job: (done, total, the labels of those still running).
  std::function<void(size_t, size_t, const std::string&)> progress;
};

// Runs every job on `threads` threads (the calling one included); returns when all are done. A job that does not
// fit beside the running ones waits for them, and the jobs after it wait behind it.
void run_parallel(const ParallelJobs& jobs, unsigned threads);

}  // namespace ifec::testbed
