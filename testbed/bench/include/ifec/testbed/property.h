// Randomized property check of the in-fabric operations: every case draws a fabric (one- or two-tier, 2..16 GPUs,
// 1..4 planes), an operation (AllReduce, reduce, multicast, the MoE combine's batch reduction, the MoE dispatch's
// batch multicast), sizes that are not powers of two, a dtype and op, a loss rate of 0.5-5% on every link and a slot
// budget, runs it on the simulated fabric and compares every output element with a reference computed on the host.
// A case is a pure function of its seed, so a failure is reproduced with `./ifec bench property --case SEED`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ifec/common/ech.h"

namespace ifec::testbed {

enum class PropertyKind : uint8_t { kAllReduce, kReduce, kMulticast, kCombine, kDispatch };
const char* property_kind_name(PropertyKind k);

struct PropertyCase {
  uint64_t seed = 0;
  PropertyKind kind = PropertyKind::kAllReduce;
  int gpus = 8;
  int planes = 2;
  bool two_tier = false;  // leaf-spine planes (2 leaves, 2 spines) instead of one switch per plane
  int members = 0;        // collectives: GPUs 0..members-1 take part
  common::EchDtype dtype = common::EchDtype::kFp32;
  common::EchRedOp op = common::EchRedOp::kSum;
  uint64_t count = 0;         // collectives: elements
  uint32_t rows = 0;          // batch operations: rows
  uint32_t row_elements = 0;  // batch operations: elements per row (bytes for dispatch)
  int max_contributors = 0;   // combine: contributors per row, at most
  double loss = 0;
  uint32_t slot_budget = 128;   // slots per group asked of each switch
  uint32_t slot_pool = 8192;    // slots each switch has
  bool corrupt_output = false;  // checks the checker: one output element is changed before the comparison

  std::string describe() const;  // one line: everything above
};

// The case drawn from `seed` (deterministic).
PropertyCase random_case(uint64_t seed);

struct PropertyResult {
  bool ok = false;        // ran to the end and every element matched
  uint64_t wrong = 0;     // elements outside the tolerance
  std::string error;      // why not ok
  double sim_us = 0;      // simulated time of the operation
  uint64_t fallback = 0;  // chunks / packets finished off the in-fabric path
  std::vector<std::string> faults;
};

PropertyResult run_property_case(const PropertyCase& c);

struct PropertySummary {
  uint64_t cases = 0;
  uint64_t failed = 0;
  uint64_t fallback_cases = 0;  // cases where some chunks left the in-fabric path (and still matched)
  double wall_seconds = 0;
  std::vector<std::string> failures;  // describe() + error, one per failed case
};

// Runs cases seed0, seed0 + 1, ... until `cases` ran or `seconds` of wall time passed (0: no limit); `progress`
// gets a line per case when set.
PropertySummary run_property_sweep(uint64_t seed0, uint64_t cases, double seconds,
                                   const std::function<void(const std::string&)>& progress = {});

}  // namespace ifec::testbed
