// A whole fabric built from a Topology on one Clock: links (rate, delay, wire overhead), switches with FIBs
// installed from FARE, and the GPU-side ports that endpoints attach to. Link events re-run FARE hop by hop,
// one advertisement round per control-plane delay, and reinstall what changed.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ifec/common/sim.h"
#include "ifec/routing/fare.h"
#include "ifec/routing/topology.h"
#include "ifec/switchemu/switch.h"

namespace ifec::testbed {

using switchemu::LoadBalance;
using switchemu::Switch;
using switchemu::SwitchConfig;
using switchemu::SwitchTotals;

struct FabricOptions {
  LoadBalance lb = LoadBalance::kPerPacket;
  bool pfc = true;
  uint64_t seed = 1;
  double loss = 0;   // injected random frame loss on every link, each direction (fault injection)
  bool ifec = true;  // switches run the IFEC engine (its settings: the topology's params.ifec)
  // Frames carry headers and lengths but no payload (common::encode_frame with a null payload): links time and
  // count them, switches queue and forward them, at their whole length, and the IFEC engines do no arithmetic.
  // Simulated times, frame counts and bytes per link are those of real payloads; results are meaningless (timing
  // only). What lets the largest fabrics fit.
  bool elided_payloads = false;
  // 0: a partitioned fabric runs one partition per plane (the plane-clocks constructor takes one clock per plane).
  // K >= 1: one per plane and leaf group, K groups of a plane's consecutive leaves (and as many runs of its other
  // switches, by index): planes x K clocks, partition plane x K + group (leaf_group_partitions). Every
  // switch-to-switch and in-node link then sends through mailboxes, whether its ends share a partition or not, so
  // a run is the same whatever K, the threads or the processes (raw traffic, and the endpoint runtime's GPU
  // partitions beside them).
  int leaf_groups = 0;
};

// Which partition runs each topology node of a fabric partitioned by plane and leaf group (`groups` per plane):
// a plane's leaves (switches with a GPU link, by node index) in `groups` runs of consecutive ones, its other
// switches spread over the groups the same way; partition plane x groups + group. A GPU: the partition of the
// switch its plane's port hangs from, or -1 when it has ports on several planes (each port runs with its switch).
// Throws Error naming the bad value when a plane has fewer leaves than groups, when a GPU's ports on one plane hang
// from leaves of two groups (only with `nics_with_leaves`: raw traffic runs a NIC port with its leaf; the endpoint
// runtime runs it with its GPU), or when a link joins two GPUs on a plane (not in-node).
std::vector<int> leaf_group_partitions(const routing::Topology& topo, int groups, bool nics_with_leaves = true);
// What describe() calls each partition of leaf_group_partitions: "p0 leaves 0-15" (leaf indices within the plane).
std::vector<std::string> leaf_group_names(const routing::Topology& topo, int groups);

// One port of a GPU: which link (sub-link) and plane it is on, and the port to send on.
struct GpuPort {
  int port = 0;                    // port number at the GPU node
  int link = 0;                    // topology link id
  int plane = 0;                   // routing::kNvlinkPlane for an in-node port
  int peer_gpu = -1;               // an in-node port's GPU at the other end
  int partition = 0;               // the partition (index of the plane clocks) it runs on: its switch's, or its GPU's
  common::Clock* clock = nullptr;  // that partition's clock
  common::LinkPort* io = nullptr;
  common::MacAddress mac{};       // this port's MAC
  common::MacAddress peer_mac{};  // the switch port at the other end
};

class Fabric {
 public:
  Fabric(common::Clock& clock, const routing::Topology& topo, FabricOptions opts);
  // A fabric partitioned by plane: plane p's links, switches and GPU ports run on plane_clocks[p] (one per plane),
  // the control plane (link events, FARE's rounds, route installs) on `control`. A partitioned run (partitions.h)
  // runs the planes' clocks apart, up to each control event, and the control events between them.
  // A link joining two planes (a server's NVLink-class link between GPUs of two planes) sends its frames through
  // mailbox(from plane, to plane) (PlanePartitions::mailbox); without one such a topology needs a single clock.
  // With opts.leaf_groups K >= 1, plane_clocks holds planes x K clocks (see FabricOptions::leaf_groups), and every
  // switch-to-switch and in-node link sends through mailbox(from, to, source: the sending node's index), `from`
  // and `to` equal where its ends share a partition.
  // With `gpu_partition` (the endpoint runtime's partitioned run), GPU g's ports run on the clock of a partition of
  // the GPUs' own instead (PlanePartitions' GPU groups): each GPU-to-switch link joins it to its switch's partition,
  // and what the GPU sends goes through a mailbox of its own (source: partitions + g by plane, its node index in
  // leaf groups).
  using MailboxFn = std::function<common::Clock*(int from, int to, int source)>;
  struct GpuPartition {
    int partition = -1;
    common::Clock* clock = nullptr;
  };
  using GpuPartitionFn = std::function<GpuPartition(int gpu)>;
  Fabric(common::Clock& control, std::vector<common::Clock*> plane_clocks, const routing::Topology& topo,
         FabricOptions opts, MailboxFn mailbox = nullptr, GpuPartitionFn gpu_partition = nullptr);
  ~Fabric();

  const routing::Topology& topology() const { return topo_; }
  const FabricOptions& options() const { return opts_; }
  common::Clock& clock() { return clock_; }  // the control plane's (every plane's, unpartitioned)
  // The partition running a link's end (side 0: link.a), and the source its frames are sorted by in a mailbox.
  std::pair<int, int> end_partition(int link, int side) const;
  // The partition running a switch (a topology node index).
  int switch_partition(int node) const { return node_partition_.at(node); }

  int num_gpus() const { return static_cast<int>(gpu_ports_.size()); }
  // A GPU's NIC ports (one per plane and sub-link), by port number.
  const std::vector<GpuPort>& gpu_ports(int gpu) const { return gpu_ports_.at(gpu); }
  // Its in-node, NVLink-class ports (routing::kNvlinkPlane links), by port number; empty on most fabrics.
  const std::vector<GpuPort>& nvlink_ports(int gpu) const { return nvlink_ports_.at(gpu); }
  // The in-node port of `gpu` toward GPU `peer` (an index into nvlink_ports), or -1.
  int nvlink_port_to(int gpu, int peer) const;
  // The GPU whose NIC carries traffic for `gpu` on `plane` (routing::relay_table): itself, a node peer, or -1.
  int relay(int gpu, int plane) const { return relays_.at(gpu).at(plane); }
  // Whether some link is NVLink-class (an in-node link between GPUs).
  bool has_nvlink() const { return has_nvlink_; }
  // The shortest delay of a link whose ends run on different planes' clocks (the partitions' lookahead), or
  // common::kForever when none does.
  common::TimeNs cross_partition_delay() const { return cross_delay_; }
  uint32_t gpu_ip(int gpu) const { return gpu_ips_.at(gpu); }
  // FARE's WECMP group at GPU `src` toward GPU `dst`: weights per GPU port (Gb/s of path bandwidth). Toward a GPU
  // on another plane, the path to its node peer on each of src's planes (which forwards over NVLink); toward a node
  // peer, the NVLink-class link itself at its rate.
  std::vector<routing::NextHop> gpu_next_hops(int src, int dst) const;

  int num_switches() const { return static_cast<int>(switches_.size()); }
  Switch& switch_at(int i) { return *switches_.at(i); }
  const Switch& switch_at(int i) const { return *switches_.at(i); }
  int switch_node(int i) const { return switch_nodes_.at(i); }
  common::Link& link(int id) { return *links_.at(id); }
  const common::Link& link(int id) const { return *links_.at(id); }
  const routing::FareRib& rib() const { return *rib_; }

  // Takes a link down (or up) at time `at`; FARE rounds follow at at + k * control_plane_delay_ns.
  void schedule_link_state(int link, bool up, common::TimeNs at);
  // Called after every FARE round that changed routes (GPU weights included), with the round's time.
  void on_routes_changed(std::function<void(common::TimeNs)> fn) { listeners_.push_back(std::move(fn)); }
  // Time the last FARE convergence finished (0 before any event).
  common::TimeNs last_converged_ns() const { return converged_ns_; }
  int fare_rounds_run() const { return rounds_run_; }

  SwitchTotals switch_totals() const;
  // Adds every process's link and switch counters into this one's: `sum` adds a vector element-wise over the
  // processes (a collective call), each process contributing its own planes' counters (the others' are zero here).
  void merge_counters(const std::function<void(std::vector<uint64_t>&)>& sum);
  // Bytes the routing state holds: the RIB, every switch's FIB and the class table (not the frames in flight).
  size_t routing_bytes() const;
  // Bytes of the links and the switches' per-port state (queues' rings, PFC, counters), frames aside.
  size_t link_bytes() const;
  // The switch (index) a GPU's port on `plane` attaches to, or -1 (one-tier planes: the plane's switch).
  int switch_of_plane(int gpu, int plane) const;
  uint32_t switch_ip(int i) const { return topo_.nodes.at(switch_nodes_.at(i)).loopback; }

 private:
  void install_routes();
  void install_loopback_routes();
  void install_gpu_routes();
  void fare_round(uint64_t generation);
  // Every link of the topology (links_), each plane's in one array (link_store_), on its partitions' clocks.
  void make_links(const MailboxFn& mailbox);
  common::Clock& end_clock(int link, int side) const;  // the clock of end_partition's partition

  common::Clock& clock_;
  std::vector<common::Clock*> plane_clocks_;  // one per partition of the fabric (plane, or plane and leaf group)
  routing::Topology topo_;
  FabricOptions opts_;
  // The links, by id; each plane's lie in one array of link_store_ (a plane partition's thread touches only its own;
  // a plane's leaf groups share its array).
  std::vector<std::unique_ptr<std::optional<common::Link>[]>> link_store_;
  std::vector<common::Link*> links_;
  std::vector<std::unique_ptr<Switch>> switches_;
  std::vector<int> switch_nodes_;
  std::vector<int> node_switch_;             // node -> switch index or -1
  std::vector<int> node_partition_;          // node -> its partition (leaf_group_partitions; a GPU on every plane: -1)
  std::vector<GpuPartition> gpu_partition_;  // GPU -> its group's partition (the endpoint runtime's), or empty
  std::vector<std::vector<int>> adj_;        // node -> its links (routing::adjacency)
  // GPU address -> destination class (routing::FareRib), shared by every switch's FIB: one table, or one per
  // plane when GPUs sit on one plane each (a GPU of another plane maps to its node peer's class on this plane).
  std::vector<std::shared_ptr<switchemu::IpMap>> class_tables_;
  std::vector<std::vector<GpuPort>> gpu_ports_;
  std::vector<std::vector<GpuPort>> nvlink_ports_;
  std::vector<uint32_t> gpu_ips_;          // [gpu]: its loopback (read per frame)
  std::vector<std::vector<int>> relays_;   // routing::relay_table
  std::vector<std::vector<int>> relayed_;  // [gpu]: the GPUs of other planes it carries on its own plane
  bool has_nvlink_ = false;
  common::TimeNs cross_delay_ = common::kForever;
  std::unique_ptr<routing::FareRib> rib_;
  std::vector<std::function<void(common::TimeNs)>> listeners_;
  uint64_t generation_ = 0;
  common::TimeNs converged_ns_ = 0;
  int rounds_run_ = 0;
};

class PlanePartitions;
// A fabric spread over MPI processes: each link end whose far end runs in another process's partition sends
// through the partitions' exchange (key: link id x 2 + the receiving side), and what arrives here goes to its end.
// Ends: Fabric::end_partition's (a GPU's in its group's partition when the fabric has GPU partitions).
void connect_processes(Fabric& fabric, PlanePartitions& parts);

// MAC address of port `port` of topology node `node` (locally administered, unique per node and port).
common::MacAddress node_port_mac(const routing::Topology& topo, int node, int port);

}  // namespace ifec::testbed
