// NVSHMEM-style device API of the GPU-initiated path: kernels post descriptors into a DeviceRingView.
//
// Each call follows the ring protocol in ifec/endpoint/descriptor.h: reserve a ticket with atomicAdd on head, wait
// for the slot, write the body, __threadfence_system(), publish seq = ticket + 1, bump the doorbell. Transfers are
// non-blocking (NVSHMEM *_nbi semantics): a put's source buffer is read when the proxy drains the descriptor, so
// reuse it only after ifec_quiet(). Every call returns false if a wait exceeded ring.timeout_ns (see api.h).
// Warp variants must be called by all 32 lanes of a warp with the same arguments; lane 0 posts.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "endpoint/cuda/api.h"

namespace ifec::endpoint {

__device__ __forceinline__ uint64_t ifec_globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ unsigned long long ifec_load_volatile(const unsigned long long* p) {
  return *reinterpret_cast<const volatile unsigned long long*>(p);
}

// Deadline for a device spin loop; timeout 0 never expires. Reads the clock only once a wait actually happens.
struct IfecDeadline {
  uint64_t timeout_ns;
  uint64_t end = 0;
  __device__ explicit IfecDeadline(uint64_t t) : timeout_ns(t) {}
  __device__ bool expired() {
    if (timeout_ns == 0) return false;
    const uint64_t now = ifec_globaltimer_ns();
    if (end == 0) end = now + timeout_ns;
    return now >= end;
  }
};

// Posts one descriptor (its seq is ignored). The ring lives in mapped host memory: every access here crosses PCIe,
// so the body goes out as one 8-byte and seven 16-byte stores.
__device__ inline bool ifec_post(const DeviceRingView& r, const Descriptor& d) {
  RingHeader* h = r.header;
  const unsigned long long ticket = atomicAdd(&h->head, 1ULL);
  if (ticket - ifec_load_volatile(&h->tail) >= r.capacity) {
    IfecDeadline deadline(r.timeout_ns);
    while (ticket - ifec_load_volatile(&h->tail) >= r.capacity) {
      if (deadline.expired()) return false;
      __nanosleep(128);
    }
  }
  Descriptor* slot = &r.slots[ticket & (r.capacity - 1)];
  const auto* src8 = reinterpret_cast<const unsigned long long*>(&d);
  reinterpret_cast<unsigned long long*>(slot)[1] = src8[1];  // op .. signal_window (bytes 8..15)
  const auto* src16 = reinterpret_cast<const uint4*>(&d);
  auto* dst16 = reinterpret_cast<uint4*>(slot);
#pragma unroll
  for (int i = 1; i < static_cast<int>(sizeof(Descriptor) / sizeof(uint4)); ++i) dst16[i] = src16[i];
  // The body must reach host memory before the proxy can see seq.
  __threadfence_system();
  *reinterpret_cast<volatile unsigned long long*>(&slot->seq) = ticket + 1;
  atomicAdd(&h->doorbell, 1ULL);
  return true;
}

// Waits until every descriptor reserved before the call (by any thread) has completed. Completions are reported in
// ticket order (see Proxy), so this covers the caller's own earlier posts and their results.
__device__ inline bool ifec_quiet(const DeviceRingView& r, unsigned long long* issued_out = nullptr) {
  const unsigned long long issued = ifec_load_volatile(&r.header->head);
  if (issued_out != nullptr) *issued_out = issued;
  IfecDeadline deadline(r.timeout_ns);
  while (ifec_load_volatile(&r.header->completed) < issued) {
    if (deadline.expired()) return false;
    __nanosleep(256);
  }
  // Acquire side: reads after quiet (fetched values the proxy copied into device memory) must not be satisfied
  // from before the completion was observed.
  __threadfence_system();
  return true;
}

__device__ inline bool ifec_put(const DeviceRingView& r, uint16_t target, uint16_t window, uint64_t remote_offset,
                                const void* src, uint32_t bytes) {
  Descriptor d;
  d.op = static_cast<uint8_t>(DescOp::kPut);
  d.target = target;
  d.window = window;
  d.length = bytes;
  d.remote_offset = remote_offset;
  d.local_addr = reinterpret_cast<uint64_t>(src);
  return ifec_post(r, d);  // its fence also orders this thread's payload stores before the publish
}

__device__ inline bool ifec_put_warp(const DeviceRingView& r, uint16_t target, uint16_t window, uint64_t remote_offset,
                                     const void* src, uint32_t bytes) {
  // All lanes' payload stores are ordered before lane 0's fence and publish by the warp barrier.
  __syncwarp();
  int ok = 1;
  if ((threadIdx.x & 31) == 0) ok = ifec_put(r, target, window, remote_offset, src, bytes);
  ok = __shfl_sync(0xFFFFFFFFu, ok, 0);
  __syncwarp();
  return ok != 0;
}

__device__ inline bool ifec_put_signal(const DeviceRingView& r, uint16_t target, uint16_t window,
                                       uint64_t remote_offset, const void* src, uint32_t bytes, uint16_t signal_window,
                                       uint64_t signal_offset, uint64_t signal_value, SignalOp signal_op) {
  Descriptor d;
  d.op = static_cast<uint8_t>(DescOp::kPutSignal);
  d.signal_op = static_cast<uint8_t>(signal_op);
  d.target = target;
  d.window = window;
  d.signal_window = signal_window;
  d.length = bytes;
  d.remote_offset = remote_offset;
  d.local_addr = reinterpret_cast<uint64_t>(src);
  d.value = signal_value;
  d.signal_offset = signal_offset;
  return ifec_post(r, d);
}

__device__ inline bool ifec_atomic_add(const DeviceRingView& r, uint16_t target, uint16_t window,
                                       uint64_t remote_offset, uint64_t value) {
  Descriptor d;
  d.op = static_cast<uint8_t>(DescOp::kAtomicAdd);
  d.target = target;
  d.window = window;
  d.length = 8;
  d.remote_offset = remote_offset;
  d.value = value;
  return ifec_post(r, d);
}

// Non-blocking fetch-add: the old value lands in *result (device memory) once a later ifec_quiet() returns.
__device__ inline bool ifec_fetch_add_nbi(const DeviceRingView& r, uint16_t target, uint16_t window,
                                          uint64_t remote_offset, uint64_t value, unsigned long long* result) {
  Descriptor d;
  d.op = static_cast<uint8_t>(DescOp::kFetchAdd);
  d.target = target;
  d.window = window;
  d.length = 8;
  d.remote_offset = remote_offset;
  d.value = value;
  d.result_addr = reinterpret_cast<uint64_t>(result);
  return ifec_post(r, d);
}

// Blocking fetch-add: posts with `scratch` (this thread's own 8 bytes of device memory) as the result address,
// quiets, and returns the old value in *old_value.
__device__ inline bool ifec_fetch_add(const DeviceRingView& r, uint16_t target, uint16_t window, uint64_t remote_offset,
                                      uint64_t value, unsigned long long* scratch, uint64_t* old_value) {
  if (!ifec_fetch_add_nbi(r, target, window, remote_offset, value, scratch)) return false;
  if (!ifec_quiet(r)) return false;
  *old_value = ifec_load_volatile(scratch);  // the proxy's copy engine wrote it: bypass a possibly stale L1 line
  return true;
}

// Later descriptors to `target` (kFenceAllTargets: to every target) are delivered after earlier ones.
__device__ inline bool ifec_fence(const DeviceRingView& r, uint16_t target = kFenceAllTargets) {
  Descriptor d;
  d.op = static_cast<uint8_t>(DescOp::kFence);
  d.target = target;
  return ifec_post(r, d);
}

}  // namespace ifec::endpoint
