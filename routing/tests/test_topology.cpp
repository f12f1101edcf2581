// Tests for the Topology queries, the generators and validate().
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <utility>

#include "ifec/common/checks.h"
#include "ifec/routing/topology.h"

namespace ifec::routing {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const common::Error& e) {
    return e.what();
  }
  return "<no error>";
}

void expect_unique_ports(const Topology& t) {
  std::set<std::pair<int, int>> used;
  for (const Link& l : t.links) {
    EXPECT_TRUE(used.emplace(l.a, l.a_port).second) << t.nodes[l.a].name << " port " << l.a_port;
    EXPECT_TRUE(used.emplace(l.b, l.b_port).second) << t.nodes[l.b].name << " port " << l.b_port;
    EXPECT_LT(l.a_port, t.nodes[l.a].num_ports);
    EXPECT_LT(l.b_port, t.nodes[l.b].num_ports);
  }
}

TEST(MakeSuperpod, ReferenceSizeHas512HalfCableLinks) {
  const Topology t = make_superpod(64, 4);
  EXPECT_EQ(t.name, "superpod-64x4");
  EXPECT_EQ(t.num_planes, 4);
  EXPECT_EQ(t.nodes.size(), 68u);
  EXPECT_EQ(t.num_gpus(), 64);
  ASSERT_EQ(t.links.size(), 512u);
  for (const Link& l : t.links) {
    EXPECT_EQ(l.rate_gbps, 400);
    EXPECT_EQ(l.subports, 2);
    EXPECT_EQ(l.delay_ns, 500u);
    EXPECT_EQ(l.cable, l.id / 2);
    EXPECT_EQ(l.subport, l.id % 2);
  }
  for (int g = 0; g < 64; ++g) EXPECT_EQ(t.gpu_access_gbps(g), 3200) << "GPU " << g;
  for (int g = 0; g < 64; ++g) EXPECT_EQ(t.nodes[g].num_ports, 8);
  for (int p = 0; p < 4; ++p) {
    const Node& sw = t.nodes[64 + p];
    EXPECT_EQ(sw.kind, NodeKind::kSwitch);
    EXPECT_EQ(sw.plane, p);
    EXPECT_EQ(sw.num_ports, 128);
    EXPECT_EQ(t.links_of(64 + p).size(), 128u);
  }
  expect_unique_ports(t);
}

TEST(MakeSuperpod, GpuPortsRunPlaneByPlaneAndSwitchPortsGpuByGpu) {
  const Topology t = make_superpod(8, 2);
  // GPU 5, plane 1 is cable 5 * 2 + 1 = 11, i.e. links 22 and 23.
  const Link& l = t.links[22];
  EXPECT_EQ(l.a, t.gpu_node(5));
  EXPECT_EQ(t.nodes[l.b].name, "p1-sw");
  EXPECT_EQ(l.a_port, 2);   // plane 1, subport 0 -> 1 * 2 + 0
  EXPECT_EQ(l.b_port, 10);  // GPU 5, subport 0 -> 5 * 2 + 0
  EXPECT_EQ(t.links[23].a_port, 3);
  EXPECT_EQ(t.links[23].b_port, 11);
  EXPECT_EQ(t.links[23].cable, 11);
  EXPECT_EQ(t.peer(22, l.b), std::make_pair(l.a, 2));
  EXPECT_EQ(t.peer(22, l.a), std::make_pair(l.b, 10));
}

TEST(MakeFatTree, ReferenceSizeCounts) {
  const Topology t = make_fat_tree(64, 4, 8, 4);
  EXPECT_EQ(t.name, "fat-tree-64x4");
  EXPECT_EQ(t.nodes.size(), 64u + 4 * (8 + 4));
  ASSERT_EQ(t.links.size(), 64u * 4 + 4 * 8 * 4);
  for (const Link& l : t.links) EXPECT_EQ(l.rate_gbps, 400);
  EXPECT_EQ(t.gpu_access_gbps(0), 1600);
  const int leaf = t.find_node("p2-leaf3");
  const int spine = t.find_node("p2-spine1");
  ASSERT_GE(leaf, 0);
  ASSERT_GE(spine, 0);
  EXPECT_EQ(t.nodes[leaf].num_ports, 8 + 4);  // 8 GPUs, then 4 uplinks
  EXPECT_EQ(t.nodes[spine].num_ports, 8);
  // GPU 29 sits on leaf 29 / 8 = 3 of every plane, on leaf port 29 % 8 = 5.
  int found = 0;
  for (int l : t.links_of(t.gpu_node(29))) {
    const auto [peer, port] = t.peer(l, t.gpu_node(29));
    EXPECT_EQ(t.nodes[peer].name, "p" + std::to_string(t.links[l].plane) + "-leaf3");
    EXPECT_EQ(port, 5);
    ++found;
  }
  EXPECT_EQ(found, 4);
  expect_unique_ports(t);
}

TEST(MakeFatTree, RejectsLeavesThatDoNotDivideGpus) {
  EXPECT_NE(error_of([] { make_fat_tree(10, 1, 4, 2); }).find("got 4"), std::string::npos);
}

// DeepSeek-V3's fabric: GPU i of a server on plane i, a full NVLink-class mesh in the server, two tiers per plane;
// a GPU's traffic on another plane goes through its server's GPU there.
TEST(MakeDeepseekFabric, ServersPlanesAndInNodeLinks) {
  const Topology t = make_deepseek_fabric(8, 4, 2, 2);  // 32 GPUs, 4 planes of 2 leaves (4 NICs each) + 2 spines
  EXPECT_EQ(t.num_gpus(), 32);
  EXPECT_EQ(t.num_planes, 4);
  EXPECT_EQ(t.name, "deepseek-32x4");
  const std::vector<std::vector<int>> relays = relay_table(t);
  int nvlink = 0;
  for (const Link& l : t.links) {
    if (l.plane == kNvlinkPlane) {
      ++nvlink;
      EXPECT_EQ(t.nodes[l.a].gpu_index / 4, t.nodes[l.b].gpu_index / 4) << "link " << l.id << " leaves its server";
      EXPECT_DOUBLE_EQ(l.rate_gbps, 1280);
    }
  }
  EXPECT_EQ(nvlink, 8 * 6);                                          // 4 choose 2 per server
  EXPECT_EQ(static_cast<int>(t.links.size()), 32 + 48 + 4 * 2 * 2);  // NICs, NVLink, leaf-spine
  for (int g = 0; g < 32; ++g) {
    EXPECT_EQ(t.nodes[g].plane, g % 4);
    EXPECT_DOUBLE_EQ(t.gpu_access_gbps(g), 400);
    for (int p = 0; p < 4; ++p) EXPECT_EQ(relays[g][p], g / 4 * 4 + p) << "GPU " << g << " plane " << p;
  }
  EXPECT_EQ(t.nodes[t.find_node("p3-leaf1")].num_ports, 4 + 2);   // servers 4..7's GPU 3, then the spines
  EXPECT_THROW(make_deepseek_fabric(6, 4, 4, 2), common::Error);  // leaves must divide the servers
  const Topology full = make_deepseek_fabric(2048, 8, 64, 32);
  EXPECT_EQ(full.num_gpus(), 16384);
  EXPECT_EQ(full.nodes[full.find_node("p7-spine31")].num_ports, 64);
  EXPECT_EQ(full.nodes[full.find_node("p0-leaf63")].num_ports, 64);
}

TEST(Loopbacks, FollowTheAddressingScheme) {
  const Topology t = make_superpod(300, 2, 800, 1);
  EXPECT_EQ(t.nodes[0].loopback, 0x0A000001u);                     // 10.0.0.1
  EXPECT_EQ(t.nodes[249].loopback, 0x0A0000FAu);                   // 10.0.0.250
  EXPECT_EQ(t.nodes[250].loopback, 0x0A000101u);                   // 10.0.1.1
  EXPECT_EQ(t.nodes[299].loopback, 0x0A000132u);                   // 10.0.1.50
  EXPECT_EQ(t.nodes[t.find_node("p1-sw")].loopback, 0x0AFF0101u);  // 10.255.1.1
  const Topology f = make_fat_tree(8, 2, 2, 2);
  EXPECT_EQ(f.nodes[f.find_node("p1-leaf1")].loopback, 0x0AFF0102u);   // 10.255.1.2
  EXPECT_EQ(f.nodes[f.find_node("p1-spine0")].loopback, 0x0AFF0103u);  // leaves first, then spines
}

TEST(TopologyQueries, UnknownNamesAndIndices) {
  const Topology t = make_superpod(4, 1);
  EXPECT_EQ(t.find_node("gpu3"), 3);
  EXPECT_EQ(t.find_node("gpu4"), -1);
  EXPECT_NE(error_of([&] { t.gpu_node(4); }).find("index 4"), std::string::npos);
  EXPECT_NE(error_of([&] { t.peer(0, 3); }).find("does not touch node 3"), std::string::npos);
}

TEST(Validate, NamesDuplicatePort) {
  Topology t = make_superpod(4, 1);
  t.links[2].b_port = t.links[0].b_port;
  const std::string msg = error_of([&] { validate(t); });
  EXPECT_NE(msg.find("duplicate port: node 'p0-sw' port 0"), std::string::npos) << msg;
  EXPECT_EQ(msg.rfind("generator:make_superpod(4, 1, 800, 2, 500): ", 0), 0u) << msg;
}

TEST(Validate, NamesUnreachableGpuAndPlane) {
  Topology t = make_fat_tree(4, 2, 2, 1);
  // Cut plane 1's only spine off leaf 1: GPUs 2 and 3 (leaf 1) lose GPUs 0 and 1 on plane 1.
  Topology cut = t;
  cut.links.clear();
  for (const Link& l : t.links) {
    if (l.plane == 1 && t.nodes[l.a].name == "p1-leaf1" && t.nodes[l.b].name == "p1-spine0") continue;
    cut.links.push_back(l);
  }
  // Renumber what validate() checks structurally so only the reachability problem remains.
  for (size_t i = 0; i < cut.links.size(); ++i) {
    cut.links[i].id = static_cast<int>(i);
    cut.links[i].cable = static_cast<int>(i);
  }
  cut.nodes[cut.find_node("p1-leaf1")].num_ports = 2;
  cut.nodes[cut.find_node("p1-spine0")].num_ports = 1;
  const std::string msg = error_of([&] { validate(cut); });
  EXPECT_NE(msg.find("GPU 'gpu0' cannot reach GPU 'gpu2' on plane 1"), std::string::npos) << msg;
}

TEST(Validate, RejectsParamsOutOfRange) {
  Topology t = make_superpod(2, 1);
  t.params.pfc.xon_bytes = t.params.pfc.xoff_bytes + 1;
  EXPECT_NE(error_of([&] { validate(t); }).find("xon_bytes 262145 > xoff_bytes 262144"), std::string::npos);
  t = make_superpod(2, 1);
  t.params.ecn.pmax = 1.5;
  EXPECT_NE(error_of([&] { validate(t); }).find("pmax 1.5"), std::string::npos);
  t = make_superpod(2, 1);
  t.links[1].rate_gbps = 0;
  EXPECT_NE(error_of([&] { validate(t); }).find("rate_gbps 0 outside [0.001, 1000000]"), std::string::npos);
}

}  // namespace
}  // namespace ifec::routing
