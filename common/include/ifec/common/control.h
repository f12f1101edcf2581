// The control plane: the one interface through which workloads reach switches (reserve and release IFEC groups,
// register windows for multicast, read slots, counters and FARE's weights, set link state). Every call answers
// asynchronously, never inside the call itself, with an error as a value that names the switch and the reason, so a
// network hop (the live testbed's gRPC) fits behind the same calls as the simulator's in-process implementation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ifec/common/counters.h"
#include "ifec/common/ech.h"

namespace ifec::common {

struct GroupMember {
  bool local = true;         // contributes here (false: attached to another leaf of a two-tier plane)
  uint32_t ip = 0;           // the member's loopback
  uint64_t result_va = 0;    // VA of the collective buffer in the member's window (results land at +offset)
  uint32_t rkey = 0;         // the member's window rkey
  bool destination = false;  // receives the result
};

// A group's members at most on any switch: ECH's expected-contributor byte counts up to 255 (0: every member). A
// switch keeps contributors and acknowledgements in bitmaps this wide; how many members it accepts is its
// configuration (routing::IfecParams::max_group_members, 64 by default).
constexpr size_t kMaxGroupMembers = 256;

struct GroupReservation {
  uint32_t job = 1;
  uint16_t group = 0;
  EchOp op = EchOp::kAllReduce;
  EchDtype dtype = EchDtype::kFp32;
  EchRedOp redop = EchRedOp::kSum;
  uint16_t window = 0;  // the result window id (carried back in the result's ECH)
  uint32_t slots = 64;  // slot budget: chunks of this group in flight at once on this switch
  // Contributor id = index, at most kMaxGroupMembers. The communicator lists a switch's own GPUs (two-tier leaf:
  // the GPUs under it, so a GPU's id differs per plane); members not local stay listed, but do not contribute here.
  std::vector<GroupMember> members;
  // Two-tier planes: a leaf aggregates its local members, then sends the partial to `upstream_ip` (a spine) as
  // contributor `upstream_contributor` of `upstream_group`, and forwards the spine's result to its local
  // destinations. Partials travel in fp32 (`upstream_fp32`, one rounding at the end) or in the element type
  // (half the bytes for bf16/fp16, one more rounding). 0: this switch is the aggregation root.
  uint32_t upstream_ip = 0;
  uint16_t upstream_group = 0;
  uint16_t upstream_contributor = 0;
  bool upstream_fp32 = true;
};

// A GPU's window as a switch needs it to rewrite a compact-ECH multicast replica toward that GPU.
struct WindowRegistration {
  int gpu = 0;
  uint32_t ip = 0;
  uint16_t window = 0;
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t job = 0;
};

// clang-format off
#define IFEC_IFEC_COUNTERS(X)                                                                                \
  X(reservations, "")                                                                                        \
  X(reservation_failures, "")                                                                                \
  X(contributions, "")                                                                                       \
  X(duplicate_contributions, "")                                                                             \
  X(held_answers, "a destination's resent contribution to a slot still waiting for others: ACKed as held")  \
  X(resend_requests, "NAKs asking a member for a contribution it skipped (it sent later chunks): lost")       \
  X(results_sent, "")                                                                                        \
  X(result_resends, "results sent again: on a destination's retransmission or the result timer")             \
  X(lost_results, "results sent again to a member that acknowledged a later one (so lost this one)")         \
  X(implicit_acks, "a destination's next chunk in a slot, standing for its lost acknowledgement")            \
  X(late_notices, "anomaly notices for contributions to a chunk the slot already closed")                    \
  X(slots_reclaimed, "results released without every destination's acknowledgement")                         \
  X(chunks_skipped, "chunks a slot stopped waiting for (never arrived within the slot timeout)")             \
  X(acks_received, "")                                                                                       \
  X(slots_completed, "")                                                                                     \
  X(slot_busy_drops, "contribution for a slot still holding an unacknowledged older chunk (RNR NAKed)")      \
  X(unreserved_drops, "unknown (job, group): wrong job or never reserved")                                   \
  X(malformed_drops, "inconsistent with the reservation or not an ECH request at all")                       \
  X(anomalies, "slots released incomplete after the timeout")                                                \
  X(non_finite_inputs, "NaN/Inf elements seen in contributions")                                             \
  X(multicast_packets, "")                                                                                   \
  X(multicast_replicas, "")                                                                                  \
  X(multicast_repairs, "replicas re-sent to destinations that had not acknowledged")                         \
  X(multicast_repairs_held, "repairs not sent: the earlier replica to that destination was still queued "    \
      "here (or had only just left), so the source's timeout came from the queue, not a loss; a copy would " \
      "only lengthen that queue")                                                                            \
  X(multicast_completions, "")                                                                               \
  X(multicast_unknown_window, "")                                                                            \
  X(partials_sent, "leaf -> spine partial sums (two-tier planes)")                                           \
  X(partial_bytes, "their payload bytes")                                                                    \
  X(upstream_results, "spine results a leaf forwarded down")                                                 \
  X(partial_resends, "partials a leaf sent again because the spine had not answered")
// clang-format on

struct IfecCounters {
  IFEC_COUNTER_SET(IfecCounters, IFEC_IFEC_COUNTERS)
};

// One member of a switch's WECMP group toward a destination: the port and its FARE weight (the path bandwidth
// assigned to that sub-link, Gb/s; weights need not sum to anything).
struct PortWeight {
  int port = 0;
  double gbps = 0;
};

// What went wrong at a switch (or on the way to it): which switch, and why, in words a user can act on.
struct ControlError {
  std::string target;  // the switch's name (topology node), or the link
  std::string reason;
  std::string message() const { return target + ": " + reason; }
};

// A control-plane answer: nullopt error = success.
template <typename T>
struct ControlReply {
  T value{};
  std::optional<ControlError> error;
  bool ok() const { return !error.has_value(); }
};
using ControlStatus = std::optional<ControlError>;

class ControlPlane {
 public:
  using Done = std::function<void(const ControlStatus&)>;
  virtual ~ControlPlane() = default;

  // Reserves `r.slots` aggregation slots for group (r.job, r.group) on switch `sw` (its topology name).
  virtual void reserve(const std::string& sw, const GroupReservation& r, Done done) = 0;
  // Frees a group's slots (releasing one that is not reserved is not an error).
  virtual void release(const std::string& sw, uint32_t job, uint16_t group, Done done) = 0;
  // Tells switch `sw` where GPU w.gpu's window w.window lives (multicast's per-destination rewrite).
  virtual void register_window(const std::string& sw, const WindowRegistration& w, Done done) = 0;
  // Aggregation slots switch `sw` has free.
  virtual void free_slots(const std::string& sw, std::function<void(const ControlReply<uint32_t>&)> done) = 0;
  // The IFEC engine's counters of switch `sw`.
  virtual void counters(const std::string& sw, std::function<void(const ControlReply<IfecCounters>&)> done) = 0;
  // Takes topology link `link` down or up (FARE reconverges after it).
  virtual void set_link_state(int link, bool up, Done done) = 0;
  // FARE's WECMP group at switch `sw` toward GPU `dest_gpu` as the switch forwards now (empty: no route).
  virtual void fare_weights(const std::string& sw, int dest_gpu,
                            std::function<void(const ControlReply<std::vector<PortWeight>>&)> done) = 0;
};

}  // namespace ifec::common
