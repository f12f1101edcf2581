// IFEC engine: in-switch aggregation slots, result copies until acknowledged, anomaly timeouts, and the
// multicast transaction proxy.
#include "ifec/switchemu/ifec_engine.h"

#include <algorithm>
#include <sstream>

#include "ifec/common/checks.h"
#include "ifec/common/protocol.h"

namespace ifec::switchemu {

using common::Ech;
using common::EchFormat;
using common::EchOp;
using common::Opcode;

namespace {

constexpr size_t kMulticastDoneMemory = 4096;
constexpr common::TimeNs kPartialRetryNs = 1'000;  // a partial the spine refused (slot busy) goes again after 1-8 us

uint64_t group_key(uint32_t job, uint16_t group) { return (uint64_t{job} << 16) | group; }

}  // namespace

std::vector<GroupReservation> IfecEngine::reservations() const {
  std::vector<GroupReservation> out;
  for (const auto& [key, g] : groups_) {
    out.push_back(g.r);
  }
  return out;
}

IfecEngine::IfecEngine(common::Clock& clock, routing::IfecParams params, uint64_t port_rate_bps, uint32_t switch_ip,
                       Emit emit)
    : clock_(clock),
      cfg_(params),
      port_rate_bps_(port_rate_bps),
      ip_(switch_ip),
      emit_(std::move(emit)),
      free_slots_(params.slot_pool) {}

bool IfecEngine::reserve(const GroupReservation& r, std::string* why) {
  std::ostringstream os;
  const uint64_t key = group_key(r.job, r.group);
  if (groups_.count(key)) {
    os << "group " << r.group << " of job " << r.job << " is already reserved";
  } else if (r.members.size() < (r.upstream_ip != 0 ? 1 : 2) || r.members.size() > cfg_.max_group_members) {
    // A leaf may hold a single member of a two-tier group (it still sends its partial upstream).
    os << "group " << r.group << " has " << r.members.size() << " members, expected " << (r.upstream_ip != 0 ? 1 : 2)
       << ".." << cfg_.max_group_members;
  } else if (r.slots == 0) {
    os << "group " << r.group << " asks for 0 slots";
  } else if (r.slots > free_slots_) {
    os << "slot pool exhausted: group " << r.group << " asks for " << r.slots << " slots, " << free_slots_ << " of "
       << cfg_.slot_pool << " free";
  } else if (r.op != EchOp::kReduce && r.op != EchOp::kAllReduce && r.op != EchOp::kBarrier) {
    os << "group " << r.group << ": operation " << common::ech_op_name(r.op) << " needs no reservation";
  }
  if (!os.str().empty()) {
    counters_.reservation_failures++;
    if (why != nullptr) {
      *why = os.str();
    }
    return false;
  }
  Group g;
  g.r = r;
  // What the group's whole budget of chunks takes to cross the slowest port, four times over.
  const common::TimeNs drain =
      port_rate_bps_ > 0 ? static_cast<common::TimeNs>(4.0 * r.slots * cfg_.slot_bytes * 8e9 / port_rate_bps_) : 0;
  g.slot_timeout_ns = std::max(cfg_.slot_timeout_ns, drain);
  g.result_rto_ns = std::max(cfg_.result_retransmit_ns, drain / 4);
  g.heard_at.assign(r.members.size(), 0);
  g.resent_at.assign(r.members.size(), 0);
  g.latest.assign(r.members.size(), -1);
  g.acked_completion.assign(r.members.size(), 0);
  for (size_t i = 0; i < r.members.size(); ++i) {
    if (!r.members[i].local) {
      continue;  // another leaf aggregates it
    }
    g.all.set(i);
    if (r.members[i].destination) {
      g.destinations.set(i);
    }
  }
  if (g.all.none()) {
    counters_.reservation_failures++;
    if (why != nullptr) {
      *why = "group " + std::to_string(r.group) + " has no member on this switch";
    }
    return false;
  }
  if (r.upstream_ip != 0) {
    leaf_of_upstream_[group_key(r.job, r.upstream_group)] = key;
  }
  g.slots.resize(r.slots);
  for (uint32_t i = 0; i < r.slots; ++i) {
    g.slots[i].next = i;  // slot i takes chunks i, i + budget, i + 2 budget, ... in that order
  }
  free_slots_ -= r.slots;
  counters_.reservations++;
  groups_.emplace(key, std::move(g));
  return true;
}

void IfecEngine::release(uint32_t job, uint16_t group) {
  auto it = groups_.find(group_key(job, group));
  if (it != groups_.end()) {
    if (it->second.r.upstream_ip != 0) {
      leaf_of_upstream_.erase(group_key(job, it->second.r.upstream_group));
    }
    free_slots_ += static_cast<uint32_t>(it->second.slots.size());
    groups_.erase(it);
  }
}

void IfecEngine::register_window(const WindowRegistration& w) {
  windows_[{w.gpu, w.window}] = Window{w.ip, w.va, w.rkey, w.job};
  gpu_of_ip_[w.ip] = w.gpu;
}

void IfecEngine::receive(const common::ParsedFrame& pf, const uint8_t* frame) {
  const Ech& ech = *pf.h.ech;
  const uint8_t opcode = pf.h.bth.opcode;
  if (ech.format == EchFormat::kCompact) {
    if (opcode == static_cast<uint8_t>(Opcode::kWriteOnly)) {
      multicast(pf, frame);
    } else if (opcode == static_cast<uint8_t>(Opcode::kAcknowledge)) {
      multicast_ack(pf);
    } else {
      counters_.malformed_drops++;
    }
    return;
  }
  auto up = leaf_of_upstream_.find(group_key(ech.job_id, ech.group_id));
  if (up != leaf_of_upstream_.end() && pf.h.ip.src == groups_.at(up->second).r.upstream_ip) {
    upstream_result(groups_.at(up->second), pf, frame);  // the spine answering this leaf
    return;
  }
  auto it = groups_.find(group_key(ech.job_id, ech.group_id));
  if (it == groups_.end()) {
    counters_.unreserved_drops++;  // never reserved, released, or another job's group id
    return;
  }
  if (common::job_of_pkey(pf.h.bth.pkey) != (ech.job_id & common::kMaxJob)) {
    counters_.unreserved_drops++;  // the frame's partition is not the job it names
    return;
  }
  Group& g = it->second;
  if (ech.contributor_id >= g.r.members.size() || ech.op != g.r.op) {
    counters_.malformed_drops++;
    return;
  }
  if (opcode == static_cast<uint8_t>(Opcode::kAcknowledge)) {
    result_ack(g, pf);
  } else if (opcode == static_cast<uint8_t>(Opcode::kWriteOnly)) {
    contribute(g, pf, frame);
  } else {
    counters_.malformed_drops++;
  }
}

bool IfecEngine::slot_takes(Group& g, Slot& s, const common::ParsedFrame& pf, int c) {
  const Ech& ech = *pf.h.ech;
  const uint32_t chunk = ech.chunk_index;
  if (s.busy ? chunk < s.chunk : chunk < s.next) {
    late_contribution(g, s, pf);
    return false;
  }
  if (s.busy && chunk != s.chunk) {
    // A later chunk for this slot. Members send chunk j + budget only once they finished chunk j, so this
    // contribution stands for the member's acknowledgement of the older chunk, which may have been lost.
    if (s.complete && s.need.test(c) && !s.acked.test(c)) {
      s.acked.set(c);
      counters_.implicit_acks++;
      maybe_free(g, s);
    }
    if (s.busy) {
      counters_.slot_busy_drops++;  // the older chunk still waits for acknowledgements: the sender retries soon
      send_ech_rnr(g.r.members[c].ip, ech, pf.h.bth.psn, pf.h.bth.pkey);
      return false;
    }
  }
  if (!s.busy && chunk > s.next) {
    // Not its turn: the slot takes its chunks in order, and an earlier one has not arrived. If that one never
    // comes (every contributor of it gave up) the slot skips ahead after the slot timeout; late copies of what it
    // skipped get anomaly notices.
    const common::TimeNs now = clock_.now();
    if (s.knocked_since == 0) {
      s.knocked_since = now + 1;
    }
    if (now + 1 - s.knocked_since < g.slot_timeout_ns) {
      counters_.slot_busy_drops++;
      send_ech_rnr(g.r.members[c].ip, ech, pf.h.bth.psn, pf.h.bth.pkey);
      return false;
    }
    counters_.chunks_skipped += (chunk - s.next) / g.slots.size();
    s.next = chunk;
  }
  return true;
}

void IfecEngine::open_slot(Group& g, Slot& s, const common::ParsedFrame& pf) {
  const Ech& ech = *pf.h.ech;
  s.busy = true;
  s.knocked_since = 0;
  s.timed_out = false;
  s.resends = 0;
  s.busy_retries = 0;
  s.chunk = ech.chunk_index;
  s.arrived.reset();
  s.expected = ech.expected;
  s.acked.reset();
  s.requested.reset();
  s.presumed_lost.reset();
  s.complete = false;
  s.anomaly = false;
  s.elements = ech.element_count;
  s.offset = pf.h.reth->virtual_address;
  s.acc.assign(s.elements, common::Acc{});
  s.parts.assign(cfg_.reproducible ? g.r.members.size() : 0, {});
  s.result.clear();
  s.partial.clear();
  s.forwarded = false;
  s.generation++;
  arm_timeout(g, s);
}

void IfecEngine::repeat_contribution(Group& g, Slot& s, const common::ParsedFrame& pf, bool is_destination) {
  const Ech& ech = *pf.h.ech;
  const int c = ech.contributor_id;
  counters_.duplicate_contributions++;
  if (s.forwarded && !s.complete) {
    forward_partial(g, s);  // its sender never heard back: the spine may have lost our partial
  }
  if (s.complete && is_destination) {
    counters_.result_resends++;
    send_result(g, s, c);  // its copy of the result was lost
    return;
  }
  // Not a destination: its contribution's acknowledgement was lost. A destination whose chunk still waits for other
  // members (or the spine): held, as each hop of a reliable aggregation tree acknowledges what it holds; the result
  // comes when they have contributed, or a notice at the slot timeout, and its sender stops resending meanwhile.
  if (is_destination) {
    counters_.held_answers++;
    request_missing(g, s, pf);
  }
  send_ech_ack(g.r.members[c].ip, ech, pf.h.bth.psn, pf.h.bth.pkey);
}

void IfecEngine::request_missing(Group& g, Slot& s, const common::ParsedFrame& pf) {
  if (s.expected > 0 || s.forwarded) {
    return;  // any `expected` of the members will do, or only the spine's result is missing
  }
  for (size_t m = 0; m < g.r.members.size(); ++m) {
    if (g.all.test(m) && !s.arrived.test(m) && !s.requested.test(m) && g.latest[m] > int64_t{s.chunk}) {
      s.requested.set(m);
      counters_.resend_requests++;
      Ech e = *pf.h.ech;
      e.contributor_id = static_cast<uint16_t>(m);
      send_ech_ack(g.r.members[m].ip, e, s.chunk & 0xFFFFFF, pf.h.bth.pkey,
                   common::Aeth::nak(common::NakCode::kPsnSequenceError, 0));
    }
  }
}

void IfecEngine::aggregate(Group& g, Slot& s, const common::ParsedFrame& pf, const uint8_t* frame,
                           bool is_destination) {
  const Ech& ech = *pf.h.ech;
  const int c = ech.contributor_id;
  counters_.contributions++;
  if (!pf.elided) {
    const uint8_t* payload = frame + pf.payload_offset;
    const size_t non_finite = common::count_non_finite(g.r.dtype, payload, s.elements);
    if (non_finite > 0) {
      counters_.non_finite_inputs += non_finite;
      s.anomaly = true;  // aggregated anyway (NaN propagates), but the result carries the flag
    }
    if (cfg_.reproducible) {
      s.parts[c].assign(payload, payload + s.elements * common::ech_dtype_size(g.r.dtype));
    } else if (s.elements > 0) {
      common::accumulate(g.r.dtype, g.r.redop, s.acc.data(), payload, s.elements, s.arrived.none());
    }
  }
  s.arrived.set(c);
  if (!is_destination) {
    send_ech_ack(g.r.members[c].ip, ech, pf.h.bth.psn, pf.h.bth.pkey);
  }
  s.expected = std::max(s.expected, ech.expected);
  const bool full = s.expected > 0 ? s.arrived.count() >= s.expected : s.arrived == g.all;
  if (full) {
    if (g.r.upstream_ip != 0) {
      forward_partial(g, s);
      arm_result_timer(g, s);  // resends the partial until the spine answers
    } else {
      complete(g, s, false);
    }
  }
}

void IfecEngine::contribute(Group& g, const common::ParsedFrame& pf, const uint8_t* frame) {
  const Ech& ech = *pf.h.ech;
  if (ech.dtype != g.r.dtype || ech.redop != g.r.redop || !pf.h.reth ||
      size_t{ech.element_count} * common::ech_dtype_size(g.r.dtype) > cfg_.slot_bytes ||
      (g.r.op == EchOp::kBarrier && ech.element_count != 0)) {
    counters_.malformed_drops++;
    return;
  }
  const int c = ech.contributor_id;
  if (!g.all.test(c)) {
    counters_.malformed_drops++;  // not one of this switch's contributors
    return;
  }
  g.heard_at[c] = clock_.now();
  g.latest[c] = std::max<int64_t>(g.latest[c], ech.chunk_index);
  const bool is_destination = g.destinations.test(c);
  Slot& s = g.slots[ech.chunk_index % g.slots.size()];
  if (!slot_takes(g, s, pf, c)) {
    return;
  }
  if (!s.busy) {
    open_slot(g, s, pf);
  }
  if (s.arrived.test(c)) {
    repeat_contribution(g, s, pf, is_destination);
    return;
  }
  if (s.complete) {
    // Completed as an anomaly without this contributor: tell it again.
    counters_.duplicate_contributions++;
    send_result(g, s, c);
    return;
  }
  if (ech.element_count != s.elements || pf.h.reth->virtual_address != s.offset) {
    counters_.malformed_drops++;
    return;
  }
  aggregate(g, s, pf, frame, is_destination);
}

void IfecEngine::forward_partial(Group& g, Slot& s) {
  const bool fp32 = g.r.upstream_fp32 && g.r.dtype != common::EchDtype::kInt32;
  const common::EchDtype up = fp32 ? common::EchDtype::kFp32 : g.r.dtype;
  if (!s.forwarded) {
    if (cfg_.reproducible && s.elements > 0 && !elided_) {
      bool first = true;
      for (const auto& part : s.parts) {
        if (!part.empty()) {  // only this leaf's members contributed here
          common::accumulate(g.r.dtype, g.r.redop, s.acc.data(), part.data(), s.elements, first);
          first = false;
        }
      }
    }
    s.partial.resize(s.elements * common::ech_dtype_size(up));
    if (!elided_) {
      common::finalize(up, s.acc.data(), s.partial.data(), s.elements);
    }
    s.forwarded = true;
  }
  Ech e;
  e.format = EchFormat::kStandard;
  e.op = g.r.op;
  e.flags = s.anomaly ? common::ech_flags::kAnomaly : 0;
  e.job_id = g.r.job;
  e.group_id = g.r.upstream_group;
  e.contributor_id = g.r.upstream_contributor;
  e.chunk_index = s.chunk;
  e.dtype = up;
  e.redop = g.r.redop;
  e.element_count = s.elements;
  e.window_id = g.r.window;
  common::Reth reth{s.offset, 0, static_cast<uint32_t>(s.partial.size())};
  emit_(build(g.r.upstream_ip, e, static_cast<uint8_t>(Opcode::kWriteOnly), s.chunk & 0xFFFFFF,
              common::pkey_of_job(g.r.job), reth, s.partial.data(), s.partial.size()),
        uint64_t{s.chunk} + e.group_id);
  counters_.partials_sent++;
  counters_.partial_bytes += s.partial.size();
}

void IfecEngine::upstream_result(Group& g, const common::ParsedFrame& pf, const uint8_t* frame) {
  const Ech& ech = *pf.h.ech;
  Slot& s = g.slots[ech.chunk_index % g.slots.size()];
  const bool write = pf.h.bth.opcode == static_cast<uint8_t>(Opcode::kWriteOnly);
  if (!s.busy || s.chunk != ech.chunk_index) {
    if (write) {
      send_ech_ack(pf.h.ip.src, ech, pf.h.bth.psn, pf.h.bth.pkey);  // already done here: keep the spine moving
    }
    return;
  }
  if (!write) {
    if (pf.h.aeth && pf.h.aeth->kind() == common::AethKind::kRnrNak) {
      retry_partial_soon(g, s);  // the spine's slot still holds an older chunk: not an acceptance
      return;
    }
    if (pf.h.aeth && pf.h.aeth->kind() == common::AethKind::kNak) {
      if (s.forwarded && !s.complete) {  // the spine lacks our partial (request_missing): it was lost
        counters_.partial_resends++;
        forward_partial(g, s);
      }
      return;
    }
    // The spine accepted our partial and has nothing to send back (reduce, no destination under this leaf).
    if (g.destinations.none() && s.forwarded) {
      s.complete = true;
      s.need.reset();
      maybe_free(g, s);
    }
    return;
  }
  send_ech_ack(pf.h.ip.src, ech, pf.h.bth.psn, pf.h.bth.pkey);
  if (s.complete) {
    return;  // a repeat of the spine's result
  }
  counters_.upstream_results++;
  const bool timed_out = (ech.flags & common::ech_flags::kAnomaly) && pf.payload_size == 0 && s.elements > 0;
  if (timed_out) {
    complete(g, s, true);
    return;
  }
  // The spine's result is in the partials' type: one cast to the element type here, on the way out.
  s.anomaly = s.anomaly || (ech.flags & common::ech_flags::kAnomaly);
  s.acc.assign(s.elements, common::Acc{});
  if (s.elements > 0 && !pf.elided) {
    common::accumulate(ech.dtype, g.r.redop, s.acc.data(), frame + pf.payload_offset, s.elements, true);
  }
  complete(g, s, false, /*acc_ready=*/true);
}

void IfecEngine::complete(Group& g, Slot& s, bool timed_out, bool acc_ready) {
  s.complete = true;
  s.completion = ++g.completions;
  s.timed_out = timed_out;
  const size_t esize = common::ech_dtype_size(g.r.dtype);
  if (timed_out) {
    s.anomaly = true;
    s.elements = 0;  // no partial result travels: the endpoints redo this chunk on the fallback path
    s.result.clear();
    counters_.anomalies++;
  } else {
    if (cfg_.reproducible && !acc_ready && s.elements > 0 && !elided_) {
      // Fixed contributor order: bitwise the same result whatever order the contributions arrived in.
      for (size_t c = 0; c < s.parts.size(); ++c) {
        common::accumulate(g.r.dtype, g.r.redop, s.acc.data(), s.parts[c].data(), s.elements, c == 0);
      }
    }
    s.result.resize(s.elements * esize);
    if (!elided_) {
      common::finalize(g.r.dtype, s.acc.data(), s.result.data(), s.elements);
    }
    counters_.slots_completed++;
  }
  // Who must acknowledge: the destinations; after a timeout every member (all of them redo the chunk).
  s.need = timed_out ? g.all : g.destinations;
  for (size_t m = 0; m < g.r.members.size(); ++m) {
    if (s.need.test(m)) {
      send_result(g, s, static_cast<int>(m));
    }
  }
  s.generation++;  // the incompleteness timeout no longer applies; the result timer takes over
  if (s.need.any()) {
    arm_result_timer(g, s);
  } else {
    maybe_free(g, s);
  }
}

void IfecEngine::send_result(Group& g, Slot& s, int member) {
  const GroupMember& gm = g.r.members[member];
  Ech e;
  e.format = EchFormat::kStandard;
  e.op = g.r.op;
  e.flags = s.anomaly ? common::ech_flags::kAnomaly : 0;
  e.job_id = g.r.job;
  e.group_id = g.r.group;
  e.contributor_id = static_cast<uint16_t>(member);
  e.chunk_index = s.chunk;
  e.dtype = g.r.dtype;
  e.redop = g.r.redop;
  e.element_count = s.elements;
  e.window_id = g.r.window;
  common::Reth reth{gm.result_va + s.offset, gm.rkey, static_cast<uint32_t>(s.result.size())};
  emit_(build(gm.ip, e, static_cast<uint8_t>(Opcode::kWriteOnly), s.chunk & 0xFFFFFF, common::pkey_of_job(g.r.job),
              reth, s.result.data(), s.result.size()),
        uint64_t{s.chunk} + e.group_id);
  counters_.results_sent++;
}

void IfecEngine::result_ack(Group& g, const common::ParsedFrame& pf) {
  const Ech& ech = *pf.h.ech;
  counters_.acks_received++;
  if (ech.contributor_id < g.heard_at.size()) {
    g.heard_at[ech.contributor_id] = clock_.now();  // late or duplicate, it still says the member's link moves
  }
  Slot& s = g.slots[ech.chunk_index % g.slots.size()];
  if (!s.busy || s.chunk != ech.chunk_index || !s.complete) {
    return;  // late or duplicate acknowledgement
  }
  s.acked.set(ech.contributor_id);
  if (ech.contributor_id < g.acked_completion.size()) {
    uint64_t& latest = g.acked_completion[ech.contributor_id];
    latest = std::max(latest, s.completion);
  }
  maybe_free(g, s);
}

void IfecEngine::maybe_free(Group& g, Slot& s) {
  if (s.complete && (s.acked & s.need) == s.need) {
    close(g, s);
  }
}

void IfecEngine::close(Group& g, Slot& s) {
  s.busy = false;  // `chunk`, `acked` and `timed_out` stay: they answer late copies of this chunk
  s.next = s.chunk + static_cast<uint32_t>(g.slots.size());
  s.result.clear();
  s.result.shrink_to_fit();
  s.acc.clear();
  s.parts.clear();
  s.partial.clear();
  s.forwarded = false;
  s.generation++;
}

IfecEngine::Slot* IfecEngine::find_slot(uint64_t key, size_t index, uint64_t generation) {
  auto it = groups_.find(key);
  if (it == groups_.end() || index >= it->second.slots.size()) {
    return nullptr;
  }
  Slot& slot = it->second.slots[index];
  return slot.busy && slot.generation == generation ? &slot : nullptr;
}

void IfecEngine::arm_timeout(Group& g, Slot& s) {
  const uint64_t key = group_key(g.r.job, g.r.group);
  const size_t index = static_cast<size_t>(&s - g.slots.data());
  const uint64_t gen = s.generation;
  clock_.schedule(clock_.now() + g.slot_timeout_ns, [this, key, index, gen] {
    if (Slot* slot = find_slot(key, index, gen); slot != nullptr && !slot->complete) {
      complete(groups_.at(key), *slot, true);
    }
  });
}

void IfecEngine::arm_result_timer(Group& g, Slot& s) {
  const uint64_t key = group_key(g.r.job, g.r.group);
  const size_t index = static_cast<size_t>(&s - g.slots.data());
  const uint64_t gen = s.generation;
  const common::TimeNs wait = g.result_rto_ns << std::min<uint32_t>(s.resends, 3);
  clock_.schedule(clock_.now() + wait, [this, key, index, gen] {
    Slot* slot = find_slot(key, index, gen);
    if (slot == nullptr) {
      return;
    }
    Group& grp = groups_.at(key);
    if (slot->forwarded && !slot->complete) {
      // A leaf's partial the spine has not answered (lost on the way up, or its answer lost): send it again,
      // until the slot timeout gives the chunk up.
      if (slot->resends++ < cfg_.result_retries) {
        counters_.partial_resends++;
        forward_partial(grp, *slot);
        arm_result_timer(grp, *slot);
      }
      return;
    }
    // A member heard from within a timeout (its contributions or ACKs of other results) has this result queued
    // behind others (a link or a software GPU slower than the port's rate): wait on. Only members silent for a
    // timeout get it again, and only from one slot at a time: while a resend to the member is unanswered (within a
    // timeout), the other slots it has not acknowledged count the try but send nothing (a host a loaded machine
    // runs late got every result in the window again, 1,770 copies of 2,048 results in one 1 MiB AllReduce).
    // A member that acknowledged a result completed after this one lost this one's: it gets it again at once, but
    // once: results to one member may also pass each other (a Y-cable's sub-links queue apart), and a member whose
    // link is slower than the timer got a copy of every such result on every round (8,151 copies of 128 results per
    // switch to a GPU on a 1/256-rate link); after that, the silent-member rule below covers it.
    const common::TimeNs now = clock_.now();
    std::vector<int> silent;
    bool waiting = false;
    for (size_t m = 0; m < grp.r.members.size(); ++m) {
      if (slot->need.test(m) && !slot->acked.test(m) && grp.acked_completion[m] > slot->completion &&
          !slot->presumed_lost.test(m)) {
        slot->presumed_lost.set(m);
        counters_.lost_results++;
        send_result(grp, *slot, static_cast<int>(m));
      } else if (slot->need.test(m) && !slot->acked.test(m) && grp.heard_at[m] + grp.result_rto_ns <= now) {
        const bool probed = grp.resent_at[m] > grp.heard_at[m] && grp.resent_at[m] + grp.result_rto_ns > now;
        waiting = waiting || probed;
        if (!probed) {
          silent.push_back(static_cast<int>(m));
        }
      }
    }
    if (silent.empty() && !waiting) {
      arm_result_timer(grp, *slot);
      return;
    }
    // A try either way (waiting on another slot's resend too): a member that never answers is given up as before.
    if (slot->resends++ >= cfg_.result_retries) {
      counters_.slots_reclaimed++;  // a destination never acknowledged (gone): late copies get a notice
      close(grp, *slot);
      return;
    }
    for (int m : silent) {
      counters_.result_resends++;
      grp.resent_at[m] = now;
      send_result(grp, *slot, m);
    }
    arm_result_timer(grp, *slot);
  });
}

void IfecEngine::retry_partial_soon(Group& g, Slot& s) {
  const uint64_t key = group_key(g.r.job, g.r.group);
  const size_t index = static_cast<size_t>(&s - g.slots.data());
  const uint64_t gen = s.generation;
  const common::TimeNs wait = kPartialRetryNs << std::min<uint32_t>(s.busy_retries++, 3);
  clock_.schedule(clock_.now() + wait, [this, key, index, gen] {
    if (Slot* slot = find_slot(key, index, gen); slot != nullptr && slot->forwarded && !slot->complete) {
      forward_partial(groups_.at(key), *slot);
    }
  });
}

void IfecEngine::late_contribution(Group& g, Slot& s, const common::ParsedFrame& pf) {
  const Ech& ech = *pf.h.ech;
  const int c = ech.contributor_id;
  counters_.duplicate_contributions++;
  if (ech.chunk_index == s.chunk && !s.busy && !s.timed_out) {
    // The chunk this slot finished last, with every expected contribution (this one's included).
    if (!g.destinations.test(c)) {
      send_ech_ack(g.r.members[c].ip, ech, pf.h.bth.psn, pf.h.bth.pkey);  // its ACK was lost
      return;
    }
    if (s.acked.test(c)) {
      return;  // it acknowledged its result already: a stale copy that crossed it
    }
  }
  // Otherwise nothing here can answer it truly (its result was released unacknowledged, the chunk timed out or
  // was skipped, or the slot moved on): the member must take the result from another member or redo the chunk,
  // and its contribution is never aggregated again here with a partial set.
  counters_.late_notices++;
  send_notice(g, c, ech.chunk_index);
}

void IfecEngine::send_notice(Group& g, int member, uint32_t chunk) {
  const GroupMember& gm = g.r.members[member];
  Ech e;
  e.format = EchFormat::kStandard;
  e.op = g.r.op;
  e.flags = common::ech_flags::kAnomaly;
  e.job_id = g.r.job;
  e.group_id = g.r.group;
  e.contributor_id = static_cast<uint16_t>(member);
  e.chunk_index = chunk;
  e.dtype = g.r.dtype;
  e.redop = g.r.redop;
  e.element_count = 0;
  e.window_id = g.r.window;
  emit_(build(gm.ip, e, static_cast<uint8_t>(Opcode::kWriteOnly), chunk & 0xFFFFFF, common::pkey_of_job(g.r.job),
              common::Reth{gm.result_va, gm.rkey, 0}, nullptr, 0),
        uint64_t{chunk} + e.group_id);
}

namespace {

// An acknowledgement's member (Emit): a reduction chunk's is its chunk's (chunk + group), a multicast packet's its
// PSN.
uint64_t spray_of(const Ech& ech, uint32_t psn) {
  return ech.format == EchFormat::kStandard ? uint64_t{ech.chunk_index} + ech.group_id : psn;
}

}  // namespace

void IfecEngine::send_ech_ack(uint32_t dst_ip, const Ech& ech, uint32_t psn, uint16_t pkey, common::Aeth aeth,
                              uint8_t flags) {
  Ech e = ech;
  e.element_count = 0;
  e.flags = flags;
  emit_(build(dst_ip, e, static_cast<uint8_t>(Opcode::kAcknowledge), psn, pkey, std::nullopt, nullptr, 0, aeth),
        spray_of(ech, psn));
}

void IfecEngine::send_ech_rnr(uint32_t dst_ip, const Ech& ech, uint32_t psn, uint16_t pkey) {
  // RNR timer code 1 (IBTA: 0.01 ms); the endpoint's own back-off decides when it actually retries.
  send_ech_ack(dst_ip, ech, psn, pkey, common::Aeth::rnr_nak(1));
}

std::vector<uint8_t> IfecEngine::build(uint32_t dst_ip, const Ech& ech, uint8_t opcode, uint32_t psn, uint16_t pkey,
                                       const std::optional<common::Reth>& reth, const uint8_t* payload, size_t len,
                                       common::Aeth aeth) {
  common::FrameHeaders h;
  h.ip.src = ip_;
  h.ip.dst = dst_ip;
  h.ip.dscp = common::kRoceDscp;
  h.ip.ecn = common::kRoceEcn;
  h.udp.src_port = static_cast<uint16_t>(0xC000 | ((dst_ip * 2654435761u + psn) >> 18));
  h.ech = ech;
  h.bth.opcode = opcode;
  h.bth.pkey = pkey;
  h.bth.dest_qp = common::kEchQpn;
  h.bth.psn = psn;
  if (opcode == static_cast<uint8_t>(Opcode::kAcknowledge)) {
    h.aeth = aeth;
  } else {
    h.reth = reth;
  }
  return common::encode_frame(h, elided_ ? nullptr : payload, len);
}

// ------------------------------------------------------------------------------------------------ multicast --

void IfecEngine::multicast(const common::ParsedFrame& pf, const uint8_t* frame) {
  const Ech& ech = *pf.h.ech;
  const uint64_t key = multicast_key(ech.source_id, pf.h.bth.psn);
  // A completion carries the retransmission flag once a copy of the packet reached this switch: the source then
  // knows the answer follows its copy. Without it the original completed before the copy came (late, not lost), and
  // the source's other late packets are most likely completing too (EchAgent resends no more behind it).
  if (mcast_done_set_.count(key)) {
    // Completed already: our completion was lost, or is still on its way.
    send_ech_ack(pf.h.ip.src, ech, pf.h.bth.psn, pf.h.bth.pkey, common::Aeth::ack(0),
                 common::ech_flags::kRetransmission);
    return;
  }
  auto it = mcast_.find(key);
  if (it != mcast_.end()) {
    // Retransmission: repair only toward destinations that have not acknowledged (no second write elsewhere), and
    // only once their earlier replica has had time to be acknowledged: a copy behind one still queued toward a
    // congested GPU would double that GPU's backlog (a collapse at 64 ranks x 4096 tokens).
    const common::TimeNs now = clock_.now();
    it->second.copy_seen = true;
    for (int d = 0; d < 64; ++d) {
      if (it->second.pending & (1ULL << d)) {
        if (now < it->second.due[d]) {
          counters_.multicast_repairs_held++;
          continue;
        }
        counters_.multicast_repairs++;
        send_replica(it->second, d);
      }
    }
    return;
  }
  if (!pf.h.reth || mcast_.size() >= cfg_.multicast_entries) {
    counters_.malformed_drops += !pf.h.reth;
    return;  // no room: the source retries
  }
  Multicast m;
  m.source_ip = pf.h.ip.src;
  m.source_id = ech.source_id;
  m.base = ech.bitmap_base;
  m.window = ech.window_id;
  m.offset = pf.h.reth->virtual_address;
  m.psn = pf.h.bth.psn;
  m.job = common::job_of_pkey(pf.h.bth.pkey);
  m.copy_seen = (ech.flags & common::ech_flags::kRetransmission) != 0;  // the original was lost (or evicted)
  for (int d = 0; d < 64; ++d) {
    if (!(ech.dest_bitmap & (1ULL << d))) {
      continue;
    }
    auto w = windows_.find({m.base + d, ech.window_id});
    if (w == windows_.end() || w->second.job != m.job) {
      counters_.multicast_unknown_window++;  // the whole packet is refused: the source gets no completion
      return;
    }
    m.pending |= 1ULL << d;
  }
  if (pf.elided) {
    m.payload.resize(pf.payload_size);  // its length is all that travels on
  } else {
    m.payload.assign(frame + pf.payload_offset, frame + pf.payload_offset + pf.payload_size);
  }
  counters_.multicast_packets++;
  auto [pos, inserted] = mcast_.emplace(key, std::move(m));
  for (int d = 0; d < 64; ++d) {
    if (pos->second.pending & (1ULL << d)) {
      send_replica(pos->second, d);
    }
  }
}

void IfecEngine::send_replica(Multicast& m, int dest) {
  const Window& w = windows_.at({m.base + dest, m.window});
  m.due[dest] = backlog_ ? clock_.now() + backlog_(w.ip) + kRepairSlackNs : 0;
  Ech e;
  e.format = EchFormat::kCompact;
  e.op = EchOp::kMulticast;
  e.source_id = m.source_id;
  e.window_id = m.window;
  e.set_destination(m.base + dest);
  common::Reth reth{w.va + m.offset, w.rkey, static_cast<uint32_t>(m.payload.size())};
  emit_(build(w.ip, e, static_cast<uint8_t>(Opcode::kWriteOnly), m.psn, common::pkey_of_job(m.job), reth,
              m.payload.data(), m.payload.size()),
        kSwitchChooses);
  counters_.multicast_replicas++;
}

void IfecEngine::multicast_ack(const common::ParsedFrame& pf) {
  const Ech& ech = *pf.h.ech;
  auto it = mcast_.find(multicast_key(ech.source_id, pf.h.bth.psn));
  if (it == mcast_.end()) {
    return;  // duplicate acknowledgement
  }
  Multicast& m = it->second;
  for (uint64_t bits = ech.dest_bitmap; bits != 0; bits &= bits - 1) {
    const int d = ech.bitmap_base + __builtin_ctzll(bits) - m.base;  // the acknowledging endpoint, in m's bitmap
    if (d >= 0 && d < 64) {
      m.pending &= ~(1ULL << d);
    }
  }
  if (m.pending != 0) {
    return;
  }
  // Every destination has the data: one completion to the source (the transaction proxy's job).
  Ech e = ech;
  e.set_destination(m.source_id);
  send_ech_ack(m.source_ip, e, m.psn, common::pkey_of_job(m.job), common::Aeth::ack(0),
               m.copy_seen ? common::ech_flags::kRetransmission : 0);
  counters_.multicast_completions++;
  mcast_done_.push_back(it->first);
  mcast_done_set_.insert(it->first);
  if (mcast_done_.size() > kMulticastDoneMemory) {
    mcast_done_set_.erase(mcast_done_.front());
    mcast_done_.pop_front();
  }
  mcast_.erase(it);
}

}  // namespace ifec::switchemu
