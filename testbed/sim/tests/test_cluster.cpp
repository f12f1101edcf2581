// Endpoints over the simulated SuperPoD: every transaction type against a reference with loss on every link,
// per-packet spraying in the switches, and a plane failing mid-flight; plus barrier and the proxy sink.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <optional>
#include <random>

#include "ifec/common/checks.h"
#include "ifec/endpoint/proxy.h"
#include "ifec/endpoint/ring.h"
#include "ifec/testbed/cluster.h"

using namespace ifec;
using endpoint::OpHandle;
using endpoint::Ordering;

namespace {

constexpr uint16_t kData = 1;
constexpr uint16_t kCounters = 2;

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) {
    b = static_cast<uint8_t>(rng());
  }
  return v;
}

uint64_t u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

testbed::ClusterOptions options(Ordering o, double loss, switchemu::LoadBalance lb) {
  testbed::ClusterOptions opts;
  opts.fabric.loss = loss;
  opts.fabric.lb = lb;
  opts.fabric.seed = 5;
  opts.endpoint.ordering = o;
  opts.endpoint.rto_ns = 30'000;
  opts.endpoint.rto_max_ns = 500'000;
  opts.endpoint.max_retries = 14;
  return opts;
}

}  // namespace

class FabricTransactions
    : public testing::TestWithParam<std::tuple<Ordering, double, bool /*plane fails mid-flight*/>> {};

TEST_P(FabricTransactions, EveryTypeMatchesTheReference) {
  const auto [ordering, loss, fail_plane] = GetParam();
  const routing::Topology topo = routing::make_superpod(4, 4);  // 8 ports per GPU: 8 QPs per peer
  testbed::Cluster c(topo, options(ordering, loss, switchemu::LoadBalance::kPerPacket));
  c.allocate_window(kData, 4 << 20);
  c.allocate_window(kCounters, 4096);
  if (fail_plane) {
    // GPU 2 loses both plane-1 sub-links 3 us in, with traffic in flight; FARE reroutes, QPs migrate.
    for (const auto& l : topo.links) {
      if (topo.nodes[l.a].gpu_index == 2 && l.plane == 1) {
        c.fabric().schedule_link_state(l.id, false, 3'000);
      }
    }
  }
  std::vector<OpHandle> hs;
  std::vector<std::vector<uint8_t>> sent;
  for (int dst = 1; dst < 4; ++dst) {
    sent.push_back(pattern(600'000 + dst * 1000, dst));
    hs.push_back(c.ep(0).store(dst, kData, 8192, sent.back().data(), sent.back().size()));
  }
  // An RDMA WRITE straight from GPU 3's own window (no copy taken: retransmissions read the window again).
  const auto from_window = pattern(300'000, 77);
  std::memcpy(c.window_data(3, kData) + (3 << 20), from_window.data(), from_window.size());
  hs.push_back(c.ep(3).store_from_window(1, kData, 1 << 20, kData, 3 << 20, from_window.size()));
  // Every GPU adds to a counter on GPU 2 (the one whose plane fails): exactly-once across the failure.
  for (int src = 0; src < 4; ++src) {
    for (int i = 0; i < 25; ++i) {
      hs.push_back(c.ep(src).fetch_add(2, kCounters, 0, 1 + src));
    }
  }
  ASSERT_TRUE(c.wait(hs)) << "stores/atomics hung";
  for (auto& h : hs) {
    ASSERT_TRUE(h->ok()) << endpoint::op_status_name(h->status) << " " << h->error;
  }
  for (int dst = 1; dst < 4; ++dst) {
    EXPECT_EQ(std::memcmp(c.window_data(dst, kData) + 8192, sent[dst - 1].data(), sent[dst - 1].size()), 0)
        << "GPU " << dst;
  }
  EXPECT_EQ(std::memcmp(c.window_data(1, kData) + (1 << 20), from_window.data(), from_window.size()), 0)
      << "store from GPU 3's window";
  EXPECT_EQ(u64(c.window_data(2, kCounters)), 25u * (1 + 2 + 3 + 4)) << "adds applied exactly once";
  // Loads back from every peer, CAS, put_signal.
  std::vector<std::vector<uint8_t>> got(3);
  std::vector<OpHandle> loads;
  for (int dst = 1; dst < 4; ++dst) {
    got[dst - 1].resize(sent[dst - 1].size());
    loads.push_back(c.ep(0).load(got[dst - 1].data(), dst, kData, 8192, got[dst - 1].size()));
  }
  OpHandle cas = c.ep(3).compare_swap(2, kCounters, 0, 250, 1);
  const auto sig = pattern(50'000, 99);
  OpHandle ps =
      c.ep(1).put_signal(2, kData, 2 << 20, sig.data(), sig.size(), kCounters, 64, 7, endpoint::SignalOp::kSet);
  loads.push_back(cas);
  loads.push_back(ps);
  ASSERT_TRUE(c.wait(loads)) << "loads/cas/put_signal hung";
  for (int dst = 1; dst < 4; ++dst) {
    ASSERT_TRUE(loads[dst - 1]->ok()) << loads[dst - 1]->error;
    EXPECT_EQ(got[dst - 1], sent[dst - 1]) << "load from GPU " << dst;
  }
  EXPECT_EQ(cas->result, 250u);
  EXPECT_EQ(u64(c.window_data(2, kCounters)), 1u);
  EXPECT_EQ(u64(c.window_data(2, kCounters) + 64), 7u);
  EXPECT_EQ(std::memcmp(c.window_data(2, kData) + (2 << 20), sig.data(), sig.size()), 0);
  ASSERT_TRUE(c.barrier()) << "barrier hung";
  if (fail_plane && ordering != Ordering::kStrong) {  // (strong: one QP per peer, on plane 0, which stays up)
    EXPECT_GT(c.ep(2).counters().path_migrations + c.ep(0).counters().path_migrations, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(SuperPod, FabricTransactions,
                         testing::Combine(testing::Values(Ordering::kWeak, Ordering::kPartial, Ordering::kStrong),
                                          testing::Values(0.0, 0.01, 0.05), testing::Bool()),
                         [](const auto& info) {
                           return std::string(endpoint::ordering_name(std::get<0>(info.param))) + "_loss" +
                                  std::to_string(static_cast<int>(std::get<1>(info.param) * 100)) +
                                  (std::get<2>(info.param) ? "_planefail" : "");
                         });

TEST(Cluster, StoreFromWindowChecksItsSourceAndSharedWindowsAreOneMemory) {
  testbed::Cluster c(routing::make_superpod(4, 2), {});
  c.allocate_window(kData, 4096);
  OpHandle bad = c.ep(0).store_from_window(1, kData, 0, kData, 4000, 200);
  ASSERT_TRUE(bad->done());
  EXPECT_FALSE(bad->ok());
  EXPECT_NE(bad->error.find("[4000, +200)"), std::string::npos) << bad->error;
  OpHandle none = c.ep(0).store_from_window(1, kData, 0, 77, 0, 8);
  EXPECT_NE(none->error.find("window 77"), std::string::npos) << none->error;
  // Shared (the timing mode): every GPU's window is the same bytes; a store still crosses the fabric.
  c.allocate_window(kCounters, 4096, 1, true);
  EXPECT_EQ(c.window_data(0, kCounters), c.window_data(3, kCounters));
  auto sent = [&] {
    uint64_t n = 0;
    for (const auto& p : c.fabric().gpu_ports(0)) {
      n += p.io->counters().tx_frames;
    }
    return n;
  };
  const uint64_t tx = sent();
  ASSERT_TRUE(c.wait({c.ep(0).store_from_window(2, kCounters, 64, kData, 0, 1024)}));
  EXPECT_GT(sent(), tx);
  c.free_window(kCounters);
  EXPECT_EQ(c.ep(1).memory().window(kCounters), nullptr);
}

TEST(Cluster, TrafficFollowsFareWeightsAcrossPlanes) {
  // A Y-cable sub-link of GPU 1 on plane 3 is down: GPU 0's weak-mode stripes to GPU 1 put 1/7 on plane 3.
  const routing::Topology topo = routing::make_superpod(4, 4);
  testbed::Cluster c(topo, options(Ordering::kWeak, 0, switchemu::LoadBalance::kPerPacket));
  c.allocate_window(kData, 8 << 20);
  for (const auto& l : topo.links) {
    if (topo.nodes[l.a].gpu_index == 1 && l.plane == 3 && l.subport == 0) {
      c.fabric().schedule_link_state(l.id, false, 0);
    }
  }
  c.loop().run(100'000);  // FARE converges
  const auto data = pattern(7 << 20, 1);
  OpHandle h = c.ep(0).store(1, kData, 0, data.data(), data.size());
  ASSERT_TRUE(c.wait({h}));
  ASSERT_TRUE(h->ok());
  std::vector<double> plane(4, 0);
  for (int q = 0; q < c.ep(0).qps_per_peer(); ++q) {
    plane[c.fabric().gpu_ports(0)[c.ep(0).qp_port(1, q)].plane] += c.ep(0).qp(1, q).counters().tx_packets;
  }
  const double total = plane[0] + plane[1] + plane[2] + plane[3];
  EXPECT_NEAR(plane[3] / total, 1.0 / 7, 0.01);
  EXPECT_NEAR(plane[0] / total, 2.0 / 7, 0.01);
}

// Queue pairs are made on first use: a store from GPU 0 to GPU 1 makes GPU 0's requesters toward 1 and GPU 1's
// responders toward 0, nothing else (made eagerly, 8 GPUs would hold 8 x 8 x 4 QPs, a 1,024-GPU SUN 17 million).
TEST(Cluster, QueuePairsAreMadeOnFirstUse) {
  const routing::Topology topo = routing::make_superpod(8, 2);
  testbed::Cluster c(topo, options(Ordering::kWeak, 0, switchemu::LoadBalance::kPerPacket));
  c.allocate_window(kData, 1 << 20);
  for (int g = 0; g < 8; ++g) {
    EXPECT_EQ(c.ep(g).qps_made(), 0) << "GPU " << g;
  }
  const auto data = pattern(1 << 20, 3);
  OpHandle h = c.ep(0).store(1, kData, 0, data.data(), data.size());
  ASSERT_TRUE(c.wait({h}));
  ASSERT_TRUE(h->ok());
  const int k = c.ep(0).qps_per_peer();
  EXPECT_EQ(c.ep(0).qps_made(), k);  // a 1 MiB weak-mode store stripes over every sub-port
  EXPECT_EQ(c.ep(1).qps_made(), k);
  for (int g = 2; g < 8; ++g) {
    EXPECT_EQ(c.ep(g).qps_made(), 0) << "GPU " << g;
  }
  EXPECT_THROW(c.ep(0).qp(8, 0), common::Error);
  EXPECT_THROW(c.ep(0).qp(1, k), common::Error);
}

TEST(Cluster, ControlPlaneReadsFareWeightsAndTakesALinkDown) {
  // Plane 3's switch reaches GPU 1 over a Y-cable of two 400G sub-links; the control plane takes one down and the
  // switch's WECMP group toward GPU 1 keeps only the other. Bad names and GPUs come back as errors naming them.
  const routing::Topology topo = routing::make_superpod(4, 4);
  testbed::Cluster c(topo, options(Ordering::kWeak, 0, switchemu::LoadBalance::kPerPacket));
  const std::string sw = topo.nodes.at(c.fabric().switch_node(c.fabric().switch_of_plane(1, 3))).name;
  auto read = [&](const std::string& name, int gpu) {
    std::optional<common::ControlReply<std::vector<common::PortWeight>>> got;
    c.control().fare_weights(name, gpu, [&](const auto& r) { got = r; });
    EXPECT_FALSE(got.has_value()) << "answers come as events, never inside the call";
    c.loop().run(c.loop().now() + 1'000);
    EXPECT_TRUE(got.has_value());
    return got.value_or(common::ControlReply<std::vector<common::PortWeight>>{});
  };
  auto total = [](const std::vector<common::PortWeight>& v) {
    double t = 0;
    for (const auto& w : v) {
      t += w.gbps;
    }
    return t;
  };
  const auto before = read(sw, 1);
  ASSERT_TRUE(before.ok()) << before.error->message();
  ASSERT_EQ(before.value.size(), 2u);
  EXPECT_DOUBLE_EQ(total(before.value), 800);
  int down = -1;
  for (const auto& l : topo.links) {
    if (topo.nodes[l.a].gpu_index == 1 && l.plane == 3 && l.subport == 0) {
      down = l.id;
    }
  }
  ASSERT_GE(down, 0);
  common::ControlStatus st = common::ControlError{"", "no answer"};
  c.control().set_link_state(down, false, [&](const common::ControlStatus& s) { st = s; });
  c.loop().run(c.loop().now() + 100'000);  // FARE converges
  EXPECT_FALSE(st.has_value());
  const auto after = read(sw, 1);
  ASSERT_TRUE(after.ok());
  ASSERT_EQ(after.value.size(), 1u);
  EXPECT_DOUBLE_EQ(total(after.value), 400);
  const int gone = topo.links[down].a == topo.gpu_node(1) ? topo.links[down].b_port : topo.links[down].a_port;
  EXPECT_NE(after.value[0].port, gone);
  const auto unknown = read("no-such-switch", 1);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error->message(), "no-such-switch: no such switch");
  const auto bad_gpu = read(sw, 4);
  ASSERT_FALSE(bad_gpu.ok());
  EXPECT_NE(bad_gpu.error->reason.find("GPU 4 outside 0..3"), std::string::npos) << bad_gpu.error->reason;
}

TEST(Cluster, ProxyDrivesTransactionsThroughTheSink) {
  const routing::Topology topo = routing::make_superpod(4, 2);
  testbed::Cluster c(topo, options(Ordering::kPartial, 0.01, switchemu::LoadBalance::kPerFlow));
  c.allocate_window(kData, 1 << 20);
  c.allocate_window(kCounters, 4096);
  testbed::ClusterSink sink(c);
  endpoint::HostMemory host;
  endpoint::DescriptorRing ring(1024);
  endpoint::Proxy proxy(ring, sink, host, 0);
  std::vector<uint8_t> src = pattern(10'000, 5);
  std::vector<uint8_t> dst(10'000);
  uint64_t old = 0;
  endpoint::Descriptor put;
  put.op = static_cast<uint8_t>(endpoint::DescOp::kPut);
  put.target = 3;
  put.window = kData;
  put.remote_offset = 4096;
  put.length = static_cast<uint32_t>(src.size());
  put.local_addr = reinterpret_cast<uint64_t>(src.data());
  ring.post(put);
  endpoint::Descriptor fence;
  fence.op = static_cast<uint8_t>(endpoint::DescOp::kFence);
  fence.target = 3;
  ring.post(fence);
  endpoint::Descriptor get = put;
  get.op = static_cast<uint8_t>(endpoint::DescOp::kGet);
  get.local_addr = reinterpret_cast<uint64_t>(dst.data());
  ring.post(get);
  endpoint::Descriptor add;
  add.op = static_cast<uint8_t>(endpoint::DescOp::kFetchAdd);
  add.target = 2;
  add.window = kCounters;
  add.value = 11;
  add.result_addr = reinterpret_cast<uint64_t>(&old);
  ring.post(add);
  ring.post(add);
  for (int i = 0; i < 100000 && ring.completed() < 5; ++i) {
    proxy.poll_once();
  }
  ASSERT_EQ(ring.completed(), 5u);
  EXPECT_EQ(ring.errors(), 0u);
  EXPECT_EQ(dst, src) << "the get after the fence saw the put";
  EXPECT_EQ(old, 11u) << "second fetch-add returned the first one's result";
  EXPECT_EQ(u64(c.window_data(2, kCounters)), 22u);
}

// Message passing across the fabric with per-packet spraying in the switches and 5% loss on every link:
// a 256 KiB data store then a flag store; GPU 1 watches its memory. Strong needs no fence; the others do.
int fabric_mp_violations(Ordering o, bool fence, int trials) {
  int violations = 0;
  for (int t = 0; t < trials; ++t) {
    testbed::ClusterOptions opts = options(o, 0.05, switchemu::LoadBalance::kPerPacket);
    opts.fabric.seed = 40 + t;
    testbed::Cluster c(routing::make_superpod(4, 4), opts);
    c.allocate_window(kData, 1 << 20);
    c.allocate_window(kCounters, 4096);
    const auto data = pattern(256 * 1024, t);
    const uint64_t flag = 1;
    bool seen = false;
    bool bad = false;
    std::function<void()> watch = [&] {
      if (!seen && u64(c.window_data(1, kCounters)) == flag) {
        seen = true;
        bad = std::memcmp(c.window_data(1, kData), data.data(), data.size()) != 0;
      }
      if (!seen) {
        c.loop().schedule(c.loop().now() + 50, watch);
      }
    };
    c.loop().schedule(c.loop().now(), watch);
    OpHandle d = c.ep(0).store(1, kData, 0, data.data(), data.size());
    if (fence) {
      c.ep(0).fence(1);
    }
    OpHandle f = c.ep(0).store(1, kCounters, 0, &flag, 8);
    EXPECT_TRUE(c.wait({d, f}));
    c.loop().run(c.loop().now() + 1000);
    violations += bad || !seen;
  }
  return violations;
}

TEST(FabricLitmus, StrongNeedsNoFenceEvenWithSprayingAndLoss) {
  EXPECT_EQ(fabric_mp_violations(Ordering::kStrong, false, 10), 0);
}

TEST(FabricLitmus, PartialAndWeakAreOrderedByAFence) {
  EXPECT_EQ(fabric_mp_violations(Ordering::kPartial, true, 10), 0);
  EXPECT_EQ(fabric_mp_violations(Ordering::kWeak, true, 10), 0);
}

TEST(FabricLitmus, WeakWithoutFenceIsObservedToReorder) {
  EXPECT_GT(fabric_mp_violations(Ordering::kWeak, false, 10), 0) << "the litmus must be able to see a violation";
}
