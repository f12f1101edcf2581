// A GPU endpoint: its NIC (ports, per-port QP scheduling, PFC), one RC QP per (peer, sub-port), symmetric
// memory, and the transaction API a kernel's proxy or a host program calls (store, load, atomics, put_signal,
// fence, quiet). Sees only the Clock and Port seams, so it runs on any driver.
//
// Ordering modes (draft-xu-rtgwg-fare-in-sun section 4), chosen per job:
//  - weak: stores and loads are striped over all QPs by the FARE weights and every QP is out-of-order tolerant
//    (self-placing packets), so the fabric may spray per packet; nothing is ordered unless fenced.
//  - partial: an address maps to one QP (a weighted table over `stripe_bytes` granules), and QPs deliver in
//    order, so transactions to the same address stay ordered; fence / put_signal wait for earlier ones.
//  - strong: one in-order stream per peer (the first live sub-port): everything is delivered in issue order.
// A fence() makes later transactions to that peer wait until earlier ones completed (were acknowledged).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ifec/common/ethernet.h"
#include "ifec/common/fifo.h"
#include "ifec/common/interfaces.h"
#include "ifec/common/protocol.h"
#include "ifec/common/swrr.h"
#include "ifec/endpoint/descriptor.h"
#include "ifec/endpoint/ech_agent.h"
#include "ifec/endpoint/memory.h"
#include "ifec/endpoint/qp.h"
#include "ifec/endpoint/sink.h"

namespace ifec::endpoint {

enum class Ordering : uint8_t { kWeak, kPartial, kStrong };
const char* ordering_name(Ordering o);
Ordering parse_ordering(const std::string& name);  // throws Error naming the value

struct EndpointConfig {
  int index = 0;
  uint32_t ip = 0;
  uint32_t job = 1;
  Ordering ordering = Ordering::kPartial;
  uint32_t mtu = 4096;
  common::TimeNs rto_ns = 100'000;
  common::TimeNs rto_max_ns = 4'000'000;
  bool adaptive_rto = false;  // QpConfig::adaptive_rto (the live testbed turns it on)
  int max_retries = 10;
  uint32_t max_outstanding = 512;
  uint32_t ack_every = 32;
  uint32_t responder_window = 4096;
  uint32_t stripe_bytes = 16384;  // partial mode: the address granule that maps to one QP
  uint8_t dscp = common::kRoceDscp;
  int lossless_priority = 3;
  // A simulation whose payloads are elided (QpConfig::elided_payloads; the ECH agent likewise): stores take no copy
  // of their source, frames carry headers and lengths only, and nothing that arrives is written. Timing only.
  bool elided_payloads = false;
};

struct EndpointPort {
  common::Port* port = nullptr;
  int plane = 0;
  common::MacAddress mac{};
  common::MacAddress peer_mac{};
};

struct OpState {
  OpStatus status = OpStatus::kPending;
  uint64_t result = 0;  // fetched value of atomics
  std::string error;    // what went wrong, naming the value, when status is not kOk
  // Runs once when the operation completes (set it right after posting; check done() first, since invalid
  // arguments complete before the call returns).
  std::function<void(const OpState&)> on_done;
  bool done() const { return status != OpStatus::kPending; }
  bool ok() const { return status == OpStatus::kOk; }
};
using OpHandle = std::shared_ptr<OpState>;

// clang-format off
#define IFEC_ENDPOINT_COUNTERS(X)                                                            \
  X(ops_posted, "")                                                                          \
  X(ops_ok, "")                                                                              \
  X(ops_failed, "")                                                                          \
  X(tx_frames, "")                                                                           \
  X(rx_frames, "")                                                                           \
  X(rx_malformed, "failed parse_frame (checksums, lengths, unknown opcode ...)")             \
  X(rx_misaddressed, "IPv4 destination is not this endpoint")                                \
  X(rx_unknown_qp, "destination QP number this endpoint does not have")                      \
  X(rx_wrong_source, "right QP, wrong peer address")                                         \
  X(rx_unsupported, "opcodes the runtime does not speak (SEND, CNP)")                        \
  X(pfc_pauses, "")                                                                          \
  X(path_migrations, "QPs moved to another port (their own lost its route) or back")                                                                     \
  X(reconnects, "")                                                                          \
  X(reconnects_refused, "the connection manager could not reset the peer (the work failed)")
// clang-format on

struct EndpointCounters {
  IFEC_COUNTER_SET(EndpointCounters, IFEC_ENDPOINT_COUNTERS)
  QpCounters qp;  // summed over all QPs
};

// What a subscriber (a rank's communicator) hears from its endpoint while subscribed (Endpoint::subscribe).
class EndpointSubscriber {
 public:
  virtual ~EndpointSubscriber() = default;
  // A remote store or atomic landed in this endpoint's memory, or a multicast replica was written: (peer, window,
  // offset, length). Lets collectives count arrivals and wait for signal words without polling. Runs right after
  // the responder's copy of the bytes: a locked instruction here would wait for every store of that copy to land.
  virtual void on_remote_write(int peer, uint16_t window, uint64_t offset, uint64_t len) = 0;
  // At the end of every Endpoint::routes_changed() (in-fabric operations move work off planes that lost a path).
  virtual void on_routes_changed() = 0;
};

// The endpoint's subscribers. A released subscriber leaves a null slot (reused by the next subscribe) rather than
// being erased, so a subscriber released or added during a delivery neither skips nor repeats another's.
struct SubscriberList {
  std::vector<EndpointSubscriber*> slots;
  size_t live = 0;
};

// One subscriber's hold on an endpoint: destroying or resetting it stops the deliveries. It refers to the endpoint's
// list weakly, so it is safe whichever of the endpoint and the subscriber goes first.
class Subscription {
 public:
  Subscription() = default;
  ~Subscription() { reset(); }
  Subscription(Subscription&& o) noexcept = default;  // leaves `o` empty
  Subscription& operator=(Subscription&& o) noexcept;
  Subscription(const Subscription&) = delete;
  Subscription& operator=(const Subscription&) = delete;
  void reset();

 private:
  friend class Endpoint;
  Subscription(std::weak_ptr<SubscriberList> list, size_t slot) : list_(std::move(list)), slot_(slot) {}
  std::weak_ptr<SubscriberList> list_;
  size_t slot_ = 0;
};

class Endpoint {
 public:
  // peer_ips[i] is endpoint i's loopback (this endpoint's own included).
  Endpoint(common::Clock& clock, EndpointConfig cfg, std::vector<EndpointPort> ports, std::vector<uint32_t> peer_ips);
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  int index() const { return cfg_.index; }
  int num_endpoints() const { return static_cast<int>(peer_ips_.size()); }
  const EndpointConfig& config() const { return cfg_; }
  SymmetricMemory& memory() { return memory_; }

  // What this endpoint knows of a peer's window (learned when windows are exchanged).
  void set_remote_window(int peer, const WindowInfo& w);
  // A peer's window as learned, or null (this endpoint's own: memory().window()).
  const WindowInfo* peer_window(int peer, uint16_t window) const { return remote_window(peer, window); }
  common::Clock& clock() { return clock_; }
  // FARE's per-port weights toward `peer` (path bandwidth per sub-port; 0 = no route). Default: all 1.
  void set_weight_source(std::function<void(int peer, std::vector<double>* per_port)> fn);
  // Re-reads the weights: moves QPs off ports that lost their route, rebuilds the QP tables and, in the
  // ordered modes, fences every peer so no address changes QP with transactions in flight; then tells the
  // subscribers.
  void routes_changed();
  // FARE's path bandwidth toward `peer` over `plane`: the sum of this endpoint's port weights there (0 = no path).
  double plane_weight(int peer, int plane) const;
  // Delivers remote writes and route changes to `s` until the returned subscription is destroyed or reset. Several
  // subscribers may share the endpoint (NCCL's split communicators); each hears everything, in subscription order.
  [[nodiscard]] Subscription subscribe(EndpointSubscriber& s);
  // How a fatal NAK reconnects: tell endpoint `peer` to reset its responder of QP `qp` to `psn`, then call `done`
  // on this endpoint's clock ("" once the peer has, else why not: the QP's waiting work then fails). The QP sends
  // nothing new until then. Without a manager the QP goes on at once (the peer is never reset).
  using ResetDone = std::function<void(const std::string& error)>;
  using ConnectionManager = std::function<void(int peer, int qp, uint32_t psn, ResetDone done)>;
  void set_connection_manager(ConnectionManager fn) { cm_ = std::move(fn); }
  // Queues a ready-made frame on `port` (the ECH agent's; these and the QPs' frames take turns while both wait);
  // false when the port index is invalid.
  bool send_frame(int port, std::vector<uint8_t>&& frame);
  int num_ports() const { return static_cast<int>(ports_.size()); }
  const EndpointPort& port_info(int port) const { return ports_.at(port); }
  // The next hop's MAC on `port` changed (a live switch restarted with new interfaces): frames sent from now on
  // carry it.
  void set_peer_mac(int port, const common::MacAddress& mac) { ports_.at(port).peer_mac = mac; }
  uint64_t ech_frames_sent() const { return ech_frames_sent_; }
  // The endpoint half of ECH: every ECH frame this endpoint receives goes to it (see ech_agent.h).
  EchAgent& ech() { return *ech_; }
  void reset_responder(int peer, int qp, uint32_t psn);
  // Endpoint `peer` is a real RDMA stack (a Soft-RoCE guest at that GPU's address, testbed/rxe), reached by QP
  // (peer, qp) of this endpoint: see QueuePair::attach_external. Returns this side's QP number and the PSN its
  // own first request will carry.
  std::pair<uint32_t, uint32_t> attach_external(int peer, int qp, uint32_t remote_qpn, uint32_t first_request_psn,
                                                uint16_t pkey);

  OpHandle store(int peer, uint16_t window, uint64_t offset, const void* src, size_t len);
  // RDMA WRITE from this endpoint's own window `src_window` at `src_offset`: no copy is taken; the bytes are read as
  // frames are built (retransmissions too), so they must stay unchanged and the window registered until the handle
  // completes. What batch row stores use: a rank's rows are not duplicated while they queue.
  // `turn`: the store's turn in weak ordering's rotation of stripes over QPs (take_stripe_turns); by default the
  // next one, in posting order.
  static constexpr uint64_t kNextTurn = UINT64_MAX;
  OpHandle store_from_window(int peer, uint16_t window, uint64_t offset, uint16_t src_window, uint64_t src_offset,
                             size_t len, uint64_t turn = kNextTurn);
  // Weak ordering splits a store of several packets over the QPs to its peer, rotating which QP takes the short
  // tail store by store. A caller that decides the order of `stores` stores of `len` bytes now but posts them later
  // (a bounded number ahead per peer) takes their turns here, the first returned, and names each store's own:
  // they spread exactly as if posted at once. Takes none (returns the next) where such a store does not stripe.
  // Where the rotation stands (the next store's turn): a trace records it at an operation's start and a replay
  // starts there, so the replayed stores stripe as the traced ones did.
  uint64_t stripe_turn() const { return stripe_rotor_; }
  void set_stripe_turn(uint64_t turn) { stripe_rotor_ = turn; }
  uint64_t take_stripe_turns(uint64_t stores, size_t len);
  // `dst` must stay valid until the handle completes.
  OpHandle load(void* dst, int peer, uint16_t window, uint64_t offset, size_t len);
  OpHandle fetch_add(int peer, uint16_t window, uint64_t offset, uint64_t add);
  OpHandle compare_swap(int peer, uint16_t window, uint64_t offset, uint64_t compare, uint64_t swap);
  // Store, then (once the store is delivered) set or add `signal` at (sig_window, sig_offset).
  OpHandle put_signal(int peer, uint16_t window, uint64_t offset, const void* src, size_t len, uint16_t sig_window,
                      uint64_t sig_offset, uint64_t signal, SignalOp op);
  // Fences one peer, or every peer (-1); Error naming any other peer outside 0..num_endpoints()-1.
  void fence(int peer = -1);
  // Completes when every transaction posted before it has completed.
  OpHandle quiet();

  // Raw verbs: explicit VA and rkey on QP `qp`, no local validation (protection tests, tools).
  OpHandle store_raw(int peer, int qp, uint64_t va, uint32_t rkey, const void* src, size_t len);
  OpHandle load_raw(void* dst, int peer, int qp, uint64_t va, uint32_t rkey, size_t len);
  OpHandle fetch_add_raw(int peer, int qp, uint64_t va, uint32_t rkey, uint64_t add);

  bool idle() const;
  EndpointCounters counters() const;
  // Repairs so far, by the RC QPs and the ECH agent: how many packets were sent again, and the frame bytes of those
  // and of the answers copies drew (ACKs, replayed read responses): what an operation's wire bytes hold beyond its
  // first transmissions and their answers.
  struct Resent {
    uint64_t frames = 0;
    uint64_t bytes = 0;
  };
  Resent resent() const;
  // Every counter by name (transport, the QPs summed, the ECH agent's prefixed ech_): the one list the Python
  // bindings, the live daemons' control plane and their Prometheus metrics report.
  std::vector<std::pair<std::string, uint64_t>> named_counters() const;
  int qps_per_peer() const { return static_cast<int>(ports_.size()); }
  // The QP toward `peer` on sub-port `index`, made on first use (throws Error naming a bad peer or index).
  QueuePair& qp(int peer, int index);
  int qps_made() const;  // QPs made so far (a peer's QPs exist once traffic to or from it used them)
  // Port a QP currently sends on (its own sub-port unless migrated).
  int qp_port(int peer, int index) const;
  uint32_t qpn(int peer, int index) const {
    return common::rc_qpn(static_cast<uint32_t>(peer), static_cast<uint32_t>(index));
  }

 private:
  friend class EchAgent;
  struct Pending {
    uint64_t epoch;
    std::function<void()> issue;
  };
  // What the endpoint keeps toward one peer, made when it first talks to it (peer()): a rank that talks to a few
  // peers holds a few of these, not one per GPU of the fabric.
  struct PeerState {
    uint64_t epoch = 0;
    std::map<uint64_t, uint64_t> inflight;  // epoch -> work requests issued, not completed
    common::Fifo<Pending> waiting;
    std::vector<double> weights;  // per port
    std::vector<int> table;       // partial mode only: granule -> QP
    common::SmoothWrr swrr;       // weak mode small ops: QP by the weights
    int strong_qp = -1;
    std::vector<int> qp_port;                     // per QP index: the port it sends on
    std::vector<std::unique_ptr<QueuePair>> qps;  // per QP index, null until first used
    std::vector<uint64_t> queued;                 // per QP index: the ports whose active list holds it (bits)
  };
  struct PortState {
    std::deque<std::vector<uint8_t>> raw;  // frames queued by send_frame (ECH)
    std::deque<int> active;                // QP ids (peer * ports + index) with frames to send
    common::TimeNs paused_until = 0;
    bool wakeup_pending = false;
    bool qp_turn = false;  // raw and QP frames take turns while both wait
  };
  struct Op;
  void send_raw(PortState& ps, common::Port* p);

  OpHandle new_op(uint64_t* id);
  void finish_op(uint64_t id, const OpHandle& h);
  OpHandle fail_now(OpStatus status, std::string why);
  // The bookkeeping every posted transaction carries until its last work request completes.
  std::shared_ptr<Op> track(uint64_t id, const OpHandle& h);
  OpHandle raw_op(const char* what, int peer, int q, std::function<void(QueuePair&, WqeDone)> post);
  OpHandle atomic(const char* what, int peer, uint16_t window, uint64_t offset, bool cas, uint64_t compare,
                  uint64_t swap_or_add);
  const WindowInfo* remote_window(int peer, uint16_t window) const;
  std::string check_remote(int peer, uint16_t window, uint64_t offset, uint64_t len, bool atomic,
                           const WindowInfo** w) const;
  PeerState& peer_state(int p);  // made (weights, table, QP ports) on first use
  // FARE's weights toward `p` per port (1 each without a weight source).
  std::vector<double> peer_weights(int p) const;
  void refresh_peer(int peer);
  int pick_small(int peer, uint16_t window, uint64_t offset);
  // Runs `issue` now or once earlier epochs of `peer` drained; `wrs` work requests will report to done_wr().
  void submit(int peer, std::function<void()> issue);
  void wr_started(int peer, uint64_t epoch);
  void wr_done(int peer, uint64_t epoch);
  void drain_waiting(int peer);
  void post_store_parts(int peer, uint64_t epoch, uint64_t va, uint32_t rkey, const Payload& data, uint16_t window,
                        uint64_t offset, const std::shared_ptr<Op>& op, uint64_t turn = kNextTurn);
  OpHandle store_payload(int peer, uint16_t window, uint64_t offset, Payload data, const char* what,
                         uint64_t turn = kNextTurn);
  Payload payload_of(const void* src, size_t len) const;  // a copy of the source (nothing when payloads are elided)
  void post_load_parts(int peer, uint64_t epoch, uint8_t* dst, uint64_t va, uint32_t rkey, uint64_t len,
                       uint16_t window, uint64_t offset, const std::shared_ptr<Op>& op);
  WqeDone part_done(int peer, uint64_t epoch, const std::shared_ptr<Op>& op);
  void wake_qp(int qp_id);
  void make_qp(int peer, int q);
  // Bytes a peer wrote into our memory (an RC request executed, or a multicast replica written): the subscribers
  // hear of them, in window terms.
  void remote_written(int peer, uint32_t rkey, uint64_t va, uint64_t len);
  void kick(int port);
  void receive(int port, std::vector<uint8_t>&& frame);
  common::FrameHeaders headers_for(int peer, int qp_index, int port) const;

  common::Clock& clock_;
  EndpointConfig cfg_;
  std::vector<EndpointPort> ports_;
  std::vector<uint32_t> peer_ips_;
  SymmetricMemory memory_;
  std::vector<std::unique_ptr<PeerState>> peers_;        // [peer], null until first used
  std::vector<std::vector<WindowInfo>> remote_windows_;  // [peer]: its windows, as the window exchange gave them
  // Weak mode: where a multi-packet store's stripes start, advanced by one per store across all peers (a rotor per
  // peer started every peer's first store on the first QPs: few rows per peer then favoured the low planes).
  size_t stripe_rotor_ = 0;
  std::vector<PortState> port_state_;
  std::function<void(int, std::vector<double>*)> weight_source_;
  ConnectionManager cm_;
  std::shared_ptr<SubscriberList> subscribers_;  // shared with the subscriptions, which may outlive the endpoint
  std::unique_ptr<EchAgent> ech_;
  uint64_t ech_frames_sent_ = 0;
  uint64_t next_op_id_ = 1;
  // Ids of operations posted and not finished. They are posted in increasing order, so a ring of flags from the
  // oldest still outstanding answers quiet() in O(1) (a std::set took a tree node per store).
  class OutstandingOps {
   public:
    void insert(uint64_t id) {
      if (count_ == 0) {
        flags_.release_if_empty();
        first_ = id;
      }
      while (first_ + flags_.size() < id) {
        flags_.push_back(0);
      }
      flags_.push_back(1);
      ++count_;
    }
    void erase(uint64_t id) {
      if (id < first_ || id - first_ >= flags_.size() || flags_[id - first_] == 0) {
        return;
      }
      flags_[id - first_] = 0;
      --count_;
      while (!flags_.empty() && flags_.front() == 0) {
        flags_.pop_front();
        ++first_;
      }
    }
    bool empty() const { return count_ == 0; }
    uint64_t oldest() const { return first_; }  // when not empty

   private:
    uint64_t first_ = 0;
    common::Fifo<uint8_t> flags_;  // [id - first_]: 1 while outstanding
    size_t count_ = 0;
  };
  OutstandingOps outstanding_ops_;
  std::deque<std::pair<uint64_t, OpHandle>> quiet_waiters_;
  EndpointCounters counters_;
  std::shared_ptr<bool> alive_;
};

}  // namespace ifec::endpoint
