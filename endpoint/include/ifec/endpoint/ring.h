// DescriptorRing: the multi-producer / single-consumer descriptor ring of descriptor.h, with its CPU backend.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>

#include "ifec/endpoint/descriptor.h"

namespace ifec::endpoint {

// Busy-wait helper for the ring's spin loops: a few CPU pause hints, then yield so waiters on a small machine
// (more threads than cores) let the thread they wait for run.
class SpinBackoff {
 public:
  void pause() {
    if (spins_ < kSpinsBeforeYield) {
      ++spins_;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#elif defined(__aarch64__)
      asm volatile("yield");
#endif
    } else {
      std::this_thread::yield();
    }
  }
  void reset() { spins_ = 0; }

 private:
  static constexpr int kSpinsBeforeYield = 64;
  int spins_ = 0;
};

// Owns (plain host memory) or views (e.g. pinned mapped memory shared with a GPU) a RingHeader followed by
// `capacity` Descriptor slots, and implements both sides of the protocol in descriptor.h on the host:
//   producers: post(), quiet() — any number of threads at once (the CPU backend of the device API);
//   consumer:  try_pop(), mark_completed() — exactly one thread (the proxy).
// All header and `seq` accesses are __atomic builtins, so the same region can be shared with GPU producers that
// follow the protocol with atomicAdd / __threadfence_system. CPU and GPU producers must not share one ring: host
// and device read-modify-writes on `head` are not atomic with respect to each other over PCIe.
class DescriptorRing {
 public:
  static constexpr size_t kMaxCapacity = size_t{1} << 24;  // 2 GiB of slots; larger is a configuration mistake

  // Owning ring on the host heap. `capacity` must be a power of two in 1..kMaxCapacity (else ifec::common::Error).
  explicit DescriptorRing(size_t capacity);

  // Bytes a region for `capacity` slots needs (header + padding + slots).
  static size_t region_bytes(size_t capacity);
  // Initialises a caller-provided region (64-byte aligned, at least region_bytes(capacity) long): zero counters,
  // zero slots, capacity and slots_offset filled in. Returns the header.
  static RingHeader* init_region(void* region, size_t region_size, size_t capacity);
  // Non-owning view over a region already set up by init_region (validates capacity and slots_offset).
  static DescriptorRing view(void* region);

  DescriptorRing(DescriptorRing&&) noexcept;
  DescriptorRing& operator=(DescriptorRing&&) noexcept;
  DescriptorRing(const DescriptorRing&) = delete;
  DescriptorRing& operator=(const DescriptorRing&) = delete;
  ~DescriptorRing();

  // --- producer side (thread-safe) ---
  // Reserves a ticket, waits for its slot to be free, copies `d` (its `seq` is ignored), publishes seq = ticket + 1
  // with release ordering and rings the doorbell. Returns the ticket. Blocks while the ring is full: with a
  // single-threaded poll_once() consumer, post at most capacity() descriptors between polls.
  uint64_t post(const Descriptor& d);
  // Descriptors reserved so far (head).
  uint64_t issued() const;
  // Descriptors completed by the consumer so far, and how many of those failed.
  uint64_t completed() const;
  uint64_t errors() const;
  uint64_t doorbell() const;
  // Next ticket the consumer will take (tail).
  uint64_t consumed() const;
  // Waits until completed() >= issued() as read at the call. Returns false if `timeout` passes first.
  bool quiet(std::chrono::nanoseconds timeout = std::chrono::nanoseconds::max()) const;

  // --- consumer side (one thread only) ---
  // Copies the next published descriptor into *out and frees its slot; false if the next slot is not ready yet.
  bool try_pop(Descriptor* out);
  // Completes one descriptor (completed += 1, errors += 1 if `error`), release ordering so quiet() callers see the
  // effects (results written through LocalMemory) that precede it.
  void mark_completed(bool error);

  size_t capacity() const { return capacity_; }
  RingHeader* header() const { return header_; }
  Descriptor* slots() const { return slots_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  DescriptorRing(void* region, std::unique_ptr<void, Free> owned);

  std::unique_ptr<void, Free> owned_;
  RingHeader* header_ = nullptr;
  Descriptor* slots_ = nullptr;
  size_t capacity_ = 0;
  uint64_t mask_ = 0;
};

}  // namespace ifec::endpoint
