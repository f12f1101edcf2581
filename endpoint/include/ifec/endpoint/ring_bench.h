// Descriptor-rate benchmark of the CPU backend: producer threads post into a ring that a Proxy drains.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ifec::endpoint {

struct RingBenchResult {
  int producer_threads = 0;
  uint64_t descriptors = 0;  // posted and completed in total
  size_t capacity = 0;       // ring slots
  double seconds = 0;        // wall time from the producers' start to quiet() returning
  double descriptors_per_s = 0;
};

// Posts `descriptors` kAtomicAdd descriptors from `producer_threads` std::threads (split evenly) into a ring of
// `capacity` slots, drained by a Proxy thread into a sink that completes each descriptor immediately; measures
// the end-to-end rate including the final quiet(). Throws ifec::common::Error on bad arguments.
RingBenchResult bench_descriptor_rate(int producer_threads, uint64_t descriptors, size_t capacity);

}  // namespace ifec::endpoint
