// A collective point run by the simulated driver (`./ifec sim --collective`, the benches, the Python package, the
// simulated side of `./ifec live compare`): a fresh fabric and cluster from the topology, every member's input
// written into its window, the point's link failures scheduled, the collective run by every member's
// communicator, and the row filled from what the fabric counted, its outputs checked against the fp64 reference.
#pragma once

#include <cstdint>

#include "ifec/routing/topology.h"
#include "ifec/testbed/collective_point.h"
#include "ifec/testbed/partitions.h"

namespace ifec::testbed {

// Host bytes the simulated GPUs' windows of one point may take together (a buffer and a scratch window per GPU):
// 12 GiB, or 3/4 of a smaller machine's memory (point_memory_budget).
inline constexpr uint64_t kPointMemoryBudget = 12ULL << 30;
uint64_t point_memory_budget();
// Throws naming the point where its windows on every GPU of `topo` would take more than point_memory_budget(): what
// run_collective_point refuses, checked without a fabric (a bench checks every point before running any).
void check_point_memory(const routing::Topology& topo, const CollectivePoint& p);

// Throws common::Error naming a bad value of `p` (size, dtype, members, loss, slot pool or budget, failures) or a
// point too large for point_memory_budget(); a run that fails or computes a wrong result is a row with ok = false.
// `procs`: one run spread over MPI processes (every process calls this alike; rank 0's row is the run's).
CollectiveRow run_collective_point(const routing::Topology& topo, const CollectivePoint& p,
                                   const Processes* procs = nullptr);

// The all-to-all of alltoall_point.h on every GPU of a fresh fabric (`p.bytes` per peer; `p.kind` and `dtype` are
// not used): the row's time, wire bytes per plane and link, turns and the received bytes checked. Throws naming
// what it does not take (members, loss, failures, elided payloads).
CollectiveRow run_alltoall_point(const routing::Topology& topo, const CollectivePoint& p);

class Cluster;
// Sets the carried state GPUs 0..n-1 of `c` start from (`t`: stripe rotors and multicast PSNs, one per GPU or none;
// the group turn is the communicators' IfecOptions::first_group) and returns what they start from. Throws naming a
// count that is not one per GPU.
Turns start_turns(Cluster& c, const Turns& t, int n);

}  // namespace ifec::testbed
