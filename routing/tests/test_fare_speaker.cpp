// Live FARE speakers against the reference: one speaker per node of a topology, exchanging encoded frames with
// their neighbours until quiet, must reach exactly FareRib's converged groups and path bandwidths; with a failed
// sub-link, and with a silent (dead) node. Plus the frame format by hand and malformed frames.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>

#include "ifec/common/byte_order.h"
#include "ifec/routing/fare.h"
#include "ifec/routing/fare_speaker.h"

using namespace ifec;
using namespace ifec::routing;

namespace {

// Every node's speaker; deliver() floods adverts over live links (through encode/decode) until nobody changes.
struct Mesh {
  const Topology& topo;
  std::vector<std::unique_ptr<FareSpeaker>> sp;
  std::vector<char> up;
  std::vector<char> dead;  // a node whose daemon is gone: it sends nothing
  common::TimeNs now = 0;

  explicit Mesh(const Topology& t) : topo(t), up(t.links.size(), 1), dead(t.nodes.size(), 0) {
    for (size_t n = 0; n < t.nodes.size(); ++n) {
      sp.push_back(std::make_unique<FareSpeaker>(t, static_cast<int>(n)));
    }
    apply_links();
  }
  void apply_links() {
    for (const Link& l : topo.links) {
      sp[l.a]->set_port_up(l.a_port, up[l.id]);
      sp[l.b]->set_port_up(l.b_port, up[l.id]);
    }
  }
  // Rounds of 1 ms until nothing changed for 5 in a row (longer than the 3 ms hold time).
  int run(int limit = 200) {
    int rounds = 0;
    int quiet = 0;
    for (auto& s : sp) {
      s->recompute();
    }
    while (quiet < 5 && rounds++ < limit) {
      bool changed = false;
      now += 1'000'000;
      for (const Link& l : topo.links) {
        if (!up[l.id]) continue;
        for (auto [from, fport, to, tport] :
             {std::tuple{l.a, l.a_port, l.b, l.b_port}, std::tuple{l.b, l.b_port, l.a, l.a_port}}) {
          if (dead[from]) continue;
          const uint8_t mac[6] = {2, 0, 0, 0, uint8_t(from), uint8_t(fport)};
          for (const FareMessage& m : sp[from]->advert(fport)) {
            const auto frame = encode_fare(m, mac);
            FareMessage got;
            EXPECT_EQ(decode_fare(frame.data(), frame.size(), &got), "");
            EXPECT_EQ(sp[to]->receive(tport, got, now), "");
          }
        }
      }
      for (size_t n = 0; n < sp.size(); ++n) {
        sp[n]->expire(now, 3'000'000);
        changed = sp[n]->recompute() || changed;
      }
      quiet = changed ? 0 : quiet + 1;
    }
    return rounds;
  }
};

void expect_same(const Mesh& m, const FareRib& rib, const std::string& what) {
  for (size_t n = 0; n < m.topo.nodes.size(); ++n) {
    if (m.dead[n]) continue;
    for (int d = 0; d < m.topo.num_gpus(); ++d) {
      EXPECT_EQ(m.sp[n]->advertised_gbps(d), rib.advertised_gbps(static_cast<int>(n), d))
          << what << ": node " << m.topo.nodes[n].name << " toward GPU " << d;
      const auto& a = m.sp[n]->next_hops(d);
      const auto& b = rib.next_hops(static_cast<int>(n), d);
      ASSERT_EQ(a.size(), b.size()) << what << ": node " << m.topo.nodes[n].name << " toward GPU " << d;
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].link, b[i].link);
        EXPECT_EQ(a[i].port, b[i].port);
        EXPECT_DOUBLE_EQ(a[i].weight, b[i].weight);
      }
    }
  }
}

}  // namespace

TEST(FareSpeaker, SpeakersConvergeToTheReferenceRibOneAndTwoTier) {
  for (const Topology& topo : {make_superpod(8, 2), make_fat_tree(16, 2, 2, 2)}) {
    Mesh m(topo);
    m.run();
    FareRib rib(topo);
    rib.converge();
    expect_same(m, rib, topo.name + " all up");
    // A Y-cable sub-link of GPU 1 on plane 1 fails: both ends see it; the shares follow the reference.
    for (const Link& l : topo.links) {
      if (topo.nodes[l.a].gpu_index == 1 && l.plane == 1 && l.subport == 0) {
        m.up[l.id] = 0;
        rib.set_link_up(l.id, false);
      }
    }
    m.apply_links();
    m.run();
    rib.converge();
    expect_same(m, rib, topo.name + " sub-link down");
    if (topo.links.front().subports == 2) {
      EXPECT_NEAR(m.sp[topo.gpu_node(0)]->plane_gbps(1)[1] * 2, m.sp[topo.gpu_node(0)]->plane_gbps(1)[0], 1e-9)
          << "a half-failed Y-cable halves that plane's share";
    }
  }
}

TEST(FareSpeaker, ASilentNodeIsForgottenAfterTheHoldTime) {
  // The plane-1 switch's daemon dies: its links stay up (the namespace remains) but it says nothing. After the hold
  // time every GPU's plane-1 share toward every other GPU is gone, as if its links were down.
  const Topology topo = make_superpod(4, 2);
  Mesh m(topo);
  m.run();
  int sw1 = -1;
  for (size_t n = 0; n < topo.nodes.size(); ++n) {
    if (topo.nodes[n].kind == NodeKind::kSwitch && topo.nodes[n].plane == 1) sw1 = static_cast<int>(n);
  }
  ASSERT_GE(sw1, 0);
  EXPECT_GT(m.sp[topo.gpu_node(0)]->plane_gbps(2)[1], 0);
  m.dead[sw1] = 1;
  m.run();
  FareRib rib(topo);
  for (const Link& l : topo.links) {
    if (l.a == sw1 || l.b == sw1) rib.set_link_up(l.id, false);
  }
  rib.converge();
  for (int g = 0; g < 4; ++g) {
    for (int d = 0; d < 4; ++d) {
      if (g == d) continue;
      EXPECT_EQ(m.sp[topo.gpu_node(g)]->plane_gbps(d)[1], 0) << "GPU " << g << " -> " << d;
      EXPECT_EQ(m.sp[topo.gpu_node(g)]->advertised_gbps(d), rib.advertised_gbps(topo.gpu_node(g), d));
    }
  }
}

TEST(FareSpeaker, FrameFormatByHandAndMalformedFramesAreRejected) {
  FareMessage m;
  m.node = 0x0102;
  m.port = 3;
  m.seq = 0x0A0B0C0D;
  m.words = 1;
  m.first_dest = 5;
  m.gbps = {400.0};
  m.hops = {2};
  m.paths = {0x8000000000000001ULL};
  const uint8_t mac[6] = {2, 1, 2, 3, 4, 5};
  const auto f = encode_fare(m, mac);
  ASSERT_EQ(f.size(), 14u + 20 + 18);
  EXPECT_EQ(f[12], 0x88);
  EXPECT_EQ(f[13], 0xB5);
  EXPECT_EQ(std::string(f.begin() + 14, f.begin() + 18), "FARE");
  EXPECT_EQ(f[18], 1);                                          // version
  EXPECT_EQ(common::load_be16(&f[20]), 0x0102);                 // node
  EXPECT_EQ(common::load_be32(&f[24]), 0x0A0B0C0Du);            // sequence
  EXPECT_EQ(common::load_be16(&f[32]), 1);                      // count
  EXPECT_EQ(common::load_be64(&f[34]), 0x4079000000000000ULL);  // 400.0 as IEEE 754
  EXPECT_EQ(common::load_be16(&f[42]), 2);
  FareMessage back;
  ASSERT_EQ(decode_fare(f.data(), f.size(), &back), "");
  EXPECT_EQ(back.paths, m.paths);
  EXPECT_EQ(back.first_dest, 5);
  EXPECT_NE(decode_fare(f.data(), 20, &back), "");
  auto truncated = f;
  truncated.resize(f.size() - 1);
  EXPECT_NE(decode_fare(truncated.data(), truncated.size(), &back).find("too short"), std::string::npos);
  auto v2 = f;
  v2[18] = 2;
  EXPECT_NE(decode_fare(v2.data(), v2.size(), &back).find("version 2"), std::string::npos);
  // The wrong neighbour on a port is refused, naming both.
  const Topology topo = make_superpod(2, 1);
  FareSpeaker gpu0(topo, topo.gpu_node(0));
  FareMessage stranger = gpu0.advert(0).front();
  const std::string why = gpu0.receive(0, stranger, 0);
  EXPECT_NE(why.find("miswired"), std::string::npos) << why;
}
