// Host API of the CUDA backend: plain C++ (no CUDA headers, no __global__) so host code and tests can use it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ifec/endpoint/descriptor.h"
#include "ifec/endpoint/ring.h"
#include "ifec/endpoint/ring_exercise.h"
#include "ifec/endpoint/sink.h"

// Marks the few helpers kernels share with host code; expands to nothing outside nvcc.
#if defined(__CUDACC__)
#define IFEC_HOST_DEVICE __host__ __device__
#else
#define IFEC_HOST_DEVICE
#endif

namespace ifec::endpoint {

// True if device `device` can run this build's kernels (present, maps host memory, sm_90 or newer, a probe kernel
// launches). Otherwise false and, if `why` is set, the reason (e.g. the CUDA error of cudaGetDeviceCount).
bool cuda_available(std::string* why, int device = 0);
// The device's name ("NVIDIA H100 80GB HBM3"), for the rows a bench prints; "" when CUDA cannot say.
std::string cuda_device_name(int device = 0);

// What a kernel needs to post into a ring; plain pointers valid on the device. Passed by value to kernels.
struct DeviceRingView {
  RingHeader* header = nullptr;  // device address of the (mapped) header
  Descriptor* slots = nullptr;   // device address of slot 0
  uint64_t capacity = 0;
  // Device spin loops (ring full, quiet) give up after this many ns and report failure; 0 waits forever. A post
  // that gave up leaves its ticket unpublished, so the ring is unusable afterwards: this only keeps tests from
  // hanging when the proxy is broken.
  uint64_t timeout_ns = 0;
};

// A descriptor ring in pinned, mapped host memory (cudaHostAllocMapped | cudaHostAllocPortable): kernels post
// through device_view(), the host proxy consumes through ring(). Throws ifec::common::Error on CUDA failures.
class PinnedRing {
 public:
  explicit PinnedRing(size_t capacity, int device = 0);
  ~PinnedRing();
  PinnedRing(const PinnedRing&) = delete;
  PinnedRing& operator=(const PinnedRing&) = delete;

  DescriptorRing& ring() { return *ring_; }
  DeviceRingView device_view(uint64_t timeout_ns = 0) const;
  void* device_header() const { return device_; }

 private:
  void* host_ = nullptr;
  void* device_ = nullptr;
  std::unique_ptr<DescriptorRing> ring_;
};

// LocalMemory over GPU memory (any UVA address: device or mapped host). Copies on its own non-blocking stream so
// the proxy's copies do not wait for the running kernel that posted the descriptors (the legacy default stream
// would, and deadlock a kernel spinning in quiet()). Throws ifec::common::Error on CUDA failures.
class CudaLocalMemory : public LocalMemory {
 public:
  explicit CudaLocalMemory(int device = 0);
  ~CudaLocalMemory() override;
  CudaLocalMemory(const CudaLocalMemory&) = delete;
  CudaLocalMemory& operator=(const CudaLocalMemory&) = delete;
  void read(uint64_t addr, void* dst, size_t len) override;
  void write(uint64_t addr, const void* src, size_t len) override;

 private:
  int device_;
  void* stream_ = nullptr;  // cudaStream_t
};

// --- test kernel: threads and warps post puts, put-signals, atomics, fences and a blocking fetch-add ---

struct PutKernelConfig {
  int blocks = 8;
  int threads_per_block = 128;  // multiple of 32
  int iterations = 4;           // thread-level descriptors per thread (put, put-signal, atomic add in turn)
  uint32_t payload_bytes = 64;  // per thread-level put, multiple of 8
  bool warp_puts = true;        // also one warp-level 256-byte put per warp and iteration
  uint16_t targets = 16;        // destination endpoints used: id % targets
  uint64_t timeout_ns = 20'000'000'000ULL;
};

// Descriptor fields the put kernel uses, so a test can check what arrives (id = thread * iterations + iteration,
// warp id = warp * iterations + iteration, thread = global thread index).
struct PutKernelLayout {
  static constexpr uint16_t kPutWindow = 1;
  static constexpr uint16_t kSignalWindow = 2;
  static constexpr uint16_t kAtomicWindow = 3;
  static constexpr uint16_t kWarpPutWindow = 4;
  static constexpr uint16_t kFetchWindow = 5;
  static constexpr uint32_t kWarpPutBytes = 32 * 8;
  // 8-byte word `word` of the payload of thread-level put `id` (warp puts: id | 1 << 63, word = lane).
  IFEC_HOST_DEVICE static uint64_t pattern(uint64_t id, uint64_t word) {
    return (id * 0x9E3779B97F4A7C15ULL) ^ (word + 1);
  }
  // The value a sink should return for the blocking fetch-add of thread t (its `value` is t).
  IFEC_HOST_DEVICE static uint64_t fetched(uint64_t value) { return 1000 + value; }
};

struct PutKernelRun {
  double elapsed_ms = 0;
  uint32_t timeouts = 0;                  // device spin loops that gave up
  uint64_t payload_base = 0;              // device address of the thread-level put payloads (freed on return)
  uint64_t warp_payload_base = 0;         // device address of the warp-level put payloads (freed on return)
  std::vector<uint64_t> fetched;          // per thread: value its blocking ifec_fetch_add returned
  std::vector<uint64_t> quiet_issued;     // per thread: head its final ifec_quiet waited for
  std::vector<uint64_t> quiet_completed;  // per thread: `completed` read right after that quiet returned
  uint64_t expected_descriptors = 0;      // descriptors the kernel posts in total
};

// Runs the put kernel on its own non-blocking stream and waits for it. The ring's proxy must run concurrently
// (e.g. Proxy::start()). Throws ifec::common::Error on CUDA failures or a bad config.
PutKernelRun launch_put_kernel(const DeviceRingView& ring, const PutKernelConfig& cfg, int device = 0);

// Rate kernel: blocks x threads each post `per_thread` kAtomicAdd descriptors (no payload), then one quiet per
// block. Returns the kernel time in ms (cudaEvent), and how many device waits timed out in *timeouts.
double launch_rate_kernel(const DeviceRingView& ring, int blocks, int threads, int per_thread, uint32_t* timeouts,
                          int device = 0);

struct GpuRingBenchResult {
  int blocks = 0;
  int threads = 0;
  int per_thread = 0;
  uint64_t descriptors = 0;
  size_t capacity = 0;
  double seconds = 0;  // kernel time, from the first post to the last quiet returning
  double descriptors_per_s = 0;
};

// GPU descriptor rate: the rate kernel posts into a PinnedRing drained by a Proxy thread into a sink that
// completes immediately. Needs cuda_available(); throws ifec::common::Error otherwise.
GpuRingBenchResult bench_descriptor_rate_gpu(int blocks, int threads, int per_thread, size_t capacity = 4096,
                                             int device = 0);

// Host memory someone else allocated (a hostd's shared-memory ring and data area) registered with CUDA as mapped,
// so kernels reach it; unregistered on destruction. Throws ifec::common::Error on CUDA failures.
class MappedHostRegion {
 public:
  MappedHostRegion(void* host, size_t bytes, int device = 0);
  ~MappedHostRegion();
  MappedHostRegion(const MappedHostRegion&) = delete;
  MappedHostRegion& operator=(const MappedHostRegion&) = delete;
  // The device address of a host address inside the region.
  void* device_ptr(const void* host_ptr) const;
  // A view of a DescriptorRing that lives inside the region.
  DeviceRingView ring_view(const DescriptorRing& ring, uint64_t timeout_ns = 0) const;

 private:
  uint8_t* host_;
  size_t bytes_;
  uint8_t* device_ = nullptr;
};

// The ring exercise (ring_exercise.h) from a kernel: `blocks` x `threads` threads write the rows' payloads into the
// data area (`data`: its device address) and post the stores and fetch-adds, then each block quiets. Returns the
// kernel time in ms; device waits that gave up are counted in *timeouts.
double launch_ring_exercise(const DeviceRingView& ring, uint8_t* data, const RingExercise& ex, int blocks, int threads,
                            uint32_t* timeouts, int device = 0);

// Launches an empty kernel: checks the build's GPU code loads on `device`. Returns "" or the CUDA error.
std::string probe_kernel(int device = 0);

}  // namespace ifec::endpoint
