// A hostd's descriptor ring in POSIX shared memory, so local programs post memory transactions through it: CPU
// threads directly, a GPU kernel after registering the region with CUDA (cudaHostRegister, mapped). hostd owns
// the region and drains the ring into its endpoint (a Proxy and an EndpointSink on its loop); programs open it.
//
// Region (/dev/shm/ifec-ring-<node>): a HostRingInfo header, the ring (descriptor.h's header and slots), then a
// data area. A descriptor's local_addr and result_addr are byte offsets into the data area (its payloads, loaded
// bytes and fetched values); targets are GPU indices, windows the communicator's (hostd keeps kHostRingWindow of
// info.window_bytes on every rank for this).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ifec/endpoint/ring.h"
#include "ifec/endpoint/sink.h"

namespace ifec::live {

inline constexpr uint16_t kHostRingWindow = 100;  // every hostd's standing window for ring traffic

struct HostRingInfo {
  char magic[8];           // "IFECRNG1"
  uint32_t gpu;            // the owning hostd's GPU
  uint32_t ranks;          // GPUs of the fabric
  uint64_t ring_offset;    // from the start of the region (64-byte aligned)
  uint64_t ring_capacity;  // descriptor slots
  uint64_t data_offset;    // (4096-byte aligned)
  uint64_t data_bytes;
  uint16_t window;        // kHostRingWindow
  uint64_t window_bytes;  // its size on every rank
  uint64_t ready;         // 1 once hostd drains the ring (after the fabric bootstrapped)
  int32_t owner_pid;      // the hostd's process (for messages; liveness is its lock on the region)
};

// The shared-memory path of hostd `node`.
std::string host_ring_path(const std::string& node);

class HostRing {
 public:
  // hostd: creates (replacing a stale one) and initialises the region. Throws common::Error naming the path, also
  // when a running hostd of the same node holds it (and its pid).
  static std::unique_ptr<HostRing> create(const std::string& node, uint32_t gpu, uint32_t ranks, size_t capacity,
                                          size_t data_bytes, uint64_t window_bytes);
  // A program: opens hostd `node`'s region. Throws common::Error naming the path and why (no such hostd ring, not
  // a ring, a different version, a stale ring whose hostd is gone).
  static std::unique_ptr<HostRing> open(const std::string& node);
  // Whether the hostd that made the ring still runs (it holds an exclusive lock on the region while it lives).
  bool owner_alive() const;
  // ring().post() that waits for a free slot without spinning, throwing common::Error naming the hostd when that
  // hostd is gone (a full ring would otherwise be waited on forever).
  void post(const endpoint::Descriptor& d);
  // ring().quiet() that gives up, throwing common::Error naming the hostd, as soon as that hostd is gone; false when
  // `timeout` passes first.
  bool quiet(std::chrono::nanoseconds timeout);
  ~HostRing();
  HostRing(const HostRing&) = delete;
  HostRing& operator=(const HostRing&) = delete;

  HostRingInfo& info() { return *info_; }
  endpoint::DescriptorRing& ring() { return ring_; }
  uint8_t* data() { return base_ + info_->data_offset; }
  void* region() { return base_; }
  size_t region_bytes() const { return bytes_; }

 private:
  HostRing(int fd, uint8_t* base, size_t bytes, bool owner, std::string path);
  int fd_;
  uint8_t* base_;
  size_t bytes_;
  bool owner_;
  std::string path_;
  HostRingInfo* info_;
  endpoint::DescriptorRing ring_;
};

// LocalMemory over a ring's data area: addresses are offsets; out-of-range ones are refused (valid() false).
class RingDataMemory : public endpoint::LocalMemory {
 public:
  RingDataMemory(uint8_t* data, size_t bytes) : data_(data), bytes_(bytes) {}
  void read(uint64_t addr, void* dst, size_t len) override;
  void write(uint64_t addr, const void* src, size_t len) override;
  bool valid(uint64_t addr, size_t len) const override { return addr <= bytes_ && len <= bytes_ - addr; }

 private:
  uint8_t* data_;
  size_t bytes_;
};

}  // namespace ifec::live
