// Raw traffic over the simulated fabric: the acceptance checks (analytic single link, line-rate
// all-to-all, FARE shares under Y-cable and plane failures, incast with and without PFC).
#include <gtest/gtest.h>

#include <cmath>

#include "ifec/common/checks.h"
#include "ifec/common/sim.h"
#include "ifec/testbed/cluster.h"
#include "ifec/testbed/raw_traffic.h"
#include "ifec/testbed/traffic_run.h"

using namespace ifec;
using common::TimeNs;

namespace {

routing::Topology one_link(double gbps, uint64_t delay_ns) {
  routing::Topology t;
  t.name = "one-link";
  t.source = "test";
  t.num_planes = 1;
  t.nodes.resize(2);
  for (int i = 0; i < 2; ++i) {
    t.nodes[i].name = "gpu" + std::to_string(i);
    t.nodes[i].kind = routing::NodeKind::kGpu;
    t.nodes[i].gpu_index = i;
    t.nodes[i].num_ports = 1;
    t.nodes[i].loopback = 0x0A000001u + static_cast<uint32_t>(i);
  }
  routing::Link l;
  l.id = 0;
  l.a = 0;
  l.b = 1;
  l.rate_gbps = gbps;
  l.delay_ns = delay_ns;
  t.links.push_back(l);
  return t;
}

struct SimFabric {
  common::EventLoop loop;
  std::unique_ptr<testbed::Fabric> fabric;
  std::unique_ptr<testbed::RawTraffic> traffic;
  SimFabric(const routing::Topology& topo, testbed::Pattern p, uint64_t bytes, testbed::FabricOptions opts = {},
            int target = 0) {
    fabric = std::make_unique<testbed::Fabric>(loop, topo, opts);
    traffic = std::make_unique<testbed::RawTraffic>(*fabric,
                                                    testbed::make_flows(p, fabric->num_gpus(), bytes, 7, target), true);
  }
};

// Bytes GPU `g` sent on each plane toward everyone (or, with received, got from everyone).
std::vector<double> plane_bytes_of(const SimFabric& r, int g, bool received) {
  std::vector<double> v(r.fabric->topology().num_planes, 0);
  for (int other = 0; other < r.fabric->num_gpus(); ++other) {
    for (size_t p = 0; p < v.size() && other != g; ++p) {
      const int plane = static_cast<int>(p);
      v[p] += received ? r.traffic->received_bytes(other, g, plane) : r.traffic->sent_bytes(g, other, plane);
    }
  }
  return v;
}

std::vector<double> sent_by_plane(const SimFabric& r, int g) { return plane_bytes_of(r, g, false); }
std::vector<double> received_by_plane(const SimFabric& r, int g) { return plane_bytes_of(r, g, true); }

std::vector<double> shares(std::vector<double> v) {
  double total = 0;
  for (double x : v) {
    total += x;
  }
  for (double& x : v) {
    x /= total;
  }
  return v;
}

std::vector<double> minus(std::vector<double> a, const std::vector<double>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] -= b[i];
  }
  return a;
}

void expect_shares(const std::vector<double>& got, const std::vector<double>& weights, const char* what) {
  const std::vector<double> want = shares(weights);
  for (size_t p = 0; p < got.size(); ++p) {
    EXPECT_NEAR(got[p], want[p], 0.02 * want[p] + 1e-12) << what << ": plane " << p << " share";
  }
}

int link_of(const routing::Topology& t, int gpu, int plane, int sub) {
  for (const auto& l : t.links) {
    if (t.nodes[l.a].gpu_index == gpu && l.plane == plane && l.subport == sub) {
      return l.id;
    }
  }
  return -1;
}

}  // namespace

TEST(RawTraffic, OneLinkCompletionIsSerializationPlusPropagationToTheNanosecond) {
  const uint64_t bytes = 10 * 4096 + 100;  // 10 full packets and a 100-byte tail
  SimFabric r(one_link(100, 1234), testbed::Pattern::kIncast, bytes, {}, 1);
  r.traffic->start(0);
  r.loop.run();
  const auto res = r.traffic->result();
  ASSERT_TRUE(res.complete);
  // Each packet: Eth 14 + IPv4 20 + UDP 8 + BTH 12 + RETH 16 + payload + pad + ICRC 4, + 24 wire overhead.
  double bits = 0;
  for (uint64_t off = 0; off < bytes; off += 4096) {
    const uint64_t len = std::min<uint64_t>(4096, bytes - off);
    const uint64_t pad = (4 - len % 4) % 4;
    bits += (14 + 20 + 8 + 12 + 16 + len + pad + 4 + 24) * 8.0;
  }
  const TimeNs analytic = static_cast<TimeNs>(std::ceil(bits / 100.0)) + 1234;
  EXPECT_EQ(res.completion_ns, analytic);
  EXPECT_EQ(res.payload_bytes_delivered, bytes);
}

TEST(RawTraffic, SuperPod8x2AllToAllDeliversEverythingNearLineRate) {
  SimFabric r(routing::make_superpod(8, 2), testbed::Pattern::kAllToAll, 2 << 20);
  r.traffic->start(0);
  r.loop.run();
  const auto res = r.traffic->result();
  EXPECT_TRUE(res.complete);
  EXPECT_EQ(res.payload_bytes_delivered, 8u * 7 * (2 << 20));
  EXPECT_EQ(r.fabric->switch_totals().drops, 0u);
  EXPECT_GE(res.goodput_gbps / res.line_rate_gbps, 0.93) << res.goodput_gbps << " of " << res.line_rate_gbps;
  EXPECT_LE(res.goodput_gbps / res.line_rate_gbps, res.payload_efficiency + 1e-9) << "cannot beat header overhead";
}

TEST(RawTraffic, SuperPod64x4AllToAllPerPacketReaches95PercentOfLineRate) {
  SimFabric r(routing::make_superpod(64, 4), testbed::Pattern::kAllToAll, 512 * 1024);
  r.traffic->start(0);
  r.loop.run();
  const auto res = r.traffic->result();
  ASSERT_TRUE(res.complete);
  EXPECT_EQ(res.line_rate_gbps, 64 * 3200.0);
  EXPECT_GE(res.goodput_gbps / res.line_rate_gbps, 0.95) << res.goodput_gbps << " Gb/s";
}

TEST(RawTraffic, YCableSubLinkDownHalvesThatPlaneAndOtherPlanesAbsorbIt) {
  const routing::Topology topo = routing::make_superpod(8, 4);
  SimFabric r(topo, testbed::Pattern::kAllToAll, 2 << 20);
  const int victim = 5;
  r.fabric->schedule_link_state(link_of(topo, victim, 2, 0), false, 0);
  r.traffic->start(100'000);  // after FARE converged (2 rounds of 10 us)
  r.loop.run();
  ASSERT_TRUE(r.traffic->result().complete);
  // Path bandwidth 400G on plane 2 and 800G elsewhere, for the victim's sends and for everyone's sends to it.
  expect_shares(shares(sent_by_plane(r, victim)), {800, 800, 400, 800}, "victim's sends");
  expect_shares(shares(received_by_plane(r, victim)), {800, 800, 400, 800}, "sends to the victim");
  std::vector<double> healthy_pair(4);
  for (int p = 0; p < 4; ++p) {
    healthy_pair[p] = static_cast<double>(r.traffic->sent_bytes(0, 1, p));
  }
  expect_shares(shares(healthy_pair), {800, 800, 800, 800}, "between two healthy GPUs");
  // Toward a healthy GPU the victim's plane-2 bytes are half of plane 0's (its own 400G bottleneck).
  EXPECT_NEAR(r.traffic->sent_bytes(victim, 1, 2) / static_cast<double>(r.traffic->sent_bytes(victim, 1, 0)), 0.5,
              0.01);
}

TEST(RawTraffic, PlaneDownForOneGpuCarriesNothingAfterConvergenceAndRecoveryRestoresShares) {
  const routing::Topology topo = routing::make_superpod(8, 4);
  // 7 x 32 MiB per GPU at 3.2 Tb/s: about 600 us of traffic, so the failure and the recovery both fall inside it.
  SimFabric r(topo, testbed::Pattern::kAllToAll, 32 << 20);
  const int victim = 3;
  const TimeNs fail_at = 50'000;
  const TimeNs restore_at = 300'000;
  for (int sub = 0; sub < 2; ++sub) {
    r.fabric->schedule_link_state(link_of(topo, victim, 3, sub), false, fail_at);
    r.fabric->schedule_link_state(link_of(topo, victim, 3, sub), true, restore_at);
  }
  r.traffic->start(0);
  // Converged two rounds (20 us) after the failure; leave a margin for frames already queued in the switch.
  r.loop.run(fail_at + 30'000);
  const auto rx0 = received_by_plane(r, victim);
  const auto tx0 = sent_by_plane(r, victim);
  r.loop.run(restore_at - 1);
  const auto rx1 = minus(received_by_plane(r, victim), rx0);
  const auto tx1 = minus(sent_by_plane(r, victim), tx0);
  EXPECT_EQ(rx1[3], 0) << "bytes reached the victim over its failed plane after convergence";
  EXPECT_EQ(tx1[3], 0) << "the victim sent over its failed plane after convergence";
  EXPECT_GT(rx1[0], 0);
  expect_shares(shares(rx1), {800, 800, 800, 0}, "failed plane: the other three share equally");
  // Recovery: after FARE reconverges the failed plane gets its quarter back.
  r.loop.run(restore_at + 30'000);
  const auto rx2 = received_by_plane(r, victim);
  r.loop.run(restore_at + 150'000);
  expect_shares(shares(minus(received_by_plane(r, victim), rx2)), {800, 800, 800, 800}, "after recovery");
  r.loop.run();
  // Raw flows have no transport to retransmit: frames on the wire or queued for the failed links when they went
  // down are lost. Every frame must be accounted for: delivered, or counted as lost by a link.
  const auto res = r.traffic->result();
  uint64_t link_losses = 0;
  for (size_t l = 0; l < topo.links.size(); ++l) {
    for (int side = 0; side < 2; ++side) {
      link_losses += r.fabric->link(static_cast<int>(l)).end(side).counters().dropped_link_down;
    }
  }
  EXPECT_EQ(res.packets_delivered + link_losses + r.fabric->switch_totals().drops, res.packets_sent);
  EXPECT_LT(link_losses, res.packets_sent / 100) << "losses limited to the convergence window";
}

TEST(RawTraffic, IncastWithPfcIsLosslessAndPauses) {
  // 4 MiB from each of 63 senders: 512 KiB per sender sub-link, above the 256 KiB XOFF threshold.
  SimFabric r(routing::make_superpod(64, 4), testbed::Pattern::kIncast, 4 << 20,
              {switchemu::LoadBalance::kPerPacket, true});
  r.traffic->start(0);
  r.loop.run();
  const auto res = r.traffic->result();
  const auto sw = r.fabric->switch_totals();
  EXPECT_TRUE(res.complete);
  EXPECT_EQ(sw.drops, 0u);
  EXPECT_GT(sw.pause_sent, 0u);
  EXPECT_GT(res.pfc_pauses_at_nics, 0u) << "senders were paused";
  EXPECT_GE(res.goodput_gbps / res.line_rate_gbps, 0.9) << "the receiver's 3.2 Tb/s stays busy";
}

TEST(RawTraffic, IncastWithoutPfcDropsAndCountsThem) {
  SimFabric r(routing::make_superpod(64, 4), testbed::Pattern::kIncast, 1 << 20,
              {switchemu::LoadBalance::kPerPacket, false});
  r.traffic->start(0);
  r.loop.run();
  const auto res = r.traffic->result();
  const auto sw = r.fabric->switch_totals();
  EXPECT_GT(sw.buffer_drops, 0u);
  EXPECT_EQ(sw.pause_sent, 0u);
  EXPECT_FALSE(res.complete);
  EXPECT_EQ(res.packets_delivered + sw.buffer_drops, res.packets_sent) << "every packet arrived or was counted";
}

// Elided payloads change nothing the fabric sees: every link's frames and bytes in both directions, the traffic's
// times and counts, the events run, on a 1-tier and a 2-tier fabric, with a link failing and coming back.
TEST(RawTraffic, ElidedPayloadsGiveTheSameRunAsRealOnes) {
  struct Case {
    routing::Topology topo;
    testbed::Pattern pattern;
    uint64_t bytes;
  };
  const std::vector<Case> cases = {{routing::make_superpod(8, 2), testbed::Pattern::kAllToAll, 64 << 10},
                                   {routing::make_superpod(64, 4), testbed::Pattern::kPermutation, 1 << 20},
                                   {routing::make_fat_tree(32, 2, 4, 2), testbed::Pattern::kAllToAll, 16 << 10}};
  for (const Case& c : cases) {
    auto run = [&](bool elided) {
      testbed::FabricOptions o;
      o.elided_payloads = elided;
      SimFabric r(c.topo, c.pattern, c.bytes, o);
      r.fabric->schedule_link_state(link_of(c.topo, 5, 1, 0), false, 3'000);
      r.fabric->schedule_link_state(link_of(c.topo, 5, 1, 0), true, 9'000);
      r.traffic->start(0);
      r.loop.run();
      std::vector<uint64_t> links;
      for (size_t l = 0; l < c.topo.links.size(); ++l) {
        for (int side = 0; side < 2; ++side) {
          const common::PortCounters& k = r.fabric->link(static_cast<int>(l)).end(side).counters();
          links.insert(links.end(), {k.tx_frames, k.tx_bytes, k.rx_frames, k.rx_bytes, k.busy_ps, k.dropped_link_down});
        }
      }
      const testbed::TrafficResult t = r.traffic->result();
      links.insert(links.end(), {t.completion_ns, t.frame_bytes_sent, t.wire_bytes_sent, t.packets_sent,
                                 t.packets_delivered, t.payload_bytes_delivered, t.rx_bad_frames, r.loop.events_run()});
      links.insert(links.end(), t.plane_bytes.begin(), t.plane_bytes.end());
      return links;
    };
    const std::vector<uint64_t> real = run(false);
    EXPECT_EQ(run(true), real) << c.topo.name;
    EXPECT_GT(real[real.size() - c.topo.num_planes - 1], 0u) << c.topo.name << ": events ran";
  }
}

// Expert-parallel groups: all-to-all and permutation stay within consecutive groups; one group of every GPU is the
// ungrouped pattern exactly (the same seeded derangement); bad group sizes are named.
TEST(RawTraffic, GroupsKeepFlowsWithinTheirGroup) {
  const auto a2a = testbed::make_flows(testbed::Pattern::kAllToAll, 16, 4096, 1, 0, 4);
  EXPECT_EQ(a2a.size(), 16u * 3);
  for (const auto& f : a2a) {
    EXPECT_EQ(f.src / 4, f.dst / 4) << f.src << " -> " << f.dst;
    EXPECT_NE(f.src, f.dst);
  }
  const auto perm = testbed::make_flows(testbed::Pattern::kPermutation, 16, 4096, 5, 0, 8);
  std::vector<int> sends(16, 0);
  std::vector<int> receives(16, 0);
  for (const auto& f : perm) {
    EXPECT_EQ(f.src / 8, f.dst / 8) << f.src << " -> " << f.dst;
    EXPECT_NE(f.src, f.dst);
    sends[f.src]++;
    receives[f.dst]++;
  }
  EXPECT_EQ(sends, std::vector<int>(16, 1));
  EXPECT_EQ(receives, std::vector<int>(16, 1));
  const auto whole = testbed::make_flows(testbed::Pattern::kPermutation, 16, 4096, 5, 0, 16);
  const auto plain = testbed::make_flows(testbed::Pattern::kPermutation, 16, 4096, 5);
  ASSERT_EQ(whole.size(), plain.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_EQ(whole[i].src, plain[i].src);
    EXPECT_EQ(whole[i].dst, plain[i].dst);
  }
  for (int bad : {1, 3, 32}) {
    try {
      testbed::make_flows(testbed::Pattern::kAllToAll, 16, 4096, 1, 0, bad);
      ADD_FAILURE() << "group " << bad << " accepted";
    } catch (const common::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--group " + std::to_string(bad)), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(testbed::make_flows(testbed::Pattern::kIncast, 16, 4096, 1, 0, 4), common::Error);
}

// A grouped all-to-all on the fabric delivers every byte, and only within groups.
TEST(RawTraffic, GroupedAllToAllDeliversWithinGroups) {
  common::EventLoop loop;
  testbed::Fabric fabric(loop, routing::make_superpod(8, 2), {});
  testbed::RawTraffic t(fabric, testbed::make_flows(testbed::Pattern::kAllToAll, 8, 64 * 1024, 1, 0, 4), true);
  t.start(0);
  loop.run();
  ASSERT_TRUE(t.result().complete);
  EXPECT_EQ(t.result().flows, 8u * 3);
  for (int s = 0; s < 8; ++s) {
    for (int d = 0; d < 8; ++d) {
      const uint64_t got = t.received_bytes(s, d, 0) + t.received_bytes(s, d, 1);
      EXPECT_EQ(got, s != d && s / 4 == d / 4 ? 64u * 1024 : 0u) << s << " -> " << d;
    }
  }
}

// DeepSeek-V3's fabric (GPU i of a server on plane i, NVLink inside the server): a flow to a server peer goes over
// their in-node link; a frame for a GPU of another plane crosses the sender's plane to the destination server's GPU
// there, which forwards it over NVLink. Counted three ways: the generator's lanes, the links' own counters, and the
// flows' packets worked out by hand.
TEST(RawTraffic, DeepseekFabricForwardsOtherPlanesTrafficInsideTheServer) {
  const routing::Topology topo = routing::make_deepseek_fabric(8, 4, 2, 2);  // 32 GPUs, 4 per server and planes
  const uint64_t bytes = 16 << 10;                                           // 4 packets of 4 KiB per flow
  auto run = [&](bool elided) {
    testbed::FabricOptions o;
    o.elided_payloads = elided;
    auto r = std::make_unique<SimFabric>(topo, testbed::Pattern::kAllToAll, bytes, o);
    r->traffic->start(0);
    r->loop.run();
    return r;
  };
  const std::unique_ptr<SimFabric> r = run(false);
  const testbed::TrafficResult t = r->traffic->result();
  ASSERT_TRUE(t.complete);
  EXPECT_EQ(t.rx_bad_frames, 0u);
  EXPECT_EQ(r->fabric->switch_totals().drops, 0u);  // no switch met a GPU it has no route to
  uint64_t in_node = 0, relayed = 0;
  for (int s = 0; s < 32; ++s) {
    for (int d = 0; d < 32; ++d) {
      if (s == d) continue;
      const bool same_server = s / 4 == d / 4;
      in_node += same_server ? 4 : 0;
      relayed += !same_server && s % 4 != d % 4 ? 4 : 0;
      // Every byte on one lane: the sender's plane's in-node one (4 + plane) between server peers, else its plane.
      const int lane = same_server ? 4 + s % 4 : s % 4;
      EXPECT_EQ(r->traffic->received_bytes(s, d, lane), bytes) << s << " -> " << d;
      EXPECT_EQ(r->traffic->sent_bytes(s, d, lane), bytes) << s << " -> " << d;
    }
  }
  EXPECT_EQ(in_node, 8u * 12 * 4);
  EXPECT_EQ(relayed, 32u * 21 * 4);
  EXPECT_EQ(t.relayed_frames, relayed);
  uint64_t nvlink_frames = 0, nvlink_bytes = 0;
  for (const routing::Link& l : topo.links) {
    for (int side = 0; side < 2 && l.plane == routing::kNvlinkPlane; ++side) {
      nvlink_frames += r->fabric->link(l.id).end(side).counters().tx_frames;
      nvlink_bytes += r->fabric->link(l.id).end(side).counters().tx_bytes;
    }
  }
  EXPECT_EQ(nvlink_frames, in_node + relayed);  // each frame for another plane crossed exactly one in-node link
  EXPECT_EQ(t.nvlink_bytes, nvlink_bytes);
  // Every packet a full 4 KiB one, of one frame size: the NICs sent all but the in-node flows' packets.
  ASSERT_EQ(t.packets_sent, 32u * 31 * 4);
  const uint64_t frame = t.frame_bytes_sent / t.packets_sent;
  uint64_t planes = 0;
  for (uint64_t b : t.plane_bytes) planes += b;
  EXPECT_EQ(planes, (t.packets_sent - in_node) * frame);
  EXPECT_EQ(t.nvlink_bytes, (in_node + relayed) * frame);
  // Elided payloads: the same run.
  const std::unique_ptr<SimFabric> e = run(true);
  const testbed::TrafficResult te = e->traffic->result();
  EXPECT_EQ(te.completion_ns, t.completion_ns);
  EXPECT_EQ(te.nvlink_bytes, t.nvlink_bytes);
  EXPECT_EQ(te.plane_bytes, t.plane_bytes);
  EXPECT_EQ(e->loop.events_run(), r->loop.events_run());
}

// Its planes are joined inside the servers: partitions by plane exchange in-node frames through mailboxes, with
// the NVLink delay as their lookahead, and give the same run on 1, 2 and 4 threads (every link's counters
// included); over MPI processes it is refused by name, and so is the endpoint runtime.
TEST(RawTraffic, DeepseekFabricGivesTheSameRunOnAnyThreads) {
  const routing::Topology topo = routing::make_deepseek_fabric(8, 4, 2, 2);
  auto run = [&](int threads) {
    testbed::SimOptions o;
    o.pattern = testbed::Pattern::kAllToAll;
    o.bytes = 24 << 10;
    o.progress = false;
    o.threads = threads;
    o.events = {testbed::parse_link_event(topo, "p1-leaf0:p1-spine0@0ns", false),
                testbed::parse_link_event(topo, "p1-leaf0:p1-spine0@9us", true)};
    return testbed::run_sim(topo, o);
  };
  auto figures = [](const testbed::SimRun& r) {
    std::vector<uint64_t> v = {r.events,
                               r.frame_hops,
                               r.traffic.completion_ns,
                               r.traffic.nvlink_bytes,
                               r.traffic.relayed_frames,
                               r.traffic.payload_bytes_delivered,
                               r.link_drops};
    v.insert(v.end(), r.traffic.plane_bytes.begin(), r.traffic.plane_bytes.end());
    for (const testbed::LinkUtilization& u : r.links) v.push_back(u.frames);
    return v;
  };
  // (Raw traffic does not retransmit: frames a spine meets before FARE has routed around its dead link are lost.)
  const testbed::SimRun one = run(1);
  EXPECT_GT(one.traffic.payload_bytes_delivered, one.traffic.payload_bytes_offered / 2);
  EXPECT_GT(one.traffic.relayed_frames, 0u);
  EXPECT_GT(one.windows, 0u);
  EXPECT_EQ(figures(run(2)), figures(one));
  EXPECT_EQ(figures(run(4)), figures(one));
  const testbed::SimRun loop = run(0);  // one event loop: the same traffic (equal-time order may differ)
  EXPECT_EQ(loop.traffic.payload_bytes_offered, one.traffic.payload_bytes_offered);
  EXPECT_GT(loop.traffic.payload_bytes_delivered, 0u);
  testbed::Processes two{0, 2, [](std::vector<uint64_t>&) {}, {}};
  testbed::SimOptions o;
  o.bytes = 4096;
  o.progress = false;
  o.processes = &two;
  const std::string msg = [&] {
    try {
      testbed::run_sim(topo, o);
    } catch (const common::Error& err) {
      return std::string(err.what());
    }
    return std::string("<no error>");
  }();
  // Over processes its in-node links' frames cross in exchanges (test_sim.py runs it under mpirun): processes
  // without one are refused by name.
  EXPECT_NE(msg.find("of two processes needs their exchange"), std::string::npos) << msg;
  EXPECT_THROW(testbed::Cluster(topo, testbed::ClusterOptions{}), common::Error);
}
