// The endpoint's half of the ECH protocol (docs/ifec-engine.md), beside the RC transport: it sends this endpoint's
// contributions to in-fabric reductions and its compact-ECH multicast packets, retransmits them (timers from
// measured round trips), backs off on RNR NAKs, checks every result and replica that arrives (rkey, bounds, job)
// before writing it, and acknowledges them. It speaks ECH operations (groups, chunks, packets, planes), never
// workload types: communicators decide what to reduce and multicast, and read the outcomes.
//
// Endpoint::receive hands every ECH frame (UDP 4793) to EchAgent::receive.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ifec/common/counters.h"
#include "ifec/common/ech.h"
#include "ifec/common/frame.h"
#include "ifec/common/interfaces.h"
#include "ifec/common/rtt.h"

namespace ifec::endpoint {

class Endpoint;

struct EchTiming {
  // Before round trips are measured: at least `initial_rto_ns`; then srtt + 4 rttvar (Jacobson; samples only from
  // packets sent once, Karn), at least `min_rto_ns`. Each timeout doubles it up to 8x (at most `max_rto_ns`).
  common::TimeNs initial_rto_ns = 100'000;
  common::TimeNs min_rto_ns = 20'000;
  common::TimeNs max_rto_ns = 800'000;
  int max_retries = 20;                  // then the chunk or packet is given up (the caller finishes it otherwise)
  common::TimeNs busy_retry_ns = 1'000;  // after an RNR NAK (slot busy), doubling to 8x; not counted as a try
  // A resent contribution the switch acknowledged as held (its slot waits for other members): the next resend after
  // EchAgent::kHeldWaits x max_rto_ns (a try); the result, or the slot timeout's notice, normally comes first.
};

enum class EchOutcome : uint8_t {
  kPending,
  kDone,     // contribution accepted (no result expected here), result written, or multicast completed
  kAnomaly,  // the switch sent an anomaly notice: the slot timed out, or this member's result was released
  kGivenUp,  // no answer within the retry budget, or its plane was given up
};
const char* ech_outcome_name(EchOutcome o);

// ---------------------------------------------------------------------------------------------- reduction --

// One lane: this endpoint's chunks toward one group on one switch, sent in sequence order.
struct EchLane {
  int plane = 0;
  uint32_t switch_ip = 0;  // the switch this endpoint contributes to (one tier: the plane's; two tier: its leaf)
  uint16_t group = 0;
  uint32_t window = 1;  // chunks in flight on this lane (at most the group's slot budget), when lanes are independent
  // This endpoint's member index in the lane's group (its ECH contributor id): a group lists only the members that
  // contribute at its switch, so the index can differ from plane to plane (two tier: the leaf's own GPUs).
  uint16_t contributor = 0;
};

struct EchChunk {
  uint32_t lane = 0;
  uint32_t seq = 0;  // ECH chunk index within the lane's group
  uint16_t elements = 0;
  uint8_t expected = 0;    // contributors of this chunk (ECH byte 17; 0: every member of the group)
  bool contribute = true;  // this endpoint sends a contribution: source window at source_offset
  uint64_t source_offset = 0;
  uint64_t reth_va = 0;  // the contribution's RETH VA: where the chunk sits in the result buffers
  bool receive = false;  // the result comes here: checked, written where its RETH says, acknowledged
};

struct EchReduceSpec {
  uint32_t job = 1;
  common::EchOp op = common::EchOp::kAllReduce;
  common::EchDtype dtype = common::EchDtype::kFp32;
  common::EchRedOp redop = common::EchRedOp::kSum;
  uint16_t source_window = 0;  // where contributions are read
  uint16_t result_window = 0;  // carried in the ECH: where results land (in place: the same window)
  std::vector<EchLane> lanes;
  std::vector<EchChunk> chunks;  // each lane's in sequence order
  // 0: lanes independent, each with its own window. > 0: contributions leave in the order listed, per plane, with
  // this many in flight (batches whose groups' slots take chunks in one global order: no deadlock).
  uint32_t shared_window = 0;
  EchTiming timing;
};

class EchAgent;

// Timeouts on a plane, one probe at a time (a reduction's chunks, a multicast's packets): when an item's timer runs
// out while another item's resend on its plane is out and unanswered, it waits for that answer (deferred) rather
// than go again, as TCP resends the head of its window, not all of it. The probe's answer (done, or held by a
// switch waiting for a late member) sends the oldest deferred item as the next probe (once the frames already
// received are handled: its own answer may be among them), as NewReno resends the next hole on a partial ACK: each
// overdue item goes once, a round trip apart, and a held one then waits for its result (lost items recovered a
// round trip apart, before a switch's slot times out; where a member the machine runs late holds every slot, one
// resend per chunk, not one per timeout). The switch also asks for a contribution it knows was lost (a NAK).
class PlaneProbes {
 public:
  void resize(size_t items) { deferred_flag_.assign(items, 0); }
  // The plane's probe, if any (kNone).
  uint32_t probe(int plane) const {
    auto it = probe_.find(plane);
    return it == probe_.end() ? kNone : it->second;
  }
  void set_probe(int plane, uint32_t item) { probe_[plane] = item; }
  void defer(int plane, uint32_t item) {
    if (!deferred_flag_[item]) {
      deferred_flag_[item] = 1;
      deferred_[plane].push_back(item);
    }
  }
  // The oldest deferred item on `plane` for which `pending(item)` holds (kNone: none), no longer deferred.
  template <class Pending>
  uint32_t take_deferred(int plane, Pending pending) {
    std::deque<uint32_t>& q = deferred_[plane];
    while (!q.empty()) {
      const uint32_t i = q.front();
      q.pop_front();
      deferred_flag_[i] = 0;
      if (pending(i)) {
        return i;
      }
    }
    return kNone;
  }
  static constexpr uint32_t kNone = ~0u;

 private:
  std::map<int, uint32_t> probe_;
  std::map<int, std::deque<uint32_t>> deferred_;
  std::vector<char> deferred_flag_;
};

// This endpoint's part of one in-fabric reduction (or batch of them), as it progresses.
class EchReduction {
 public:
  const EchReduceSpec& spec() const { return spec_; }
  EchOutcome outcome(size_t chunk) const { return outcome_[chunk]; }
  size_t pending() const { return pending_; }
  bool done() const { return pending_ == 0; }
  uint64_t anomalies() const { return anomalies_; }
  // Results written here that carried the anomaly flag (the switch met NaN/Inf in a contribution).
  uint64_t flagged_results() const { return flagged_results_; }
  // Gives up every pending chunk on `plane` (its link, or FARE lost a path to a member): nothing more is sent there.
  void give_up_plane(int plane, const std::string& why);
  void give_up_all(const std::string& why);
  // Why each plane was given up (first reason), for reports.
  const std::map<int, std::string>& planes_given_up() const { return planes_given_up_; }
  // Called once when nothing is pending, as its own event on the endpoint's clock.
  void on_done(std::function<void()> fn);

 private:
  friend class EchAgent;
  struct Lane {
    std::vector<uint32_t> chunks;  // indices into spec.chunks, in sequence order
    size_t next = 0;               // first not yet sent
    size_t base = 0;               // first not yet finished
    uint32_t inflight = 0;
    bool dead = false;
  };
  EchReduction(EchAgent& agent, EchReduceSpec spec, uint64_t id);
  void finish(size_t chunk, EchOutcome o);

  EchAgent& agent_;
  EchReduceSpec spec_;
  uint64_t id_;
  common::RttEstimator rtt_;
  std::map<int, common::TimeNs> progress_;  // per plane: when a chunk on it last completed (its result or ACK)
  PlaneProbes probes_;
  // Another chunk's resend on `plane` is out, pending and unanswered (no held ACK): `chunk`'s timeout waits for it.
  bool probing(int plane, uint32_t chunk) const;
  std::vector<EchOutcome> outcome_;
  std::vector<uint8_t> held_;  // the switch answered its latest resend as held (the result is still to come)
  std::vector<uint8_t> tries_;
  std::vector<uint8_t> busy_;
  std::vector<uint32_t> epoch_;
  std::vector<common::TimeNs> sent_ns_;
  std::vector<char> sent_;
  std::vector<Lane> lanes_;
  std::map<int, std::vector<uint32_t>> plane_queue_;  // shared_window: per plane, chunks to send in listed order
  std::map<int, size_t> plane_next_;
  std::map<int, uint32_t> plane_inflight_;
  // (lane, seq) -> chunk, looked up for every result frame: a flat vector per lane indexed by seq (seqs are the
  // chunk's position in its lane in every plan the communicator makes), a hash map for any other numbering.
  std::vector<std::vector<uint32_t>> chunk_of_seq_;
  std::unordered_map<uint64_t, uint32_t> chunk_of_other_;
  static constexpr uint32_t kNoChunk = ~0u;
  uint32_t chunk_of(uint32_t lane, uint32_t seq) const;  // kNoChunk when none
  std::unordered_map<uint64_t, uint32_t> lane_of_;       // (switch ip << 16 | group) -> lane
  size_t pending_ = 0;
  uint64_t anomalies_ = 0;
  uint64_t flagged_results_ = 0;
  std::map<int, std::string> planes_given_up_;
  std::function<void()> on_done_;
  bool done_reported_ = false;
};

// ---------------------------------------------------------------------------------------------- multicast --

struct EchPacket {
  int plane = 0;
  uint32_t switch_ip = 0;  // this endpoint's switch on that plane (it replicates)
  uint64_t offset = 0;     // in the window, at the source and every destination
  uint32_t len = 0;
  uint64_t bitmap = 0;  // destination endpoints: bit i is endpoint base + i
  uint16_t base = 0;    // past endpoint 63 the packet is ECH v2 (common/ech.h)
};

struct EchMulticastSpec {
  uint32_t job = 1;
  uint16_t window = 0;
  std::vector<EchPacket> packets;
  uint32_t window_per_plane = 256;  // packets in flight per plane
  EchTiming timing;
};

class EchMulticast {
 public:
  const EchMulticastSpec& spec() const { return spec_; }
  EchOutcome outcome(size_t packet) const { return outcome_[packet]; }
  size_t pending() const { return pending_; }
  bool done() const { return pending_ == 0; }
  uint32_t first_psn() const { return first_psn_; }  // packet i travels with PSN first_psn + i (24 bits)
  void give_up_plane(int plane, const std::string& why);
  const std::map<int, std::string>& planes_given_up() const { return planes_given_up_; }
  void on_done(std::function<void()> fn);

 private:
  friend class EchAgent;
  EchMulticast(EchAgent& agent, EchMulticastSpec spec, uint64_t id, uint32_t first_psn);
  void finish(size_t packet, EchOutcome o);

  EchAgent& agent_;
  EchMulticastSpec spec_;
  uint64_t id_;
  uint32_t first_psn_;
  common::RttEstimator rtt_;
  std::map<int, common::TimeNs> progress_;  // per plane: when a packet on it last completed (the switch's ACK)
  PlaneProbes probes_;                      // as a reduction's chunks: one resend per plane out at a time
  bool probing(int plane, uint32_t packet) const {
    const uint32_t p = probes_.probe(plane);
    return p != PlaneProbes::kNone && p != packet && outcome_[p] == EchOutcome::kPending;
  }
  std::vector<EchOutcome> outcome_;
  std::vector<uint8_t> tries_;
  std::vector<common::TimeNs> sent_ns_;
  std::vector<char> sent_;
  std::map<int, std::vector<uint32_t>> queue_;  // per plane, packets in order
  std::map<int, size_t> next_;
  std::map<int, uint32_t> inflight_;
  size_t pending_ = 0;
  std::map<int, std::string> planes_given_up_;
  std::function<void()> on_done_;
  bool done_reported_ = false;
};

// ------------------------------------------------------------------------------------------------- agent --

// clang-format off
#define IFEC_ECH_COUNTERS(X)                                                                            \
  X(contributions_sent, "")                                                                             \
  X(retransmissions, "")                                                                                \
  X(retransmit_bytes, "frame bytes of the contributions and multicast packets sent again")              \
  X(results_written, "")                                                                                \
  X(duplicate_results, "results or replicas that had landed already (acknowledged again)")              \
  X(duplicate_ack_bytes, "frame bytes of the ACKs answering copies that had landed already")            \
  X(protection_drops, "failed the rkey/bounds/job check (or wrong size): never written, never acked")   \
  X(anomaly_notices, "")                                                                                \
  X(busy_naks, "")                                                                                      \
  X(held_acks, "ACKs of resent contributions the switch holds for a result still to come: waited for")  \
  X(resend_requests, "NAKs from the switch for a contribution it lacks while it has later ones: sent again")  \
  X(multicast_sent, "")                                                                                 \
  X(late_multicast_originals, "multicast packets sent again whose original completed before the copy came")  \
  X(replicas_written, "")                                                                               \
  X(stale_replicas, "replicas from an earlier multicast of their source (acknowledged, not written)")   \
  X(duplicate_replicas, "replicas of the current multicast written again (a repair): not new arrivals") \
  X(unmatched, "ECH for no reduction or multicast in progress here (late copies)")                      \
  X(early_results, "results of a group not started here yet: kept for when it starts, unacknowledged until then") \
  X(early_results_taken, "early results the reduction took when it started here")
// clang-format on

struct EchCounters {
  IFEC_COUNTER_SET(EchCounters, IFEC_ECH_COUNTERS)
};

class EchAgent {
 public:
  explicit EchAgent(Endpoint& ep);
  ~EchAgent();
  EchAgent(const EchAgent&) = delete;
  EchAgent& operator=(const EchAgent&) = delete;

  // Starts this endpoint's part of a reduction; the handle reports per-chunk outcomes. Throws common::Error naming
  // the problem for a spec that cannot be right (unknown lane, chunk too large, window missing).
  std::shared_ptr<EchReduction> reduce(EchReduceSpec spec);
  // Sends packets as compact-ECH multicast through this endpoint's plane switches.
  std::shared_ptr<EchMulticast> multicast(EchMulticastSpec spec);
  // Replicas of `source` into `window` with PSNs before `psn_from` (mod 2^24) are stale: an earlier multicast's.
  void accept_multicast(uint16_t window, int source, uint32_t psn_from);
  // The PSN the next multicast's first packet will carry (sources publish it so destinations can call the above).
  uint32_t next_psn() const { return next_psn_; }
  // A replay starts where a traced operation found it (a packet's sub-link follows its PSN).
  void set_next_psn(uint32_t psn) { next_psn_ = psn & 0xFFFFFF; }

  // Every ECH frame this endpoint receives.
  void receive(int port, const common::ParsedFrame& pf, const uint8_t* frame);

  const EchCounters& counters() const { return counters_; }
  // Fault injection (tests): contributions are built and timed as usual but never leave this endpoint, as if every
  // one were lost on its first link (a contributor that never arrives).
  void suppress_contributions(bool on) { suppress_contributions_ = on; }
  // A live port of this endpoint on `plane` (salt spreads frames over a Y-cable's sub-ports), or -1.
  int port_for(int plane, uint32_t salt) const;

 private:
  friend class EchReduction;
  friend class EchMulticast;

  common::Clock& clock();
  void pump(EchReduction& r);
  void send_contribution(EchReduction& r, size_t chunk, bool retransmit);
  void arm(EchReduction& r, size_t chunk, common::TimeNs delay, bool counts_as_try);
  void arm(EchMulticast& m, size_t packet, common::TimeNs delay);
  // `i` was answered (done, or held): if it was its plane's probe, the oldest item that waited on it goes again,
  // the next probe (PlaneProbes), once the frames at hand are handled (resend_next_waiting).
  void probe_answered(EchReduction& r, size_t i);
  void probe_answered(EchMulticast& m, size_t i);
  template <class Op, class Resend>
  void resend_next_waiting(Op& op, int plane, uint32_t answered, Resend resend);
  void pump(EchMulticast& m);
  void send_packet(EchMulticast& m, size_t packet, bool retransmit);
  // A held contribution's next resend waits this many longest timeouts: past the switch's slot timeout (2 ms
  // simulated against 800 us; 500 ms live against 800 ms), whose notice ends a chunk a member never joined.
  static constexpr int kHeldWaits = 4;
  std::string no_answer(int plane, int tries) const;  // why a plane whose resends went unanswered is given up
  static common::TimeNs rto(const common::RttEstimator& rtt, const EchTiming& t, int tries);
  void on_reduce_frame(int port, const common::ParsedFrame& pf, const uint8_t* frame);
  void on_compact_frame(int port, const common::ParsedFrame& pf, const uint8_t* frame);
  bool write_checked(const common::ParsedFrame& pf, const uint8_t* frame);
  // An ECH ACK of `pf`; a compact one names this endpoint as its destination.
  size_t send_ack(int port, const common::ParsedFrame& pf);  // returns the ACK's frame bytes
  common::FrameHeaders headers(int port, uint32_t dst_ip, uint16_t entropy, uint8_t opcode, uint16_t pkey,
                               uint32_t psn) const;
  template <typename Fn>
  void later(common::TimeNs delay, uint64_t id, Fn fn);
  void prune();

  Endpoint& ep_;
  EchCounters counters_;
  uint64_t next_id_ = 1;
  uint32_t next_psn_ = 0;
  // Live operations by id (weak: the caller owns them); lookups from (switch ip, job, group) and from PSN.
  std::map<uint64_t, std::weak_ptr<EchReduction>> reductions_;
  // Looked up for every reduction frame, among a group per destination and plane (2,048 at EP 256): hashed, as
  // nothing walks them in order.
  using GroupKey = std::tuple<uint32_t, uint32_t, uint16_t>;  // (switch ip, job, group)
  struct GroupKeyHash {
    size_t operator()(const GroupKey& k) const {
      return std::hash<uint64_t>()((uint64_t{std::get<0>(k)} << 32 | std::get<1>(k)) * 0x9E3779B97F4A7C15ULL ^
                                   std::get<2>(k));
    }
  };
  std::unordered_map<GroupKey, uint64_t, GroupKeyHash> reduction_of_group_;
  // When each group was last active here and how long a late copy of its results can still come (see
  // note_group); swept of stale entries whenever it has doubled since the last sweep (at least kGroupsRemembered).
  static constexpr size_t kGroupsRemembered = 4096;
  std::unordered_map<GroupKey, std::pair<common::TimeNs, common::TimeNs>, GroupKeyHash> group_activity_;
  size_t next_group_sweep_ = kGroupsRemembered;
  void note_group(const GroupKey& k, common::TimeNs max_rto_ns);
  bool recently_used(const GroupKey& k);
  // Results for a group this endpoint has not started yet (its peers began the operation first): kept (at most
  // kEarlyFrames) for the reduction that starts it here, which takes those younger than four of its longest
  // timeouts. Left to the switch, such a result comes again only once this endpoint has gone quiet for the group's
  // result timeout: hundreds of milliseconds on a slow link, while everything else of the operation is done.
  static constexpr size_t kEarlyFrames = 1024;
  struct EarlyFrame {
    int port;
    common::TimeNs at;
    common::ParsedFrame pf;
    std::vector<uint8_t> bytes;
  };
  std::unordered_map<GroupKey, std::vector<EarlyFrame>, GroupKeyHash> early_;
  size_t early_frames_ = 0;
  void keep_early(const GroupKey& k, int port, const common::ParsedFrame& pf, const uint8_t* frame);
  void take_early(uint64_t reduction_id);
  std::map<uint64_t, std::weak_ptr<EchMulticast>> multicasts_;
  std::unordered_map<uint32_t, std::pair<uint64_t, uint32_t>> packet_of_psn_;  // psn -> (multicast id, packet)
  std::map<uint64_t, std::pair<uint32_t, uint32_t>> psn_range_;                // multicast id -> (first psn, packets)
  // Keyed (window << 32 | source), looked up for every replica.
  static uint64_t source_key(uint16_t window, int source) { return uint64_t{window} << 32 | uint32_t(source); }
  std::unordered_map<uint64_t, uint32_t> accept_from_;  // -> the oldest current PSN
  // (window, source) -> PSNs of the current multicast already written here: a repaired (duplicate) replica is
  // written and acknowledged again but not reported as a new arrival (it could land after the operation ended and
  // be taken for the next one's bytes).
  std::unordered_map<uint64_t, std::unordered_set<uint32_t>> replicas_seen_;
  bool suppress_contributions_ = false;
  std::shared_ptr<bool> alive_;
};

}  // namespace ifec::endpoint
