// Kernels of the CUDA backend (probe, put test, descriptor rate) and the host launchers declared in api.h.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "endpoint/cuda/api.h"
#include "endpoint/cuda/cuda_check.h"
#include "endpoint/cuda/device_api.cuh"
#include "ifec/common/checks.h"

namespace ifec::endpoint {

namespace {

__global__ void probe(int* out) { *out = 42; }

__global__ void put_kernel(DeviceRingView r, PutKernelConfig cfg, uint64_t* payload, uint64_t* warp_payload,
                           unsigned long long* scratch, uint64_t* fetched, unsigned long long* quiet_issued,
                           unsigned long long* quiet_completed, unsigned int* timeouts) {
  using L = PutKernelLayout;
  const uint64_t t = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint64_t warp = t / 32;
  const unsigned lane = threadIdx.x & 31;
  const uint32_t words = cfg.payload_bytes / 8;
  bool ok = true;
  for (int it = 0; it < cfg.iterations; ++it) {
    const uint64_t id = t * cfg.iterations + it;
    uint64_t* src = payload + id * words;
    for (uint32_t w = 0; w < words; ++w) src[w] = L::pattern(id, w);
    const auto target = static_cast<uint16_t>(id % cfg.targets);
    const uint64_t offset = id * cfg.payload_bytes;
    switch (it % 3) {
      case 0:
        ok = ifec_put(r, target, L::kPutWindow, offset, src, cfg.payload_bytes);
        break;
      case 1:
        ok = ifec_put_signal(r, target, L::kPutWindow, offset, src, cfg.payload_bytes, L::kSignalWindow, t * 8, id,
                             SignalOp::kAdd);
        break;
      default:
        ok = ifec_atomic_add(r, target, L::kAtomicWindow, t * 8, id);
        break;
    }
    if (cfg.warp_puts) {
      const uint64_t wid = warp * cfg.iterations + it;
      uint64_t* wsrc = warp_payload + wid * 32;
      wsrc[lane] = L::pattern(wid | (1ULL << 63), lane);
      const bool wok = ifec_put_warp(r, static_cast<uint16_t>(wid % cfg.targets), L::kWarpPutWindow,
                                     wid * L::kWarpPutBytes, wsrc, L::kWarpPutBytes);
      ok = ok && wok;
    }
    // Leave the loop warp-uniformly: the warp collectives above need all 32 lanes.
    if (!__all_sync(0xFFFFFFFFu, ok)) break;
  }
  if (ok && lane == 0) ok = ifec_fence(r);
  uint64_t old = 0;
  if (ok) ok = ifec_fetch_add(r, static_cast<uint16_t>(t % cfg.targets), L::kFetchWindow, t * 8, t, &scratch[t], &old);
  fetched[t] = old;
  unsigned long long issued = 0;
  if (ok) ok = ifec_quiet(r, &issued);
  quiet_issued[t] = issued;
  quiet_completed[t] = ifec_load_volatile(&r.header->completed);
  if (!ok) atomicAdd(timeouts, 1u);
}

__global__ void rate_kernel(DeviceRingView r, int per_thread, unsigned int* timeouts) {
  Descriptor d;
  d.op = static_cast<uint8_t>(DescOp::kAtomicAdd);
  d.target = static_cast<uint16_t>(blockIdx.x);
  d.length = 8;
  d.value = 1;
  d.remote_offset = threadIdx.x * 8;
  bool ok = true;
  for (int i = 0; i < per_thread && ok; ++i) ok = ifec_post(r, d);
  if (!ok) atomicAdd(timeouts, 1u);
  __syncthreads();
  if (threadIdx.x == 0 && !ifec_quiet(r)) atomicAdd(timeouts, 1u);
}

__global__ void ring_exercise_kernel(DeviceRingView r, uint8_t* data, RingExercise ex, unsigned int* timeouts) {
  const uint64_t tid = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  bool ok = true;
  for (uint64_t i = tid; i < ex.puts && ok; i += stride) {
    uint8_t* row = data + ex.rows_at + i * ex.row_bytes;
    for (uint64_t k = 0; k < ex.row_bytes; ++k) row[k] = RingExercise::byte(ex.seed, i, k);
    ok = ifec_post(r, ex.put(i));  // its system fence orders the payload before the publish
  }
  for (uint64_t i = tid; i < ex.fetch_adds && ok; i += stride) ok = ifec_post(r, ex.fetch_add(i));
  if (!ok) atomicAdd(timeouts, 1u);
  __syncthreads();
  if (threadIdx.x == 0 && !ifec_quiet(r)) atomicAdd(timeouts, 1u);
}

// Device allocation, stream and events that release themselves when a launcher returns or throws.
struct DeviceAlloc {
  void* p = nullptr;
  explicit DeviceAlloc(size_t bytes) { IFEC_CUDA_CHECK(cudaMalloc(&p, bytes < 8 ? 8 : bytes)); }
  ~DeviceAlloc() { cudaFree(p); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

struct TimedStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  TimedStream() {
    // Non-blocking: must not serialise with the proxy's copies (CudaLocalMemory) while the kernel waits on them.
    IFEC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    IFEC_CUDA_CHECK(cudaEventCreate(&start));
    IFEC_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~TimedStream() {
    if (stop) cudaEventDestroy(stop);
    if (start) cudaEventDestroy(start);
    if (stream) cudaStreamDestroy(stream);
  }
  double finish() {
    IFEC_CUDA_CHECK(cudaGetLastError());
    IFEC_CUDA_CHECK(cudaEventRecord(stop, stream));
    IFEC_CUDA_CHECK(cudaStreamSynchronize(stream));
    float ms = 0;
    IFEC_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms;
  }
};

template <typename T>
std::vector<T> copy_out(const T* dev, size_t n, cudaStream_t s) {
  std::vector<T> host(n);
  IFEC_CUDA_CHECK(cudaMemcpyAsync(host.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost, s));
  IFEC_CUDA_CHECK(cudaStreamSynchronize(s));
  return host;
}

void check_view(const DeviceRingView& r) {
  IFEC_CHECK(r.header != nullptr && r.slots != nullptr, "device ring view has no header or slots");
  IFEC_CHECK(r.capacity != 0 && (r.capacity & (r.capacity - 1)) == 0,
             "device ring view capacity " << r.capacity << " is not a power of two");
}

}  // namespace

std::string probe_kernel(int device) {
  cudaError_t err = cudaSetDevice(device);
  int* out = nullptr;
  if (err == cudaSuccess) err = cudaMalloc(&out, sizeof(int));
  if (err == cudaSuccess) {
    probe<<<1, 1>>>(out);
    err = cudaGetLastError();
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
    cudaFree(out);
  }
  return err == cudaSuccess ? std::string() : std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

PutKernelRun launch_put_kernel(const DeviceRingView& ring, const PutKernelConfig& cfg, int device) {
  check_view(ring);
  IFEC_CHECK(cfg.blocks >= 1, "put kernel blocks " << cfg.blocks << " must be positive");
  IFEC_CHECK(cfg.threads_per_block >= 32 && cfg.threads_per_block <= 1024 && cfg.threads_per_block % 32 == 0,
             "put kernel threads_per_block " << cfg.threads_per_block << " is not a multiple of 32 in 32..1024");
  IFEC_CHECK(cfg.iterations >= 0, "put kernel iterations " << cfg.iterations << " is negative");
  IFEC_CHECK(cfg.payload_bytes >= 8 && cfg.payload_bytes % 8 == 0,
             "put kernel payload_bytes " << cfg.payload_bytes << " is not a positive multiple of 8");
  IFEC_CHECK(cfg.targets >= 1, "put kernel needs at least one target");
  IFEC_CUDA_CHECK(cudaSetDevice(device));

  const uint64_t threads = static_cast<uint64_t>(cfg.blocks) * cfg.threads_per_block;
  const uint64_t warps = threads / 32;
  const uint64_t iters = static_cast<uint64_t>(cfg.iterations);
  DeviceAlloc payload(threads * iters * cfg.payload_bytes);
  DeviceAlloc warp_payload(cfg.warp_puts ? warps * iters * PutKernelLayout::kWarpPutBytes : 8);
  DeviceAlloc scratch(threads * 8), fetched(threads * 8), issued(threads * 8), completed(threads * 8);
  DeviceAlloc timeouts(sizeof(unsigned int));

  DeviceRingView view = ring;
  view.timeout_ns = cfg.timeout_ns;
  TimedStream ts;
  IFEC_CUDA_CHECK(cudaMemsetAsync(scratch.p, 0, threads * 8, ts.stream));
  IFEC_CUDA_CHECK(cudaMemsetAsync(timeouts.p, 0, sizeof(unsigned int), ts.stream));
  IFEC_CUDA_CHECK(cudaEventRecord(ts.start, ts.stream));
  put_kernel<<<cfg.blocks, cfg.threads_per_block, 0, ts.stream>>>(
      view, cfg, payload.as<uint64_t>(), warp_payload.as<uint64_t>(), scratch.as<unsigned long long>(),
      fetched.as<uint64_t>(), issued.as<unsigned long long>(), completed.as<unsigned long long>(),
      timeouts.as<unsigned int>());

  PutKernelRun run;
  run.elapsed_ms = ts.finish();
  run.timeouts = copy_out(timeouts.as<unsigned int>(), 1, ts.stream)[0];
  run.payload_base = reinterpret_cast<uint64_t>(payload.p);
  run.warp_payload_base = reinterpret_cast<uint64_t>(warp_payload.p);
  run.fetched = copy_out(fetched.as<uint64_t>(), threads, ts.stream);
  for (unsigned long long v : copy_out(issued.as<unsigned long long>(), threads, ts.stream))
    run.quiet_issued.push_back(v);
  for (unsigned long long v : copy_out(completed.as<unsigned long long>(), threads, ts.stream))
    run.quiet_completed.push_back(v);
  run.expected_descriptors = threads * iters + (cfg.warp_puts ? warps * iters : 0) + warps + threads;
  return run;
}

double launch_rate_kernel(const DeviceRingView& ring, int blocks, int threads, int per_thread, uint32_t* timeouts,
                          int device) {
  check_view(ring);
  IFEC_CHECK(blocks >= 1 && threads >= 1 && threads <= 1024 && per_thread >= 0,
             "rate kernel shape " << blocks << " x " << threads << " x " << per_thread << " is invalid");
  IFEC_CUDA_CHECK(cudaSetDevice(device));
  DeviceAlloc dev_timeouts(sizeof(unsigned int));
  TimedStream ts;
  IFEC_CUDA_CHECK(cudaMemsetAsync(dev_timeouts.p, 0, sizeof(unsigned int), ts.stream));
  IFEC_CUDA_CHECK(cudaEventRecord(ts.start, ts.stream));
  rate_kernel<<<blocks, threads, 0, ts.stream>>>(ring, per_thread, dev_timeouts.as<unsigned int>());
  const double ms = ts.finish();
  const unsigned int t = copy_out(dev_timeouts.as<unsigned int>(), 1, ts.stream)[0];
  if (timeouts != nullptr) *timeouts = t;
  return ms;
}

double launch_ring_exercise(const DeviceRingView& ring, uint8_t* data, const RingExercise& ex, int blocks, int threads,
                            uint32_t* timeouts, int device) {
  check_view(ring);
  IFEC_CHECK(blocks >= 1 && threads >= 1 && threads <= 1024,
             "ring exercise shape " << blocks << " x " << threads << " is invalid");
  IFEC_CUDA_CHECK(cudaSetDevice(device));
  DeviceAlloc dev_timeouts(sizeof(unsigned int));
  TimedStream ts;
  IFEC_CUDA_CHECK(cudaMemsetAsync(dev_timeouts.p, 0, sizeof(unsigned int), ts.stream));
  IFEC_CUDA_CHECK(cudaEventRecord(ts.start, ts.stream));
  ring_exercise_kernel<<<blocks, threads, 0, ts.stream>>>(ring, data, ex, dev_timeouts.as<unsigned int>());
  const double ms = ts.finish();
  const unsigned int t = copy_out(dev_timeouts.as<unsigned int>(), 1, ts.stream)[0];
  if (timeouts != nullptr) *timeouts = t;
  return ms;
}

}  // namespace ifec::endpoint
