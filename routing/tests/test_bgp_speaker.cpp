// FARE over BGP against the reference: one BgpSpeaker per node of a topology, their sessions wired through an
// in-memory transport (TCP connections both ways at once, so every session starts with an RFC 4271 §6.8
// collision), must reach exactly FareRib's converged groups and path bandwidths; with a failed sub-link, a
// failed leaf-spine link, a killed node and a hung one (its peers' hold timers).
#include <gtest/gtest.h>

#include <initializer_list>
#include <map>
#include <memory>
#include <set>

#include "ifec/common/byte_order.h"
#include "ifec/common/checks.h"
#include "ifec/common/ipv4.h"
#include "ifec/routing/bgp_speaker.h"
#include "ifec/routing/fare.h"

using namespace ifec;
using namespace ifec::routing;

namespace {

struct End {
  int node;
  int conn;
  bool operator<(const End& o) const { return node != o.node ? node < o.node : conn < o.conn; }
};

// Every node's speaker and the TCP connections between them.
struct Fabric {
  const Topology& topo;
  std::vector<std::unique_ptr<BgpSpeaker>> sp;
  std::vector<char> carrier;  // by link
  std::vector<char> alive;    // a killed node's process is gone: its connections close, it accepts nothing
  std::vector<char> hung;     // a hung node keeps its connections but neither reads nor writes
  std::map<End, End> pairs;   // an established TCP connection, both directions
  std::vector<std::pair<End, int>> connecting;  // (connector, its port) waiting to be accepted
  common::TimeNs now = 0;
  std::vector<std::string> log;

  explicit Fabric(const Topology& t, BgpSpeakerOptions opt = {})
      : topo(t), carrier(t.links.size(), 1), alive(t.nodes.size(), 1), hung(t.nodes.size(), 0) {
    for (size_t n = 0; n < t.nodes.size(); ++n) {
      sp.push_back(std::make_unique<BgpSpeaker>(t, static_cast<int>(n), opt));
    }
    for (const Link& l : t.links) {
      sp[l.a]->set_port_up(l.a_port, true, now);
      sp[l.b]->set_port_up(l.b_port, true, now);
    }
    for (auto& s : sp) s->start(now);
  }
  bool active(int n) const { return alive[n] && !hung[n]; }
  void unpair(End e, bool tell_peer) {
    auto it = pairs.find(e);
    if (it == pairs.end()) return;
    const End peer = it->second;
    pairs.erase(peer);
    pairs.erase(it);
    if (tell_peer && active(peer.node)) sp[peer.node]->closed(peer.conn, now);
  }
  // The peer end of `node`'s `port`: (node, port).
  std::pair<int, int> across(int node, int port) const {
    for (int l : topo.links_of(node)) {
      const Link& k = topo.links[l];
      if (k.a == node && k.a_port == port) return {k.b, k.b_port};
      if (k.b == node && k.b_port == port) return {k.a, k.a_port};
    }
    return {-1, -1};
  }
  int link_of(int node, int port) const {
    for (int l : topo.links_of(node)) {
      const Link& k = topo.links[l];
      if ((k.a == node && k.a_port == port) || (k.b == node && k.b_port == port)) return l;
    }
    return -1;
  }
  // One pass: every speaker processes, its requests run, bytes move. True when anything happened.
  bool step() {
    bool any = false;
    for (size_t n = 0; n < sp.size(); ++n) {
      if (!active(static_cast<int>(n))) continue;
      any = sp[n]->process(now) || any;
      for (const BgpLogLine& l : sp[n]->take_log()) log.push_back(topo.nodes[n].name + ": " + l.text);
      for (BgpTransportRequest& r : sp[n]->take_requests()) {
        any = true;
        const End me{static_cast<int>(n), r.conn};
        if (r.kind == BgpTransportRequest::Kind::kClose) {
          auto it = pairs.find(me);
          if (it != pairs.end() && !r.last_bytes.empty() && active(it->second.node)) {
            sp[it->second.node]->received(it->second.conn, r.last_bytes.data(), r.last_bytes.size(), now);
          }
          unpair(me, true);
          continue;
        }
        EXPECT_EQ(r.peer_addr, bgp_link_address(topo, link_of(me.node, r.port), across(me.node, r.port).first));
        unpair(me, true);
        connecting.push_back({me, r.port});
      }
    }
    // Connections complete on the connecting side first, then reach the other: both ends' attempts cross.
    std::vector<std::pair<End, int>> now_connecting = std::exchange(connecting, {});
    for (auto& [me, port] : now_connecting) {
      const auto [peer, peer_port] = across(me.node, port);
      if (!carrier[link_of(me.node, port)] || !alive[peer]) {
        sp[me.node]->connect_failed(me.conn, now);
        continue;
      }
      sp[me.node]->connected(me.conn, now);
    }
    for (auto& [me, port] : now_connecting) {
      const auto [peer, peer_port] = across(me.node, port);
      if (!carrier[link_of(me.node, port)] || !alive[peer]) continue;
      const int c = hung[peer] ? -1 : sp[peer]->accepted(peer_port, now);
      if (c < 0) {
        sp[me.node]->closed(me.conn, now);
        continue;
      }
      pairs[me] = End{peer, c};
      pairs[End{peer, c}] = me;
      any = true;
    }
    for (size_t n = 0; n < sp.size(); ++n) {
      if (!active(static_cast<int>(n))) continue;
      for (int c : sp[n]->connections()) {
        auto it = pairs.find(End{static_cast<int>(n), c});
        if (it == pairs.end()) continue;
        const std::vector<uint8_t> bytes = sp[n]->take_output(c);
        if (bytes.empty()) continue;
        any = true;
        if (active(it->second.node)) sp[it->second.node]->received(it->second.conn, bytes.data(), bytes.size(), now);
      }
    }
    return any;
  }
  // Steps until quiet, moving time to the next timer when nothing else is left, up to `until` more ns.
  void run(common::TimeNs span = 2 * kSecondNs) {
    const common::TimeNs until = now + span;
    while (now <= until) {
      if (step()) continue;
      common::TimeNs t = common::kForever;
      for (size_t n = 0; n < sp.size(); ++n) {
        if (active(static_cast<int>(n))) t = std::min(t, sp[n]->next_timer());
      }
      if (t > until) break;
      now = std::max(now, t);
      for (size_t n = 0; n < sp.size(); ++n) {
        if (active(static_cast<int>(n))) sp[n]->tick(now);
      }
    }
    now = until;
  }
  void set_link(int l, bool up) {
    carrier[l] = up ? 1 : 0;
    const Link& k = topo.links[l];
    for (auto [n, p] : {std::pair{k.a, k.a_port}, std::pair{k.b, k.b_port}}) {
      if (alive[n]) sp[n]->set_port_up(p, up, now);
    }
  }
  void kill(int n) {
    alive[n] = 0;
    std::vector<End> mine;
    for (auto& [a, b] : pairs) {
      if (a.node == n) mine.push_back(a);
    }
    for (End e : mine) unpair(e, true);  // the kernel closes a dead process's sockets
  }
};

void expect_same(const Fabric& f, const FareRib& rib, const std::string& what) {
  for (size_t n = 0; n < f.topo.nodes.size(); ++n) {
    if (!f.alive[n] || f.hung[n]) continue;
    for (int d = 0; d < f.topo.num_gpus(); ++d) {
      EXPECT_EQ(f.sp[n]->advertised_gbps(d), rib.advertised_gbps(static_cast<int>(n), d))
          << what << ": node " << f.topo.nodes[n].name << " toward GPU " << d;
      const auto& a = f.sp[n]->next_hops(d);
      const auto& b = rib.next_hops(static_cast<int>(n), d);
      ASSERT_EQ(a.size(), b.size()) << what << ": node " << f.topo.nodes[n].name << " toward GPU " << d;
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].link, b[i].link);
        EXPECT_DOUBLE_EQ(a[i].weight, b[i].weight) << what << ": " << f.topo.nodes[n].name << " -> " << d;
      }
    }
  }
}

int switch_of_plane(const Topology& topo, int plane) {
  for (size_t n = 0; n < topo.nodes.size(); ++n) {
    if (topo.nodes[n].kind == NodeKind::kSwitch && topo.nodes[n].plane == plane) return static_cast<int>(n);
  }
  return -1;
}

// The connection at `sw`'s end of node `peer`'s session (-1 when there is none).
int session_end(const Fabric& f, int peer, int sw) {
  for (const auto& [a, b] : f.pairs) {
    if (a.node == peer && b.node == sw) return b.conn;
  }
  return -1;
}

}  // namespace

TEST(BgpSpeaker, NumberingAndAddresses) {
  const Topology topo = make_superpod(2, 1);
  EXPECT_EQ(bgp_as_of(3), 4200000003u);
  EXPECT_EQ(bgp_node_of_as(topo, 4200000002u), 2);
  EXPECT_EQ(bgp_node_of_as(topo, 65001), -1);
  const Link& l = topo.links[1];
  EXPECT_EQ(common::ipv4_to_string(bgp_link_address(topo, 1, l.a)), "10.64.0.10");
  EXPECT_EQ(common::ipv4_to_string(bgp_link_address(topo, 1, l.b)), "10.64.0.11");
  EXPECT_THROW(bgp_link_address(topo, 99, 0), common::Error);
}

TEST(BgpSpeaker, SessionsComeUpThroughCollisionsAndMatchTheReferenceOneAndTwoTier) {
  for (const Topology& topo : {make_superpod(8, 2), make_fat_tree(16, 2, 2, 2)}) {
    Fabric f(topo);
    f.run();
    for (size_t n = 0; n < topo.nodes.size(); ++n) {
      for (int p = 0; p < f.sp[n]->ports(); ++p) {
        EXPECT_TRUE(f.sp[n]->established(p)) << topo.nodes[n].name << " port " << p;
      }
    }
    bool collided = false;
    for (const std::string& line : f.log) collided = collided || line.find("collision") != std::string::npos;
    EXPECT_TRUE(collided) << "both ends connect at once: RFC 4271 §6.8 decides";
    FareRib rib(topo);
    rib.converge();
    expect_same(f, rib, topo.name + " all up");
    // A Y-cable sub-link of GPU 1 on plane 1 fails: its session ends; the shares follow the reference.
    for (const Link& l : topo.links) {
      if (topo.nodes[l.a].gpu_index == 1 && l.plane == 1 && l.subport == 0) {
        f.set_link(l.id, false);
        rib.set_link_up(l.id, false);
      }
    }
    f.run();
    rib.converge();
    expect_same(f, rib, topo.name + " sub-link down");
    if (topo.links.front().subports == 2) {
      EXPECT_NEAR(f.sp[topo.gpu_node(0)]->plane_gbps(1)[1] * 2, f.sp[topo.gpu_node(0)]->plane_gbps(1)[0], 1e-9)
          << "a half-failed Y-cable halves that plane's share";
    }
  }
}

TEST(BgpSpeaker, AFailedLeafSpineLinkInATwoTierFatTree) {
  const Topology topo = make_fat_tree(16, 2, 2, 2);
  Fabric f(topo);
  f.run();
  FareRib rib(topo);
  for (const Link& l : topo.links) {
    if (topo.nodes[l.a].kind == NodeKind::kSwitch && topo.nodes[l.b].kind == NodeKind::kSwitch) {
      f.set_link(l.id, false);
      rib.set_link_up(l.id, false);
      break;
    }
  }
  f.run();
  rib.converge();
  expect_same(f, rib, "leaf-spine link down");
}

TEST(BgpSpeaker, AKilledSwitchIsWithdrawnAtOnceAndAHungOneAfterTheHoldTime) {
  const Topology topo = make_superpod(4, 2);
  for (bool hang : {false, true}) {
    Fabric f(topo);
    f.run();
    const int sw1 = switch_of_plane(topo, 1);
    ASSERT_GE(sw1, 0);
    EXPECT_GT(f.sp[topo.gpu_node(0)]->plane_gbps(2)[1], 0);
    if (hang) {
      f.hung[sw1] = 1;
      f.run(kSecondNs);  // under the 3 s hold time: still there
      EXPECT_GT(f.sp[topo.gpu_node(0)]->plane_gbps(2)[1], 0) << "withdrawn before the hold time";
      f.run(3 * kSecondNs);
    } else {
      f.kill(sw1);
      f.run(kSecondNs / 10);
    }
    FareRib rib(topo);
    for (const Link& l : topo.links) {
      if (l.a == sw1 || l.b == sw1) rib.set_link_up(l.id, false);
    }
    rib.converge();
    for (int g = 0; g < 4; ++g) {
      for (int d = 0; d < 4; ++d) {
        if (g == d) continue;
        EXPECT_EQ(f.sp[topo.gpu_node(g)]->plane_gbps(d)[1], 0) << (hang ? "hung" : "killed") << " GPU " << g;
        EXPECT_EQ(f.sp[topo.gpu_node(g)]->advertised_gbps(d), rib.advertised_gbps(topo.gpu_node(g), d));
      }
    }
    if (hang) {
      bool expired = false;
      for (const std::string& line : f.log) expired = expired || line.find("Hold Timer Expired") != std::string::npos;
      EXPECT_TRUE(expired);
    }
  }
}

TEST(BgpSpeaker, TheRibShowsPathsBandwidthsAndTheSelectedNextHops) {
  const Topology topo = make_superpod(4, 2);
  Fabric f(topo);
  f.run();
  const int g0 = topo.gpu_node(0);
  const std::vector<BgpRibRow> rows = f.sp[g0]->rib();
  // GPU 0 learns GPU 2's loopback from both planes' switches, on both Y-cable sub-links of each.
  int toward2 = 0;
  for (const BgpRibRow& r : rows) {
    if (r.dest_gpu != 2) continue;
    ++toward2;
    ASSERT_EQ(r.as_path.size(), 2u);
    EXPECT_EQ(bgp_node_of_as(topo, r.as_path[1]), topo.gpu_node(2));
    EXPECT_EQ(topo.nodes[bgp_node_of_as(topo, r.as_path[0])].kind, NodeKind::kSwitch);
    EXPECT_TRUE(r.selected);
    EXPECT_GT(r.weight, 0);
    EXPECT_DOUBLE_EQ(r.gbps, f.sp[bgp_node_of_as(topo, r.as_path[0])]->advertised_gbps(2));
  }
  EXPECT_EQ(toward2, 4);
}

TEST(BgpSpeaker, AGpuReadvertisesItsBundleBandwidthWhenASubLinkComesUpWithNothingElseChanging) {
  // GPU 1 is away (its links down), so GPU 0 has no route whose decision a second sub-link could change: its own
  // route on the first session must still go from one sub-link's bandwidth to the bundle's.
  const Topology topo = make_superpod(2, 1);
  Fabric f(topo);
  const int g0 = topo.gpu_node(0);
  int second = -1;
  for (const Link& l : topo.links) {
    if (l.a == topo.gpu_node(1) || l.b == topo.gpu_node(1)) f.set_link(l.id, false);
    if ((l.a == g0 || l.b == g0) && l.subport == 1) second = l.id;
  }
  ASSERT_GE(second, 0);
  f.set_link(second, false);
  f.run();
  f.set_link(second, true);
  f.run();
  const int sw = topo.links[second].a == g0 ? topo.links[second].b : topo.links[second].a;
  int rows = 0;
  for (const BgpRibRow& r : f.sp[sw]->rib()) {
    if (r.dest_gpu != 0) continue;
    ++rows;
    EXPECT_DOUBLE_EQ(r.gbps, 800) << "port " << r.port << ": GPU 0's route still carries one sub-link's bandwidth";
  }
  EXPECT_EQ(rows, 2);
}

// Two GPUs on one switch (plane 0), every session up: a test plays GPU 0 at the switch's end of its session.
struct TwoGpusOnASwitch {
  const Topology topo = make_superpod(2, 1, 800, 1);
  Fabric f{topo};
  const int g0 = topo.gpu_node(0);
  const int g1 = topo.gpu_node(1);
  const int sw = switch_of_plane(topo, 0);
  int conn = -1;  // the switch's end of GPU 0's session
  TwoGpusOnASwitch() {
    f.run();
    conn = session_end(f, g0, sw);
  }
};

// A peer's route whose AS_PATH, with this switch's AS prepended, no longer fits one UPDATE (RFC 4271 §9.2: a
// speaker advertises what it can send): that route alone is not announced (and withdrawn where it was), and the
// switch goes on exporting every other change; it threw out of its export loop before, and its other peers never
// heard from it again.
TEST(BgpSpeaker, ARouteTooLongToReannounceIsWithdrawnAndTheRestStillFlow) {
  TwoGpusOnASwitch two;
  auto& [topo, f, g0, g1, sw, conn] = two;
  ASSERT_GE(conn, 0);
  ASSERT_EQ(f.sp[g1]->next_hops(0).size(), 1u);
  auto announce = [&](size_t extra_ases) {
    BgpUpdate u;
    u.attrs.origin = BgpOrigin::kIgp;
    BgpAsPathSegment seg{kAsSequence, {bgp_as_of(g0)}};
    std::vector<BgpAsPathSegment> path;
    for (uint32_t as = 64512; as < 64512 + extra_ases; ++as) {
      if (seg.asns.size() == 255) path.push_back(std::exchange(seg, BgpAsPathSegment{kAsSequence, {}}));
      seg.asns.push_back(as);
    }
    path.push_back(seg);
    u.attrs.as_path = path;
    u.attrs.next_hop = bgp_link_address(topo, topo.links_of(g0).at(0), g0);
    u.attrs.ext_communities = {encode_path_bandwidth(bgp_as_of(g0), 800, BgpSpeakerOptions{}.units)};
    u.nlri = {BgpPrefix{topo.nodes[g0].loopback, 32}};
    const std::vector<std::vector<uint8_t>> msgs = encode_bgp_updates(u, true);
    ASSERT_EQ(msgs.size(), 1u);
    f.sp[sw]->received(conn, msgs[0].data(), msgs[0].size(), f.now);
    f.run();
  };
  announce(1007);  // 4094 bytes: fits as sent, not with the switch's AS in front
  EXPECT_TRUE(f.sp[g1]->next_hops(0).empty()) << "GPU 1 kept a route the switch could no longer announce";
  EXPECT_TRUE(std::any_of(f.log.begin(), f.log.end(), [](const std::string& l) {
    return l.find("not announced (1 routes)") != std::string::npos;
  }));
  announce(2);  // a path that fits again: announced as any change is
  EXPECT_EQ(f.sp[g1]->next_hops(0).size(), 1u) << "the switch stopped exporting after the long route";
}

namespace {

std::vector<uint8_t> cat(std::initializer_list<std::vector<uint8_t>> parts) {
  std::vector<uint8_t> out;
  for (const std::vector<uint8_t>& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::vector<uint8_t> be32(uint32_t v) {
  return {static_cast<uint8_t>(v >> 24), static_cast<uint8_t>(v >> 16), static_cast<uint8_t>(v >> 8),
          static_cast<uint8_t>(v)};
}

// An UPDATE with no classic Withdrawn Routes: its path attributes, then its NLRI field (none by default: every
// route in the attributes).
std::vector<uint8_t> update_bytes(const std::vector<uint8_t>& attrs, const std::vector<uint8_t>& nlri = {}) {
  const size_t len = 23 + attrs.size() + nlri.size();
  return cat({std::vector<uint8_t>(16, 0xff),                                 // marker
              {static_cast<uint8_t>(len >> 8), static_cast<uint8_t>(len), 2,  // length, UPDATE
               0x00, 0x00,                                                    // withdrawn routes length 0
               static_cast<uint8_t>(attrs.size() >> 8), static_cast<uint8_t>(attrs.size())},  // attributes length
              attrs,
              nlri});
}

}  // namespace

// A peer that carries IPv4 unicast in MP_REACH_NLRI / MP_UNREACH_NLRI (RFC 4760; GoBGP does): the switch removes
// GPU 0's route withdrawn that way (so GPU 1 loses its path to GPU 0) and installs it announced that way again.
TEST(BgpSpeaker, RoutesInMultiprotocolAttributesAreLearntAndWithdrawn) {
  TwoGpusOnASwitch two;
  auto& [topo, f, g0, g1, sw, conn] = two;
  ASSERT_GE(conn, 0);
  ASSERT_EQ(f.sp[g1]->next_hops(0).size(), 1u);
  const auto routes_to_g0 = [&] {
    std::vector<BgpRibRow> rows;
    for (const BgpRibRow& r : f.sp[sw]->rib()) {
      if (r.dest_gpu == 0) rows.push_back(r);
    }
    return rows;
  };
  ASSERT_EQ(routes_to_g0().size(), 1u);
  const std::vector<uint8_t> loopback_32 = cat({{0x20}, be32(topo.nodes[g0].loopback)});  // GPU 0's loopback/32

  const std::vector<uint8_t> unreach = cat({{0x80, 0x0f, 0x08,   // MP_UNREACH_NLRI, length 8
                                             0x00, 0x01, 0x01},  // AFI 1, SAFI 1
                                            loopback_32});
  const std::vector<uint8_t> withdraw = update_bytes(unreach);
  f.sp[sw]->received(conn, withdraw.data(), withdraw.size(), f.now);
  f.run();
  EXPECT_TRUE(routes_to_g0().empty()) << "the switch kept a route withdrawn in MP_UNREACH_NLRI";
  EXPECT_TRUE(f.sp[g1]->next_hops(0).empty());

  const BgpExtCommunity bw = encode_path_bandwidth(bgp_as_of(g0), 800, BgpSpeakerOptions{}.units);
  const uint32_t next_hop = bgp_link_address(topo, topo.links_of(g0).at(0), g0);
  // ORIGIN IGP, AS_PATH [GPU 0], EXTENDED_COMMUNITIES with its bandwidth, then the route in MP_REACH_NLRI.
  const std::vector<uint8_t> origin = {0x40, 0x01, 0x01, 0x00};
  const std::vector<uint8_t> as_path = cat({{0x40, 0x02, 0x06, 0x02, 0x01}, be32(bgp_as_of(g0))});
  const std::vector<uint8_t> ext = cat({{0xc0, 0x10, 0x08}, {bw.bytes.begin(), bw.bytes.end()}});
  const std::vector<uint8_t> reach = cat({
      {0x80, 0x0e, 0x0e, 0x00, 0x01, 0x01, 0x04},  // MP_REACH_NLRI, length 14: AFI 1, SAFI 1, next hop length 4
      be32(next_hop),                              // next hop: GPU 0's address on the link
      {0x00},                                      // reserved
      loopback_32,                                 // NLRI
  });
  const std::vector<uint8_t> attrs = cat({origin, as_path, ext, reach});
  const std::vector<uint8_t> announce = update_bytes(attrs);
  f.sp[sw]->received(conn, announce.data(), announce.size(), f.now);
  f.run();
  const std::vector<BgpRibRow> rows = routes_to_g0();
  ASSERT_EQ(rows.size(), 1u) << "the switch did not install the route announced in MP_REACH_NLRI";
  EXPECT_EQ(rows[0].as_path, (std::vector<uint32_t>{bgp_as_of(g0)}));
  EXPECT_DOUBLE_EQ(rows[0].gbps, 800);
  EXPECT_EQ(f.sp[g1]->next_hops(0).size(), 1u);
}

// RFC 4760 §3 in one UPDATE: GPU 0's loopback in MP_REACH_NLRI via GPU 0's address on the link, and a classic
// route (192.0.2.0/24) via NEXT_HOP, another address. Each is stored and shown with its own next hop; NEXT_HOP's
// was once kept for both (FARE still forwards by the session's port either way).
TEST(BgpSpeaker, ClassicAndMultiprotocolRoutesInOneUpdateKeepTheirOwnNextHops) {
  TwoGpusOnASwitch two;
  auto& [topo, f, g0, g1, sw, conn] = two;
  ASSERT_GE(conn, 0);
  const uint32_t mp_next_hop = bgp_link_address(topo, topo.links_of(g0).at(0), g0);
  const uint32_t classic_next_hop = mp_next_hop + 2;  // another address of the link's /29
  const BgpExtCommunity bw = encode_path_bandwidth(bgp_as_of(g0), 800, BgpSpeakerOptions{}.units);
  const std::vector<uint8_t> attrs = cat({
      {0x80, 0x0e, 0x0e, 0x00, 0x01, 0x01, 0x04},  // MP_REACH_NLRI, length 14: AFI 1, SAFI 1, next hop length 4
      be32(mp_next_hop),                           // next hop: GPU 0's address on the link
      {0x00, 0x20},                                // reserved; a /32...
      be32(topo.nodes[g0].loopback),               // ...GPU 0's loopback
      {0x40, 0x01, 0x01, 0x00},                    // ORIGIN IGP
      {0x40, 0x02, 0x06, 0x02, 0x01},              // AS_PATH: one AS_SEQUENCE of one AS...
      be32(bgp_as_of(g0)),                         // ...GPU 0's
      {0x40, 0x03, 0x04},                          // NEXT_HOP: the classic NLRI's
      be32(classic_next_hop),                      //
      {0xc0, 0x10, 0x08},                          // EXTENDED_COMMUNITIES: the path bandwidth
      {bw.bytes.begin(), bw.bytes.end()},
  });
  const std::vector<uint8_t> msg = update_bytes(attrs, {0x18, 192, 0, 2});  // NLRI 192.0.2.0/24
  f.sp[sw]->received(conn, msg.data(), msg.size(), f.now);
  f.run();
  std::map<BgpPrefix, BgpRibRow> learnt;  // from GPU 0
  for (const BgpRibRow& r : f.sp[sw]->rib()) {
    if (r.peer == topo.nodes[g0].name) learnt[r.prefix] = r;
  }
  const BgpPrefix loopback{topo.nodes[g0].loopback, 32};
  const BgpPrefix classic = bgp_prefix(0xc0000200, 24);
  ASSERT_EQ(learnt.count(loopback), 1u);
  ASSERT_EQ(learnt.count(classic), 1u) << "the switch did not store the classic route";
  EXPECT_EQ(common::ipv4_to_string(learnt[loopback].next_hop), common::ipv4_to_string(mp_next_hop));
  EXPECT_EQ(common::ipv4_to_string(learnt[classic].next_hop), common::ipv4_to_string(classic_next_hop));
  for (const BgpPrefix& p : {loopback, classic}) {  // the attributes both share
    EXPECT_EQ(learnt[p].as_path, (std::vector<uint32_t>{bgp_as_of(g0)}));
    EXPECT_DOUBLE_EQ(learnt[p].gbps, 800);
  }
  EXPECT_EQ(learnt[loopback].dest_gpu, 0);
  EXPECT_TRUE(learnt[loopback].selected);
  EXPECT_EQ(f.sp[g1]->next_hops(0).size(), 1u);
}

// A route whose link bandwidth reads as nothing (NaN, negative or 0) carries nothing: the spine takes the longer
// path that has bandwidth, as if the short one were withdrawn (it took the short one's hop count as the shortest
// and then dropped its next hop for having no bandwidth, leaving GPU 0 unreachable).
TEST(BgpSpeaker, ARouteWithoutBandwidthCountsAsWithdrawn) {
  const Topology topo = make_fat_tree(4, 1, 2, 2);
  const int g0 = topo.gpu_node(0);
  for (const uint32_t bits : {0x7fc00000u, 0xc8435000u, 0u}) {  // NaN, -200000 B/s, 0
    Fabric f(topo);
    f.run();
    const int spine = topo.find_node("p0-spine0");
    int leaf = -1;
    for (int l : topo.links_of(g0)) leaf = topo.links[l].a == g0 ? topo.links[l].b : topo.links[l].a;
    int conn = -1;  // the spine's end of the session with GPU 0's leaf
    for (const auto& [a, b] : f.pairs) {
      if (a.node == leaf && b.node == spine) conn = b.conn;
    }
    ASSERT_GE(conn, 0);
    ASSERT_EQ(f.sp[spine]->fare().hops(0), 2);
    BgpUpdate u;
    u.attrs.origin = BgpOrigin::kIgp;
    u.attrs.as_path = std::vector<BgpAsPathSegment>{{kAsSequence, {bgp_as_of(leaf), bgp_as_of(g0)}}};
    int link = -1;
    for (int l : topo.links_of(spine)) {
      if (topo.links[l].a == leaf || topo.links[l].b == leaf) link = l;
    }
    u.attrs.next_hop = bgp_link_address(topo, link, leaf);
    BgpExtCommunity bw = encode_path_bandwidth(bgp_as_of(leaf), 400, BgpSpeakerOptions{}.units);
    common::store_be32(bw.bytes.data() + 4, bits);
    u.attrs.ext_communities = {bw};
    u.nlri = {BgpPrefix{topo.nodes[g0].loopback, 32}};
    const std::vector<std::vector<uint8_t>> msgs = encode_bgp_updates(u, true);
    f.sp[spine]->received(conn, msgs[0].data(), msgs[0].size(), f.now);
    f.run();
    EXPECT_GT(f.sp[spine]->fare().hops(0), 2) << std::hex << bits;
    EXPECT_FALSE(f.sp[spine]->next_hops(0).empty()) << "GPU 0 unreachable from the spine, bandwidth bits " << bits;
    EXPECT_GT(f.sp[spine]->advertised_gbps(0), 0);
  }
}
