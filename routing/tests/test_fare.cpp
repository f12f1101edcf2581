// Tests for FareRib: path bandwidth and WECMP weights on the SuperPoD and the multi-plane fat tree, against
// hand-computed values, and the hop-by-hop round structure of step().
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "ifec/common/checks.h"
#include "ifec/routing/fare.h"
#include "ifec/routing/topology.h"

namespace ifec::routing {
namespace {

using Gbps = std::vector<double>;

double weight_on(const std::vector<NextHop>& group, int link) {
  double w = 0;
  for (const NextHop& h : group) w += h.link == link ? h.weight : 0;
  return w;
}

// make_superpod lays cables out GPU-major: GPU g, plane p is cable g * planes + p, links 2c and 2c + 1.
int superpod_link(int gpu, int plane, int planes, int subport) { return 2 * (gpu * planes + plane) + subport; }

TEST(FareSuperpod, FromScratchTakesTwoRounds) {
  const Topology t = make_superpod(8, 2);
  FareRib rib(t);
  // Round 1: each switch hears every GPU's own advertisement. Round 2: GPUs hear the switches. Round 3: quiet.
  EXPECT_EQ(rib.converge(), 2);
  EXPECT_FALSE(rib.step());
}

TEST(FareSuperpod, AllUpPlanesAreEqual) {
  for (const int planes : {2, 4}) {
    const int gpus = planes == 2 ? 8 : 64;
    const Topology t = make_superpod(gpus, planes);
    FareRib rib(t);
    rib.converge();
    for (int src : {0, 3, gpus - 1}) {
      for (int dst : {0, 5, gpus - 2}) {
        if (src == dst) {
          EXPECT_EQ(rib.plane_gbps(src, dst), Gbps(planes, 0.0));
          EXPECT_TRUE(rib.next_hops(t.gpu_node(src), dst).empty());
          continue;
        }
        EXPECT_EQ(rib.plane_gbps(src, dst), Gbps(planes, 800.0)) << src << " -> " << dst;
        EXPECT_EQ(rib.advertised_gbps(t.gpu_node(src), dst), 800.0 * planes);
      }
    }
    EXPECT_TRUE(std::isinf(rib.advertised_gbps(t.gpu_node(5), 5)));
  }
}

TEST(FareSuperpod, SwitchGroupHasOneNextHopPerUpSubLink) {
  const Topology t = make_superpod(8, 2);
  FareRib rib(t);
  rib.converge();
  const int sw1 = t.find_node("p1-sw");
  const std::vector<NextHop>& g = rib.next_hops(sw1, 5);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].link, superpod_link(5, 1, 2, 0));
  EXPECT_EQ(g[0].port, 10);  // switch port 5 * 2 + 0
  EXPECT_EQ(g[0].weight, 400);
  EXPECT_EQ(g[1].link, superpod_link(5, 1, 2, 1));
  EXPECT_EQ(g[1].port, 11);
  EXPECT_EQ(g[1].weight, 400);
  EXPECT_EQ(rib.advertised_gbps(sw1, 5), 800);
  // The GPU side: toward GPU 2, GPU 0 spreads over its four sub-links, 400 each, on ports 0..3.
  const std::vector<NextHop>& h = rib.next_hops(t.gpu_node(0), 2);
  ASSERT_EQ(h.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(h[i].link, i);
    EXPECT_EQ(h[i].port, i);
    EXPECT_EQ(h[i].weight, 400);
  }
}

void check_sub_link_failure(int gpus, int planes) {
  SCOPED_TRACE(std::to_string(gpus) + "x" + std::to_string(planes));
  const Topology t = make_superpod(gpus, planes);
  FareRib rib(t);
  rib.converge();
  const int sw1 = t.find_node("p1-sw");
  Gbps one_down(planes, 800.0);
  one_down[1] = 400;

  rib.set_link_up(superpod_link(5, 1, planes, 0), false);
  EXPECT_FALSE(rib.link_up(superpod_link(5, 1, planes, 0)));
  // Round 1: the two ends of the cable (switch 1 and GPU 5) recompute; GPU 0 still holds the old advertisement.
  EXPECT_TRUE(rib.step());
  EXPECT_EQ(rib.advertised_gbps(sw1, 5), 400);
  EXPECT_EQ(rib.plane_gbps(5, 0), one_down);
  EXPECT_EQ(rib.plane_gbps(0, 5), Gbps(planes, 800.0));
  // Round 2: the other GPUs hear switch 1's new advertisement.
  EXPECT_TRUE(rib.step());
  EXPECT_EQ(rib.plane_gbps(0, 5), one_down);
  EXPECT_EQ(rib.plane_gbps(gpus - 1, 5), one_down);
  EXPECT_FALSE(rib.step());
  EXPECT_EQ(rib.plane_gbps(5, 3), one_down);
  EXPECT_EQ(rib.plane_gbps(0, 3), Gbps(planes, 800.0));  // untouched pairs keep everything
  const std::vector<NextHop>& g = rib.next_hops(sw1, 5);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].link, superpod_link(5, 1, planes, 1));
  EXPECT_EQ(g[0].weight, 400);

  // The whole cable down: plane 1 has no way to GPU 5 at all.
  rib.set_link_up(superpod_link(5, 1, planes, 1), false);
  EXPECT_EQ(rib.converge(), 2);  // same two rounds: the cable's ends, then everyone adjacent to switch 1
  Gbps plane_gone(planes, 800.0);
  plane_gone[1] = 0;
  EXPECT_EQ(rib.plane_gbps(0, 5), plane_gone);
  EXPECT_EQ(rib.plane_gbps(5, 0), plane_gone);
  EXPECT_TRUE(rib.next_hops(sw1, 5).empty());
  EXPECT_EQ(rib.advertised_gbps(sw1, 5), 0);
  EXPECT_EQ(rib.advertised_gbps(t.gpu_node(0), 5), 800.0 * (planes - 1));

  // Recovery.
  rib.set_link_up(superpod_link(5, 1, planes, 0), true);
  rib.set_link_up(superpod_link(5, 1, planes, 1), true);
  EXPECT_EQ(rib.converge(), 2);
  EXPECT_EQ(rib.plane_gbps(0, 5), Gbps(planes, 800.0));
  EXPECT_EQ(rib.plane_gbps(5, 0), Gbps(planes, 800.0));
  EXPECT_EQ(rib.next_hops(sw1, 5).size(), 2u);
}

TEST(FareSuperpod, SubLinkAndCableFailureOn8x2) { check_sub_link_failure(8, 2); }
TEST(FareSuperpod, SubLinkAndCableFailureOn64x4) { check_sub_link_failure(64, 4); }

TEST(FareSuperpod, ChangeAtAccessLinkConvergesInTwoRounds) {
  // In a 1-tier SuperPoD every GPU is two hops from every other through its plane's switch. A change on GPU g's
  // access link is seen in round 1 by its two ends (the switch and g itself), and in round 2 by every GPU that
  // hears that switch; nobody is three hops from the change, so round 3 changes nothing: converge() == 2.
  const Topology t = make_superpod(64, 4);
  FareRib rib(t);
  rib.converge();
  for (int gpu : {0, 17, 63}) {
    rib.set_link_up(superpod_link(gpu, 3, 4, 1), false);
    EXPECT_EQ(rib.converge(), 2) << "GPU " << gpu;
    rib.set_link_up(superpod_link(gpu, 3, 4, 1), true);
    EXPECT_EQ(rib.converge(), 2) << "GPU " << gpu;
  }
}

TEST(FareRib, RejectsBadIndices) {
  const Topology t = make_superpod(4, 1);
  FareRib rib(t);
  EXPECT_THROW(rib.set_link_up(8, false), common::Error);
  EXPECT_THROW(rib.advertised_gbps(0, 4), common::Error);
  EXPECT_THROW(rib.next_hops(5, 0), common::Error);
  EXPECT_THROW(rib.plane_gbps(-1, 0), common::Error);
}

// make_fat_tree(16, 2, 4, 4, 400, 100): GPUs 0..15, 4 per leaf; per plane 4 leaves x 4 spines. Node ids: plane 0
// leaves 16..19 and spines 20..23. Link ids: access link of GPU g on plane p is g * 2 + p (0..31); plane-0 link
// leaf i - spine s is 32 + i * 4 + s. 100G fabric links make the leaf uplinks (4 x 100) the bottleneck.
struct SmallFatTree : ::testing::Test {
  const Topology t = make_fat_tree(16, 2, 4, 4, 400, 100);
  static constexpr int kLeaf0 = 16;
  static constexpr int kLeaf1 = 17;
  static constexpr int kSpine1 = 21;
  static int uplink(int leaf, int spine) { return 32 + leaf * 4 + spine; }
};

TEST_F(SmallFatTree, FromScratchTakesFourRounds) {
  FareRib rib(t);
  // GPU -> leaf (1), -> spines (2), -> remote leaves (3), -> remote GPUs (4); round 5 is quiet.
  EXPECT_EQ(rib.converge(), 4);
}

TEST_F(SmallFatTree, AllUpLeafSplitsEquallyOverSpines) {
  ASSERT_EQ(t.nodes[kLeaf0].name, "p0-leaf0");
  ASSERT_EQ(t.nodes[kSpine1].name, "p0-spine1");
  FareRib rib(t);
  rib.converge();
  const std::vector<NextHop>& g = rib.next_hops(kLeaf0, 4);  // GPU 4 sits on leaf 1
  ASSERT_EQ(g.size(), 4u);
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(g[s].link, uplink(0, s));
    EXPECT_EQ(g[s].port, 4 + s);  // after the 4 GPU ports
    EXPECT_EQ(g[s].weight, 100);
  }
  EXPECT_EQ(rib.advertised_gbps(kLeaf0, 4), 400);
  EXPECT_EQ(rib.advertised_gbps(kSpine1, 4), 100);
  EXPECT_EQ(rib.plane_gbps(0, 4), Gbps({400, 400}));
  // Same leaf: straight down the one access link.
  ASSERT_EQ(rib.next_hops(kLeaf0, 1).size(), 1u);
  EXPECT_EQ(rib.next_hops(kLeaf0, 1)[0].link, 2);
  EXPECT_EQ(rib.next_hops(kLeaf0, 1)[0].weight, 400);
}

TEST_F(SmallFatTree, LeafSpineFailurePropagatesHopByHop) {
  FareRib rib(t);
  rib.converge();
  rib.set_link_up(uplink(0, 1), false);

  // Round 1: only the link's ends change. Leaf 0 keeps 3 of 4 spines toward remote GPUs: 3 x 100 = 300. Spine 1
  // loses GPUs 0..3: leaf 0 is cut off and every other leaf's paths toward them pass through spine 1 itself.
  EXPECT_TRUE(rib.step());
  EXPECT_EQ(rib.advertised_gbps(kLeaf0, 4), 300);
  EXPECT_EQ(weight_on(rib.next_hops(kLeaf0, 4), uplink(0, 1)), 0);
  EXPECT_EQ(rib.next_hops(kLeaf0, 4).size(), 3u);
  EXPECT_EQ(rib.advertised_gbps(kSpine1, 0), 0);
  EXPECT_TRUE(rib.next_hops(kSpine1, 0).empty());
  EXPECT_EQ(rib.advertised_gbps(kLeaf1, 0), 400);     // not yet
  EXPECT_EQ(rib.plane_gbps(0, 4), Gbps({400, 400}));  // not yet
  EXPECT_EQ(rib.plane_gbps(4, 0), Gbps({400, 400}));

  // Round 2: neighbors of the ends. GPU 0 gets min(400 NIC, 300 leaf) = 300 on plane 0; leaf 1 drops spine 1
  // toward GPUs 0..3 (3 x min(100, 400) = 300).
  EXPECT_TRUE(rib.step());
  EXPECT_EQ(rib.plane_gbps(0, 4), Gbps({300, 400}));
  EXPECT_EQ(rib.advertised_gbps(kLeaf1, 0), 300);
  EXPECT_EQ(weight_on(rib.next_hops(kLeaf1, 0), uplink(1, 1)), 0);
  EXPECT_EQ(rib.plane_gbps(4, 0), Gbps({400, 400}));  // not yet

  // Round 3: GPUs on the other leaves (min(400, 300) = 300). Spine 1 also re-learns GPUs 0..3 through the other
  // leaves (4 hops, a valley path: 3 leaves x min(100, 300) = 300) now that their paths no longer contain it;
  // nobody uses it, since every leaf still has 3-hop paths.
  EXPECT_TRUE(rib.step());
  EXPECT_EQ(rib.plane_gbps(4, 0), Gbps({300, 400}));
  EXPECT_EQ(rib.plane_gbps(15, 3), Gbps({300, 400}));
  EXPECT_EQ(rib.advertised_gbps(kSpine1, 0), 300);
  EXPECT_EQ(rib.next_hops(kSpine1, 0).size(), 3u);
  EXPECT_FALSE(rib.step());
  EXPECT_EQ(rib.plane_gbps(0, 1), Gbps({400, 400}));  // same leaf: unaffected

  // Recovery mirrors it: leaf 0 and spine 1, then GPUs under leaf 0 and the other leaves, then their GPUs.
  rib.set_link_up(uplink(0, 1), true);
  EXPECT_EQ(rib.converge(), 3);
  EXPECT_EQ(rib.plane_gbps(0, 4), Gbps({400, 400}));
  EXPECT_EQ(rib.plane_gbps(4, 0), Gbps({400, 400}));
  EXPECT_EQ(rib.advertised_gbps(kSpine1, 0), 100);
}

TEST_F(SmallFatTree, NicDownWithdrawsThePlaneInFourRounds) {
  FareRib rib(t);
  rib.converge();
  rib.set_link_up(0 * 2 + 1, false);  // GPU 0's plane-1 NIC
  // Round 1 leaf 0 withdraws GPU 0 (its spines' paths all contain leaf 0); round 2 the spines withdraw (every
  // other leaf's paths contain them); round 3 the other leaves; round 4 their GPUs. No count-to-infinity.
  EXPECT_EQ(rib.converge(), 4);
  EXPECT_EQ(rib.plane_gbps(4, 0), Gbps({400, 0}));
  EXPECT_EQ(rib.plane_gbps(1, 0), Gbps({400, 0}));
  EXPECT_EQ(rib.plane_gbps(0, 9), Gbps({400, 0}));
  for (int n = 0; n < static_cast<int>(t.nodes.size()); ++n) {
    if (t.nodes[n].plane == 1) {
      EXPECT_EQ(rib.advertised_gbps(n, 0), 0) << t.nodes[n].name;
    }
  }
}

TEST(FareFatTree, ReferenceFabricKeepsNicRateAfterOneUplinkLoss) {
  // 64 GPUs x 4 planes, 8 leaves x 4 spines, all 400G: a leaf has 4 x 400 = 1600 up, so losing one uplink leaves
  // 1200, still above the 400G NIC: the GPUs' plane bandwidth stays 400 while the leaf's advertisement drops.
  const Topology t = make_fat_tree(64, 4, 8, 4);
  FareRib rib(t);
  EXPECT_EQ(rib.converge(), 4);
  const int leaf0 = t.find_node("p2-leaf0");
  const int spine3 = t.find_node("p2-spine3");
  EXPECT_EQ(rib.advertised_gbps(leaf0, 40), 1600);
  EXPECT_EQ(rib.plane_gbps(0, 40), Gbps(4, 400.0));
  int failed = -1;
  for (int l : t.links_of(leaf0)) {
    if (t.peer(l, leaf0).first == spine3) failed = l;
  }
  ASSERT_GE(failed, 0);
  rib.set_link_up(failed, false);
  EXPECT_EQ(rib.converge(), 3);
  EXPECT_EQ(rib.advertised_gbps(leaf0, 40), 1200);
  EXPECT_EQ(weight_on(rib.next_hops(leaf0, 40), failed), 0);
  EXPECT_EQ(rib.plane_gbps(0, 40), Gbps(4, 400.0));
  EXPECT_EQ(rib.advertised_gbps(t.find_node("p2-leaf5"), 3), 1200);
}

TEST(FarePerformance, ReferenceFabricsConvergeFromScratchQuickly) {
  const Topology pod = make_superpod(64, 4);
  const Topology tree = make_fat_tree(64, 4, 8, 4);
  for (const Topology* t : {&pod, &tree}) {
    const auto start = std::chrono::steady_clock::now();
    FareRib rib(*t);
    rib.converge();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(ms, 250) << t->name;  // the budget is "well under a second"; Release builds take a few ms
    RecordProperty(t->name + "_converge_ms", std::to_string(ms));
  }
}

// ------------------------------------------------------------------------- against the per-GPU reference --

// The RIB as it was before destination classes: every node's row toward every GPU, path sets over every node. The
// class RIB must give the same advertisement, hop-by-hop changes and WECMP group at every node toward every GPU,
// round by round.
class PerGpuRib {
 public:
  explicit PerGpuRib(const Topology& t) : t_(t), words_(static_cast<size_t>(fare_path_words(t))) {
    const int nodes = static_cast<int>(t.nodes.size());
    const int gpus = t.num_gpus();
    up_.assign(t.links.size(), 1);
    for (int x = 0; x < nodes; ++x) bundles_.push_back(fare_bundles(t, x));
    adv_.assign(nodes, std::vector<double>(gpus, 0));
    hops_.assign(nodes, std::vector<int>(gpus, -1));
    groups_.assign(nodes, std::vector<std::vector<NextHop>>(gpus));
    paths_.assign(static_cast<size_t>(nodes) * gpus * words_, 0);
    for (int g = 0; g < gpus; ++g) {
      const int n = t.gpu_node(g);
      adv_[n][g] = INFINITY;
      hops_[n][g] = 0;
      paths_[(static_cast<size_t>(n) * gpus + g) * words_ + n / 64] |= uint64_t{1} << (n % 64);
    }
  }
  void set_link_up(int link, bool up) { up_[link] = up; }
  bool step() {
    const int nodes = static_cast<int>(t_.nodes.size());
    const int gpus = t_.num_gpus();
    auto adv = adv_;
    auto hops = hops_;
    auto paths = paths_;
    bool changed = false;
    std::vector<NextHop> group;
    for (int x = 0; x < nodes; ++x) {
      std::vector<double> bw;
      for (const FareBundle& b : bundles_[x]) {
        double sum = 0;
        for (int l : b.links) sum += up_[l] ? t_.links[l].rate_gbps : 0;
        bw.push_back(sum);
      }
      for (int d = 0; d < gpus; ++d) {
        const auto [gbps, h] = fare_decide(
            t_, x, t_.gpu_node(d), bundles_[x], bw, up_,
            [&](size_t i) {
              const int n = bundles_[x][i].peer;
              return FareAdvert{adv_[n][d], hops_[n][d], &paths_[(static_cast<size_t>(n) * gpus + d) * words_]};
            },
            fare_path_bits(t_, x), &paths[(static_cast<size_t>(x) * gpus + d) * words_], &group);
        adv[x][d] = gbps;
        hops[x][d] = h;
        changed = changed || group.size() != groups_[x][d].size() ||
                  !std::equal(group.begin(), group.end(), groups_[x][d].begin(), [](auto& a, auto& b) {
                    return a.link == b.link && a.port == b.port && a.weight == b.weight;
                  });
        groups_[x][d] = group;
      }
    }
    changed = changed || adv != adv_ || hops != hops_ || paths != paths_;
    adv_ = std::move(adv);
    hops_ = std::move(hops);
    paths_ = std::move(paths);
    return changed;
  }
  double adv(int node, int d) const { return adv_[node][d]; }
  const std::vector<NextHop>& group(int node, int d) const { return groups_[node][d]; }

 private:
  const Topology& t_;
  size_t words_;
  std::vector<char> up_;
  std::vector<std::vector<FareBundle>> bundles_;
  std::vector<std::vector<double>> adv_;
  std::vector<std::vector<int>> hops_;
  std::vector<std::vector<std::vector<NextHop>>> groups_;
  std::vector<uint64_t> paths_;
};

// Steps both until neither changes, comparing every row after every round.
void expect_same_rounds(const Topology& t, FareRib& rib, PerGpuRib& ref, const std::string& when) {
  for (int round = 1; round < 64; ++round) {
    const bool changed = rib.step();
    ASSERT_EQ(changed, ref.step()) << when << ", round " << round;
    for (int n = 0; n < static_cast<int>(t.nodes.size()); ++n) {
      for (int d = 0; d < t.num_gpus(); ++d) {
        const std::vector<NextHop> got = rib.next_hops(n, d);
        const std::vector<NextHop>& want = ref.group(n, d);
        ASSERT_EQ(rib.advertised_gbps(n, d), ref.adv(n, d))
            << when << ", round " << round << ", " << t.nodes[n].name << " -> GPU " << d;
        ASSERT_EQ(got.size(), want.size()) << when << ", round " << round << ", " << t.nodes[n].name << " -> GPU " << d;
        for (size_t k = 0; k < got.size(); ++k) {
          ASSERT_TRUE(got[k].link == want[k].link && got[k].port == want[k].port && got[k].weight == want[k].weight)
              << when << ", round " << round << ", " << t.nodes[n].name << " -> GPU " << d << " hop " << k;
        }
      }
    }
    if (!changed) return;
  }
  FAIL() << when << ": no convergence";
}

// A scenario of link events, each followed by rounds until quiet, on both RIBs.
void expect_same_as_per_gpu(const Topology& t, const std::vector<std::pair<int, bool>>& events) {
  FareRib rib(t);
  PerGpuRib ref(t);
  expect_same_rounds(t, rib, ref, t.name + " from scratch");
  for (size_t i = 0; i < events.size(); ++i) {
    rib.set_link_up(events[i].first, events[i].second);
    ref.set_link_up(events[i].first, events[i].second);
    expect_same_rounds(t, rib, ref, t.name + " after event " + std::to_string(i));
  }
}

TEST(FareClasses, SuperpodRoundsEqualThePerGpuRibThroughSubLinkAndPlaneFailures) {
  const Topology t = make_superpod(8, 3);
  EXPECT_EQ(FareRib(t).num_classes(), 1) << "every GPU hangs from every plane's switch alike";
  // GPU 5's plane-1 sub-link, then the rest of its plane-1 cable, GPU 0 (the class's representative) loses a
  // sub-link too, restorations in another order.
  expect_same_as_per_gpu(t, {{superpod_link(5, 1, 3, 0), false},
                             {superpod_link(5, 1, 3, 1), false},
                             {superpod_link(0, 2, 3, 1), false},
                             {superpod_link(5, 1, 3, 0), true},
                             {superpod_link(0, 2, 3, 1), true},
                             {superpod_link(5, 1, 3, 1), true}});
}

TEST(FareClasses, FatTreeRoundsEqualThePerGpuRibThroughUplinkAndNicFailures) {
  const Topology t = make_fat_tree(16, 2, 4, 2);
  EXPECT_EQ(FareRib(t).num_classes(), 4) << "one class per leaf";
  int uplink = -1;
  for (const Link& l : t.links) {
    if (t.nodes[l.a].kind == NodeKind::kSwitch && t.nodes[l.b].kind == NodeKind::kSwitch) uplink = l.id;
  }
  const int nic = t.links_of(t.gpu_node(4))[1];  // GPU 4's plane-1 NIC: the first of its leaf's class
  expect_same_as_per_gpu(t, {{uplink, false},
                             {nic, false},
                             {t.links_of(t.gpu_node(6))[0], false},
                             {uplink, true},
                             {nic, true},
                             {t.links_of(t.gpu_node(6))[0], true}});
}

TEST(FareClasses, StateGrowsWithClassesNotWithGpusSquared) {
  // Twice the GPUs on the same leaves: the same classes, the same rows; the per-GPU RIB held four times as much.
  const Topology t256 = make_fat_tree(256, 8, 16, 8);
  const Topology t512 = make_fat_tree(512, 8, 16, 8);
  const size_t small = FareRib(t256).memory_bytes();
  const size_t large = FareRib(t512).memory_bytes();
  EXPECT_LT(large, small * 5 / 4) << small << " -> " << large << " bytes";
  const Topology t2048 = make_fat_tree(2048, 8, 64, 32);
  FareRib rib(t2048);
  rib.converge();
  EXPECT_LT(rib.memory_bytes(), 64u << 20) << "2,048 GPUs x 8 planes: " << rib.memory_bytes() << " bytes";
}

// GPUs on one plane each: FARE routes each plane's GPUs only (NVLink-class links are not in its bundles), a class
// per leaf and plane; a GPU of another plane is unreachable on this one (the fabric relays through a node peer).
TEST(FareClasses, DeepseekFabricRoutesEachPlanesGpusByLeaf) {
  const Topology t = make_deepseek_fabric(8, 4, 2, 2);
  FareRib rib(t);
  rib.converge();
  EXPECT_EQ(rib.num_classes(), 4 * 2);
  EXPECT_EQ(rib.class_members(rib.class_of(0)), (std::vector<int>{0, 4, 8, 12}));  // plane 0, leaf 0: servers 0-3
  std::vector<double> on_plane0(4, 0.0);
  on_plane0[0] = 400;
  EXPECT_EQ(rib.plane_gbps(0, 28), on_plane0);                   // server 7's GPU 0, over the spines
  EXPECT_EQ(rib.plane_gbps(0, 1), std::vector<double>(4, 0.0));  // another plane: not FARE's to route
  for (const NextHop& h : rib.next_hops(t.gpu_node(0), 28)) EXPECT_NE(t.links[h.link].plane, kNvlinkPlane);
}

}  // namespace
}  // namespace ifec::routing
