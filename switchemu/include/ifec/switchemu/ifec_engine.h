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

#include <array>
#include <bitset>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ifec/common/aeth.h"
#include "ifec/common/control.h"
#include "ifec/common/ech.h"
#include "ifec/common/frame.h"
#include "ifec/common/interfaces.h"
#include "ifec/common/numeric.h"
#include "ifec/routing/topology.h"

namespace ifec::switchemu {

using common::GroupMember;
using common::GroupReservation;
using common::IfecCounters;
using common::WindowRegistration;

class IfecEngine {
 public:
  // A frame the engine originates, and which of equal next hops it takes (Switch::inject): kSwitchChooses, the
  // switch's own per-packet choice, or a number the member follows. Everything about chunk c of group g (its result,
  // its ACKs, a partial upstream) follows c + g: on a Y-cable it travels the sub-link the endpoint sent the chunk's
  // contribution on ((c + g) mod n), whatever else the switch forwarded meanwhile. Multicast replicas take the
  // switch's own rotation: a GPU receiving many sources' packets at once (an MoE dispatch) needs them spread over
  // its sub-links, which the sources' PSNs do not do (pinned to them, the dispatch was 12% slower).
  static constexpr uint64_t kSwitchChooses = UINT64_MAX;
  using Emit = std::function<void(std::vector<uint8_t>&& frame, uint64_t spray)>;
  // `params`: the fabric's IFEC settings (topology file); `port_rate_bps`: the switch's slowest port, so a group's
  // timers are at least a few times what its budget of chunks takes to cross it (slow links do not time out or
  // resend what is merely queued).
  IfecEngine(common::Clock& clock, routing::IfecParams params, uint64_t port_rate_bps, uint32_t switch_ip, Emit emit);
  // How long a frame toward `dst_ip` queued now waits before it leaves this switch (its egress backlog at line
  // rate). Without it a multicast repair is always sent; with it, a repair toward a destination whose earlier
  // replica is still queued is held (the source timed out on the queue, not on a loss).
  using Backlog = std::function<common::TimeNs(uint32_t dst_ip)>;
  void set_backlog(Backlog backlog) { backlog_ = std::move(backlog); }
  // A simulation whose payloads are elided: slots, bitmaps and timers as always, but no arithmetic, and results,
  // partials and replicas go out elided (at their whole length).
  void set_elided_payloads(bool on) { elided_ = on; }
  // Margin after a replica leaves the queue for it to reach its GPU and the acknowledgement to come back.
  static constexpr common::TimeNs kRepairSlackNs = 5'000;

  // Control API (the testbed's stand-in for the switch's gRPC control plane).
  // Reserves `r.slots` slots for the group; false with `why` naming the problem (pool exhausted, bad member list).
  bool reserve(const GroupReservation& r, std::string* why);
  void release(uint32_t job, uint16_t group);
  // A GPU's window, for compact multicast's per-destination rewrite.
  void register_window(const WindowRegistration& w);

  // An ECH frame addressed to this switch.
  void receive(const common::ParsedFrame& pf, const uint8_t* frame);

  const IfecCounters& counters() const { return counters_; }
  uint32_t free_slots() const { return free_slots_; }
  // The groups reserved now (the control plane's `groups` listing).
  std::vector<GroupReservation> reservations() const;
  uint32_t ip() const { return ip_; }

 private:
  // One bit per member of a group (contributor id), as wide as any switch may be configured for.
  using Members = std::bitset<common::kMaxGroupMembers>;

  // Slot i serves chunks i, i + budget, i + 2 budget, ... strictly in that order (`next`). After it closes (every
  // destination acknowledged, or reclaimed) it remembers the chunk and who acknowledged, so a late copy of that
  // chunk or an older one is answered, never aggregated into a fresh slot.
  struct Slot {
    bool busy = false;
    uint32_t chunk = 0;                // the chunk it holds (busy) or held last
    uint32_t next = 0;                 // the chunk it opens for next
    common::TimeNs knocked_since = 0;  // 1 + when a later chunk first asked for it while it waited for `next`
    Members arrived;                   // contributor bitmap
    uint8_t expected = 0;              // contributors this chunk waits for (0: the group's local members)
    Members acked;                     // bitmap of result acknowledgements
    Members need;                      // who must acknowledge before the slot is free
    Members requested;                 // members asked to resend their contribution (request_missing)
    Members presumed_lost;             // members sent the result again for acknowledging a later one (once each)
    uint64_t completion = 0;           // the group's count of completed slots when this one completed
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
    Members all;           // bitmap of every contributor
    Members destinations;  // bitmap of result destinations
    std::vector<Slot> slots;
    std::vector<common::TimeNs> heard_at;  // per member: when a contribution or ACK of it last came here
    // Per member: when the result timer last resent a result to it. One resend per silent member per timeout (the
    // member's answer to it says whether it is gone or only late), not one per slot it has not acknowledged.
    std::vector<common::TimeNs> resent_at;
    // Per member: the latest chunk it contributed (-1: none yet). A member sends its chunks in order, so a slot
    // still missing its contribution for an older chunk lost it; one missing it for a later chunk is only late.
    std::vector<int64_t> latest;
    uint64_t completions = 0;  // slots completed so far
    // Per member: the latest completion (Slot::completion) whose result it acknowledged. Results go out in
    // completion order, so a member that acknowledged a later one lost this one's, unless it is still on its way.
    std::vector<uint64_t> acked_completion;
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
    uint16_t base = 0;  // the bitmap's first endpoint (ECH v2; 0 in v1)
    uint16_t window = 0;
    uint64_t offset = 0;
    uint32_t psn = 0;
    uint32_t job = 0;
    uint64_t pending = 0;    // destinations (base + bit) not yet acknowledged
    bool copy_seen = false;  // a copy the source sent again arrived (or made the entry): its completion says so
    std::vector<uint8_t> payload;
    // Per destination: when its replica should have been acknowledged at the earliest (left this switch's queue,
    // plus a round trip to the GPU); a repair before then is held.
    std::array<common::TimeNs, 64> due{};
  };

  void contribute(Group& g, const common::ParsedFrame& pf, const uint8_t* frame);
  // contribute()'s steps. Whether slot `s` takes the contribution of member `bit` now: not when it is late, when the
  // slot still holds an older chunk, or when an earlier chunk has not arrived (each answered here).
  bool slot_takes(Group& g, Slot& s, const common::ParsedFrame& pf, int c);
  void open_slot(Group& g, Slot& s, const common::ParsedFrame& pf);  // for the contribution's chunk, its timer armed
  // A contribution the slot already holds: its sender missed our answer (ACK, result, or the spine's).
  void repeat_contribution(Group& g, Slot& s, const common::ParsedFrame& pf, bool is_destination);
  // Adds a new contribution to the slot; the last one expected completes it (or goes upstream, on a leaf).
  void aggregate(Group& g, Slot& s, const common::ParsedFrame& pf, const uint8_t* frame, bool is_destination);
  void forward_partial(Group& g, Slot& s);
  void upstream_result(Group& g, const common::ParsedFrame& pf, const uint8_t* frame);
  void result_ack(Group& g, const common::ParsedFrame& pf);
  // Finishes a slot: casts the accumulators (reduced here, or already holding a spine's result when acc_ready)
  // and sends the result, or, when timed out, the anomaly notice.
  void complete(Group& g, Slot& s, bool timed_out, bool acc_ready = false);
  void send_result(Group& g, Slot& s, int member);
  // An ECH acknowledgement frame: an ACK, or with `aeth` an RNR NAK or a NAK; its ECH flags are `flags` (none, but
  // the retransmission flag on a multicast's completion once a copy of the packet has reached this switch).
  void send_ech_ack(uint32_t dst_ip, const common::Ech& ech, uint32_t psn, uint16_t pkey,
                    common::Aeth aeth = common::Aeth::ack(0), uint8_t flags = 0);
  // RNR NAK: the contribution's slot still holds an older chunk; the sender retries after a short back-off.
  void send_ech_rnr(uint32_t dst_ip, const common::Ech& ech, uint32_t psn, uint16_t pkey);
  // Asks each member slot `s` still waits for and that has contributed a later chunk (so lost this one) to send its
  // contribution again: a NAK (PSN sequence error) for the chunk, once per member per slot.
  void request_missing(Group& g, Slot& s, const common::ParsedFrame& pf);
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
  void send_replica(Multicast& m, int dest);
  std::vector<uint8_t> build(uint32_t dst_ip, const common::Ech& ech, uint8_t opcode, uint32_t psn, uint16_t pkey,
                             const std::optional<common::Reth>& reth, const uint8_t* payload, size_t len,
                             common::Aeth aeth = common::Aeth::ack(0));

  common::Clock& clock_;
  routing::IfecParams cfg_;
  uint64_t port_rate_bps_;
  uint32_t ip_;
  Emit emit_;
  Backlog backlog_;
  bool elided_ = false;
  IfecCounters counters_;
  uint32_t free_slots_;
  std::map<uint64_t, Group> groups_;               // key: job << 16 | group
  std::map<uint64_t, uint64_t> leaf_of_upstream_;  // (job, upstream group) -> (job, local group) on a leaf
  std::map<std::pair<int, uint16_t>, Window> windows_;
  std::map<uint32_t, int> gpu_of_ip_;
  // Keyed (source id << 32 | psn), looked up for every packet and acknowledgement among up to multicast_entries:
  // hashed, as nothing walks them in order.
  static uint64_t multicast_key(uint32_t source_id, uint32_t psn) { return uint64_t{source_id} << 32 | psn; }
  std::unordered_map<uint64_t, Multicast> mcast_;
  std::deque<uint64_t> mcast_done_;              // recently completed, to re-ACK late retransmissions
  std::unordered_set<uint64_t> mcast_done_set_;  // the same, for lookup
};

}  // namespace ifec::switchemu
