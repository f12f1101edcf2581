// Descriptor-rate benchmark of the CPU backend (ring + proxy + a sink that completes at once).
#include "ifec/endpoint/ring_bench.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "ifec/common/checks.h"
#include "ifec/endpoint/proxy.h"
#include "ifec/endpoint/ring.h"
#include "ifec/endpoint/sink.h"

namespace ifec::endpoint {

RingBenchResult bench_descriptor_rate(int producer_threads, uint64_t descriptors, size_t capacity) {
  IFEC_CHECK(producer_threads >= 1 && producer_threads <= 1024,
             "descriptor-rate bench: producer_threads " << producer_threads << " outside 1..1024");
  IFEC_CHECK(descriptors >= 1, "descriptor-rate bench: descriptors " << descriptors << " must be positive");
  DescriptorRing ring(capacity);  // validates capacity
  NullSink sink;
  HostMemory mem;
  Proxy proxy(ring, sink, mem, 0);
  proxy.start();

  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> producers;
  producers.reserve(producer_threads);
  for (int t = 0; t < producer_threads; ++t) {
    const uint64_t n = descriptors / producer_threads + (static_cast<uint64_t>(t) < descriptors % producer_threads);
    producers.emplace_back([&, t, n] {
      Descriptor d;
      d.op = static_cast<uint8_t>(DescOp::kAtomicAdd);
      d.target = static_cast<uint16_t>(t);
      d.value = 1;
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      for (uint64_t i = 0; i < n; ++i) {
        d.remote_offset = i * 8;
        ring.post(d);
      }
    });
  }
  while (ready.load() < producer_threads) std::this_thread::yield();
  const auto t0 = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : producers) th.join();
  ring.quiet();
  const auto t1 = std::chrono::steady_clock::now();
  proxy.stop();

  RingBenchResult r;
  r.producer_threads = producer_threads;
  r.descriptors = descriptors;
  r.capacity = capacity;
  r.seconds = std::chrono::duration<double>(t1 - t0).count();
  r.descriptors_per_s = r.seconds > 0 ? static_cast<double>(descriptors) / r.seconds : 0;
  IFEC_CHECK(ring.completed() == descriptors && ring.errors() == 0,
             "descriptor-rate bench: " << ring.completed() << " of " << descriptors << " completed, " << ring.errors()
                                       << " errors");
  return r;
}

}  // namespace ifec::endpoint
