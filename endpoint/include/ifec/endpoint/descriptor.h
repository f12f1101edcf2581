// The transaction descriptor and ring layout shared by GPU kernels, the CPU backend and the proxy thread.
// Plain C++ (no CUDA types) so host code, .cu files and tests include the same definition.
//
// Protocol (one ring per GPU, multi-producer / single-consumer):
//   producer (GPU thread or CPU thread): ticket = atomicAdd(&hdr->head, 1); wait while ticket - tail >= capacity;
//     fill slots[ticket & mask] except `seq`; memory fence; write seq = ticket + 1; then atomicAdd(&doorbell, 1).
//   proxy: for ticket = tail: wait until slots[ticket & mask].seq == ticket + 1; read it; tail = ticket + 1;
//     issue it through a TransactionSink; when the sink completes it, completed += 1 (errors += 1 on failure).
//   device quiet(): issued = head at the time of the call; spin until completed >= issued.
//   `completed` is a prefix count: consumers report completions in ticket order even when the sink finishes out
//   of order (the Proxy does), otherwise later descriptors could satisfy an earlier quiet().
//   CPU and GPU producers never share a ring: GPU atomics on mapped host memory are not atomic against the CPU.
// Counters are 64-bit and never wrap in practice.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ifec::endpoint {

enum class DescOp : uint8_t {
  kNop = 0,
  kPut = 1,          // store `length` bytes from local_addr to (target, window, remote_offset)
  kPutSignal = 2,    // put, then once it is delivered, signal op on (target, signal_window, signal_offset)
  kAtomicAdd = 3,    // 64-bit add of `value`, result discarded
  kFetchAdd = 4,     // 64-bit fetch-add; the old value is written to result_addr
  kCompareSwap = 5,  // 64-bit CAS (compare, value); the old value is written to result_addr
  kGet = 6,          // load `length` bytes from (target, window, remote_offset) into local_addr
  kFence = 7,        // later descriptors to `target` are delivered after earlier ones (target 0xFFFF: all)
};

enum class SignalOp : uint8_t { kSet = 0, kAdd = 1 };  // NVSHMEM_SIGNAL_SET / NVSHMEM_SIGNAL_ADD

struct alignas(64) Descriptor {
  uint64_t seq = 0;  // ticket + 1 when the slot is ready; written last by the producer
  uint8_t op = 0;    // DescOp
  uint8_t signal_op = 0;
  uint16_t target = 0;  // destination endpoint (PE)
  uint16_t window = 0;
  uint16_t signal_window = 0;
  uint32_t length = 0;
  uint32_t reserved = 0;
  uint64_t remote_offset = 0;
  uint64_t local_addr =
      0;               // payload source (put) or destination (get): device memory on a GPU, host on the CPU backend
  uint64_t value = 0;  // add, swap or signal value
  uint64_t compare = 0;
  uint64_t signal_offset = 0;
  uint64_t result_addr = 0;  // fetched value destination (8 bytes), 0 for none
};
static_assert(sizeof(Descriptor) == 128, "two cache lines per descriptor");

// Ring header, placed at the start of the shared (pinned, mapped) region; slots follow at `slots_offset`.
struct alignas(64) RingHeader {
  alignas(64) unsigned long long head;       // next ticket producers reserve
  alignas(64) unsigned long long tail;       // next ticket the proxy consumes
  alignas(64) unsigned long long doorbell;   // bumped by producers after publishing a slot
  alignas(64) unsigned long long completed;  // descriptors the proxy has completed
  alignas(64) unsigned long long errors;     // of those, completed with an error
  alignas(64) unsigned long long capacity;   // power of two
  unsigned long long slots_offset;           // bytes from the header to slot 0
};

inline constexpr uint16_t kFenceAllTargets = 0xFFFF;

}  // namespace ifec::endpoint
