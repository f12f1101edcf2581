// `./ifec bench endpoint`: descriptors per second through the ring and proxy, and store goodput of the endpoint
// runtime on the simulated fabric (one plane vs all four).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ifec/endpoint/endpoint.h"
#include "ifec/routing/topology.h"

namespace ifec::testbed {

struct StoreGoodput {
  std::string mode;     // ordering mode
  int planes = 0;       // planes the endpoints used
  uint64_t stores = 0;  // non-blocking stores in flight together
  uint64_t bytes_each = 0;
  double sim_ns = 0;          // simulated time from the first post to quiet() completing
  double goodput_gbps = 0;    // payload bits / simulated time
  double line_rate_gbps = 0;  // the source GPU's access bandwidth on those planes
  double wall_seconds = 0;
};

// GPU 0 streams `stores` stores of `bytes_each` to GPU 1 of `topo` using only the first `planes` planes.
StoreGoodput bench_store_goodput(const routing::Topology& topo, endpoint::Ordering mode, int planes, uint64_t stores,
                                 uint64_t bytes_each);

struct DescriptorRate {
  std::string backend;  // "cpu-null-sink" or "cpu-sim-fabric"
  int producer_threads = 0;
  uint64_t descriptors = 0;
  double seconds = 0;  // wall clock
  double per_second = 0;
};

// The GPUs bench_descriptor_rate_sim needs: GPU 0 puts to GPUs 1..7.
constexpr int kDescriptorBenchGpus = 8;

// Descriptors through a ring and a proxy into the simulated fabric: 8-byte puts from GPU 0 to its peers,
// including the simulation work behind each (wall-clock rate of this machine).
DescriptorRate bench_descriptor_rate_sim(const routing::Topology& topo, uint64_t descriptors);

}  // namespace ifec::testbed
