// Tests for the YAML loader and writer: error messages with file:line and the bad value, defaults, round trips,
// and the shipped testbed/topologies files.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "ifec/common/checks.h"
#include "ifec/routing/topology.h"

namespace ifec::routing {
namespace {

// Field-by-field equality; `source` is left out because it records where each copy came from.
void expect_same(const Topology& x, const Topology& y) {
  EXPECT_EQ(x.name, y.name);
  EXPECT_EQ(x.num_planes, y.num_planes);
  const FabricParams& p = x.params;
  const FabricParams& q = y.params;
  EXPECT_EQ(p.mtu, q.mtu);
  EXPECT_EQ(p.buffer_bytes, q.buffer_bytes);
  EXPECT_EQ(p.wire_overhead_bytes, q.wire_overhead_bytes);
  EXPECT_EQ(p.control_plane_delay_ns, q.control_plane_delay_ns);
  EXPECT_EQ(p.priorities, q.priorities);
  EXPECT_EQ(p.ecn.kmin_bytes, q.ecn.kmin_bytes);
  EXPECT_EQ(p.ecn.kmax_bytes, q.ecn.kmax_bytes);
  EXPECT_EQ(p.ecn.pmax, q.ecn.pmax);
  EXPECT_EQ(p.pfc.enabled, q.pfc.enabled);
  EXPECT_EQ(p.pfc.xoff_bytes, q.pfc.xoff_bytes);
  EXPECT_EQ(p.pfc.xon_bytes, q.pfc.xon_bytes);
  EXPECT_EQ(p.pfc.lossless_priority, q.pfc.lossless_priority);
  EXPECT_EQ(p.ifec.max_group_members, q.ifec.max_group_members);
  ASSERT_EQ(x.nodes.size(), y.nodes.size());
  for (size_t i = 0; i < x.nodes.size(); ++i) {
    const Node& a = x.nodes[i];
    const Node& b = y.nodes[i];
    EXPECT_EQ(a.name, b.name) << "node " << i;
    EXPECT_EQ(a.kind, b.kind) << "node " << i;
    EXPECT_EQ(a.plane, b.plane) << "node " << i;
    EXPECT_EQ(a.gpu_index, b.gpu_index) << "node " << i;
    EXPECT_EQ(a.num_ports, b.num_ports) << "node " << i;
    EXPECT_EQ(a.loopback, b.loopback) << "node " << i;
  }
  ASSERT_EQ(x.links.size(), y.links.size());
  for (size_t i = 0; i < x.links.size(); ++i) {
    const Link& a = x.links[i];
    const Link& b = y.links[i];
    EXPECT_EQ(a.id, b.id) << "link " << i;
    EXPECT_EQ(a.a, b.a) << "link " << i;
    EXPECT_EQ(a.a_port, b.a_port) << "link " << i;
    EXPECT_EQ(a.b, b.b) << "link " << i;
    EXPECT_EQ(a.b_port, b.b_port) << "link " << i;
    EXPECT_EQ(a.plane, b.plane) << "link " << i;
    EXPECT_EQ(a.rate_gbps, b.rate_gbps) << "link " << i;  // exact: the writer prints round-trip decimals
    EXPECT_EQ(a.delay_ns, b.delay_ns) << "link " << i;
    EXPECT_EQ(a.cable, b.cable) << "link " << i;
    EXPECT_EQ(a.subport, b.subport) << "link " << i;
    EXPECT_EQ(a.subports, b.subports) << "link " << i;
  }
}

std::string parse_error(const std::string& yaml) {
  try {
    parse_topology(yaml, "t.yaml");
  } catch (const common::Error& e) {
    return e.what();
  }
  return "<no error>";
}

// The message must start with "t.yaml:LINE: " and contain every fragment (the bad value, the node, ...).
void expect_error(const std::string& yaml, int line, std::initializer_list<std::string> fragments) {
  const std::string msg = parse_error(yaml);
  const std::string prefix = "t.yaml:" + std::to_string(line) + ": ";
  EXPECT_EQ(msg.rfind(prefix, 0), 0u) << "expected prefix '" << prefix << "' in: " << msg;
  for (const std::string& f : fragments)
    EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
}

// Two GPUs, two planes, one switch per plane. Line numbers below count from "name:" as line 1.
const std::string kHead =
    "name: tiny\n"                                        // 1
    "planes: 2\n"                                         // 2
    "gpus: 2\n"                                           // 3
    "switches:\n"                                         // 4
    "  - {name: sw0, plane: 0}\n"                         // 5
    "  - {name: sw1, plane: 1}\n"                         // 6
    "links:\n"                                            // 7
    "  - {a: gpu0, b: sw0}\n"                             // 8
    "  - {a: gpu1, b: sw0}\n"                             // 9
    "  - {a: gpu0, b: sw1}\n";                            // 10
const std::string kLastLink = "  - {a: gpu1, b: sw1}\n";  // 11
const std::string kTiny = kHead + kLastLink;

TEST(ParseTopology, MinimalFileGetsDefaults) {
  const Topology t = parse_topology(kTiny, "t.yaml");
  EXPECT_EQ(t.source, "t.yaml");
  EXPECT_EQ(t.name, "tiny");
  EXPECT_EQ(t.num_gpus(), 2);
  ASSERT_EQ(t.links.size(), 4u);
  const FabricParams d;
  EXPECT_EQ(t.params.mtu, d.mtu);
  EXPECT_EQ(t.params.buffer_bytes, 4u * 1024 * 1024);
  EXPECT_EQ(t.params.ecn.kmin_bytes, 65536u);
  EXPECT_EQ(t.params.pfc.xoff_bytes, 262144u);
  EXPECT_EQ(t.params.pfc.lossless_priority, 3);
  EXPECT_EQ(t.params.control_plane_delay_ns, 10000u);
  for (const Link& l : t.links) {
    EXPECT_EQ(l.rate_gbps, 400);
    EXPECT_EQ(l.subports, 1);
    EXPECT_EQ(l.delay_ns, 500u);
    EXPECT_EQ(l.cable, l.id);
  }
  EXPECT_EQ(t.links[3].plane, 1);   // from sw1
  EXPECT_EQ(t.links[3].a_port, 1);  // gpu1's second link
  EXPECT_EQ(t.links[3].b_port, 1);  // sw1's second link
  EXPECT_EQ(t.nodes[t.find_node("sw1")].num_ports, 2);
}

TEST(ParseTopology, YCableExpandsIntoSubLinksOnConsecutivePorts) {
  const Topology t = parse_topology(
      "name: y\nplanes: 1\nlink_defaults: {rate_gbps: 800, subports: 2}\ngpus: [ga, gb]\n"
      "switches: [{name: s, plane: 0}]\n"
      "links:\n"
      "  - {a: ga, b: s}\n"
      "  - {a: gb, b: s, rate_gbps: 300, subports: 3, delay_ns: 800, a_port: 0, b_port: 4, plane: 0}\n"
      "  - {a: s, b: ga, subport_gbps: 25, a_port: 2}\n"
      "  - {a: gb, b: s, rate_gbps: 50, subports: 1}\n",
      "y.yaml");
  ASSERT_EQ(t.links.size(), 2u + 3u + 2u + 1u);
  EXPECT_EQ(t.nodes[0].name, "ga");
  EXPECT_EQ(t.links[0].rate_gbps, 400);
  EXPECT_EQ(t.links[1].subport, 1);
  EXPECT_EQ(t.links[1].b_port, 1);
  for (int i = 2; i < 5; ++i) {
    EXPECT_EQ(t.links[i].rate_gbps, 100);
    EXPECT_EQ(t.links[i].delay_ns, 800u);
    EXPECT_EQ(t.links[i].cable, 1);
    EXPECT_EQ(t.links[i].subport, i - 2);
    EXPECT_EQ(t.links[i].subports, 3);
    EXPECT_EQ(t.links[i].a_port, i - 2);
    EXPECT_EQ(t.links[i].b_port, 4 + i - 2);
  }
  // A cable given its first port at one end is numbered automatically at the other: ga's next is 2.
  EXPECT_EQ(t.links[5].a, t.find_node("s"));
  EXPECT_EQ(t.links[5].a_port, 2);
  EXPECT_EQ(t.links[5].b_port, 2);
  EXPECT_EQ(t.links[5].rate_gbps, 25);
  // Automatic numbering continues after the highest port taken so far: s used 0..6, gb 0..2.
  EXPECT_EQ(t.links[7].a_port, 3);
  EXPECT_EQ(t.links[7].b_port, 7);
  EXPECT_EQ(t.nodes[t.find_node("s")].num_ports, 8);
  EXPECT_EQ(t.gpu_access_gbps(1), 350);
}

// The simulator and the daemons run one port per link, 0 to the node's highest: a skipped port is refused at load,
// at the node's line, naming the port; ports given out of order load.
TEST(ParseTopology, APortSkippedIsNamed) {
  expect_error(kHead + "  - {a: gpu1, b: sw1, b_port: 2}\n", 6, {"node 'sw1' has no link on port 1 (ports 0..2"});
  expect_error(kHead + "  - {a: gpu1, b: sw1, a_port: 2}\n", 3, {"node 'gpu1' has no link on port 1"});
  const Topology t = parse_topology(kHead + "  - {a: gpu1, b: sw1, a_port: 1, b_port: 1}\n", "t.yaml");
  EXPECT_EQ(t.nodes[t.find_node("sw1")].num_ports, 2);
}

TEST(ParseTopology, UnknownNode) { expect_error(kHead + "  - {a: gpu99, b: sw1}\n", 11, {"unknown node 'gpu99'"}); }

TEST(ParseTopology, DuplicatePort) {
  expect_error(kHead + "  - {a: gpu1, b: sw1, b_port: 0}\n", 11, {"duplicate port", "node 'sw1' port 0", "line 10"});
  // Auto-numbered ends collide as well: gpu0's cable takes sw0 ports 0..1, the explicit a_port 1 repeats one.
  expect_error(
      "name: d\nplanes: 1\ngpus: 2\nswitches: [{name: sw0, plane: 0}]\nlinks:\n"
      "  - {a: gpu0, b: sw0, subports: 2}\n"
      "  - {b: gpu1, a: sw0, a_port: 1}\n",
      7, {"node 'sw0' port 1"});
}

TEST(ParseTopology, RateOutsideWhatTheLinkModelTimes) {
  expect_error(kHead + "  - {a: gpu1, b: sw1, rate_gbps: -400}\n", 11, {"rate_gbps -400 outside [0.001, 1000000]"});
  expect_error(kHead + "  - {a: gpu1, b: sw1, rate_gbps: 0}\n", 11, {"rate_gbps 0 outside"});
  expect_error(kHead + "  - {a: gpu1, b: sw1, rate_gbps: 1e300}\n", 11, {"rate_gbps 1e300 outside"});
  expect_error(kHead + "  - {a: gpu1, b: sw1, subport_gbps: 0.0000001}\n", 11, {"subport_gbps 0.0000001 outside"});
}

TEST(LoadTopology, ADirectoryIsNamed) {
  try {
    routing::load_topology(IFEC_TOPOLOGY_DIR);
    FAIL() << "a directory loaded as a topology";
  } catch (const common::Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
}

TEST(ParseTopology, BadDelay) {
  expect_error(kHead + "  - {a: gpu1, b: sw1, delay_ns: -5}\n", 11, {"delay_ns must be >= 0", "-5"});
  expect_error(kHead + "  - {a: gpu1, b: sw1, delay_ns: 1.5}\n", 11, {"delay_ns", "'1.5'"});
}

TEST(ParseTopology, SubportsBelowOne) {
  expect_error(kHead + "  - {a: gpu1, b: sw1, subports: 0}\n", 11, {"subports must be >= 1, got 0"});
}

TEST(ParseTopology, PlaneOutOfRange) {
  std::string yaml = kTiny;
  yaml.replace(yaml.find("sw1, plane: 1"), 13, "sw1, plane: 2");
  expect_error(yaml, 6, {"plane 2 out of range [0, 2)", "'sw1'"});
  expect_error(kHead + "  - {a: gpu1, b: sw1, plane: 5}\n", 11, {"plane 5 out of range"});
}

TEST(ParseTopology, SwitchPlaneMismatch) {
  expect_error(kHead + "  - {a: gpu1, b: sw1, plane: 0}\n", 11, {"link plane 0", "'sw1' is on plane 1"});
  expect_error(kTiny + "  - {a: sw0, b: sw1}\n", 12, {"switch plane mismatch", "'sw0' is on plane 0"});
}

TEST(ParseTopology, UnknownKeysAnywhere) {
  expect_error(kHead + "  - {a: gpu1, b: sw1, rate_gpbs: 400}\n", 11, {"unknown key 'rate_gpbs' in link"});
  expect_error("nmae: x\n" + kTiny, 1, {"unknown key 'nmae' in topology"});
  expect_error(kTiny + "params:\n  mtu: 4096\n  ecn: {kmin_bytes: 1, kmaxbytes: 2}\n", 14,
               {"unknown key 'kmaxbytes' in ecn"});
  expect_error(kTiny + "link_defaults: {rate: 1}\n", 12, {"unknown key 'rate' in link_defaults"});
  std::string yaml = kTiny;
  yaml.replace(yaml.find("{name: sw0, plane: 0}"), 21, "{name: sw0, plane: 0, ports: 8}");
  expect_error(yaml, 5, {"unknown key 'ports' in switch"});
}

TEST(ParseTopology, WrongTypes) {
  expect_error(kHead + "  - {a: gpu1, b: sw1, rate_gbps: fast}\n", 11, {"rate_gbps must be a number", "'fast'"});
  expect_error(kTiny + "params: {pfc: {enabled: maybe}}\n", 12, {"enabled", "'maybe'"});
  expect_error(kTiny + "params: {priorities: [1, 2]}\n", 12, {"priorities must be an integer, got a list"});
  std::string yaml = kTiny;
  yaml.replace(yaml.find("gpus: 2"), 7, "gpus: two");
  expect_error(yaml, 3, {"gpus must be a count or a list of names", "'two'"});
}

TEST(ParseTopology, ThresholdRelations) {
  expect_error(kTiny + "params:\n  pfc: {xoff_bytes: 262144,\n        xon_bytes: 300000}\n", 14,
               {"xon_bytes 300000 > xoff_bytes 262144"});
  // Only xoff given, below the default xon: the line of the key that was written.
  expect_error(kTiny + "params:\n  pfc:\n    xoff_bytes: 1000\n", 14, {"xon_bytes 131072 > xoff_bytes 1000"});
  expect_error(kTiny + "params:\n  ecn: {kmin_bytes: 600000}\n", 13, {"kmin_bytes 600000 > kmax_bytes 524288"});
  expect_error(kTiny + "params:\n  ecn: {pmax: 1.5}\n", 13, {"pmax 1.5 outside [0, 1]"});
  expect_error(kTiny + "params:\n  ecn: {pmax: -0.1}\n", 13, {"pmax -0.1"});
  expect_error(kTiny + "params:\n  mtu: 100\n", 13, {"mtu 100 outside [256, 9000]"});
  expect_error(kTiny + "params:\n  mtu: 9001\n", 13, {"mtu 9001"});
  // A buffer that holds no full-sized frame dropped every one (blamed on failed links); the name names folders.
  expect_error(kTiny + "params:\n  buffer_bytes: 1\n", 13,
               {"buffer_bytes 1 holds no full-sized frame: at least mtu 4096 + 256 bytes of headers (4352)"});
  EXPECT_EQ(parse_topology(kTiny + "params:\n  buffer_bytes: 4352\n", "t.yaml").params.buffer_bytes, 4352u);
  for (const char* name : {"\"../../x\"", "\"a/b\"", "..", "\"two\\nlines\""}) {
    const std::string yaml = "name: " + std::string(name) + kTiny.substr(kTiny.find('\n'));
    expect_error(yaml, 1, {"expected printable characters without '/'"});
  }
}

TEST(ParseTopology, IfecEngineSettings) {
  const Topology t = parse_topology(
      kTiny + "params:\n  ifec: {slot_pool: 64, slot_timeout_ns: 500000, upstream_fp32: false, reproducible: true}\n",
      "t.yaml");
  EXPECT_EQ(t.params.ifec.slot_pool, 64u);
  EXPECT_EQ(t.params.ifec.slot_timeout_ns, 500000u);
  EXPECT_FALSE(t.params.ifec.upstream_fp32);
  EXPECT_TRUE(t.params.ifec.reproducible);
  EXPECT_EQ(t.params.ifec.result_retries, IfecParams{}.result_retries);       // unset keys keep their defaults
  EXPECT_EQ(parse_topology(to_yaml(t), "again").params.ifec.slot_pool, 64u);  // and they round-trip
  expect_error(kTiny + "params:\n  ifec: {slot_pool: 0}\n", 13, {"ifec slot_pool must be > 0"});
  expect_error(kTiny + "params:\n  ifec: {multicast_entries: 0}\n", 13, {"ifec multicast_entries must be > 0"});
  expect_error(kTiny + "params:\n  ifec: {slot_bytes: 8}\n", 13, {"ifec slot_bytes 8 outside [64, 65536]"});
  expect_error(kTiny + "params:\n  ifec: {slots: 3}\n", 13, {"unknown key 'slots' in ifec"});
  // Group size: 64 by default (and then not written), up to the 256 ECH's expected-contributor byte can count.
  EXPECT_EQ(t.params.ifec.max_group_members, 64u);
  EXPECT_EQ(to_yaml(t).find("max_group_members"), std::string::npos);
  const Topology wide = parse_topology(kTiny + "params:\n  ifec: {max_group_members: 256}\n", "t.yaml");
  EXPECT_EQ(wide.params.ifec.max_group_members, 256u);
  EXPECT_EQ(parse_topology(to_yaml(wide), "again").params.ifec.max_group_members, 256u);
  expect_error(kTiny + "params:\n  ifec: {max_group_members: 257}\n", 13,
               {"ifec max_group_members 257 outside [2, 256]"});
  expect_error(kTiny + "params:\n  ifec: {max_group_members: 1}\n", 13, {"max_group_members 1"});
  expect_error(kTiny + "params:\n  ifec: {reproducible: often}\n", 13, {"reproducible", "'often'"});
}

TEST(ParseTopology, MissingRequiredKeys) {
  expect_error(kHead + "  - {a: gpu1}\n", 11, {"missing required key 'b' in link"});
  std::string yaml = kTiny;
  yaml.erase(yaml.find("planes: 2\n"), 10);
  expect_error(yaml, 1, {"missing required key 'planes' in topology"});
  expect_error(kHead + "  - {a: gpu1, b: sw1}\n  - {plane: 0, b: sw0}\n", 12, {"missing required key 'a'"});
}

TEST(ParseTopology, YamlSyntaxErrorHasItsLine) {
  expect_error(kHead + "  - {a: gpu1, b: sw1\n", 12, {"YAML syntax error"});
  expect_error("name: x\nplanes: 1\n  gpus: 2\n", 3, {"YAML syntax error"});
}

TEST(ParseTopology, GpuWithoutPathOnAPlane) {
  // gpu1 (line 4 of the block list) has no plane-1 link.
  expect_error(
      "name: p\nplanes: 2\ngpus:\n  - gpu0\n  - gpu1\nswitches: [{name: sw0, plane: 0}, {name: sw1, plane: 1}]\n"
      "links: [{a: gpu0, b: sw0}, {a: gpu1, b: sw0}, {a: gpu0, b: sw1}]\n",
      5, {"GPU 'gpu1' cannot reach GPU 'gpu0' on plane 1"});
  // Plane 1 split in two islands: gpu0 reaches sw1a, gpu1 only sw1b.
  expect_error(
      "name: p\nplanes: 2\ngpus:\n  - gpu0\n  - gpu1\nswitches:\n  - {name: sw0, plane: 0}\n"
      "  - {name: sw1a, plane: 1}\n  - {name: sw1b, plane: 1}\n"
      "links: [{a: gpu0, b: sw0}, {a: gpu1, b: sw0}, {a: gpu0, b: sw1a}, {a: gpu1, b: sw1b}]\n",
      5, {"GPU 'gpu0' cannot reach GPU 'gpu1' on plane 1"});
}

TEST(ParseTopology, OtherStructuralErrors) {
  expect_error(kTiny + "  - {a: gpu0, b: gpu1}\n", 12, {"two GPUs", "'gpu0'", "'gpu1'", "give its plane"});
  std::string yaml = kTiny;
  yaml.replace(yaml.find("name: sw1"), 9, "name: sw0");
  expect_error(yaml, 6, {"duplicate node name 'sw0'", "line 5"});
  expect_error(kTiny + "planes: 3\n", 12, {"duplicate key 'planes'"});
  expect_error("- 1\n- 2\n", 1, {"expected a mapping at the top level"});
}

TEST(LoadTopology, MissingFileNamesThePath) {
  try {
    load_topology("/nonexistent/dir/fabric.yaml");
    FAIL() << "no error";
  } catch (const common::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/fabric.yaml"), std::string::npos) << e.what();
  }
}

TEST(ToYaml, GeneratorsRoundTrip) {
  for (const Topology& t : {make_superpod(64, 4), make_superpod(3, 2, 100, 3, 700), make_fat_tree(64, 4, 8, 4),
                            make_fat_tree(12, 3, 3, 2, 100, 400 / 3.0, 123), make_deepseek_fabric(4, 4, 2, 2)}) {
    SCOPED_TRACE(t.source);
    const Topology back = parse_topology(to_yaml(t), "roundtrip.yaml");
    expect_same(t, back);
    EXPECT_EQ(to_yaml(back), to_yaml(t));
  }
}

TEST(ToYaml, IrregularFileRoundTrips) {
  const std::string yaml =
      "name: \"odd fabric: v2\"\nplanes: 2\n"
      "params: {mtu: 1024, buffer_bytes: 1000000, wire_overhead_bytes: 20, control_plane_delay_ns: 2500, "
      "priorities: 4, ecn: {kmin_bytes: 1000, kmax_bytes: 2000, pmax: 0.35}, "
      "pfc: {enabled: false, xoff_bytes: 5000, xon_bytes: 5000, lossless_priority: 1}}\n"
      "gpus: [\"true\", \"g-1\", \"3x\"]\n"
      "switches: [{name: a, plane: 0}, {name: b, plane: 1}, {name: c, plane: 1}]\n"
      "links:\n"
      "  - {a: \"true\", b: a, rate_gbps: 100, subports: 3, a_port: 4, b_port: 2}\n"
      "  - {a: g-1, b: a, delay_ns: 0, b_port: 0}\n"
      "  - {a: 3x, b: a, subport_gbps: 0.1, b_port: 1}\n"
      "  - {a: b, b: \"true\", rate_gbps: 1e3, subports: 4, b_port: 0}\n"
      "  - {a: g-1, b: c}\n"
      "  - {a: 3x, b: c}\n"
      "  - {a: b, b: c, subports: 2, rate_gbps: 1600}\n";
  const Topology t = parse_topology(yaml, "odd.yaml");
  EXPECT_EQ(t.name, "odd fabric: v2");
  EXPECT_EQ(t.nodes[0].name, "true");
  EXPECT_FALSE(t.params.pfc.enabled);
  EXPECT_EQ(t.links[0].rate_gbps, 100.0 / 3);
  const Topology back = parse_topology(to_yaml(t), "odd.yaml");
  expect_same(t, back);
}

// The shipped files must stay what the generators produce (regenerate with ifec_gen_topologies).
Topology named(Topology t, const std::string& name) {
  t.name = name;
  return t;
}

TEST(ShippedTopologies, MatchTheGenerators) {
  const std::string dir = IFEC_TOPOLOGY_DIR;
  const std::pair<std::string, Topology> cases[] = {
      {"superpod-64x4.yaml", make_superpod(64, 4, 800, 2)},
      {"fat-tree-64x4.yaml", make_fat_tree(64, 4, 8, 4, 400, 800)},
      {"superpod-8x2.yaml", make_superpod(8, 2, 800, 2)},
      {"paced-4x2.yaml", make_paced_superpod()},
      {"sun-1024x8.yaml", named(make_fat_tree(1024, 8, 64, 32, 800, 400, 500, 2), "sun-1024x8")},
      {"fat-tree-2048x8.yaml", named(make_fat_tree(2048, 8, 64, 32), "fat-tree-2048x8")},
      {"fat-tree-1024x1.yaml", named(make_fat_tree(1024, 1, 32, 32), "fat-tree-1024x1")},
      {"deepseek-v3-16k.yaml", named(make_deepseek_fabric(2048, 8, 64, 32), "deepseek-v3-16k")},
      {"superpod-256x8.yaml",
       [] {
         Topology t = named(make_superpod(256, 8, 400, 1), "superpod-256x8");
         t.params.ifec.max_group_members = 256;
         return t;
       }()},
  };
  for (const auto& [file, expected] : cases) {
    SCOPED_TRACE(file);
    const Topology t = load_topology(dir + "/" + file);
    EXPECT_EQ(t.source.rfind(dir + "/" + file, 0), 0u) << t.source;
    expect_same(t, expected);
  }
}

TEST(ParseTopology, AGeneratorNamesTheFabricAndItsArgumentsAreChecked) {
  const Topology t = parse_topology(
      "name: pod\nparams: {mtu: 1024}\ngenerator: {kind: superpod, gpus: 8, planes: 2, port_gbps: 400}\n", "t.yaml");
  expect_same(t, [] {
    Topology want = make_superpod(8, 2, 400, 2);
    want.name = "pod";
    want.params.mtu = 1024;
    return want;
  }());
  EXPECT_NE(t.source.find("make_superpod(8, 2, 400"), std::string::npos) << t.source;
  expect_error("name: x\ngenerator: {kind: torus, gpus: 8}\n", 2,
               {"generator kind 'torus'", "superpod, fat_tree or deepseek"});
  expect_error("name: x\ngenerator: {kind: superpod, planes: 2}\n", 2, {"generator gpus is required"});
  expect_error("name: x\ngenerator: {kind: superpod, gpus: 8, planes: 2, leaves: 4}\n", 2, {"'leaves'"});
  expect_error("name: x\ngenerator: {kind: fat_tree, gpus: 8.5, planes: 2, leaves: 2, spines: 1}\n", 2,
               {"gpus must be a whole number"});
  expect_error("name: x\ngenerator: {kind: fat_tree, gpus: 10, planes: 2, leaves: 4, spines: 1}\n", 2,
               {"leaves must be >= 1 and divide gpus (10), got 4"});
  expect_error("name: x\ngpus: 4\ngenerator: {kind: superpod, gpus: 8, planes: 2}\n", 2,
               {"gpus does not go with a generator"});
  expect_error("name: x\ngenerator: [superpod]\n", 2, {"generator must be a mapping"});
  // Counts each in range whose product is not: refused before a link is laid out (they filled memory first).
  expect_error("name: x\ngenerator: {kind: fat_tree, gpus: 1024, planes: 1, leaves: 1024, spines: 65536}\n", 2,
               {"make_fat_tree: these arguments lay out 6.711e+07 links; at most 4194304"});
  expect_error("name: x\ngenerator: {kind: superpod, gpus: 64000, planes: 256}\n", 2,
               {"make_superpod: these arguments lay out 3.277e+07 links"});
}

// The generators called directly (from Python, say) check what a topology file's generator does, up front.
TEST(Generators, RefuseWhatATopologyFileWouldBeforeBuildingAnything) {
  auto error = [](const std::function<void()>& make) -> std::string {
    try {
      make();
    } catch (const common::Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error([] { make_superpod(100'000'000, 2); }), "make_superpod: gpus must be 1..64000, got 100000000");
  EXPECT_EQ(error([] { make_fat_tree(8, 2, 2, 10'000'000); }), "make_fat_tree: spines must be 1..65536, got 10000000");
  EXPECT_EQ(error([] { make_fat_tree(8, 2, 2, 1, 400, 400, uint64_t{1} << 62); }),
            "make_fat_tree: delay_ns must be at most 1000000000 ns, got 4611686018427387904");
  EXPECT_EQ(error([] { make_fat_tree(8, 2, 2, 1, 2e6); }),
            "make_fat_tree: nic_gbps must be 0.001..1e+06 Gb/s, got 2e+06");
  EXPECT_EQ(error([] { make_deepseek_fabric(10'000, 8, 2, 1); }),
            "make_deepseek_fabric: nodes x gpus_per_node (the GPUs) must be 1..64000, got 80000");
  EXPECT_EQ(error([] { make_superpod(8, 300); }), "make_superpod: planes must be 1..256, got 300");
  EXPECT_EQ(error([] { make_deepseek_fabric(2048, 8, 64, 32); }), "");  // DeepSeek-V3's 16,384 GPUs fit
}

TEST(ParseTopology, DirectGpuLinkWithPlaneLoadsAndRoundTrips) {
  const Topology t = parse_topology(
      "name: bench\nplanes: 1\ngpus: 2\nswitches: []\nlinks:\n  - {a: gpu0, b: gpu1, plane: 0, rate_gbps: 100, "
      "subports: 1}\n",
      "bench.yaml");
  ASSERT_EQ(t.links.size(), 1u);
  EXPECT_EQ(t.links[0].plane, 0);
  EXPECT_DOUBLE_EQ(t.links[0].rate_gbps, 100);
  const Topology back = parse_topology(to_yaml(t), "again");
  EXPECT_EQ(back.links.size(), 1u);
  EXPECT_EQ(back.links[0].plane, 0);
}

// GPUs on one plane each and in-node links: the explicit form loads like the generator's, and each rule is named.
TEST(ParseTopology, SinglePlaneGpusAndNvlinkLinks) {
  const std::string head =
      "name: node\nplanes: 2\ngpus: [{name: g0, plane: 0}, {name: g1, plane: 1}, {name: g2, plane: 0}, "
      "{name: g3, plane: 1}]\nswitches: [{name: s0, plane: 0}, {name: s1, plane: 1}]\nlinks:\n";  // lines 1-5
  const std::string nics = "  - {a: g0, b: s0}\n  - {a: g1, b: s1}\n  - {a: g2, b: s0}\n  - {a: g3, b: s1}\n";
  const std::string nvlinks = "  - {a: g0, b: g1, plane: nvlink, rate_gbps: 1280}\n  - {a: g2, b: g3, plane: nvlink}\n";
  const Topology t = parse_topology(head + nics + nvlinks, "t.yaml");
  EXPECT_EQ(t.nodes[1].plane, 1);
  EXPECT_EQ(t.links[4].plane, kNvlinkPlane);
  EXPECT_TRUE(t.single_plane_gpus());
  EXPECT_EQ(relay_table(t)[1], (std::vector<int>{0, 1}));  // g1's traffic on plane 0 goes through g0
  EXPECT_DOUBLE_EQ(t.gpu_access_gbps(0), 400);             // the NIC's, not NVLink's
  expect_same(t, parse_topology(to_yaml(t), "again"));
  expect_error(head + nics + "  - {a: g0, b: s1}\n", 10, {"GPU 'g0' sits on plane 0 only"});
  expect_error(head + nics + "  - {a: g0, b: s0, plane: nvlink}\n", 10, {"plane nvlink", "not a switch"});
  expect_error(head + nics + nvlinks.substr(0, nvlinks.find('\n') + 1), 3, {"'g3'", "no NVLink-class peer on plane 0"});
  expect_error("name: n\nplanes: 2\ngpus: [{name: g0, plane: 2}]\nswitches: []\nlinks: []\n", 3,
               {"GPU plane 2", "[0, 1]"});
}

}  // namespace
// A node's name becomes its namespace, container, host, log and key file names and a line of FRR's configuration:
// one that could escape a folder, a YAML document or a shell command is refused at load, named.
TEST(ParseTopology, NodeNamesThatCouldEscapeWhereTheyGoAreNamed) {
  auto with_gpu = [](const std::string& gpu, const std::string& sw = "sw") {
    return parse_error("name: n\nplanes: 1\ngpus: [g0, " + gpu + "]\nswitches: [{name: " + sw +
                       ", plane: 0}]\nlinks: [{a: g0, b: " + sw + "}, {a: " + gpu + ", b: " + sw + "}]\n");
  };
  for (const std::string bad : {"\"../evil\"", "\"a b\"", "\"-x\"", "\"g'1\"", "\"a\\nb\"", "\"a:b\"", "\"\\u00e9\""}) {
    const std::string msg = with_gpu(bad);
    EXPECT_NE(msg.find("node name '"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("expected up to 63 letters, digits"), std::string::npos) << bad << ": " << msg;
  }
  EXPECT_NE(with_gpu(std::string(64, 'g')).find("node name '" + std::string(60, 'g') + "...'"), std::string::npos);
  EXPECT_EQ(with_gpu("g.1_a-B"), "<no error>");
  EXPECT_EQ(with_gpu("3x", std::string(63, 's')), "<no error>");
}

}  // namespace ifec::routing
