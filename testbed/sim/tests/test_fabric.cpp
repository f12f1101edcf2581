// Fabric builder: FIBs from FARE, and hop-by-hop reinstallation after link events at the control-plane delay.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "ifec/common/sim.h"
#include "ifec/testbed/fabric.h"
#include "ifec/testbed/raw_traffic.h"

using namespace ifec;

namespace {

int switch_of_plane(const testbed::Fabric& f, int plane) {
  for (int s = 0; s < f.num_switches(); ++s) {
    if (f.topology().nodes[f.switch_node(s)].plane == plane) {
      return s;
    }
  }
  return -1;
}

}  // namespace

TEST(Fabric, InstallsOneNextHopPerSubLinkWithItsRate) {
  common::EventLoop loop;
  const routing::Topology topo = routing::make_superpod(8, 2, 800, 2);
  testbed::Fabric fabric(loop, topo, {});
  ASSERT_EQ(fabric.num_switches(), 2);
  for (int s = 0; s < 2; ++s) {
    for (int g = 0; g < 8; ++g) {
      const auto* group = fabric.switch_at(s).route(fabric.gpu_ip(g));
      ASSERT_NE(group, nullptr);
      ASSERT_EQ(group->size(), 2u) << "two 400G sub-links of the Y-cable";
      EXPECT_DOUBLE_EQ((*group)[0].weight, 400);
      EXPECT_DOUBLE_EQ((*group)[1].weight, 400);
    }
  }
  EXPECT_EQ(fabric.gpu_ports(3).size(), 4u) << "2 planes x 2 sub-ports";
}

TEST(Fabric, SubLinkFailureReachesSwitchAfterOneRoundAndSourcesAfterTwo) {
  common::EventLoop loop;
  routing::Topology topo = routing::make_superpod(8, 2, 800, 2);
  topo.params.control_plane_delay_ns = 10'000;
  testbed::Fabric fabric(loop, topo, {});
  int victim = -1;
  for (const auto& l : topo.links) {
    if (topo.nodes[l.a].gpu_index == 5 && l.plane == 1 && l.subport == 0) {
      victim = l.id;
    }
  }
  ASSERT_GE(victim, 0);
  const int sw = switch_of_plane(fabric, 1);
  fabric.schedule_link_state(victim, false, 1'000);
  loop.run(1'000 + 10'000 - 1);
  EXPECT_EQ(fabric.switch_at(sw).route(fabric.gpu_ip(5))->size(), 2u) << "before the first round";
  EXPECT_DOUBLE_EQ(fabric.rib().plane_gbps(0, 5)[1], 800);
  loop.run(1'000 + 10'000);
  EXPECT_EQ(fabric.switch_at(sw).route(fabric.gpu_ip(5))->size(), 1u) << "adjacent switch after one round";
  EXPECT_DOUBLE_EQ(fabric.rib().plane_gbps(0, 5)[1], 800) << "GPU 0 has not heard yet";
  loop.run(1'000 + 20'000);
  EXPECT_DOUBLE_EQ(fabric.rib().plane_gbps(0, 5)[1], 400) << "GPU 0 after the second round";
  EXPECT_DOUBLE_EQ(fabric.rib().plane_gbps(0, 5)[0], 800);
  loop.run();
  EXPECT_GT(fabric.last_converged_ns(), 1'000u + 20'000u);
}

// Twice the GPUs on the same switches: routes are per destination class (one per leaf) and per attached GPU, and
// flows are the traffic, so the state doubles at most; anything kept per GPU pair (per switch per GPU, per source
// per destination) would quadruple it.
TEST(Fabric, RoutingAndTrafficStateGrowLinearlyWithGpus) {
  auto state = [](int gpus) {
    common::EventLoop loop;
    testbed::Fabric f(loop, routing::make_fat_tree(gpus, 8, 16, 8), {});
    testbed::RawTraffic t(f, testbed::make_flows(testbed::Pattern::kPermutation, gpus, 1 << 20, 1), false);
    return std::make_pair(f.routing_bytes(), t.memory_bytes());
  };
  const auto [routes256, flows256] = state(256);
  const auto [routes512, flows512] = state(512);
  EXPECT_LT(routes512, routes256 * 5 / 2) << routes256 << " -> " << routes512 << " bytes of routes";
  EXPECT_LT(flows512, flows256 * 5 / 2) << flows256 << " -> " << flows512 << " bytes of flows";
  EXPECT_LT(routes512 / 512, size_t{64} << 10) << "bytes of routes per GPU";
}

// Each plane's links lie together in memory: with a thread per plane, a GPU's links to two planes side by side (the
// topology's order) shared cache lines between the threads. No plane's address range holds another plane's link.
TEST(Fabric, EachPlanesLinksLieTogetherInMemory) {
  common::EventLoop loop;
  const routing::Topology topo = routing::make_superpod(16, 4, 400, 1);
  testbed::Fabric f(loop, topo, {});
  std::map<int, std::pair<uintptr_t, uintptr_t>> range;  // plane: lowest and highest link address
  for (const routing::Link& l : topo.links) {
    const auto at = reinterpret_cast<uintptr_t>(&f.link(l.id));
    auto [it, fresh] = range.try_emplace(l.plane, at, at);
    it->second = {std::min(it->second.first, at), std::max(it->second.second, at)};
  }
  ASSERT_EQ(range.size(), 4u);
  int among_others = 0;
  std::string first;
  for (const routing::Link& l : topo.links) {
    const auto at = reinterpret_cast<uintptr_t>(&f.link(l.id));
    for (const auto& [plane, r] : range) {
      if (plane != l.plane && at >= r.first && at <= r.second && among_others++ == 0) {
        first = "link " + std::to_string(l.id) + " of plane " + std::to_string(l.plane) + " lies among plane " +
                std::to_string(plane) + "'s";
      }
    }
  }
  EXPECT_EQ(among_others, 0) << first;
}

// Loopbacks a switch reaches over the same ports share one member list (route() returns it): a leaf reaches every
// other leaf over all its up links, a spine every other spine over all its down links. A list per destination switch
// kept (leaves + spines)^2 lists of up to 64 members per plane: 126 MB of a 2,048-GPU fat tree's routing state. (They
// also share one group, so one rotation: not visible here; `./ifec bench scale` prints the routing bytes per GPU.)
TEST(Fabric, LoopbacksReachedOverTheSamePortsShareOneMemberList) {
  common::EventLoop loop;
  const routing::Topology topo = routing::make_fat_tree(64, 2, 8, 4);
  testbed::Fabric f(loop, topo, {});
  for (int s = 0; s < f.num_switches(); ++s) {
    std::set<int> neighbours;  // switches one link away: routed over the links to each
    for (const routing::Link& l : topo.links) {
      for (int side = 0; side < 2; ++side) {
        const int me = side == 0 ? l.a : l.b;
        const int peer = side == 0 ? l.b : l.a;
        if (me == f.switch_node(s) && topo.nodes[peer].kind == routing::NodeKind::kSwitch) {
          neighbours.insert(peer);
        }
      }
    }
    std::map<std::vector<int>, const void*> group_of_ports;
    std::set<const void*> groups;
    int far = 0;
    for (int t = 0; t < f.num_switches(); ++t) {
      const bool same_plane = topo.nodes[f.switch_node(t)].plane == topo.nodes[f.switch_node(s)].plane;
      const auto* hops = f.switch_at(s).route(f.switch_ip(t));
      if (t == s || !same_plane) {
        continue;
      }
      ASSERT_NE(hops, nullptr) << "switch " << s << " to switch " << t << "'s loopback";
      std::vector<int> ports;
      for (const switchemu::NextHopPort& h : *hops) {
        ports.push_back(h.port);
      }
      const auto [it, fresh] = group_of_ports.emplace(ports, hops);
      EXPECT_EQ(it->second, hops) << "switch " << s << ": loopbacks over the same ports in different groups";
      groups.insert(hops);
      far += neighbours.count(f.switch_node(t)) == 0;
    }
    EXPECT_GT(far, 0) << "switch " << s << " has loopbacks two hops away";
    EXPECT_EQ(groups.size(), neighbours.size() + 1) << "switch " << s << ": a list per neighbour and one for the rest";
  }
}
