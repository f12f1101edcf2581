// The software switch data plane: the contract every driver (sim, live) feeds frames into.
//
// Packet path (one frame, top to bottom; receive() and forward() in switch.cpp):
//   Port receiver -> parse (MAC control? -> PFC pause/resume of our own egress, done)
//     -> parse_l3 (malformed: drop, count)
//     -> [ECH addressed to this switch: parse_frame, ICRC included (malformed: drop, count) -> IFEC engine, done]
//     -> FIB lookup on the destination /32 (no route: drop, count) -> TTL check (expiring: drop, count)
//     -> WECMP choice: per flow (5-tuple hash with the switch's seed) or per packet (smooth weighted round robin);
//        members whose own link is down are skipped at once (local failover) until FARE reweighs the group
//     -> egress admission (shared buffer; lossy queues capped per queue), before any rewrite: a drop costs no more
//     -> ECN mark (RED-style between kmin and kmax) -> TTL decrement, ECN and MAC rewrite
//     -> PFC ingress accounting (XOFF/XON toward the sender)
//     -> egress queue per priority -> strict-priority transmit, skipping paused priorities -> Port::send
//
// Buffer model: the switch has one shared packet buffer of params.buffer_bytes x ports. Lossy priorities
// (all of them when PFC is off) are also capped at params.buffer_bytes per egress queue and drop beyond it;
// the lossless priority is bounded by PFC (XOFF per ingress port and priority) and drops only if the shared
// buffer itself runs out, which the counters report.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "ifec/common/counters.h"
#include "ifec/common/ethernet.h"
#include "ifec/common/fifo.h"
#include "ifec/common/frame.h"
#include "ifec/common/interfaces.h"
#include "ifec/common/swrr.h"
#include "ifec/routing/topology.h"
#include "ifec/switchemu/ifec_engine.h"
#include "ifec/switchemu/ip_map.h"

namespace ifec::switchemu {

enum class LoadBalance : uint8_t { kPerFlow, kPerPacket };

const char* load_balance_name(LoadBalance lb);
LoadBalance parse_load_balance(const std::string& name);  // flow | packet; throws Error naming the value

struct SwitchConfig {
  std::string name = "switch";
  uint32_t ip = 0;    // the switch's loopback: ECH frames addressed to it go to the IFEC engine
  bool ifec = true;   // run an IFEC engine, with params.ifec (otherwise frames for the switch itself are dropped)
  uint64_t seed = 1;  // flow-hash and ECN-marking randomness
  LoadBalance lb = LoadBalance::kPerPacket;
  routing::FabricParams params;
  common::MacAddress base_mac = {0x02, 0x53, 0x57, 0x00, 0x00, 0x00};  // port p: last two bytes = p
  std::vector<common::MacAddress> port_macs;  // when given (live: the interfaces' own), port p's MAC is port_macs[p]
  // A simulation whose payloads are elided (common::ParseOptions::allow_elided): frames are parsed and queued at
  // the length their headers say, and the IFEC engine keeps its slots and timing but does no arithmetic. Never in
  // the live testbed.
  bool elided_payloads = false;
};

struct NextHopPort {
  int port = 0;
  double weight = 1;
  common::MacAddress next_mac{};
};

// clang-format off
#define IFEC_QUEUE_COUNTERS(X) \
  X(enqueued_frames, "")       \
  X(tx_frames, "")             \
  X(tx_bytes, "")              \
  X(drops, "")                 \
  X(ecn_marks, "")             \
  X(bytes_now, "")             \
  X(high_water_bytes, "")
// clang-format on

struct QueueCounters {
  IFEC_COUNTER_SET(QueueCounters, IFEC_QUEUE_COUNTERS)
};

// clang-format off
#define IFEC_SWITCH_PORT_COUNTERS(X)                                                     \
  X(rx_frames, "")                                                                       \
  X(rx_bytes, "")                                                                        \
  X(tx_frames, "data frames")                                                            \
  X(tx_bytes, "")                                                                        \
  X(pause_sent, "XOFF frames sent out of this port (toward the upstream sender)")        \
  X(resume_sent, "XON frames")                                                           \
  X(pause_received, "PFC frames received that paused one of our priorities")             \
  X(malformed_drops, "")                                                                 \
  X(no_route_drops, "")                                                                  \
  X(ttl_drops, "")                                                                       \
  X(link_down_drops, "frames the port refused because its link was down")                \
  X(failovers, "frames steered off a group member whose link was down (local failover)")
// clang-format on

struct SwitchPortCounters {
  IFEC_COUNTER_SET(SwitchPortCounters, IFEC_SWITCH_PORT_COUNTERS)
  std::vector<QueueCounters> queues;
};

struct SwitchTotals {
  uint64_t rx_frames = 0;
  uint64_t tx_frames = 0;
  uint64_t drops = 0;  // queue, buffer, no-route, malformed and TTL drops (link-down losses: see the links)
  uint64_t buffer_drops = 0;
  uint64_t ecn_marks = 0;
  uint64_t pause_sent = 0;
  uint64_t pause_received = 0;
  uint64_t shared_buffer_high_water = 0;
};

class Switch {
 public:
  // The switch owns neither the clock nor the ports; both must outlive it.
  Switch(common::Clock& clock, SwitchConfig cfg, std::vector<common::Port*> ports);
  Switch(const Switch&) = delete;
  Switch& operator=(const Switch&) = delete;

  // Installs (or, with an empty group, removes) the WECMP group for a destination /32. Ports must exist and
  // weights be >= 0 with a positive sum; throws ifec::common::Error naming the bad value otherwise.
  void set_route(uint32_t dst_ip, std::vector<NextHopPort> group);
  // One group for several destinations at once: they share it, its weighted round robin included, as prefixes
  // share a hardware ECMP group (a fabric's switches route every GPU behind the same far leaf alike). Replaces
  // what each of them had.
  void set_route(const std::vector<uint32_t>& dst_ips, std::vector<NextHopPort> group);
  const std::vector<NextHopPort>* route(uint32_t dst_ip) const;
  // Routes by destination class, as prefixes aggregate destinations: `classes` maps a destination /32 to its class
  // (one table a whole fabric shares, kept by its builder), and set_class_route gives this switch's group toward a
  // class. A /32 route of its own (set_route) comes first, as the longer prefix does.
  void set_class_table(std::shared_ptr<const IpMap> classes);
  void set_class_route(int cls, std::vector<NextHopPort> group);  // empty: no route toward the class
  // Bytes the FIB holds (the index and the groups), for the benches.
  size_t fib_bytes() const;
  // Bytes of the per-port state (queues' rings, PFC and counters), frames in them aside, for the benches.
  size_t port_state_bytes() const;

  int num_ports() const { return static_cast<int>(ports_.size()); }
  const SwitchPortCounters& counters(int port) const { return state_.at(port).counters; }
  // Every counter (ports, their queues, the buffer's), writable, in a fixed order: a run spread over processes
  // adds theirs together.
  void visit_counters(const std::function<void(uint64_t&)>& fn);
  SwitchTotals totals() const;
  // The IFEC engine (null when disabled).
  IfecEngine* ifec() { return ifec_.get(); }
  const IfecEngine* ifec() const { return ifec_.get(); }
  // Forwards a frame the switch itself originates (the IFEC engine's results, ACKs, replicas); `spray` names the
  // member of equal next hops it takes (IfecEngine::Emit) where packets are sprayed.
  void inject(std::vector<uint8_t>&& frame, uint64_t spray = IfecEngine::kSwitchChooses);
  const SwitchConfig& config() const { return cfg_; }
  common::MacAddress port_mac(int port) const;
  // Priority a frame with this DSCP is queued in (lossless class for RoCE's DSCP 26, 0 otherwise).
  int priority_of(uint8_t dscp) const;

 private:
  struct Packet {
    std::vector<uint8_t> bytes;
    int ingress = 0;
    size_t size = 0;  // on the wire (the buffer's, or an elided frame's whole length)
  };
  static constexpr int kMaxPriorities = 8;
  // Fixed arrays and FIFOs that allocate on first use: a fabric of 50,000 switch ports keeps this for each.
  struct PortState {
    std::array<common::Fifo<Packet>, kMaxPriorities> queues;
    common::Fifo<std::vector<uint8_t>> control;                 // PFC frames: sent before any data, never paused
    std::array<common::TimeNs, kMaxPriorities> paused_until{};  // set by PFC frames the peer sends us
    std::array<uint64_t, kMaxPriorities> ingress_bytes{};       // bytes received here still buffered
    std::array<char, kMaxPriorities> xoff_sent{};               // our PAUSE toward this port's peer is active
    bool wakeup_pending = false;
    SwitchPortCounters counters;
  };
  // A group's next hops and weights, immutable once made and shared by every group over the same ones (a leaf's
  // groups toward the other leaves' classes all go over its up links at the same weights): a group keeps only its
  // own rotation.
  struct Members {
    std::vector<NextHopPort> hops;
    std::vector<double> cumulative;  // for per-flow weighted hashing
    std::vector<double> weights;     // the hops' weights, for the per-packet smooth round robin
    double total = 0;
  };
  struct Group {
    std::shared_ptr<const Members> members;
    std::vector<double> rotation;  // this group's smooth weighted round robin state (common::SmoothWrr::next)
    int refs = 0;                  // destinations routed by it
  };
  struct SameHops {  // orders member lists by their hops (ports, weights, next MACs)
    bool operator()(const std::shared_ptr<const Members>& a, const std::shared_ptr<const Members>& b) const;
  };

  void receive(int in_port, std::vector<uint8_t>&& frame);
  // Time a frame toward `dst_ip` queued now waits here before it leaves (the busiest next-hop port's backlog).
  common::TimeNs backlog_ns(uint32_t dst_ip) const;
  // Forwarding from FIB lookup on; in_port -1 for frames the switch originates (no PFC ingress accounting).
  void forward(int in_port, std::vector<uint8_t>&& frame, const common::L3View& l3,
               uint64_t spray = IfecEngine::kSwitchChooses);
  void handle_pfc(int in_port, const std::vector<uint8_t>& frame);
  int choose(Group& g, uint64_t flow_hash, size_t bytes);  // per packet: shares of the bytes
  int choose_live(Group& g, uint64_t flow_hash, size_t bytes);
  int choose_sprayed(const Group& g, uint64_t spray) const;
  static int weighted_pick(const Group& g, uint64_t hash);
  void enqueue(int out_port, int prio, Packet&& pkt);
  void transmit(int port);
  void send_pfc(int port, int prio, bool pause);
  void schedule_refresh(int port, int prio);
  void release_ingress(int in_port, int prio, size_t bytes);
  size_t wire_size(const std::vector<uint8_t>& frame) const {
    return cfg_.elided_payloads ? common::wire_frame_bytes(frame) : frame.size();
  }
  void release_group(int32_t slot);  // one destination fewer on it (-1: none)
  int32_t new_group(std::vector<NextHopPort> hops, int refs);
  void start_rotation(Group& g, int32_t slot);
  int32_t lookup(uint32_t dst_ip) const;  // the group slot toward `dst_ip`, or -1

  common::Clock& clock_;
  SwitchConfig cfg_;
  std::vector<common::Port*> ports_;
  std::vector<PortState> state_;
  IpMap fib_;                             // destination -> groups_ slot
  std::shared_ptr<const IpMap> classes_;  // destination -> class (shared by the fabric's switches)
  std::vector<int32_t> class_groups_;     // class -> groups_ slot or -1
  std::vector<Group> groups_;
  std::vector<int32_t> free_groups_;
  std::set<std::shared_ptr<const Members>, SameHops> members_;  // every member list a group uses, once
  SwitchPortCounters originated_;  // what frames the switch itself originates count against (no ingress port)
  std::mt19937_64 rng_;
  uint64_t shared_used_ = 0;
  uint64_t shared_capacity_ = 0;
  uint64_t shared_high_water_ = 0;
  uint64_t buffer_drops_ = 0;
  uint64_t originated_drops_ = 0;  // engine frames with no route or no buffer
  std::unique_ptr<IfecEngine> ifec_;
};

}  // namespace ifec::switchemu
