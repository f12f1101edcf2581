// Switch pipeline: forwarding and rewrites, drops with reasons, WECMP shares, ECN, PFC, and driver independence.
//
//          host0 --\                /-- host2
//          host1 ---[ switch (ports 0..N-1) ]--- host3   (host i is 10.0.0.(i+1), on switch port i)
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <type_traits>
#include <vector>

#include "ifec/common/byte_order.h"
#include "ifec/common/checks.h"
#include "ifec/common/frame.h"
#include "ifec/common/pfc.h"
#include "ifec/common/sim.h"
#include "ifec/switchemu/switch.h"

using namespace ifec;
using common::TimeNs;

namespace {

uint32_t host_ip(int i) { return 0x0A000001u + static_cast<uint32_t>(i); }

std::vector<uint8_t> roce_frame(int src, int dst, uint32_t psn, size_t payload, uint16_t sport = 0xC000) {
  common::FrameHeaders h;
  h.ip.src = host_ip(src);
  h.ip.dst = host_ip(dst);
  h.ip.dscp = 26;
  h.ip.ecn = 2;
  h.ip.ttl = 64;
  h.udp.src_port = sport;
  h.bth.opcode = static_cast<uint8_t>(common::Opcode::kWriteOnly);
  h.bth.dest_qp = 7;
  h.bth.psn = psn;
  h.reth = common::Reth{0x1000, 1, static_cast<uint32_t>(payload)};
  std::vector<uint8_t> data(payload, 0x5A);
  return common::encode_frame(h, data.data(), data.size());
}

// A switch wired to N hosts whose links may have different rates.
template <typename ClockT>
struct Bench {
  ClockT& clock;
  std::vector<std::unique_ptr<common::Link>> links;
  std::unique_ptr<switchemu::Switch> sw;
  std::vector<std::vector<std::vector<uint8_t>>> received;  // per host
  std::vector<std::vector<TimeNs>> pauses_seen;             // per host: times PFC pause frames arrived

  Bench(ClockT& c, std::vector<uint64_t> rates_bps, switchemu::SwitchConfig cfg) : clock(c) {
    std::vector<common::Port*> ports;
    received.resize(rates_bps.size());
    pauses_seen.resize(rates_bps.size());
    for (size_t i = 0; i < rates_bps.size(); ++i) {
      links.push_back(std::make_unique<common::Link>(clock, common::LinkConfig{rates_bps[i], 100, 24}));
      ports.push_back(&links.back()->end(0));
      links.back()->end(1).set_receiver([this, i](std::vector<uint8_t>&& f) {
        if (common::is_mac_control(f.data(), f.size())) {
          pauses_seen[i].push_back(clock.now());
        } else {
          received[i].push_back(std::move(f));
        }
      });
    }
    sw = std::make_unique<switchemu::Switch>(clock, cfg, ports);
    for (size_t i = 0; i < rates_bps.size(); ++i) {
      sw->set_route(host_ip(static_cast<int>(i)), {{static_cast<int>(i), 1.0, {0x02, 0, 0, 0, 0, uint8_t(i)}}});
    }
  }
  common::LinkPort& host(int i) { return links[i]->end(1); }
};

// Sends `frames` from host `src` back to back (honouring nothing: hosts here are dumb traffic sources).
template <typename B>
void blast(B& b, int src, std::vector<std::vector<uint8_t>> frames) {
  auto q = std::make_shared<std::vector<std::vector<uint8_t>>>(std::move(frames));
  auto idx = std::make_shared<size_t>(0);
  auto pump = [&b, src, q, idx] {
    if (*idx < q->size() && !b.host(src).busy()) {
      b.host(src).send(std::move((*q)[(*idx)++]));
    }
  };
  b.host(src).set_tx_ready(pump);
  pump();
}

// Hosts 0, 1 and 2 each blast `frames` 1000-byte frames at host 3.
template <typename B>
void incast_to_port3(B& b, uint32_t frames) {
  for (int s = 0; s < 3; ++s) {
    std::vector<std::vector<uint8_t>> batch;
    for (uint32_t i = 0; i < frames; ++i) {
      batch.push_back(roce_frame(s, 3, i, 1000));
    }
    blast(b, s, batch);
  }
}

switchemu::SwitchConfig config(bool pfc = true) {
  switchemu::SwitchConfig cfg;
  cfg.name = "sw-test";
  cfg.params.pfc.enabled = pfc;
  return cfg;
}

constexpr uint64_t k100G = 100'000'000'000ULL;

// Four frames from host 0, to hosts 98 and 99 in turn, through to the end; each of ports 1 and 2 got two.
template <typename B>
void send_interleaved_to_98_and_99(B& b, common::EventLoop& loop) {
  std::vector<std::vector<uint8_t>> frames;
  for (uint32_t i = 0; i < 4; ++i) {
    frames.push_back(roce_frame(0, 98 + static_cast<int>(i % 2), i, 64));
  }
  blast(b, 0, frames);
  loop.run();
  ASSERT_EQ(b.received[1].size(), 2u);
  ASSERT_EQ(b.received[2].size(), 2u);
}

// The destination addresses of the frames port `port` carried.
template <class B>
std::set<uint32_t> destinations_on(const B& b, int port) {
  std::set<uint32_t> dests;
  for (const auto& f : b.received[port]) {
    common::L3View l3;
    EXPECT_TRUE(common::parse_l3(f.data(), f.size(), &l3).ok());
    dests.insert(l3.dst);
  }
  return dests;
}

}  // namespace

TEST(Switch, ForwardsByDestinationAndRewritesTtlMacsKeepingIcrcValid) {
  common::EventLoop loop;
  Bench<common::EventLoop> b(loop, {k100G, k100G, k100G}, config());
  blast(b, 0, {roce_frame(0, 2, 1, 256), roce_frame(0, 1, 2, 256)});
  loop.run();
  ASSERT_EQ(b.received[2].size(), 1u);
  ASSERT_EQ(b.received[1].size(), 1u);
  EXPECT_EQ(b.received[0].size(), 0u);
  common::ParsedFrame pf;
  ASSERT_TRUE(common::parse_frame(b.received[2][0].data(), b.received[2][0].size(), &pf).ok())
      << "IP checksum and ICRC must survive the TTL rewrite";
  EXPECT_EQ(pf.h.ip.ttl, 63);
  EXPECT_EQ(pf.h.eth.dst, (common::MacAddress{0x02, 0, 0, 0, 0, 2}));
  EXPECT_EQ(pf.h.eth.src, b.sw->port_mac(2));
  EXPECT_EQ(b.sw->counters(2).tx_frames, 1u);
  EXPECT_EQ(b.sw->counters(0).rx_frames, 2u);
}

TEST(Switch, DropsAndCountsMalformedUnroutableAndExpiredFrames) {
  common::EventLoop loop;
  Bench<common::EventLoop> b(loop, {k100G, k100G}, config());
  std::vector<uint8_t> no_route = roce_frame(0, 9, 1, 64);
  std::vector<uint8_t> truncated = roce_frame(0, 1, 2, 64);
  truncated.resize(20);
  std::vector<uint8_t> bad_version = roce_frame(0, 1, 3, 64);
  bad_version[14] = 0x65;
  common::FrameHeaders h;
  h.ip.src = host_ip(0);
  h.ip.dst = host_ip(1);
  h.ip.ttl = 1;
  h.bth.opcode = static_cast<uint8_t>(common::Opcode::kAcknowledge);
  h.aeth = common::Aeth::ack(1);
  blast(b, 0, {no_route, truncated, bad_version, common::encode_frame(h, nullptr, 0), roce_frame(0, 1, 4, 64)});
  loop.run();
  EXPECT_EQ(b.sw->counters(0).no_route_drops, 1u);
  EXPECT_EQ(b.sw->counters(0).malformed_drops, 2u);
  EXPECT_EQ(b.sw->counters(0).ttl_drops, 1u);
  EXPECT_EQ(b.received[1].size(), 1u) << "the good frame after the bad ones still goes through";
}

TEST(Switch, SetRouteRejectsBadGroups) {
  common::EventLoop loop;
  Bench<common::EventLoop> b(loop, {k100G, k100G}, config());
  EXPECT_THROW(b.sw->set_route(1, {{5, 1.0, {}}}), common::Error);
  EXPECT_THROW(b.sw->set_route(1, {{0, -1.0, {}}}), common::Error);
  EXPECT_THROW(b.sw->set_route(1, {{0, 0.0, {}}}), common::Error);
  b.sw->set_route(host_ip(1), {});
  EXPECT_EQ(b.sw->route(host_ip(1)), nullptr);
}

TEST(Switch, PerPacketSprayingFollowsWeightsExactly) {
  common::EventLoop loop;
  Bench<common::EventLoop> b(loop, {k100G, k100G, k100G}, config());
  // Destination 10.0.0.100 reachable over ports 1 and 2 with weights 3:1.
  const uint32_t dst = host_ip(99);
  b.sw->set_route(dst, {{1, 3.0, {}}, {2, 1.0, {}}});
  std::vector<std::vector<uint8_t>> frames;
  for (uint32_t i = 0; i < 400; ++i) {
    frames.push_back(roce_frame(0, 99, i, 64));
  }
  blast(b, 0, frames);
  loop.run();
  EXPECT_EQ(b.received[1].size(), 300u);
  EXPECT_EQ(b.received[2].size(), 100u);
}

TEST(Switch, RotationsOfSeparateGroupsStartApart) {
  common::EventLoop loop;
  Bench<common::EventLoop> b(loop, {k100G, k100G, k100G, k100G, k100G}, config());
  // Sixteen destinations, each its own group over ports 1-4 (1:1:1:1; a leaf's classes over its spines), one frame
  // to each at once: rotations all starting at the first member would send all sixteen over port 1 (a leaf's
  // frames of one moment all to one spine, the next moment's to the next: a 2,048-GPU permutation took 10.64 us,
  // 49% of its line rate, against 8.96 us with rotations starting apart).
  std::vector<std::vector<uint8_t>> frames;
  for (int d = 80; d < 96; ++d) {
    b.sw->set_route(host_ip(d), {{1, 1.0, {}}, {2, 1.0, {}}, {3, 1.0, {}}, {4, 1.0, {}}});
    frames.push_back(roce_frame(0, d, 0, 64));
  }
  blast(b, 0, frames);
  loop.run();
  size_t most = 0;
  for (int port = 1; port <= 4; ++port) {
    most = std::max(most, b.received[port].size());
  }
  EXPECT_EQ(b.received[1].size() + b.received[2].size() + b.received[3].size() + b.received[4].size(), 16u);
  EXPECT_LE(most, 8u) << "the sixteen groups' first frames on one port";
}

TEST(Switch, DestinationsSharingAGroupShareItsSprayingAndLeaveItOneByOne) {
  common::EventLoop loop;
  Bench<common::EventLoop> b(loop, {k100G, k100G, k100G}, config());
  // Two destinations behind one group of ports 1 and 2 (1:1): their frames, interleaved, alternate between the
  // ports as one stream would (one shared round robin), so each port carries one destination's frames; with a
  // round robin each, each destination's frames would alternate, and each port would carry one frame to each.
  const uint32_t x = host_ip(98);
  const uint32_t y = host_ip(99);
  b.sw->set_route(std::vector<uint32_t>{x, y}, {{1, 1.0, {}}, {2, 1.0, {}}});
  send_interleaved_to_98_and_99(b, loop);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(destinations_on(b, 1).size(), 1u);
  EXPECT_EQ(destinations_on(b, 2).size(), 1u);
  EXPECT_NE(destinations_on(b, 1), destinations_on(b, 2));
  // One destination re-routed alone keeps the other on the group; withdrawing the last one frees it.
  b.sw->set_route(x, {{1, 1.0, {}}});
  ASSERT_NE(b.sw->route(y), nullptr);
  EXPECT_EQ(b.sw->route(y)->size(), 2u);
  EXPECT_EQ(b.sw->route(x)->size(), 1u);
  b.sw->set_route(std::vector<uint32_t>{x, y}, {});
  EXPECT_EQ(b.sw->route(x), nullptr);
  EXPECT_EQ(b.sw->route(y), nullptr);
}

TEST(Switch, GroupsOverTheSameHopsShareTheirMemberListButEachKeepsItsRotation) {
  common::EventLoop loop;
  Bench<common::EventLoop> b(loop, {k100G, k100G, k100G}, config());
  // Two destinations, each its own group over ports 1 and 2 (1:1; a leaf's routes toward two other leaves): one
  // member list in memory, but each destination's frames alternate on their own, so interleaved, each port carries one
  // frame to each (one shared rotation would send every frame to x over one port, every frame to y over the other).
  const uint32_t x = host_ip(98);
  const uint32_t y = host_ip(99);
  b.sw->set_route(x, {{1, 1.0, {}}, {2, 1.0, {}}});
  b.sw->set_route(y, {{1, 1.0, {}}, {2, 1.0, {}}});
  EXPECT_EQ(b.sw->route(x), b.sw->route(y)) << "one member list";
  const size_t shared = b.sw->fib_bytes();
  b.sw->set_route(y, {{2, 1.0, {}}, {1, 1.0, {}}});  // the same ports in another order: another list
  EXPECT_NE(b.sw->route(x), b.sw->route(y));
  EXPECT_GT(b.sw->fib_bytes(), shared);
  b.sw->set_route(y, {{1, 1.0, {}}, {2, 1.0, {}}});
  send_interleaved_to_98_and_99(b, loop);
  ASSERT_FALSE(HasFatalFailure());
  for (int port : {1, 2}) {
    EXPECT_EQ(destinations_on(b, port), (std::set<uint32_t>{x, y})) << "port " << port << " carried one frame to each";
  }
  // Withdrawn, the list goes when its last group does.
  b.sw->set_route(x, {});
  EXPECT_NE(b.sw->route(y), nullptr);
  b.sw->set_route(y, {});
  EXPECT_EQ(b.sw->route(y), nullptr);
}

TEST(Switch, PerFlowHashingKeepsFlowsOnOnePathAndSplitsFlowsByWeight) {
  common::EventLoop loop;
  switchemu::SwitchConfig cfg = config();
  cfg.lb = switchemu::LoadBalance::kPerFlow;
  Bench<common::EventLoop> b(loop, {k100G, k100G, k100G}, cfg);
  const uint32_t dst = host_ip(99);
  b.sw->set_route(dst, {{1, 1.0, {}}, {2, 1.0, {}}});
  std::vector<std::vector<uint8_t>> frames;
  for (int flow = 0; flow < 2000; ++flow) {
    for (int k = 0; k < 2; ++k) {
      frames.push_back(roce_frame(0, 99, static_cast<uint32_t>(k), 64, static_cast<uint16_t>(0xC000 + flow)));
    }
  }
  blast(b, 0, frames);
  loop.run();
  std::map<uint16_t, std::set<int>> ports_of_flow;
  for (int port = 1; port <= 2; ++port) {
    for (const auto& f : b.received[port]) {
      ports_of_flow[common::load_be16(f.data() + 34)].insert(port);
    }
  }
  ASSERT_EQ(ports_of_flow.size(), 2000u);
  for (const auto& [sport, ports] : ports_of_flow) {
    EXPECT_EQ(ports.size(), 1u) << "flow " << sport << " split over paths";
  }
  const double share = b.received[1].size() / 4000.0;
  EXPECT_NEAR(share, 0.5, 0.05) << "2000 flows hashed over two equal paths";
}

TEST(Switch, EcnMarksOnlyBetweenThresholdsAndAbove) {
  common::EventLoop loop;
  switchemu::SwitchConfig cfg = config(false);
  cfg.params.ecn = {20'000, 60'000, 1.0};
  cfg.params.buffer_bytes = 1 << 30;
  // Three fast senders into one slow port: the queue builds up.
  Bench<common::EventLoop> b(loop, {k100G, k100G, k100G, 10'000'000'000ULL}, cfg);
  incast_to_port3(b, 100);
  loop.run();
  ASSERT_EQ(b.received[3].size(), 300u);
  const auto& q = b.sw->counters(3).queues[config().params.pfc.lossless_priority];
  EXPECT_GT(q.ecn_marks, 0u);
  EXPECT_GT(q.high_water_bytes, 60'000u);
  size_t ce = 0;
  for (size_t i = 0; i < b.received[3].size(); ++i) {
    ce += (b.received[3][i][15] & 3) == 3;
  }
  EXPECT_EQ(ce, q.ecn_marks) << "every counted mark is a CE codepoint on the wire";
  // The first frames met an empty queue: none of them can be marked.
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_NE(b.received[3][i][15] & 3, 3) << "frame " << i << " marked below kmin";
  }
}

TEST(Switch, PfcPausesSendersInsteadOfDropping) {
  common::EventLoop loop;
  switchemu::SwitchConfig cfg = config(true);
  cfg.params.pfc.xoff_bytes = 20'000;
  cfg.params.pfc.xon_bytes = 10'000;
  cfg.params.buffer_bytes = 200'000;
  Bench<common::EventLoop> b(loop, {k100G, k100G, k100G, 10'000'000'000ULL}, cfg);
  // Senders that honour PFC: they stop while paused (quanta -> time) and resume on XON.
  std::vector<TimeNs> paused_until(3, 0);
  std::vector<std::vector<std::vector<uint8_t>>> queues(3);
  std::vector<size_t> next(3, 0);
  std::function<void(int)> pump = [&](int s) {
    if (next[s] >= queues[s].size() || b.host(s).busy()) {
      return;
    }
    if (paused_until[s] > loop.now()) {
      loop.schedule(paused_until[s], [&, s] { pump(s); });
      return;
    }
    b.host(s).send(std::move(queues[s][next[s]++]));
  };
  for (int s = 0; s < 3; ++s) {
    for (uint32_t i = 0; i < 300; ++i) {
      queues[s].push_back(roce_frame(s, 3, i, 1000));
    }
    b.host(s).set_tx_ready([&, s] { pump(s); });
    b.host(s).set_receiver([&, s](std::vector<uint8_t>&& f) {
      common::PfcFrame p;
      ASSERT_TRUE(common::PfcFrame::decode(f.data(), f.size(), &p).ok());
      const int prio = cfg.params.pfc.lossless_priority;
      paused_until[s] = p.quanta[prio] ? loop.now() + common::pfc_quanta_ns(p.quanta[prio], k100G) : 0;
      pump(s);
    });
    pump(s);
  }
  loop.run();
  EXPECT_EQ(b.received[3].size(), 900u) << "lossless: everything arrives";
  const auto totals = b.sw->totals();
  EXPECT_EQ(totals.drops, 0u);
  EXPECT_GT(totals.pause_sent, 0u);
  EXPECT_GT(b.sw->counters(0).resume_sent, 0u);
}

TEST(Switch, WithoutPfcOverflowDropsAreCounted) {
  common::EventLoop loop;
  switchemu::SwitchConfig cfg = config(false);
  cfg.params.buffer_bytes = 50'000;
  Bench<common::EventLoop> b(loop, {k100G, k100G, k100G, 10'000'000'000ULL}, cfg);
  incast_to_port3(b, 300);
  loop.run();
  const auto totals = b.sw->totals();
  EXPECT_GT(totals.buffer_drops, 0u);
  EXPECT_EQ(b.received[3].size() + totals.buffer_drops, 900u) << "every frame either arrived or was counted";
  EXPECT_EQ(totals.pause_sent, 0u);
}

TEST(Switch, SamePipelineUnderWallClockDriverForwardsIdentically) {
  // The pipeline sees only Clock and Port: run one scenario in virtual time and in wall-clock time.
  auto scenario = [](auto& clock, auto run) {
    Bench<std::remove_reference_t<decltype(clock)>> b(clock, {1'000'000'000ULL, 1'000'000'000ULL, 1'000'000'000ULL},
                                                      config());
    b.sw->set_route(host_ip(99), {{1, 2.0, {}}, {2, 1.0, {}}});
    std::vector<std::vector<uint8_t>> frames;
    for (uint32_t i = 0; i < 30; ++i) {
      frames.push_back(roce_frame(0, 99, i, 500));
    }
    blast(b, 0, frames);
    run();
    return std::vector<size_t>{b.received[1].size(), b.received[2].size(), size_t(b.sw->counters(0).rx_frames)};
  };
  common::EventLoop sim;
  const auto virt = scenario(sim, [&] { sim.run(); });
  common::RealtimeLoop wall;
  const TimeNs t0 = wall.now();
  const auto real = scenario(wall, [&] { wall.run(wall.now() + 2'000'000'000ULL); });
  const TimeNs elapsed = wall.now() - t0;
  EXPECT_EQ(virt, (std::vector<size_t>{20, 10, 30}));
  EXPECT_EQ(real, virt);
  // 30 frames of 578 wire bytes at 1 Gb/s take 138.7 us of real serialization: wall time cannot be less.
  EXPECT_GE(elapsed, 138'000u);
}

TEST(Switch, LocalFailoverSkipsAGroupMemberWhoseLinkIsDown) {
  common::EventLoop loop;
  Bench<common::EventLoop> b(loop, {k100G, k100G, k100G}, config());
  b.sw->set_route(host_ip(99), {{1, 1.0, {}}, {2, 1.0, {}}});
  b.links[2]->set_up(false);  // FARE has not reacted: the group still lists port 2
  std::vector<std::vector<uint8_t>> frames;
  for (uint32_t i = 0; i < 50; ++i) {
    frames.push_back(roce_frame(0, 99, i, 64));
  }
  blast(b, 0, frames);
  loop.run();
  EXPECT_EQ(b.received[1].size(), 50u) << "everything moved to the live member";
  EXPECT_GE(b.sw->counters(0).failovers, 25u);
  EXPECT_EQ(b.sw->totals().drops, 0u);
  b.links[1]->set_up(false);
  blast(b, 0, {roce_frame(0, 99, 60, 64)});
  loop.run();
  EXPECT_EQ(b.sw->counters(0).no_route_drops, 1u) << "no live member left: dropped and counted";
}
