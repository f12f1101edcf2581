// The fabric description every driver builds from: nodes, planes, links (Y-cable sub-links expanded), thresholds.
// Loaded from YAML (docs in testbed/topologies/README.md) or produced by the generators below.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ifec::routing {

enum class NodeKind : uint8_t { kGpu, kSwitch };
const char* node_kind_name(NodeKind k);  // "gpu" | "switch"

// A link's plane for an in-node, NVLink-class link between two GPUs of one server: no switch, no plane, never in
// FARE's routes; a GPU that sits on one plane forwards over it what arrives for a node peer on another plane.
inline constexpr int kNvlinkPlane = -1;

struct Node {
  std::string name;
  NodeKind kind = NodeKind::kGpu;
  // Switches: the plane they belong to. GPUs: -1 (a NIC port on every plane, the FARE draft's SUN) or the one plane
  // its NIC is on (DeepSeek-V3's fabric: GPU i of a server on plane i; other planes through its node peers).
  int plane = -1;
  int gpu_index = -1;     // GPUs: 0..num_gpus-1, the index used in ECH bitmaps and loopback addresses
  int num_ports = 0;      // ports used by links (ports are numbered 0..num_ports-1)
  uint32_t loopback = 0;  // host order /32; GPU i: 10.0.(i/250).(i%250+1); n-th switch of plane p: 10.255.p.n
};

// Link rates the link model times exactly (bits per second fit 64 bits; a frame serializes in under a minute).
inline constexpr double kMinLinkGbps = 0.001;
inline constexpr double kMaxLinkGbps = 1e6;
// GPUs a topology may have: the loopback scheme 10.0.(i / 250).(i % 250 + 1) holds 64,000.
inline constexpr int kMaxGpus = 64000;
// A link's delay at most a second (beyond it a run is nonsense, and sums of delays would wrap simulated time).
inline constexpr uint64_t kMaxDelayNs = 1'000'000'000;
// Planes a topology may have, and links a generator may lay out (DeepSeek-V3's 16,384-GPU fabric has 90,112).
inline constexpr int kMaxPlanes = 256;
inline constexpr long long kMaxGeneratedLinks = 1LL << 22;

// One physical, full-duplex link between (a, a_port) and (b, b_port). A Y-cable of k sub-ports becomes k links
// that share a `cable` id; `subport` numbers them 0..k-1.
struct Link {
  int id = 0;
  int a = 0;  // node index
  int a_port = 0;
  int b = 0;
  int b_port = 0;
  int plane = 0;  // kNvlinkPlane: an in-node link between two GPUs
  double rate_gbps = 400;
  uint64_t delay_ns = 500;
  int cable = 0;
  int subport = 0;
  int subports = 1;  // sub-links in this cable
};

struct EcnConfig {
  uint64_t kmin_bytes = 64 * 1024;   // below: never mark
  uint64_t kmax_bytes = 512 * 1024;  // above: always mark
  double pmax = 0.2;                 // marking probability reached at kmax
};

struct PfcConfig {
  bool enabled = true;
  uint64_t xoff_bytes = 256 * 1024;  // per ingress port and priority: send PAUSE above this
  uint64_t xon_bytes = 128 * 1024;   // send RESUME below this
  int lossless_priority = 3;         // DSCP 26 maps here; the RoCE traffic class
};

// The IFEC engine's settings, the same on every switch of the fabric (topology `params: ifec: {...}`).
struct IfecParams {
  uint32_t slot_pool = 8192;               // aggregation slots per switch, shared by all groups
  uint32_t slot_bytes = 4096;              // payload one slot holds: a chunk is min(mtu, slot_bytes) bytes
  uint64_t slot_timeout_ns = 2'000'000;    // an incomplete slot is released with the anomaly flag after this
  uint64_t result_retransmit_ns = 20'000;  // unacknowledged results are sent again after this (doubling to 8x)
  uint32_t result_retries = 8;             // ... this many times, then the slot is reclaimed
  uint32_t multicast_entries = 65536;      // multicast packets a switch holds until every destination acknowledged
  // Members a group may have on one switch (the width of its slots' contributor bitmaps): 2..256
  // (common::kMaxGroupMembers, what ECH's one-byte expected-contributor count can name).
  uint32_t max_group_members = 64;
  bool upstream_fp32 = true;  // two-tier planes: leaf -> spine partials in fp32 (else the element type)
  bool reproducible = false;  // reduce in contributor order: bitwise the same result in any arrival order
};

struct FabricParams {
  uint32_t mtu = 4096;                      // RoCE path MTU: payload bytes per packet
  uint64_t buffer_bytes = 4 * 1024 * 1024;  // per egress queue (per port and priority)
  uint32_t wire_overhead_bytes = 24;        // preamble+SFD 8, FCS 4, inter-frame gap 12
  uint64_t control_plane_delay_ns = 10000;  // per hop: FARE advertisement processing + propagation
  int priorities = 8;
  EcnConfig ecn;
  PfcConfig pfc;
  IfecParams ifec;
};

struct Topology {
  std::string name;
  std::string source;  // file it was loaded from, or "generator:..." — used in error messages and reports
  int num_planes = 0;
  std::vector<Node> nodes;
  std::vector<Link> links;
  FabricParams params;

  int num_gpus() const;
  // Node index of GPU `gpu_index`; throws ifec::common::Error naming the index when out of range.
  int gpu_node(int gpu_index) const;
  // Node index by name, or -1.
  int find_node(const std::string& name) const;
  // Links attached to node `n` (ids into `links`). A scan of every link: callers that ask for many nodes of a large
  // fabric build adjacency() once instead.
  std::vector<int> links_of(int node) const;
  // The far end of link `l` seen from node `n`: (node, port).
  std::pair<int, int> peer(int link, int node) const;
  // Aggregate access bandwidth of one GPU over all planes (sum of its NIC links' rates, NVLink-class ones aside).
  double gpu_access_gbps(int gpu_index) const;
  // Whether GPU `gpu_index` has a NIC port on `plane` (every plane, or its own one).
  bool gpu_on_plane(int gpu_index, int plane) const;
  // Whether some GPU sits on one plane only (then other planes are reached through node peers: relay_table).
  bool single_plane_gpus() const;
};

// [gpu][plane]: the GPU whose NIC carries traffic for GPU g on plane p: g itself when it sits on p, else its
// NVLink-class peer on p (DeepEP's internode path: the fabric delivers to the destination's same-plane node peer,
// which forwards it inside the node), -1 when none. validate() ensures every entry is set.
std::vector<std::vector<int>> relay_table(const Topology& t);

// Every node's links, in link id order (what links_of(n) returns, for all n at once).
std::vector<std::vector<int>> adjacency(const Topology& t);

// Loads and validates a YAML topology. Errors throw ifec::common::Error with "FILE:LINE: message naming the value".
Topology load_topology(const std::string& path);
Topology parse_topology(const std::string& yaml_text, const std::string& source_name);
// Writes the YAML form that load_topology() reads back to an equal topology.
std::string to_yaml(const Topology& t);

// Checks structure (every GPU reaches every other GPU on every plane, ports unique, rates > 0, ...);
// throws ifec::common::Error naming the first problem. load_topology() calls it; generators too.
void validate(const Topology& t);

// Each generator checks its arguments against the limits a topology file has (kMaxGpus, kMaxPlanes, link rates in
// [kMinLinkGbps, kMaxLinkGbps], delays up to kMaxDelayNs, at most 8 sub-links a cable) and the links it would lay out
// against kMaxGeneratedLinks before it builds anything, and throws common::Error naming the value.

// (a) draft-xu-rtgwg-fare-in-sun Figure 1: `gpus` GPUs, `planes` planes, one switch per plane; every GPU port
// a Y-cable of `subports` sub-links of port_gbps/subports each (64 x 4 x 800G as 2 x 400G is the reference).
Topology make_superpod(int gpus, int planes, double port_gbps = 800, int subports = 2, uint64_t delay_ns = 500);
// The live testbed's cross-validation fabric, "paced-4x2": make_superpod(4, 2, 0.02, 2), Y-cables of 2 x 10 Mb/s,
// slow enough that the software switches on two cores keep up, so link rates (not CPUs) bound its transfers: a
// 4 KiB frame takes 3.4 ms on a sub-link, against the tens of microseconds a daemon adds per hop (at 2 x 50 Mb/s
// the in-fabric AllReduce's switches were CPU-bound from 1 MiB and a 64 KiB one 8-14% slower live).
Topology make_paced_superpod();
// (b) multi-plane two-tier fat tree: per plane `leaves` leaves and `spines` spines, full leaf-spine mesh;
// each GPU has one NIC port per plane on leaf (gpu / (gpus/leaves)), a cable of `nic_subports` sub-links (2: the
// FARE draft's Y-cables, in a two-tier SUN) of nic_gbps / nic_subports each.
Topology make_fat_tree(int gpus, int planes, int leaves, int spines, double nic_gbps = 400, double fabric_gbps = 400,
                       uint64_t delay_ns = 500, int nic_subports = 1);
// (c) DeepSeek-V3's multi-plane fat tree (its paper's Figure 3): `nodes` servers of `gpus_per_node` GPUs; GPU i of
// each server has one NIC port on plane i (so planes = gpus_per_node) and every pair of a server's GPUs an
// NVLink-class link of nvlink_gbps (the paper's 160 GB/s a GPU gets from NVLink; each link has all of it, the
// budget a GPU shares between peers is not modelled); each plane a two-tier fat tree of `leaves` leaves and `spines`
// spines, every leaf with nodes/leaves NIC ports down and `spines` up. The paper's full size: 2,048 nodes x 8 GPUs =
// 16,384 GPUs, 64 leaves and 32 spines of 64-port 400G switches per plane. Traffic for a GPU on another plane crosses
// the fabric on the sender's plane to the destination's node peer there, and that peer forwards it over NVLink.
Topology make_deepseek_fabric(int nodes, int gpus_per_node, int leaves, int spines, double nic_gbps = 400,
                              double nvlink_gbps = 1280, uint64_t delay_ns = 500, uint64_t nvlink_delay_ns = 200);

}  // namespace ifec::routing
