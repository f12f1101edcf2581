// Endpoint benchmarks: store goodput on the simulated SuperPoD, descriptor rate through ring + proxy + fabric.
#include "ifec/testbed/endpoint_bench.h"

#include <chrono>

#include "ifec/common/checks.h"
#include "ifec/endpoint/proxy.h"
#include "ifec/endpoint/ring.h"
#include "ifec/testbed/cluster.h"

namespace ifec::testbed {

StoreGoodput bench_store_goodput(const routing::Topology& topo, endpoint::Ordering mode, int planes, uint64_t stores,
                                 uint64_t bytes_each) {
  const auto wall0 = std::chrono::steady_clock::now();
  IFEC_CHECK(topo.num_gpus() >= 2,
             "store benchmark: topology " << topo.name << " has " << topo.num_gpus() << " GPUs, needs 2");
  ClusterOptions opts;
  opts.planes = planes;
  opts.endpoint.ordering = mode;
  // Spraying is what weak mode is for; the ordered modes want each QP on one path.
  opts.fabric.lb =
      mode == endpoint::Ordering::kWeak ? switchemu::LoadBalance::kPerPacket : switchemu::LoadBalance::kPerFlow;
  Cluster c(topo, opts);
  constexpr uint16_t kWin = 1;
  c.allocate_window(kWin, stores * bytes_each);
  std::vector<uint8_t> src(bytes_each);
  for (size_t i = 0; i < src.size(); ++i) {
    src[i] = static_cast<uint8_t>(i * 13);
  }
  const common::TimeNs t0 = c.now();
  std::vector<endpoint::OpHandle> hs;
  for (uint64_t i = 0; i < stores; ++i) {
    hs.push_back(c.ep(0).store(1, kWin, i * bytes_each, src.data(), src.size()));
  }
  hs.push_back(c.ep(0).quiet());
  IFEC_CHECK(c.wait(hs, 10'000'000'000ULL), "store benchmark did not finish in 10 s of simulated time");
  for (const auto& h : hs) {
    IFEC_CHECK(h->ok(), "store benchmark: a store failed: " << h->error);
  }
  StoreGoodput r;
  r.mode = endpoint::ordering_name(mode);
  r.planes = planes;
  r.stores = stores;
  r.bytes_each = bytes_each;
  r.sim_ns = static_cast<double>(c.now() - t0);
  r.goodput_gbps = stores * bytes_each * 8.0 / r.sim_ns;
  for (const auto& p : c.fabric().gpu_ports(0)) {
    if (p.plane < planes) {
      r.line_rate_gbps += p.io->rate_bps() / 1e9;
    }
  }
  r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return r;
}

DescriptorRate bench_descriptor_rate_sim(const routing::Topology& topo, uint64_t descriptors) {
  const int gpus = topo.num_gpus();
  IFEC_CHECK(gpus >= kDescriptorBenchGpus, "descriptor benchmark: topology " << topo.name << " has " << gpus
                                                                             << " GPUs, needs "
                                                                             << kDescriptorBenchGpus);
  ClusterOptions opts;
  opts.endpoint.ordering = endpoint::Ordering::kWeak;
  Cluster c(topo, opts);
  c.allocate_window(1, 1 << 20);
  ClusterSink sink(c);
  endpoint::HostMemory host;
  endpoint::DescriptorRing ring(4096);
  endpoint::Proxy proxy(ring, sink, host, 0);
  uint64_t value = 7;
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t posted = 0;
  while (ring.completed() < descriptors) {
    // The producer (a GPU kernel's stand-in) keeps the ring topped up; the proxy drains it on this thread.
    while (posted < descriptors && posted - ring.completed() < 2048) {
      endpoint::Descriptor d;
      d.op = static_cast<uint8_t>(endpoint::DescOp::kPut);
      d.target = static_cast<uint16_t>(1 + posted % (kDescriptorBenchGpus - 1));
      d.window = 1;
      d.remote_offset = (posted * 8) % (1 << 20);
      d.length = 8;
      d.local_addr = reinterpret_cast<uint64_t>(&value);
      ring.post(d);
      ++posted;
    }
    proxy.poll_once();
  }
  DescriptorRate r;
  r.backend = "cpu-sim-fabric";
  r.producer_threads = 1;
  r.descriptors = descriptors;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.per_second = descriptors / r.seconds;
  IFEC_CHECK(ring.errors() == 0, "descriptor benchmark: " << ring.errors() << " descriptors failed");
  return r;
}

}  // namespace ifec::testbed
