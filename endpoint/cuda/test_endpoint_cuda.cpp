// GPU tests of the CUDA backend: kernels post through the device API, a Proxy drains the pinned ring into a sink.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "endpoint/cuda/api.h"
#include "ifec/common/checks.h"
#include "ifec/endpoint/proxy.h"

namespace ifec::endpoint {
namespace {

using L = PutKernelLayout;

#define IFEC_REQUIRE_GPU()                                                \
  do {                                                                    \
    std::string why;                                                      \
    if (!cuda_available(&why)) GTEST_SKIP() << "no CUDA device: " << why; \
  } while (0)

// Records every descriptor, checks put payloads against the kernel's pattern as it reads them through `mem`, writes
// fetch-add results, and completes each descriptor two progress() calls later, so the kernel's quiet() really has
// to wait for the proxy. Runs on the proxy thread only; the test reads it after Proxy::stop().
class GpuRecordingSink : public TransactionSink {
 public:
  void submit(int, const Descriptor& d, LocalMemory& mem, Done done) override {
    seen.push_back(d);
    const auto op = static_cast<DescOp>(d.op);
    if (op == DescOp::kPut || op == DescOp::kPutSignal) {
      std::vector<uint64_t> words(d.length / 8);
      mem.read(d.local_addr, words.data(), d.length);
      const bool warp = d.window == L::kWarpPutWindow;
      const uint64_t id = warp ? d.remote_offset / L::kWarpPutBytes : d.remote_offset / d.length;
      for (size_t w = 0; w < words.size(); ++w) {
        if (words[w] != L::pattern(warp ? id | (1ULL << 63) : id, w)) ++payload_mismatches;
      }
    }
    if (op == DescOp::kFetchAdd) {
      const uint64_t old = L::fetched(d.value);
      mem.write(d.result_addr, &old, sizeof(old));
    }
    pending.push_back({std::move(done), calls + 2});
  }
  bool progress() override {
    ++calls;
    while (!pending.empty() && pending.front().due <= calls) {
      pending.front().done(OpStatus::kOk);
      pending.pop_front();
    }
    return !pending.empty();
  }

  struct Pending {
    Done done;
    uint64_t due;
  };
  std::vector<Descriptor> seen;
  std::deque<Pending> pending;
  uint64_t calls = 0;
  uint64_t payload_mismatches = 0;
};

TEST(CudaBackend, AvailabilityComesWithAReason) {
  std::string why = "unchanged";
  if (cuda_available(&why)) {
    EXPECT_TRUE(why.empty());
  } else {
    EXPECT_FALSE(why.empty());
    EXPECT_NE(why, "unchanged");
    std::printf("cuda_available: false: %s\n", why.c_str());
  }
}

TEST(CudaBackend, KernelPostsReachTheProxyExactlyOnce) {
  IFEC_REQUIRE_GPU();
  PinnedRing ring(256);  // smaller than the number of posting threads: exercises wrap and full-ring waits
  CudaLocalMemory mem;
  GpuRecordingSink sink;
  Proxy proxy(ring.ring(), sink, mem, 3);
  proxy.start();
  PutKernelConfig cfg;
  cfg.blocks = 16;
  cfg.threads_per_block = 128;
  cfg.iterations = 6;
  cfg.payload_bytes = 64;
  const PutKernelRun run = launch_put_kernel(ring.device_view(), cfg);
  proxy.stop();

  const uint64_t threads = static_cast<uint64_t>(cfg.blocks) * cfg.threads_per_block;
  const uint64_t warps = threads / 32;
  const uint64_t iters = cfg.iterations;
  ASSERT_EQ(run.timeouts, 0u);
  EXPECT_EQ(run.expected_descriptors, threads * iters + warps * iters + warps + threads);
  EXPECT_EQ(ring.ring().issued(), run.expected_descriptors);
  EXPECT_EQ(ring.ring().completed(), run.expected_descriptors);
  EXPECT_EQ(ring.ring().errors(), 0u);
  ASSERT_EQ(sink.seen.size(), run.expected_descriptors);
  EXPECT_EQ(sink.payload_mismatches, 0u);

  std::vector<int> thread_ops(threads * iters, 0), warp_puts(warps * iters, 0), fetches(threads, 0);
  uint64_t fences = 0, bad = 0;
  for (size_t i = 0; i < sink.seen.size(); ++i) {
    const Descriptor& d = sink.seen[i];
    if (d.seq != i + 1) ++bad;  // tickets arrive in order
    switch (static_cast<DescOp>(d.op)) {
      case DescOp::kPut:
      case DescOp::kPutSignal: {
        if (d.window == L::kWarpPutWindow) {
          const uint64_t wid = d.remote_offset / L::kWarpPutBytes;
          if (wid >= warps * iters || d.length != L::kWarpPutBytes || d.target != wid % cfg.targets ||
              d.local_addr != run.warp_payload_base + wid * L::kWarpPutBytes) {
            ++bad;
            continue;
          }
          ++warp_puts[wid];
          continue;
        }
        const uint64_t id = d.remote_offset / cfg.payload_bytes;
        const bool is_signal = static_cast<DescOp>(d.op) == DescOp::kPutSignal;
        if (id >= threads * iters || d.window != L::kPutWindow || d.length != cfg.payload_bytes ||
            d.target != id % cfg.targets || d.local_addr != run.payload_base + id * cfg.payload_bytes ||
            (id % iters) % 3 != (is_signal ? 1u : 0u)) {
          ++bad;
          continue;
        }
        if (is_signal && (d.signal_window != L::kSignalWindow || d.signal_offset != (id / iters) * 8 || d.value != id ||
                          d.signal_op != static_cast<uint8_t>(SignalOp::kAdd))) {
          ++bad;
        }
        ++thread_ops[id];
        break;
      }
      case DescOp::kAtomicAdd: {
        const uint64_t id = d.value;
        if (id >= threads * iters || d.window != L::kAtomicWindow || d.remote_offset != (id / iters) * 8 ||
            d.target != id % cfg.targets || (id % iters) % 3 != 2) {
          ++bad;
          continue;
        }
        ++thread_ops[id];
        break;
      }
      case DescOp::kFetchAdd: {
        const uint64_t t = d.value;
        if (t >= threads || d.window != L::kFetchWindow || d.remote_offset != t * 8 || d.result_addr == 0) {
          ++bad;
          continue;
        }
        ++fetches[t];
        break;
      }
      case DescOp::kFence:
        fences += d.target == kFenceAllTargets;
        break;
      default:
        ++bad;
    }
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(fences, warps);
  auto not_once = [](const std::vector<int>& v) {
    size_t n = 0;
    for (int c : v) n += c != 1;
    return n;
  };
  EXPECT_EQ(not_once(thread_ops), 0u);
  EXPECT_EQ(not_once(warp_puts), 0u);
  EXPECT_EQ(not_once(fetches), 0u);

  // quiet() returned only after the proxy completed everything before it, including the result copy.
  uint64_t wrong_fetch = 0, early_quiet = 0;
  for (uint64_t t = 0; t < threads; ++t) {
    wrong_fetch += run.fetched[t] != L::fetched(t);
    early_quiet += run.quiet_completed[t] < run.quiet_issued[t] || run.quiet_issued[t] == 0;
  }
  EXPECT_EQ(wrong_fetch, 0u);
  EXPECT_EQ(early_quiet, 0u);
  const ProxyStats st = proxy.stats();
  EXPECT_EQ(st.submitted, run.expected_descriptors);
  EXPECT_EQ(st.fences, warps);
  EXPECT_EQ(st.sink_exceptions, 0u);
  std::printf("put kernel: %llu descriptors in %.3f ms\n", static_cast<unsigned long long>(run.expected_descriptors),
              run.elapsed_ms);
}

TEST(CudaBackend, KernelQuietWaitsForALateProxy) {
  IFEC_REQUIRE_GPU();
  PinnedRing ring(1024);
  CudaLocalMemory mem;
  GpuRecordingSink sink;
  Proxy proxy(ring.ring(), sink, mem, 0);
  PutKernelConfig cfg;
  cfg.blocks = 2;
  cfg.threads_per_block = 64;
  cfg.iterations = 3;
  PutKernelRun run;
  std::thread kernel([&] { run = launch_put_kernel(ring.device_view(), cfg); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(ring.ring().completed(), 0u);
  EXPECT_GT(ring.ring().doorbell(), 0u) << "the kernel should have posted while the proxy was away";
  proxy.start();
  kernel.join();
  proxy.stop();
  ASSERT_EQ(run.timeouts, 0u);
  EXPECT_GE(run.elapsed_ms, 150.0) << "the kernel finished without waiting for the proxy";
  for (uint64_t t = 0; t < run.fetched.size(); ++t) ASSERT_EQ(run.fetched[t], L::fetched(t)) << "thread " << t;
  EXPECT_EQ(ring.ring().completed(), run.expected_descriptors);
}

TEST(CudaBackend, DescriptorRateBench) {
  IFEC_REQUIRE_GPU();
  const GpuRingBenchResult r = bench_descriptor_rate_gpu(16, 128, 64, 4096);
  EXPECT_EQ(r.descriptors, 16u * 128u * 64u);
  EXPECT_GT(r.descriptors_per_s, 0);
  std::printf("GPU descriptor rate: %d x %d x %d = %llu descriptors, capacity %zu: %.3f ms, %.2f M/s\n", r.blocks,
              r.threads, r.per_thread, static_cast<unsigned long long>(r.descriptors), r.capacity, r.seconds * 1e3,
              r.descriptors_per_s / 1e6);
}

TEST(CudaBackend, PinnedRingRejectsBadCapacityBeforeTouchingCuda) {
  EXPECT_THROW(PinnedRing ring(1000), common::Error);
}

}  // namespace
}  // namespace ifec::endpoint
