// Raw flows between GPU NICs over a Fabric (before the endpoint runtime): all-to-all, permutation, incast.
// Each flow's packets are split over the source's ports (planes, sub-ports) in proportion to FARE's weights and
// re-split whenever FARE changes them; each port drains its share round-robin over destinations. Packets are real
// RoCEv2 RDMA WRITE ONLY frames (each with its RETH, so any arrival order places correctly); receivers parse
// and verify them (ICRC included) and honour PFC pauses from their switch. On a fabric whose GPUs sit on one plane
// each (routing::make_deepseek_fabric), a flow to a node peer goes over their NVLink-class link, and a frame for a
// GPU of another plane crosses the fabric to that GPU's node peer on the sender's plane, which forwards it over
// NVLink ahead of its own in-node flows (DeepEP's internode kernels do the same).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ifec/common/fifo.h"
#include "ifec/common/interfaces.h"
#include "ifec/testbed/fabric.h"

namespace ifec::testbed {

enum class Pattern : uint8_t { kAllToAll, kPermutation, kIncast };
Pattern parse_pattern(const std::string& name);  // throws Error naming the bad value
const char* pattern_name(Pattern p);

struct FlowSpec {
  int src = 0;
  int dst = 0;
  uint64_t bytes = 0;
};

// all-to-all: every ordered pair; permutation: a seeded derangement; incast: every GPU to GPU `incast_target`.
// `group` > 0: all-to-all and permutation within consecutive groups of that many GPUs (expert-parallel groups),
// which must divide the GPUs; 0: one group of every GPU. Bad values throw Error naming them.
constexpr uint64_t kMaxFlowBytes = uint64_t{1} << 40;  // a flow's bytes at most (its packet count and sums fit)
std::vector<FlowSpec> make_flows(Pattern p, int gpus, uint64_t bytes, uint64_t seed, int incast_target = 0,
                                 int group = 0);

struct TrafficResult {
  common::TimeNs start_ns = 0;
  common::TimeNs completion_ns = 0;  // last byte delivered, relative to start
  bool complete = false;             // every flow delivered every byte
  size_t flows = 0;
  size_t incomplete_flows = 0;
  uint64_t payload_bytes_offered = 0;
  uint64_t payload_bytes_delivered = 0;
  uint64_t frame_bytes_sent = 0;  // Ethernet frames as sent by NICs (headers + payload + ICRC)
  uint64_t wire_bytes_sent = 0;   // plus preamble, FCS and inter-frame gap
  uint64_t packets_sent = 0;
  uint64_t packets_delivered = 0;
  uint64_t nic_drops = 0;  // frames lost at NICs (bad frames received, in-flight loss on GPU links)
  uint64_t rx_bad_frames = 0;
  uint64_t pfc_pauses_at_nics = 0;    // PFC frames received by NICs that paused a priority
  std::vector<uint64_t> plane_bytes;  // frame bytes sent by NICs per plane
  // In-node, NVLink-class links (fabrics whose GPUs sit on one plane each): frame bytes sent on them, and the
  // frames a GPU forwarded there for a node peer of another plane (DeepEP's internode path).
  uint64_t nvlink_bytes = 0;
  uint64_t relayed_frames = 0;
  double goodput_gbps = 0;
  double line_rate_gbps = 0;      // bottleneck aggregate: min(sum of senders' access, sum of receivers')
  double payload_efficiency = 0;  // payload / wire bytes: the ceiling on goodput / line rate
};

class RawTraffic {
 public:
  RawTraffic(testbed::Fabric& fabric, std::vector<FlowSpec> flows, bool verify_icrc = true);
  RawTraffic(const RawTraffic&) = delete;
  RawTraffic& operator=(const RawTraffic&) = delete;

  void start(common::TimeNs at);
  TrafficResult result() const;

  // Payload bytes GPU `dst` received from GPU `src` through plane `plane` so far (0 without such a flow).
  uint64_t received_bytes(int src, int dst, int plane) const;
  // Payload bytes GPU `src` sent toward GPU `dst` through plane `plane` so far (0 without such a flow).
  uint64_t sent_bytes(int src, int dst, int plane) const;
  // Bytes the generator holds for its flows and NICs (what grows with the traffic), for the benches.
  size_t memory_bytes() const;

  // Adds a vector element-wise over every process of a run spread over MPI processes (a collective call).
  using SumFn = std::function<void(std::vector<uint64_t>&)>;
  // Spread over processes: only the ports of `active_slots` send here (slot: lane x leaf groups + the port's leaf
  // group; a lane is a plane, or planes + p for plane p's GPUs' in-node ports; one group but with
  // FabricOptions::leaf_groups); before each re-split of the flows over planes, `sum` gathers what every process's
  // ports sent (so every process splits alike).
  void spread_over_processes(std::vector<bool> active_slots, SumFn sum);
  // After the run: adds every process's deliveries and NIC counters into this one's (each process counted only
  // its own planes), so that result() and the per-plane bytes are the whole run's.
  void merge(const SumFn& sum);

 private:
  // State grows with the flows, not with GPUs x GPUs: a flow's per-port and per-plane counters sit in flat arrays
  // at its own offsets, and a receiver finds the flow among its own incoming ones. Nothing a port's sending or
  // receiving writes is shared with another partition's ports (counters are per lane and leaf group), so a fabric
  // partitioned by plane, or plane and leaf group (partitions.h), runs each partition's traffic on its own thread; what
  // the planes share (how many packets of a flow every port sent) is read only by the control plane's events, between
  // the partitions' runs.
  struct Flow {
    FlowSpec spec;
    uint64_t packets = 0;
    // The port that sends the flow's short last packet (-1: none, or sent): the control plane's (a port that sends
    // it says so in its own FlowPort, short_pending).
    int short_port = -1;
  };
  struct FlowPort {           // a flow on one of its source's ports
    uint64_t alloc = 0;       // packets assigned, not yet sent
    uint64_t sent = 0;        // packets sent
    uint32_t psn = 0;         // each port is its own QP
    bool sent_short = false;  // this port sent the flow's short last packet
  };
  struct alignas(64) PlaneCounters {  // what one lane's ports of one leaf group counted (a cache line of its own)
    uint64_t packets_sent = 0;
    uint64_t frame_bytes_sent = 0;
    uint64_t wire_bytes_sent = 0;
    uint64_t nic_drops = 0;
    uint64_t packets_delivered = 0;
    uint64_t payload_bytes_delivered = 0;
    uint64_t rx_bad_frames = 0;
    uint64_t pfc_pauses_at_nics = 0;
    uint64_t relayed_frames = 0;  // forwarded for a node peer (counted on the NVLink lane) ...
    uint64_t relayed_bytes = 0;   // ... and their frame bytes (not in frame_bytes_sent: no packet of a flow's own)
    std::vector<uint64_t*> fields() {
      return {&packets_sent,  &frame_bytes_sent,   &wire_bytes_sent,
              &nic_drops,     &packets_delivered,  &payload_bytes_delivered,
              &rx_bad_frames, &pfc_pauses_at_nics, &relayed_frames,
              &relayed_bytes};
    }
  };
  struct alignas(64) NicPort {  // cache lines of its own: the ports of one NIC run on different threads
    std::vector<int> ring;      // flows with packets assigned to this port
    size_t cursor = 0;
    std::vector<common::TimeNs> paused_until;
    bool wakeup_pending = false;
    int plane = 0;                             // its lane: a plane, or in-node num_planes + its GPU's plane
    size_t slot = 0;                           // its counters: lane x leaf groups + its partition's leaf group
    common::Clock* clock = nullptr;            // its partition's
    const GpuPort* io = nullptr;               // the fabric's port (a NIC port or an in-node one)
    common::Fifo<std::vector<uint8_t>> relay;  // in-node ports: frames forwarded for the peer, sent first
  };
  struct Nic {
    std::vector<NicPort> ports;
    std::vector<int> flows;                    // flows this GPU sends
    std::vector<std::pair<int, int>> inflows;  // (source GPU, flow) of the flows it receives, by source
  };

  void resplit(int gpu);
  void order_flows(int gpu);
  void pump(int gpu, int port_index);
  void receive(int gpu, int port_index, std::vector<uint8_t>&& frame);
  void receive_pfc(int gpu, int port_index, const std::vector<uint8_t>& frame);
  // A frame for `dst`, a node peer of `gpu` on another plane: out of their in-node port (false: no such peer).
  bool relay(int gpu, int dst, std::vector<uint8_t>&& frame);
  int port_index_of(int gpu, int port) const;
  int flow_between(int src, int dst) const;  // -1 when there is none

  void send_packet(int gpu, int pi, int fi, bool last_of_port);
  void gather_sent();
  size_t at(int fi, int plane) const { return static_cast<size_t>(plane) * flows_.size() + fi; }
  // Flow `fi` on its source's port `pi`: port-major, so that each port's (each plane's) counters lie apart.
  FlowPort& port_of(int fi, size_t pi) { return ports_[pi * flows_.size() + fi]; }
  // Whether flow `fi`'s short last packet waits to be sent (by port short_port, which it stays with once sent).
  bool short_pending(int fi) {
    return flows_[fi].short_port >= 0 && !port_of(fi, static_cast<size_t>(flows_[fi].short_port)).sent_short;
  }

  testbed::Fabric& fabric_;
  common::Clock& clock_;  // the control plane's: the start
  std::vector<Flow> flows_;
  std::vector<Nic> nics_;
  std::vector<FlowPort> ports_;  // per source port index and flow (port_of)
  size_t max_ports_ = 0;         // the most ports a source has
  bool verify_icrc_;
  common::TimeNs start_ = 0;
  bool started_ = false;
  uint32_t mtu_;
  int prio_;
  // Per (plane, flow), plane-major (each plane's counters apart from the others'): payload bytes delivered and
  // sent, the last delivery's time.
  std::vector<uint64_t> rx_by_plane_;
  std::vector<uint64_t> tx_by_plane_;
  std::vector<common::TimeNs> last_rx_;
  size_t lanes_ = 0;                     // planes, and as many in-node lanes on a fabric with in-node links
  size_t groups_ = 1;                    // leaf groups per plane (FabricOptions::leaf_groups, at least 1)
  std::vector<PlaneCounters> counters_;  // [slot]
  std::vector<bool> active_;             // slots whose ports send in this process (all but in a run over processes)
  SumFn sum_;                            // set in a run over processes
};

}  // namespace ifec::testbed
