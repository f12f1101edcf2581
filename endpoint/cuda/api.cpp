// Host side of the CUDA backend: device checks, the pinned mapped ring, CudaLocalMemory and the GPU rate bench.
#include "endpoint/cuda/api.h"

#include <cuda_runtime.h>

#include <sstream>

#include "endpoint/cuda/cuda_check.h"
#include "ifec/common/checks.h"
#include "ifec/endpoint/proxy.h"

namespace ifec::endpoint {

namespace {

// The architecture this library's kernels are built for (cuda/CMakeLists.txt: sm_90 SASS + compute_90 PTX).
constexpr int kMinComputeMajor = 9;

int device_attribute(cudaDeviceAttr attr, int device) {
  int v = 0;
  return cudaDeviceGetAttribute(&v, attr, device) == cudaSuccess ? v : -1;
}

}  // namespace

std::string cuda_device_name(int device) {
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, device) == cudaSuccess ? std::string(prop.name) : std::string();
}

bool cuda_available(std::string* why, int device) {
  auto fail = [why](const std::string& reason) {
    if (why != nullptr) *why = reason;
    return false;
  };
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    return fail(std::string("cudaGetDeviceCount: ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
  if (count == 0) return fail("cudaGetDeviceCount found no devices");
  if (device < 0 || device >= count) {
    return fail("device " + std::to_string(device) + " out of range 0.." + std::to_string(count - 1));
  }
  const int major = device_attribute(cudaDevAttrComputeCapabilityMajor, device);
  const int minor = device_attribute(cudaDevAttrComputeCapabilityMinor, device);
  if (major < kMinComputeMajor) {
    std::ostringstream os;
    os << "device " << device << " has compute capability " << major << "." << minor << "; kernels are built for sm_"
       << kMinComputeMajor << "0";
    return fail(os.str());
  }
  if (device_attribute(cudaDevAttrCanMapHostMemory, device) != 1) {
    return fail("device " + std::to_string(device) + " cannot map host memory (the ring lives there)");
  }
  if (device_attribute(cudaDevAttrUnifiedAddressing, device) != 1) {
    return fail("device " + std::to_string(device) + " has no unified addressing (CudaLocalMemory needs it)");
  }
  const std::string probe = probe_kernel(device);
  if (!probe.empty()) return fail("probe kernel failed on device " + std::to_string(device) + ": " + probe);
  if (why != nullptr) why->clear();
  return true;
}

PinnedRing::PinnedRing(size_t capacity, int device) {
  const size_t bytes = DescriptorRing::region_bytes(capacity);  // validates capacity first
  IFEC_CUDA_CHECK(cudaSetDevice(device));
  // Portable: any device context may use it; mapped: kernels reach it over PCIe / C2C without copies.
  IFEC_CUDA_CHECK(cudaHostAlloc(&host_, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  try {
    DescriptorRing::init_region(host_, bytes, capacity);
    ring_ = std::make_unique<DescriptorRing>(DescriptorRing::view(host_));
    IFEC_CUDA_CHECK(cudaHostGetDevicePointer(&device_, host_, 0));
  } catch (...) {
    cudaFreeHost(host_);
    throw;
  }
}

MappedHostRegion::MappedHostRegion(void* host, size_t bytes, int device)
    : host_(static_cast<uint8_t*>(host)), bytes_(bytes) {
  IFEC_CUDA_CHECK(cudaSetDevice(device));
  IFEC_CUDA_CHECK(cudaHostRegister(host, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
  void* d = nullptr;
  const cudaError_t e = cudaHostGetDevicePointer(&d, host, 0);
  if (e != cudaSuccess) {
    cudaHostUnregister(host);
    IFEC_FAIL("cudaHostGetDevicePointer of a registered region: " << cudaGetErrorString(e));
  }
  device_ = static_cast<uint8_t*>(d);
}

MappedHostRegion::~MappedHostRegion() { cudaHostUnregister(host_); }

void* MappedHostRegion::device_ptr(const void* host_ptr) const {
  const auto* p = static_cast<const uint8_t*>(host_ptr);
  IFEC_CHECK(p >= host_ && p < host_ + bytes_, "address outside the registered region");
  return device_ + (p - host_);
}

DeviceRingView MappedHostRegion::ring_view(const DescriptorRing& ring, uint64_t timeout_ns) const {
  DeviceRingView v;
  v.header = static_cast<RingHeader*>(device_ptr(ring.header()));
  v.slots = static_cast<Descriptor*>(device_ptr(ring.slots()));
  v.capacity = ring.capacity();
  v.timeout_ns = timeout_ns;
  return v;
}

PinnedRing::~PinnedRing() {
  ring_.reset();
  cudaFreeHost(host_);
}

DeviceRingView PinnedRing::device_view(uint64_t timeout_ns) const {
  DeviceRingView v;
  v.header = static_cast<RingHeader*>(device_);
  v.slots = reinterpret_cast<Descriptor*>(static_cast<char*>(device_) + ring_->header()->slots_offset);
  v.capacity = ring_->capacity();
  v.timeout_ns = timeout_ns;
  return v;
}

CudaLocalMemory::CudaLocalMemory(int device) : device_(device) {
  IFEC_CUDA_CHECK(cudaSetDevice(device_));
  cudaStream_t s = nullptr;
  IFEC_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;
}

CudaLocalMemory::~CudaLocalMemory() { cudaStreamDestroy(static_cast<cudaStream_t>(stream_)); }

void CudaLocalMemory::read(uint64_t addr, void* dst, size_t len) {
  if (len == 0) return;
  auto s = static_cast<cudaStream_t>(stream_);
  // The calling (proxy) thread's current device may differ from ours.
  IFEC_CUDA_CHECK(cudaSetDevice(device_));
  const cudaError_t err = cudaMemcpyAsync(dst, reinterpret_cast<const void*>(addr), len, cudaMemcpyDefault, s);
  IFEC_CHECK(err == cudaSuccess, "CudaLocalMemory read of " << len << " bytes at 0x" << std::hex << addr << ": "
                                                            << cudaGetErrorString(err));
  IFEC_CUDA_CHECK(cudaStreamSynchronize(s));
}

void CudaLocalMemory::write(uint64_t addr, const void* src, size_t len) {
  if (len == 0) return;
  auto s = static_cast<cudaStream_t>(stream_);
  IFEC_CUDA_CHECK(cudaSetDevice(device_));
  const cudaError_t err = cudaMemcpyAsync(reinterpret_cast<void*>(addr), src, len, cudaMemcpyDefault, s);
  IFEC_CHECK(err == cudaSuccess, "CudaLocalMemory write of " << len << " bytes at 0x" << std::hex << addr << ": "
                                                             << cudaGetErrorString(err));
  // Synchronous: the proxy marks the descriptor complete right after, and quiet() readers rely on the data.
  IFEC_CUDA_CHECK(cudaStreamSynchronize(s));
}

GpuRingBenchResult bench_descriptor_rate_gpu(int blocks, int threads, int per_thread, size_t capacity, int device) {
  std::string why;
  IFEC_CHECK(cuda_available(&why, device), "no CUDA device: " << why);
  PinnedRing ring(capacity, device);
  NullSink sink;
  HostMemory mem;  // the null sink touches no payload
  Proxy proxy(ring.ring(), sink, mem, 0);
  proxy.start();
  uint32_t timeouts = 0;
  const double ms =
      launch_rate_kernel(ring.device_view(30'000'000'000ULL), blocks, threads, per_thread, &timeouts, device);
  proxy.stop();
  GpuRingBenchResult r;
  r.blocks = blocks;
  r.threads = threads;
  r.per_thread = per_thread;
  r.descriptors = static_cast<uint64_t>(blocks) * threads * per_thread;
  r.capacity = capacity;
  r.seconds = ms / 1e3;
  r.descriptors_per_s = r.seconds > 0 ? static_cast<double>(r.descriptors) / r.seconds : 0;
  IFEC_CHECK(timeouts == 0 && ring.ring().completed() == r.descriptors,
             "GPU descriptor-rate bench: " << timeouts << " device timeouts, " << ring.ring().completed() << " of "
                                           << r.descriptors << " completed");
  return r;
}

}  // namespace ifec::endpoint
