// The IFEC engine: what makes the switch an IFEC switch. It consumes ECH frames addressed to the switch and
// produces new ones through the switch's normal forwarding path.
//
// Reduction / AllReduce / barrier (standard ECH). A control API reserves a group (job, group id, members in
// contributor order, which of them receive the result, dtype, op, slot budget). Contributor c sends chunk j of
// its buffer as a WRITE ONLY with a standard ECH (chunk index = j, the group's per-switch chunk sequence; RETH VA =
// byte offset of the chunk in the collective buffer). The chunk lands in slot j % budget, keyed by
// (job, group, j), with a contributor bitmap so duplicates are ignored. Floats accumulate in fp32 (bf16/fp16 are
// cast once on the way out); the reproducible mode keeps every contribution and reduces in contributor order, so
// the result is bitwise the same whatever the arrival order. When the bitmap is full the result goes to every
// destination as a WRITE ONLY into its window (VA and rkey from the reservation), and the slot keeps a copy until
// every destination acknowledged it (an ECH ACK): a contributor that retransmits because its result was lost gets
// the copy again. Non-destination contributors (reduce) get an ECH ACK per accepted contribution. A slot that
// stays incomplete for slot_timeout_ns is released with the anomaly flag (to every member), so the endpoints can
// finish that chunk on the fallback path. NaN/Inf inputs are aggregated (they propagate) but flag the result.
//
// Multicast (compact ECH). A source sends a store with a destination bitmap and no reservation. The engine
// replicates it to every destination, rewriting IP destination, RETH VA and rkey from the destination's registered
// window, and acts as a transaction proxy: it gathers the destinations' ECH ACKs and sends the source one ACK.
// A retransmission from the source is repaired only toward destinations that have not acknowledged.
//
// Frames from the wrong job, for an unreserved group, or inconsistent with the reservation are dropped and counted.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "ifec/common/aeth.h"
#include "ifec/common/ech.h"
#include "ifec/common/frame.h"
#include "ifec/common/interfaces.h"
#include "ifec/common/numeric.h"

namespace ifec::switchemu {

struct IfecConfig {
  uint32_t slot_pool = 8192;                   // aggregation slots in this switch, shared by all groups
  uint32_t slot_bytes = 4096;                  // payload bytes one slot can hold (one chunk)
  common::TimeNs slot_timeout_ns = 2'000'000;  // incomplete slot -> released with the anomaly flag
  // A finished result not yet acknowledged by every destination is sent again to those that have not, after this
  // long (doubling, at most 8x), `result_retries` times; then the slot is reclaimed (a destination is gone).
  common::TimeNs result_retransmit_ns = 20'000;
  uint32_t result_retries = 8;
  bool reproducible = false;           // fixed contributor order instead of arrival order
  uint32_t multicast_entries = 65536;  // multicast packets held until every destination acknowledged
  // The slowest port's rate (set by the switch). A group's timers are at least a few times what its budget of
  // chunks takes to cross such a port, so slow links do not time out or resend what is merely queued.
  uint64_t port_rate_bps = 0;
};

struct GroupMember {
  bool local = true;         // contributes here (false: attached to another leaf of a two-tier plane)
  uint32_t ip = 0;           // the member's loopback
  uint64_t result_va = 0;    // VA of the collective buffer in the member's window (results land at +offset)
  uint32_t rkey = 0;         // the member's window rkey
  bool destination = false;  // receives the result
};

struct GroupReservation {
  uint32_t job = 1;
  uint16_t group = 0;
  common::EchOp op = common::EchOp::kAllReduce;
  common::EchDtype dtype = common::EchDtype::kFp32;
  common::EchRedOp redop = common::EchRedOp::kSum;
  uint16_t window = 0;               // the result window id (carried back in the result's ECH)
  uint32_t slots = 64;               // slot budget: chunks of this group in flight at once on this switch
  std::vector<GroupMember> members;  // contributor id = index, at most 64
  // Two-tier planes: a leaf aggregates its local members, then sends the partial to `upstream_ip` (a spine) as
  // contributor `upstream_contributor` of `upstream_group`, and forwards the spine's result to its local
  // destinations. Partials travel in fp32 (`upstream_fp32`, one rounding at the end) or in the element type
  // (half the bytes for bf16/fp16, one more rounding). 0: this switch is the aggregation root.
  uint32_t upstream_ip = 0;
  uint16_t upstream_group = 0;
  uint16_t upstream_contributor = 0;
  bool upstream_fp32 = true;
};

struct IfecCounters {
  uint64_t reservations = 0;
  uint64_t reservation_failures = 0;
  uint64_t contributions = 0;
  uint64_t duplicate_contributions = 0;
  uint64_t results_sent = 0;
  uint64_t result_resends = 0;   // results sent again: on a destination's retransmission or the result timer
  uint64_t implicit_acks = 0;    // a destination's next chunk in a slot, standing for its lost acknowledgement
  uint64_t late_notices = 0;     // anomaly notices for contributions to a chunk the slot already closed
  uint64_t slots_reclaimed = 0;  // results released without every destination's acknowledgement
  uint64_t chunks_skipped = 0;   // chunks a slot stopped waiting for (never arrived within the slot timeout)
  uint64_t acks_received = 0;
  uint64_t slots_completed = 0;
  uint64_t slot_busy_drops = 0;    // contribution for a slot still holding an unacknowledged older chunk (RNR NAKed)
  uint64_t unreserved_drops = 0;   // unknown (job, group): wrong job or never reserved
  uint64_t malformed_drops = 0;    // inconsistent with the reservation or not an ECH request at all
  uint64_t anomalies = 0;          // slots released incomplete after the timeout
  uint64_t non_finite_inputs = 0;  // NaN/Inf elements seen in contributions
  uint64_t multicast_packets = 0;
  uint64_t multicast_replicas = 0;
  uint64_t multicast_repairs = 0;  // replicas re-sent to destinations that had not acknowledged
  uint64_t multicast_completions = 0;
  uint64_t multicast_unknown_window = 0;
  uint64_t partials_sent = 0;     // leaf -> spine partial sums (two-tier planes)
  uint64_t partial_bytes = 0;     // their payload bytes
  uint64_t upstream_results = 0;  // spine results a leaf forwarded down
  uint64_t partial_resends = 0;   // partials a leaf sent again because the spine had not answered
};

class IfecEngine {
 public:
  using Emit = std::function<void(std::vector<uint8_t>&& frame)>;
  IfecEngine(common::Clock& clock, IfecConfig cfg, uint32_t switch_ip, Emit emit);

  // Control API (the testbed's stand-in for the switch's gRPC control plane).
  // Reserves `r.slots` slots for the group; false with `why` naming the problem (pool exhausted, bad member list).
  bool reserve(const GroupReservation& r, std::string* why);
  void release(uint32_t job, uint16_t group);
  // A GPU's window, for compact multicast's per-destination rewrite.
  void register_window(int gpu, uint32_t ip, uint16_t window, uint64_t va, uint32_t rkey, uint32_t job);

  // An ECH frame addressed to this switch.
  void receive(const common::ParsedFrame& pf, const uint8_t* frame);

  const IfecCounters& counters() const { return counters_; }
  uint32_t free_slots() const { return free_slots_; }
  uint32_t ip() const { return ip_; }

 private:
  // Slot i serves chunks i, i + budget, i + 2 budget, ... strictly in that order (`next`). After it closes (every
  // destination acknowledged, or reclaimed) it remembers the chunk and who acknowledged, so a late copy of that
  // chunk or an older one is answered, never aggregated into a fresh slot.
  struct Slot {
    bool busy = false;
    uint32_t chunk = 0;                // the chunk it holds (busy) or held last
    uint32_t next = 0;                 // the chunk it opens for next
    common::TimeNs knocked_since = 0;  // 1 + when a later chunk first asked for it while it waited for `next`
    uint64_t arrived = 0;              // contributor bitmap
    uint8_t expected = 0;              // contributors this chunk waits for (0: the group's local members)
    uint64_t acked = 0;                // bitmap of result acknowledgements
    uint64_t need = 0;                 // who must acknowledge before the slot is free
    bool complete = false;
    bool anomaly = false;
    bool timed_out = false;     // closed incomplete (anomaly notice instead of a result)
    uint32_t resends = 0;       // result timer rounds so far
    uint32_t busy_retries = 0;  // two-tier leaf: RNR NAKs from the spine for this chunk
    uint16_t elements = 0;
    uint64_t offset = 0;  // byte offset of the chunk in the collective buffer
    std::vector<common::Acc> acc;
    std::vector<std::vector<uint8_t>> parts;  // reproducible mode: each contributor's bytes
    std::vector<uint8_t> result;              // finished result, kept until acknowledged
    std::vector<uint8_t> partial;             // two-tier leaf: the partial sent upstream, kept for resends
    bool forwarded = false;                   // two-tier leaf: partial sent, waiting for the spine
    uint64_t generation = 0;                  // bumps on reuse, so stale timeout events do nothing
  };
  struct Group {
    GroupReservation r;
    common::TimeNs slot_timeout_ns = 0;  // the config's, or longer for a large budget on slow ports
    common::TimeNs result_rto_ns = 0;
    uint64_t all = 0;           // bitmap of every contributor
    uint64_t destinations = 0;  // bitmap of result destinations
    std::vector<Slot> slots;
  };
  struct Window {
    uint32_t ip = 0;
    uint64_t va = 0;
    uint32_t rkey = 0;
    uint32_t job = 0;
  };
  struct Multicast {
    uint32_t source_ip = 0;
    uint16_t source_id = 0;
    uint16_t window = 0;
    uint64_t offset = 0;
    uint32_t psn = 0;
    uint32_t job = 0;
    uint64_t pending = 0;  // destinations not yet acknowledged
    std::vector<uint8_t> payload;
  };

  void contribute(Group& g, const common::ParsedFrame& pf, const uint8_t* frame);
  void forward_partial(Group& g, Slot& s);
  void upstream_result(Group& g, const common::ParsedFrame& pf, const uint8_t* frame);
  void result_ack(Group& g, const common::ParsedFrame& pf);
  // Finishes a slot: casts the accumulators (reduced here, or already holding a spine's result when acc_ready)
  // and sends the result, or, when timed out, the anomaly notice.
  void complete(Group& g, Slot& s, bool timed_out, bool acc_ready = false);
  void send_result(Group& g, Slot& s, int member);
  void send_ech_ack(uint32_t dst_ip, const common::Ech& ech, uint32_t psn, uint16_t pkey);
  // RNR NAK: the contribution's slot still holds an older chunk; the sender retries after a short back-off.
  void send_ech_rnr(uint32_t dst_ip, const common::Ech& ech, uint32_t psn, uint16_t pkey);
  void maybe_free(Group& g, Slot& s);
  void close(Group& g, Slot& s);
  void arm_timeout(Group& g, Slot& s);
  void arm_result_timer(Group& g, Slot& s);
  // A contribution to a chunk this slot already closed (or an older one): acknowledge, ignore, or tell the member
  // its result is gone (anomaly notice) so it takes the result from another member or redoes the chunk.
  void late_contribution(Group& g, Slot& s, const common::ParsedFrame& pf);
  void send_notice(Group& g, int member, uint32_t chunk);
  void retry_partial_soon(Group& g, Slot& s);
  Slot* find_slot(uint64_t key, size_t index, uint64_t generation);
  void multicast(const common::ParsedFrame& pf, const uint8_t* frame);
  void multicast_ack(const common::ParsedFrame& pf);
  void send_replica(const Multicast& m, int dest);
  std::vector<uint8_t> build(uint32_t dst_ip, const common::Ech& ech, uint8_t opcode, uint32_t psn, uint16_t pkey,
                             const std::optional<common::Reth>& reth, const uint8_t* payload, size_t len,
                             common::Aeth aeth = common::Aeth::ack(0));

  common::Clock& clock_;
  IfecConfig cfg_;
  uint32_t ip_;
  Emit emit_;
  IfecCounters counters_;
  uint32_t free_slots_;
  std::map<uint64_t, Group> groups_;               // key: job << 16 | group
  std::map<uint64_t, uint64_t> leaf_of_upstream_;  // (job, upstream group) -> (job, local group) on a leaf
  std::map<std::pair<int, uint16_t>, Window> windows_;
  std::map<uint32_t, int> gpu_of_ip_;
  std::map<std::pair<uint32_t, uint32_t>, Multicast> mcast_;  // (source ip, psn)
  std::deque<std::pair<uint32_t, uint32_t>> mcast_done_;      // recently completed, to re-ACK late retransmissions
  std::set<std::pair<uint32_t, uint32_t>> mcast_done_set_;    // the same, for lookup
};

}  // namespace ifec::switchemu
