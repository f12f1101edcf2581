// What the proxy drains descriptors into: the endpoint runtime implements it over the simulated fabric; tests and
// the descriptor-rate benchmark use simple sinks. Also the accessor that emulates the NIC's GPUDirect DMA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "ifec/endpoint/descriptor.h"

namespace ifec::endpoint {

enum class OpStatus : uint8_t {
  kPending = 0,
  kOk,
  kRemoteAccessError,  // NAKed: bad rkey, out of bounds or wrong job; target memory unchanged
  kRetryExceeded,      // no acknowledgement after the retry budget: peer unreachable
  kInvalidArgument,    // rejected before anything was sent (bad target, window, length, alignment)
};
const char* op_status_name(OpStatus s);

// Reads and writes the initiator's local memory named in descriptors (device memory on a GPU: cudaMemcpy).
class LocalMemory {
 public:
  virtual ~LocalMemory() = default;
  virtual void read(uint64_t addr, void* dst, size_t len) = 0;
  virtual void write(uint64_t addr, const void* src, size_t len) = 0;
  // Whether [addr, addr + len) may be read and written (a bounded region says no to what lies outside it).
  virtual bool valid(uint64_t addr, size_t len) const {
    (void)addr;
    (void)len;
    return true;
  }
};

// Host pointers used as addresses (the CPU backend).
class HostMemory : public LocalMemory {
 public:
  void read(uint64_t addr, void* dst, size_t len) override;
  void write(uint64_t addr, const void* src, size_t len) override;
};

class TransactionSink {
 public:
  using Done = std::function<void(OpStatus status)>;
  virtual ~TransactionSink() = default;
  // Issues one descriptor from endpoint `source`; payloads are read / results written through `mem`.
  // `done` runs exactly once, on the proxy thread, from inside submit() or a later progress().
  virtual void submit(int source, const Descriptor& d, LocalMemory& mem, Done done) = 0;
  // Lets the sink advance (e.g. run the simulated fabric) ; returns true if it has work outstanding.
  virtual bool progress() = 0;
};

// Completes every descriptor inside submit(): measures a ring and proxy, not a transport (benchmarks, tests).
class NullSink : public TransactionSink {
 public:
  void submit(int, const Descriptor&, LocalMemory&, Done done) override { done(OpStatus::kOk); }
  bool progress() override { return false; }
};

}  // namespace ifec::endpoint
