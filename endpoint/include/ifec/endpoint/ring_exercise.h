// The exercise both kinds of producer run on a hostd's descriptor ring (ifec-ring: CPU threads, or a CUDA kernel
// with --gpu): rows of a known pattern stored into a target GPU's window, and 64-bit fetch-adds of 1 on one counter
// there. Local addresses are offsets in the producer's data area (the ring's shared region), so the same
// descriptors work from either side. Plain C++, callable from kernels too.
#pragma once

#include <cstdint>

#include "ifec/endpoint/descriptor.h"

#if defined(__CUDACC__)
#define IFEC_RING_HD __host__ __device__
#else
#define IFEC_RING_HD
#endif

namespace ifec::endpoint {

struct RingExercise {
  uint16_t target = 0;
  uint16_t window = 0;
  uint64_t counter = 0;  // the counter's offset in the window; row i lands at counter + 64 + i * row_bytes
  uint64_t puts = 0;
  uint64_t row_bytes = 0;
  uint64_t fetch_adds = 0;
  uint64_t results_at = 64;  // data-area offset of fetched value i (8 B each; 0 would mean "no result")
  uint64_t rows_at = 0;      // data-area offset of row i's payload
  uint64_t seed = 1;

  // Byte k of row i (a test recomputes it).
  IFEC_RING_HD static uint8_t byte(uint64_t seed, uint64_t i, uint64_t k) {
    return static_cast<uint8_t>((seed * 29 + i * 131 + k * 7) ^ (k >> 8));
  }
  IFEC_RING_HD Descriptor put(uint64_t i) const {
    Descriptor d;
    d.op = static_cast<uint8_t>(DescOp::kPut);
    d.target = target;
    d.window = window;
    d.length = static_cast<uint32_t>(row_bytes);
    d.remote_offset = counter + 64 + i * row_bytes;
    d.local_addr = rows_at + i * row_bytes;
    return d;
  }
  IFEC_RING_HD Descriptor fetch_add(uint64_t i) const {
    Descriptor d;
    d.op = static_cast<uint8_t>(DescOp::kFetchAdd);
    d.target = target;
    d.window = window;
    d.length = 8;
    d.remote_offset = counter;
    d.value = 1;
    d.result_addr = results_at + i * 8;
    return d;
  }
};

}  // namespace ifec::endpoint
