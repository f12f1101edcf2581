// Collectives over a Cluster: the shared description of one operation and its result, the endpoint-based
// implementation (ring / chain / dissemination over RC transactions: the baseline and the fallback path), and the
// in-fabric one (IFEC engine in the switches, selected by ECH).
//
// Buffers are in place: every member holds its input at (window, offset) and, when the operation finishes, the
// result is there too (allreduce: every member; reduce: the root; multicast: every member gets the root's bytes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ifec/common/ech.h"
#include "ifec/common/interfaces.h"

namespace ifec::workloads {

class Cluster;

enum class Collective : uint8_t { kAllReduce, kReduce, kMulticast, kBarrier };
const char* collective_name(Collective c);
Collective parse_collective(const std::string& name);  // throws Error naming the value

struct CollectiveSpec {
  Collective kind = Collective::kAllReduce;
  std::vector<int> members;  // GPU indices, in ring order; 2 or more, distinct
  int root = 0;              // reduce destination / multicast source: one of the members
  uint16_t window = 1;       // symmetric window holding the buffer on every member
  uint64_t offset = 0;       // byte offset of the buffer inside the window
  uint64_t count = 0;        // elements of `dtype` (multicast moves count x element size bytes)
  common::EchDtype dtype = common::EchDtype::kFp32;
  common::EchRedOp op = common::EchRedOp::kSum;
  uint16_t scratch_window = 2;  // per-member staging + signal words for the endpoint-based path
};

struct CollectiveResult {
  bool ok = false;
  std::string error;
  common::TimeNs start_ns = 0;
  common::TimeNs end_ns = 0;
  bool fell_back = false;           // in-fabric path could not serve it (no reservation, pool exhausted, anomaly)
  uint64_t fallback_chunks = 0;     // chunks completed on the endpoint-based path instead
  uint64_t anomalies = 0;           // chunks a switch released with the anomaly flag
  std::string fallback_reason;      // why the fabric did not serve (part of) it, when fell_back
  std::vector<std::string> faults;  // what the operation met and did about it, one line each (in-fabric path)
};

size_t element_size(common::EchDtype t);
// Scratch bytes the endpoint-based path needs in `scratch_window` on every member for `spec`.
uint64_t ring_scratch_bytes(const CollectiveSpec& spec);
// Validates a spec against the cluster (members, root, windows and sizes); throws Error naming the bad value.
void validate_spec(Cluster& cluster, const CollectiveSpec& spec);

// Endpoint-based path: allreduce = ring reduce-scatter + ring allgather; reduce = ring reduce-scatter + gather
// to the root; multicast = pipelined chain from the root; barrier = dissemination. Every step is an RC
// transaction (a plain store whose arrival the receiver counts, like RDMA WRITE WITH IMMEDIATE); reductions happen
// at the endpoints in the element type (one rounding per step,
// as NCCL does). Runs the simulation until done or `limit` of simulated time passed (then ok = false).
CollectiveResult run_endpoint_collective(Cluster& cluster, const CollectiveSpec& spec,
                                         common::TimeNs limit = 10'000'000'000ULL);

}  // namespace ifec::workloads
