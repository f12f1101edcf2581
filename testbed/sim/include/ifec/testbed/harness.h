// The simulated rank harness: one communicator per GPU over one event loop, driven to completion, and the
// collective descriptions the CLI, the benches, the property check and the Python package use. Every operation
// here is the ranks' own parts (workloads::Communicator) started together and merged into one result: the harness
// never reaches into an operation; it only splits a whole-cluster description into per-rank arguments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ifec/testbed/cluster.h"
#include "ifec/workloads/communicator.h"

namespace ifec::testbed {

using workloads::Algo;
using workloads::Collective;
using workloads::CollectiveResult;
using workloads::IfecOptions;

// One collective over a set of GPUs (rank r is members[r]).
struct CollectiveSpec {
  Collective kind = Collective::kAllReduce;
  std::vector<int> members;  // GPU indices, in rank (ring) order; 2 or more, distinct
  int root = 0;              // reduce destination / broadcast source: a member GPU
  uint16_t window = 1;       // symmetric window holding the buffer on every member
  uint64_t offset = 0;       // byte offset of the buffer inside the window
  uint64_t count = 0;        // elements of `dtype` (broadcast moves count x element size bytes)
  common::EchDtype dtype = common::EchDtype::kFp32;
  common::EchRedOp op = common::EchRedOp::kSum;
  uint16_t scratch_window = 2;  // per-member staging + signal words of the endpoint-based algorithms
};

// The communicator's arguments for `spec` (root as a rank).
workloads::CollArgs coll_args(const CollectiveSpec& spec);
// Scratch bytes `algo` needs in spec.scratch_window on every member (best: what its choice on `topo` needs, or
// without a topology the largest any choice needs).
uint64_t ring_scratch_bytes(const CollectiveSpec& spec, Algo algo = Algo::kRing,
                            const routing::Topology* topo = nullptr);
// Validates a spec against the cluster (members, root, windows and sizes, the scratch `algo` needs; ifec: the
// ring's, its fallback); throws Error naming the bad value.
void validate_spec(Cluster& cluster, const CollectiveSpec& spec, Algo algo = Algo::kRing);

// The endpoint-based algorithms (ring, tree, rd, oneshot, or best: the one the cost model picks), run by every
// member's communicator. Runs the simulation until done or `limit` of simulated time passed (then ok = false).
CollectiveResult run_endpoint_collective(Cluster& cluster, const CollectiveSpec& spec,
                                         common::TimeNs limit = 10'000'000'000ULL, Algo algo = Algo::kRing);

// Merges the ranks' results of one operation: ok when every rank is; times span them all; fallback counts are the
// largest (collectives: every rank counts every chunk) or the sum (batch operations: each rank counts its own rows).
CollectiveResult merge_results(const std::vector<CollectiveResult>& ranks, const std::vector<int>& gpus,
                               bool sum_counts);

// Batch multicast (MoE dispatch): many rows, each from its own source to its own destination set, in one operation.
// A row lives at the same byte offset of `window` at its source and at every destination (a symmetric layout).
struct RowMulticast {
  int source = 0;
  uint64_t offset = 0;            // byte offset of the row in the window, at the source and every destination
  std::vector<int> destinations;  // GPUs, source excluded (past GPU 63 the packets are ECH v2)
};
struct BatchMulticastSpec {
  uint16_t window = 0;
  uint64_t row_bytes = 0;
  std::vector<RowMulticast> rows;
};

// Batch reduction (MoE combine): many rows, each summed in the fabric from its own contributors and delivered to
// its own destination (which does not contribute: it adds its own part locally).
struct RowReduce {
  int destination = 0;
  uint32_t index = 0;  // result row: lands at result_offset + index * row bytes of result_window at the destination
  std::vector<std::pair<int, uint64_t>> contributions;  // (GPU, byte offset of its row in source_window)
};
struct BatchReduceSpec {
  uint16_t source_window = 0;
  uint16_t result_window = 0;
  uint64_t result_offset = 0;
  common::EchDtype dtype = common::EchDtype::kFp32;
  uint32_t row_elements = 0;
  std::vector<RowReduce> rows;  // row indices unique per destination
};

// Batch of point-to-point row stores (the endpoint-based MoE dispatch and combine): each row from its source's
// source_window to its destination's dest_window; a source posts its rows in the order listed.
struct RowPutSpec {
  int source = 0;
  uint64_t from = 0;  // byte offset in source_window at the source
  int destination = 0;
  uint64_t to = 0;  // byte offset in dest_window at the destination (distinct rows do not overlap)
};
struct BatchPutSpec {
  uint16_t source_window = 0;
  uint16_t dest_window = 0;
  uint64_t row_bytes = 0;
  std::vector<RowPutSpec> rows;
};

// Validates a whole batch against the cluster (GPUs, windows, row bounds, duplicates); throws Error naming the
// bad value. (Each rank also checks its own part; this catches it before any rank starts.)
void validate_rows(Cluster& cluster, const BatchMulticastSpec& spec);
void validate_rows(Cluster& cluster, const BatchReduceSpec& spec);
void validate_rows(Cluster& cluster, const BatchPutSpec& spec);
// Each rank's part of a whole-batch description (rank = GPU: batch operations run over every GPU).
std::vector<workloads::BatchMulticastArgs> split_rows(const BatchMulticastSpec& spec, int gpus);
std::vector<workloads::BatchReduceArgs> split_rows(const BatchReduceSpec& spec, int gpus);
std::vector<workloads::BatchPutArgs> split_rows(const BatchPutSpec& spec, int gpus);

// Every GPU's communicator runs its part of the batch of row stores (validated first).
CollectiveResult run_put_rows(Cluster& cluster, const BatchPutSpec& spec, common::TimeNs limit = 10'000'000'000ULL);
// The same from each rank's own part (per_gpu[g]: rank = GPU g; one per GPU of the cluster), as ranks plan it.
CollectiveResult run_put_rows(Cluster& cluster, std::vector<workloads::BatchPutArgs> per_gpu,
                              common::TimeNs limit = 10'000'000'000ULL);

struct IfecStats {
  uint64_t operations = 0;
  uint64_t fallback_operations = 0;  // operations that used the endpoint-based path for some or all chunks
  uint64_t fallback_chunks = 0;
  uint64_t anomalies = 0;  // anomaly-flagged results (timeouts and NaN/Inf)
  uint64_t contributions_sent = 0;
  uint64_t retransmissions = 0;
  uint64_t results_received = 0;
  uint64_t duplicate_results = 0;
  uint64_t protection_drops = 0;  // ECH writes that failed the rkey/bounds/job check
  uint64_t multicast_packets = 0;
  uint64_t busy_naks = 0;  // contributions a switch refused because their slot held an older chunk (retried)
};

// The in-fabric collectives of a cluster's ranks (the communicators' `ifec` algorithm and batch operations).
class IfecCollectives {
 public:
  explicit IfecCollectives(Cluster& cluster, IfecOptions opts = {});

  CollectiveResult run(const CollectiveSpec& spec, common::TimeNs limit = 10'000'000'000ULL);
  CollectiveResult multicast_rows(const BatchMulticastSpec& spec, common::TimeNs limit = 10'000'000'000ULL);
  CollectiveResult reduce_rows(const BatchReduceSpec& spec, common::TimeNs limit = 10'000'000'000ULL);
  // The same from each rank's own part (one per GPU of the cluster, rank = GPU), as ranks plan it.
  CollectiveResult multicast_rows(std::vector<workloads::BatchMulticastArgs> per_gpu,
                                  common::TimeNs limit = 10'000'000'000ULL);
  CollectiveResult reduce_rows(std::vector<workloads::BatchReduceArgs> per_gpu,
                               common::TimeNs limit = 10'000'000'000ULL);

  // Fault injection for tests: contributions from `gpu` never leave it (a contributor that never arrives).
  void suppress_contributions(int gpu, bool on = true);
  // Operation counts of this object and the endpoints' ECH counters since it was made.
  IfecStats stats() const;
  IfecOptions& options() { return opts_; }

 private:
  CollectiveResult account(CollectiveResult r);
  workloads::CommOptions comm_options(common::TimeNs limit) const;

  Cluster& cluster_;
  IfecOptions opts_;
  IfecStats ops_;
  std::vector<endpoint::EchCounters> base_;  // per GPU, at construction
};

}  // namespace ifec::testbed
