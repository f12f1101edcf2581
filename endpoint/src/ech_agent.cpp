// The endpoint half of ECH: lanes of contributions with windows and retransmission, RNR back-off, results and
// replicas checked before they are written, acknowledgements, and multicast packets with their completions.
#include "ifec/endpoint/ech_agent.h"

#include <algorithm>
#include <cstring>

#include "ifec/common/checks.h"
#include "ifec/common/names.h"
#include "ifec/common/protocol.h"
#include "ifec/endpoint/endpoint.h"

namespace ifec::endpoint {

using common::Ech;
using common::EchFormat;
using common::Opcode;
using common::TimeNs;

namespace {

constexpr uint32_t kPsnMask = 0xFFFFFF;

bool is_notice(const common::ParsedFrame& pf, common::EchOp op) {
  return (pf.h.ech->flags & common::ech_flags::kAnomaly) && pf.payload_size == 0 &&
         (op == common::EchOp::kBarrier || pf.h.ech->element_count == 0);
}

constexpr common::Name<EchOutcome> kEchOutcomeNames[] = {
    {EchOutcome::kPending, "pending"},
    {EchOutcome::kDone, "done"},
    {EchOutcome::kAnomaly, "anomaly"},
    {EchOutcome::kGivenUp, "given up"},
};
constexpr common::Vocabulary kEchOutcomes("ECH outcome", kEchOutcomeNames);

}  // namespace

const char* ech_outcome_name(EchOutcome o) { return kEchOutcomes.name(o); }

// ----------------------------------------------------------------------------------------- EchReduction --

EchReduction::EchReduction(EchAgent& agent, EchReduceSpec spec, uint64_t id)
    : agent_(agent), spec_(std::move(spec)), id_(id), rtt_(spec_.timing.min_rto_ns) {
  const size_t n = spec_.chunks.size();
  outcome_.assign(n, EchOutcome::kPending);
  held_.assign(n, 0);
  probes_.resize(n);
  tries_.assign(n, 0);
  busy_.assign(n, 0);
  epoch_.assign(n, 0);
  sent_ns_.assign(n, 0);
  sent_.assign(n, 0);
  lanes_.resize(spec_.lanes.size());
  for (uint32_t l = 0; l < spec_.lanes.size(); ++l) {
    lane_of_[uint64_t{spec_.lanes[l].switch_ip} << 16 | spec_.lanes[l].group] = l;
  }
  chunk_of_seq_.resize(spec_.lanes.size());
  for (uint32_t i = 0; i < n; ++i) {
    const EchChunk& c = spec_.chunks[i];
    lanes_[c.lane].chunks.push_back(i);
    std::vector<uint32_t>& by_seq = chunk_of_seq_[c.lane];
    if (c.seq == by_seq.size()) {
      by_seq.push_back(i);
    } else {
      chunk_of_other_[uint64_t{c.lane} << 32 | c.seq] = i;
    }
    if (spec_.shared_window > 0 && c.contribute) {
      plane_queue_[spec_.lanes[c.lane].plane].push_back(i);
    }
  }
  pending_ = n;
}

uint32_t EchReduction::chunk_of(uint32_t lane, uint32_t seq) const {
  if (lane < chunk_of_seq_.size() && seq < chunk_of_seq_[lane].size()) {
    return chunk_of_seq_[lane][seq];
  }
  auto it = chunk_of_other_.find(uint64_t{lane} << 32 | seq);
  return it == chunk_of_other_.end() ? kNoChunk : it->second;
}

bool EchReduction::probing(int plane, uint32_t chunk) const {
  const uint32_t p = probes_.probe(plane);
  return p != PlaneProbes::kNone && p != chunk && outcome_[p] == EchOutcome::kPending && !held_[p];
}

void EchReduction::finish(size_t i, EchOutcome o) {
  if (outcome_[i] != EchOutcome::kPending) {
    return;
  }
  outcome_[i] = o;
  epoch_[i]++;  // its timers do nothing now
  pending_--;
  anomalies_ += o == EchOutcome::kAnomaly;
  const EchChunk& c = spec_.chunks[i];
  if (o == EchOutcome::kDone) {
    progress_[spec_.lanes[c.lane].plane] = agent_.clock().now();
  }
  if (sent_[i]) {
    if (spec_.shared_window > 0) {
      plane_inflight_[spec_.lanes[c.lane].plane]--;
    } else {
      lanes_[c.lane].inflight--;
    }
  }
  if (pending_ == 0 && on_done_ && !done_reported_) {
    done_reported_ = true;
    agent_.later(0, id_, [this] { on_done_(); });
  }
}

void EchReduction::give_up_plane(int plane, const std::string& why) {
  bool any = false;
  for (size_t l = 0; l < lanes_.size(); ++l) {
    if (spec_.lanes[l].plane != plane || lanes_[l].dead) {
      continue;
    }
    lanes_[l].dead = true;
    any = true;
    for (uint32_t i : lanes_[l].chunks) {
      finish(i, EchOutcome::kGivenUp);
    }
  }
  if (any) {
    planes_given_up_.emplace(plane, why);
  }
}

void EchReduction::give_up_all(const std::string& why) {
  for (const EchLane& lane : spec_.lanes) {
    give_up_plane(lane.plane, why);
  }
}

void EchReduction::on_done(std::function<void()> fn) {
  on_done_ = std::move(fn);
  if (pending_ == 0 && !done_reported_) {
    done_reported_ = true;
    agent_.later(0, id_, [this] { on_done_(); });
  }
}

// ------------------------------------------------------------------------------------------ EchMulticast --

EchMulticast::EchMulticast(EchAgent& agent, EchMulticastSpec spec, uint64_t id, uint32_t first_psn)
    : agent_(agent), spec_(std::move(spec)), id_(id), first_psn_(first_psn), rtt_(spec_.timing.min_rto_ns) {
  const size_t n = spec_.packets.size();
  outcome_.assign(n, EchOutcome::kPending);
  tries_.assign(n, 0);
  sent_ns_.assign(n, 0);
  sent_.assign(n, 0);
  probes_.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    queue_[spec_.packets[i].plane].push_back(i);
  }
  pending_ = n;
}

void EchMulticast::finish(size_t i, EchOutcome o) {
  if (outcome_[i] != EchOutcome::kPending) {
    return;
  }
  outcome_[i] = o;
  pending_--;
  if (o == EchOutcome::kDone) {
    progress_[spec_.packets[i].plane] = agent_.clock().now();
  }
  if (sent_[i]) {
    inflight_[spec_.packets[i].plane]--;
  }
  if (pending_ == 0 && on_done_ && !done_reported_) {
    done_reported_ = true;
    agent_.later(0, id_, [this] { on_done_(); });
  }
}

void EchMulticast::give_up_plane(int plane, const std::string& why) {
  bool any = false;
  for (uint32_t i : queue_[plane]) {
    any = any || outcome_[i] == EchOutcome::kPending;
    finish(i, EchOutcome::kGivenUp);
  }
  if (any) {
    planes_given_up_.emplace(plane, why);
  }
}

void EchMulticast::on_done(std::function<void()> fn) {
  on_done_ = std::move(fn);
  if (pending_ == 0 && !done_reported_) {
    done_reported_ = true;
    agent_.later(0, id_, [this] { on_done_(); });
  }
}

// --------------------------------------------------------------------------------------------- EchAgent --

EchAgent::EchAgent(Endpoint& ep) : ep_(ep), alive_(std::make_shared<bool>(true)) {}

EchAgent::~EchAgent() { *alive_ = false; }

common::Clock& EchAgent::clock() { return ep_.clock_; }

// Runs `fn` after `delay` as its own event if the agent and operation `id` still exist.
template <typename Fn>
void EchAgent::later(TimeNs delay, uint64_t id, Fn fn) {
  std::weak_ptr<bool> alive = alive_;
  clock().schedule(clock().now() + delay, [this, alive, id, fn = std::move(fn)]() mutable {
    auto a = alive.lock();
    if (!a || !*a) {
      return;
    }
    auto r = reductions_.find(id);
    auto m = multicasts_.find(id);
    const bool live =
        (r != reductions_.end() && !r->second.expired()) || (m != multicasts_.end() && !m->second.expired());
    if (live) {
      fn();
    }
  });
}

std::string EchAgent::no_answer(int plane, int tries) const {
  return "GPU " + std::to_string(ep_.index()) + ": no answer from the switch on plane " + std::to_string(plane) +
         " to " + std::to_string(tries) + " resends";
}

TimeNs EchAgent::rto(const common::RttEstimator& rtt, const EchTiming& t, int tries) {
  const TimeNs base = rtt.rto(t.initial_rto_ns);
  return std::min<TimeNs>(std::max(base, t.max_rto_ns), base << std::min(tries, 3));
}

int EchAgent::port_for(int plane, uint32_t salt) const {
  int live[64];
  int n = 0;
  for (int p = 0; p < ep_.num_ports() && n < 64; ++p) {
    if (ep_.port_info(p).plane == plane && ep_.port_info(p).port->link_up()) {
      live[n++] = p;
    }
  }
  return n == 0 ? -1 : live[salt % n];
}

std::shared_ptr<EchReduction> EchAgent::reduce(EchReduceSpec spec) {
  const size_t esize = common::ech_dtype_size(spec.dtype);
  IFEC_CHECK(esize > 0, "ECH reduction: unknown dtype " << static_cast<int>(spec.dtype));
  for (size_t i = 0; i < spec.chunks.size(); ++i) {
    const EchChunk& c = spec.chunks[i];
    IFEC_CHECK(c.lane < spec.lanes.size(),
               "ECH reduction: chunk " << i << " names lane " << c.lane << " of " << spec.lanes.size());
    if (c.contribute) {
      const WindowInfo* w = ep_.memory().window(spec.source_window);
      IFEC_CHECK(w != nullptr, "ECH reduction: GPU " << ep_.index() << " has no window " << spec.source_window);
      IFEC_CHECK(c.source_offset + c.elements * esize <= w->size,
                 "ECH reduction: chunk " << i << " at " << c.source_offset << " overruns window " << spec.source_window
                                         << " (" << w->size << " B)");
    }
  }
  for (const EchLane& l : spec.lanes) {
    IFEC_CHECK(l.window > 0 || spec.shared_window > 0, "ECH reduction: lane of group " << l.group << " has window 0");
  }
  prune();
  const uint64_t id = next_id_++;
  std::shared_ptr<EchReduction> r(new EchReduction(*this, std::move(spec), id));
  reductions_[id] = r;
  for (const EchLane& l : r->spec_.lanes) {
    const GroupKey k{l.switch_ip, r->spec_.job, l.group};
    reduction_of_group_[k] = id;
    note_group(k, r->spec_.timing.max_rto_ns);
  }
  pump(*r);
  if (early_frames_ > 0) {
    take_early(id);
  }
  return r;
}

// Sends what the windows allow: per lane in sequence order, or per plane in listed order (shared window). A chunk
// counts in flight from its first transmission until it finishes (finish() takes it out).
void EchAgent::pump(EchReduction& r) {
  auto send = [&](uint32_t i, uint32_t& inflight) {
    if (!r.spec_.chunks[i].contribute || r.outcome_[i] != EchOutcome::kPending) {
      return;
    }
    r.sent_[i] = 1;
    r.sent_ns_[i] = clock().now();
    ++inflight;
    send_contribution(r, i, false);
  };
  if (r.spec_.shared_window > 0) {
    for (auto& [plane, q] : r.plane_queue_) {
      size_t& next = r.plane_next_[plane];
      uint32_t& inflight = r.plane_inflight_[plane];
      while (next < q.size() && inflight < r.spec_.shared_window) {
        send(q[next++], inflight);
      }
    }
    return;
  }
  for (size_t l = 0; l < r.lanes_.size(); ++l) {
    EchReduction::Lane& lane = r.lanes_[l];
    while (lane.base < lane.chunks.size() && r.outcome_[lane.chunks[lane.base]] != EchOutcome::kPending) {
      ++lane.base;
    }
    while (!lane.dead && lane.next < lane.chunks.size() && lane.next < lane.base + r.spec_.lanes[l].window) {
      send(lane.chunks[lane.next++], lane.inflight);
    }
  }
}

void EchAgent::send_contribution(EchReduction& r, size_t i, bool retransmit) {
  const EchChunk& c = r.spec_.chunks[i];
  const EchLane& lane = r.spec_.lanes[c.lane];
  const int port = port_for(lane.plane, c.seq + static_cast<uint32_t>(lane.group));
  if (port < 0) {
    r.give_up_plane(lane.plane,
                    "GPU " + std::to_string(ep_.index()) + " has no live link on plane " + std::to_string(lane.plane));
    return;
  }
  arm(r, i, rto(r.rtt_, r.spec_.timing, r.tries_[i]), true);
  const size_t bytes = size_t{c.elements} * common::ech_dtype_size(r.spec_.dtype);
  common::FrameHeaders h = headers(port, lane.switch_ip, static_cast<uint16_t>(ep_.index() * 977 + c.seq),
                                   static_cast<uint8_t>(Opcode::kWriteOnly), common::pkey_of_job(r.spec_.job), c.seq);
  Ech ech;
  ech.format = EchFormat::kStandard;
  ech.op = r.spec_.op;
  ech.flags = retransmit ? common::ech_flags::kRetransmission : 0;
  ech.job_id = r.spec_.job;
  ech.group_id = lane.group;
  ech.contributor_id = lane.contributor;
  ech.chunk_index = c.seq;
  ech.dtype = r.spec_.dtype;
  ech.redop = r.spec_.redop;
  ech.element_count = c.elements;
  ech.expected = c.expected;
  ech.window_id = r.spec_.result_window;
  h.ech = ech;
  h.reth = common::Reth{c.reth_va, 0, static_cast<uint32_t>(bytes)};
  const WindowInfo* w = ep_.memory().window(r.spec_.source_window);
  if (!suppress_contributions_) {
    std::vector<uint8_t> f =
        common::encode_frame(h, ep_.config().elided_payloads ? nullptr : w->data + c.source_offset, bytes);
    counters_.retransmit_bytes += retransmit ? f.size() : 0;
    ep_.send_frame(port, std::move(f));
  }
  counters_.contributions_sent++;
  counters_.retransmissions += retransmit;
}

// One live timer per chunk: a newer arm() makes older ones do nothing. A timeout counts as a try (after
// max_retries the chunk is given up); a retry after an RNR NAK does not.
void EchAgent::arm(EchReduction& r, size_t i, TimeNs delay, bool counts_as_try) {
  const uint32_t epoch = ++r.epoch_[i];
  EchReduction* rp = &r;
  later(delay, r.id_, [this, rp, i, epoch, counts_as_try] {
    EchReduction& r = *rp;
    if (r.epoch_[i] != epoch || r.outcome_[i] != EchOutcome::kPending) {
      return;
    }
    // Other chunks on its plane completed within a timeout: the queue ahead of this one is moving, wait on (a timer
    // per chunk otherwise resends every chunk queued longer than the timeout, and the copies lengthen the queue). A
    // plane that stopped answering still runs out of tries while another plane progresses.
    const int plane = r.spec_.lanes[r.spec_.chunks[i].lane].plane;
    const TimeNs until = r.progress_[plane] + rto(r.rtt_, r.spec_.timing, r.tries_[i]);
    if (counts_as_try && until > clock().now()) {
      arm(r, i, until - clock().now(), true);
      return;
    }
    // Another chunk's resend on this plane is out and unanswered: this one waits, and its answer (a result, or held:
    // the switch waits for a member a loaded host runs late) sends the oldest that waited (probe_answered).
    // Resending every chunk whose timer ran out (a whole window, while one member is late) lengthened the queues.
    if (counts_as_try && r.probing(plane, static_cast<uint32_t>(i))) {
      r.probes_.defer(plane, static_cast<uint32_t>(i));
      arm(r, i, rto(r.rtt_, r.spec_.timing, r.tries_[i]), true);
      return;
    }
    if (counts_as_try && ++r.tries_[i] > r.spec_.timing.max_retries) {
      // The plane answered none of its resends for the whole budget (the others waited on them): it is given up,
      // as a plane FARE lost, and its chunks finish on the planes left.
      r.give_up_plane(plane, no_answer(plane, r.tries_[i] - 1));
      pump(r);
      return;
    }
    if (counts_as_try) {
      r.probes_.set_probe(plane, static_cast<uint32_t>(i));
      r.held_[i] = 0;
    }
    send_contribution(r, i, true);
  });
}

// The probe `answered` of `plane` had its answer: the oldest item that waited on it goes (`resend(j)`), once what
// has already arrived is handled (a task due now runs after the frames at hand): after a stall (the switch's host,
// or this one) the answers of the waiting items are often right behind the probe's, and resending at its answer
// sent the next one ahead of its own answer, answer after answer, through the whole window.
template <class Op, class Resend>
void EchAgent::resend_next_waiting(Op& op, int plane, uint32_t answered, Resend resend) {
  if (op.probes_.probe(plane) != answered) {
    return;
  }
  Op* p = &op;
  later(0, op.id_, [p, plane, answered, resend] {
    Op& op = *p;
    if (op.probes_.probe(plane) != answered) {
      return;  // another item's resend became the plane's probe meanwhile
    }
    const uint32_t j = op.probes_.take_deferred(plane, [&op](uint32_t k) {
      return op.outcome_[k] == EchOutcome::kPending && op.tries_[k] < op.spec_.timing.max_retries;
    });
    if (j != PlaneProbes::kNone) {
      op.tries_[j]++;
      op.probes_.set_probe(plane, j);
      resend(j);
    }
  });
}

void EchAgent::probe_answered(EchReduction& r, size_t i) {
  EchReduction* rp = &r;
  resend_next_waiting(r, r.spec_.lanes[r.spec_.chunks[i].lane].plane, static_cast<uint32_t>(i), [this, rp](uint32_t j) {
    rp->held_[j] = 0;
    send_contribution(*rp, j, true);
  });
}

// ---------------------------------------------------------------------------------------------- multicast --

void EchAgent::probe_answered(EchMulticast& m, size_t i) {
  EchMulticast* mp = &m;
  resend_next_waiting(m, m.spec_.packets[i].plane, static_cast<uint32_t>(i),
                      [this, mp](uint32_t j) { send_packet(*mp, j, true); });
}

// A packet's timer: resent when nothing of its multicast on its plane completed for a timeout (as a reduction's
// chunks).
void EchAgent::arm(EchMulticast& m, size_t i, TimeNs delay) {
  EchMulticast* mp = &m;
  later(delay, m.id_, [this, mp, i] {
    EchMulticast& m = *mp;
    if (m.outcome_[i] != EchOutcome::kPending) {
      return;
    }
    const int plane = m.spec_.packets[i].plane;
    const TimeNs until = m.progress_[plane] + rto(m.rtt_, m.spec_.timing, m.tries_[i]);
    if (until > clock().now()) {
      arm(m, i, until - clock().now());
      return;
    }
    if (m.probing(plane, static_cast<uint32_t>(i))) {  // another packet's resend on the plane is unanswered
      m.probes_.defer(plane, static_cast<uint32_t>(i));
      arm(m, i, rto(m.rtt_, m.spec_.timing, m.tries_[i]));
      return;
    }
    if (++m.tries_[i] > m.spec_.timing.max_retries) {
      m.give_up_plane(plane, no_answer(plane, m.tries_[i] - 1));  // as a reduction's chunk
      pump(m);
      return;
    }
    m.probes_.set_probe(plane, static_cast<uint32_t>(i));
    send_packet(m, i, true);
  });
}

std::shared_ptr<EchMulticast> EchAgent::multicast(EchMulticastSpec spec) {
  const WindowInfo* w = ep_.memory().window(spec.window);
  IFEC_CHECK(w != nullptr, "ECH multicast: GPU " << ep_.index() << " has no window " << spec.window);
  for (size_t i = 0; i < spec.packets.size(); ++i) {
    const EchPacket& p = spec.packets[i];
    IFEC_CHECK(p.offset + p.len <= w->size, "ECH multicast: packet " << i << " at " << p.offset << " + " << p.len
                                                                     << " overruns window " << spec.window);
    const int self = ep_.index() - p.base;
    IFEC_CHECK(p.bitmap != 0 && !(self >= 0 && self < 64 && (p.bitmap >> self) & 1) && p.base + 63 <= 0xFFFF,
               "ECH multicast: packet " << i << " has destination bitmap " << p.bitmap << " from endpoint " << p.base
                                        << " (must be non-empty, without the source, below endpoint 65536)");
  }
  IFEC_CHECK(spec.packets.size() < (1u << 23), "ECH multicast: " << spec.packets.size() << " packets (PSNs repeat)");
  prune();
  const uint64_t id = next_id_++;
  const uint32_t first = next_psn_;
  next_psn_ = (next_psn_ + static_cast<uint32_t>(spec.packets.size())) & kPsnMask;
  std::shared_ptr<EchMulticast> m(new EchMulticast(*this, std::move(spec), id, first));
  multicasts_[id] = m;
  for (uint32_t i = 0; i < m->spec_.packets.size(); ++i) {
    packet_of_psn_[(first + i) & kPsnMask] = {id, i};
  }
  psn_range_[id] = {first, static_cast<uint32_t>(m->spec_.packets.size())};
  pump(*m);
  return m;
}

// Forgets operations their owners dropped (and the lookups that led to them).
void EchAgent::prune() {
  for (auto it = reductions_.begin(); it != reductions_.end();) {
    it = it->second.expired() ? reductions_.erase(it) : std::next(it);
  }
  for (auto it = reduction_of_group_.begin(); it != reduction_of_group_.end();) {
    it = reductions_.count(it->second) ? std::next(it) : reduction_of_group_.erase(it);
  }
  for (auto it = multicasts_.begin(); it != multicasts_.end();) {
    if (!it->second.expired()) {
      ++it;
      continue;
    }
    const auto [first, n] = psn_range_[it->first];
    for (uint32_t i = 0; i < n; ++i) {
      auto p = packet_of_psn_.find((first + i) & kPsnMask);
      if (p != packet_of_psn_.end() && p->second.first == it->first) {
        packet_of_psn_.erase(p);
      }
    }
    psn_range_.erase(it->first);
    it = multicasts_.erase(it);
  }
}

void EchAgent::accept_multicast(uint16_t window, int source, uint32_t psn_from) {
  accept_from_[source_key(window, source)] = psn_from & kPsnMask;
  replicas_seen_[source_key(window, source)].clear();
}

void EchAgent::pump(EchMulticast& m) {
  for (auto& [plane, q] : m.queue_) {
    size_t& next = m.next_[plane];
    uint32_t& inflight = m.inflight_[plane];
    while (next < q.size() && inflight < m.spec_.window_per_plane) {
      const uint32_t i = q[next++];
      if (m.outcome_[i] != EchOutcome::kPending) {
        continue;
      }
      m.sent_[i] = 1;
      m.sent_ns_[i] = clock().now();
      ++inflight;
      send_packet(m, i, false);
    }
  }
}

void EchAgent::send_packet(EchMulticast& m, size_t i, bool retransmit) {
  const EchPacket& pk = m.spec_.packets[i];
  // Its sub-link follows its PSN, as the switch's replicas of it do (IfecEngine::Emit).
  const uint32_t psn = (m.first_psn_ + static_cast<uint32_t>(i)) & kPsnMask;
  const int port = port_for(pk.plane, psn);
  if (port < 0) {
    m.give_up_plane(pk.plane,
                    "GPU " + std::to_string(ep_.index()) + " has no live link on plane " + std::to_string(pk.plane));
    return;
  }
  arm(m, i, rto(m.rtt_, m.spec_.timing, m.tries_[i]));
  common::FrameHeaders h = headers(port, pk.switch_ip, static_cast<uint16_t>(i),
                                   static_cast<uint8_t>(Opcode::kWriteOnly), common::pkey_of_job(m.spec_.job), psn);
  Ech ech;
  ech.format = EchFormat::kCompact;
  ech.op = common::EchOp::kMulticast;
  ech.flags = retransmit ? common::ech_flags::kRetransmission : 0;
  ech.source_id = static_cast<uint16_t>(ep_.index());
  ech.window_id = m.spec_.window;
  ech.dest_bitmap = pk.bitmap;
  ech.bitmap_base = pk.base;
  h.ech = ech;
  h.reth = common::Reth{pk.offset, 0, pk.len};
  const uint8_t* bytes = ep_.config().elided_payloads ? nullptr : ep_.memory().window(m.spec_.window)->data + pk.offset;
  std::vector<uint8_t> f = common::encode_frame(h, bytes, pk.len);
  counters_.retransmit_bytes += retransmit ? f.size() : 0;
  ep_.send_frame(port, std::move(f));
  counters_.multicast_sent++;
  counters_.retransmissions += retransmit;
}

// -------------------------------------------------------------------------------------------------- receive --

// A group's last activity here. Group ids come back (a communicator cycles through them): a result for a group that
// matches no running reduction is a late copy only while the group's last reduction could still be answered by
// its switch (a few of its longest timeouts); after that, or for a group never used, it is early.
void EchAgent::note_group(const GroupKey& k, common::TimeNs max_rto_ns) {
  const common::TimeNs now = clock().now();
  auto [it, added] = group_activity_.insert_or_assign(k, std::make_pair(now, 4 * max_rto_ns));
  (void)it;
  // Stale entries go when the map has doubled since the last sweep: amortised O(1) per result frame, even when
  // every remembered group is still recent.
  if (added && group_activity_.size() >= next_group_sweep_) {
    for (auto g = group_activity_.begin(); g != group_activity_.end();) {
      g = now - g->second.first > g->second.second ? group_activity_.erase(g) : std::next(g);
    }
    next_group_sweep_ = std::max(kGroupsRemembered, 2 * group_activity_.size());
  }
}

void EchAgent::keep_early(const GroupKey& k, int port, const common::ParsedFrame& pf, const uint8_t* frame) {
  if (early_frames_ >= kEarlyFrames) {
    return;  // the switch sends it again once this side is quiet for the group's timeout
  }
  const size_t len = pf.elided ? pf.payload_offset : pf.ip_offset + pf.h.ip.total_length;
  early_[k].push_back({port, clock().now(), pf, std::vector<uint8_t>(frame, frame + len)});
  ++early_frames_;
}

// As its own event (a result may finish the reduction, whose owner may then start the next): the kept results of
// the reduction's groups, those younger than four of its longest timeouts, as if they arrived now.
void EchAgent::take_early(uint64_t reduction_id) {
  std::weak_ptr<bool> alive = alive_;
  clock().schedule(clock().now(), [this, alive, reduction_id] {
    auto a = alive.lock();
    auto it = reductions_.find(reduction_id);
    std::shared_ptr<EchReduction> r = (a && *a && it != reductions_.end()) ? it->second.lock() : nullptr;
    if (!r) {
      return;
    }
    for (const EchLane& l : r->spec_.lanes) {
      auto e = early_.find({l.switch_ip, r->spec_.job, l.group});
      if (e == early_.end()) {
        continue;
      }
      std::vector<EarlyFrame> frames = std::move(e->second);
      early_.erase(e);
      early_frames_ -= frames.size();
      for (const EarlyFrame& f : frames) {
        if (clock().now() - f.at <= 4 * r->spec_.timing.max_rto_ns) {
          counters_.early_results_taken++;
          on_reduce_frame(f.port, f.pf, f.bytes.data());
        }
      }
    }
  });
}

bool EchAgent::recently_used(const GroupKey& k) {
  auto it = group_activity_.find(k);
  return it != group_activity_.end() && clock().now() - it->second.first <= it->second.second;
}

void EchAgent::receive(int port, const common::ParsedFrame& pf, const uint8_t* frame) {
  if (pf.h.ech->format == EchFormat::kCompact) {
    on_compact_frame(port, pf, frame);
  } else {
    on_reduce_frame(port, pf, frame);
  }
}

void EchAgent::on_reduce_frame(int port, const common::ParsedFrame& pf, const uint8_t* frame) {
  const Ech& ech = *pf.h.ech;
  auto g = reduction_of_group_.find({pf.h.ip.src, ech.job_id, ech.group_id});
  std::shared_ptr<EchReduction> r;
  if (g != reduction_of_group_.end()) {
    auto it = reductions_.find(g->second);
    r = it == reductions_.end() ? nullptr : it->second.lock();
  }
  const bool write = pf.h.bth.opcode == static_cast<uint8_t>(Opcode::kWriteOnly);
  size_t i = 0;
  bool found = false;
  if (r) {
    auto l = r->lane_of_.find(uint64_t{pf.h.ip.src} << 16 | ech.group_id);
    const uint32_t c = l == r->lane_of_.end() ? EchReduction::kNoChunk : r->chunk_of(l->second, ech.chunk_index);
    found = c != EchReduction::kNoChunk;
    i = found ? c : 0;
  }
  if (!found) {
    if (write && !recently_used({pf.h.ip.src, ech.job_id, ech.group_id})) {
      // A result for a group this endpoint has not started yet (its peers began the operation first): kept for
      // the reduction that starts it here, unacknowledged until then (keep_early).
      counters_.early_results++;
      keep_early({pf.h.ip.src, ech.job_id, ech.group_id}, port, pf, frame);
      return;
    }
    counters_.unmatched++;
    if (write) {
      send_ack(port, pf);  // a late result or notice: quiet the switch, write nothing
    }
    return;
  }
  const EchChunk& c = r->spec_.chunks[i];
  const bool pending = r->outcome_[i] == EchOutcome::kPending;
  note_group({pf.h.ip.src, ech.job_id, ech.group_id}, r->spec_.timing.max_rto_ns);
  auto sample = [&] {
    if (c.contribute && r->tries_[i] == 0 && r->busy_[i] == 0 && r->sent_[i]) {
      r->rtt_.sample(clock().now() - r->sent_ns_[i]);
    }
  };
  if (!write) {
    if (pf.h.aeth && pf.h.aeth->kind() == common::AethKind::kRnrNak) {
      if (pending && c.contribute) {  // slot busy with an older chunk: retry soon, not after the loss timeout
        counters_.busy_naks++;
        arm(*r, i, r->spec_.timing.busy_retry_ns << std::min<int>(r->busy_[i]++, 3), false);
      }
      return;
    }
    if (pf.h.aeth && pf.h.aeth->kind() == common::AethKind::kNak) {
      if (pending && c.contribute) {  // the switch has later chunks of ours but not this one: it was lost
        counters_.resend_requests++;
        send_contribution(*r, i, true);
      }
      return;
    }
    if (pending && c.contribute && !c.receive) {  // contribution accepted; no result comes here
      sample();
      r->finish(i, EchOutcome::kDone);
      probe_answered(*r, i);
      pump(*r);
    } else if (pending && c.contribute) {
      // Held: the switch has our contribution and waits for other members (one a loaded host runs late). Their
      // result, or the slot timeout's notice, ends the chunk; resending meanwhile only adds to the switch's load.
      counters_.held_acks++;
      r->held_[i] = 1;
      arm(*r, i, kHeldWaits * r->spec_.timing.max_rto_ns, true);
      probe_answered(*r, i);
    }
    return;
  }
  if (!pending) {
    counters_.duplicate_results++;  // landed already, or given up: acknowledge again, write nothing
    counters_.duplicate_ack_bytes += send_ack(port, pf);
    return;
  }
  if (is_notice(pf, r->spec_.op)) {
    counters_.anomaly_notices++;  // the slot timed out, or this member's result was released
    r->finish(i, EchOutcome::kAnomaly);
  } else {
    const size_t bytes = size_t{c.elements} * common::ech_dtype_size(r->spec_.dtype);
    if (!c.receive || pf.payload_size != bytes || !write_checked(pf, frame)) {
      counters_.protection_drops++;
      return;  // not acknowledged: a wrong result never lands, and the switch cannot free the slot for it
    }
    counters_.results_written++;
    r->flagged_results_ += (pf.h.ech->flags & common::ech_flags::kAnomaly) != 0;
    sample();
    r->finish(i, EchOutcome::kDone);
    probe_answered(*r, i);
  }
  send_ack(port, pf);
  pump(*r);
}

void EchAgent::on_compact_frame(int port, const common::ParsedFrame& pf, const uint8_t* frame) {
  const Ech& ech = *pf.h.ech;
  const uint32_t psn = pf.h.bth.psn & kPsnMask;
  if (pf.h.bth.opcode != static_cast<uint8_t>(Opcode::kWriteOnly)) {
    // The switch's single completion for one of our packets to all its destinations.
    auto p = packet_of_psn_.find(psn);
    if (ech.source_id != ep_.index() || p == packet_of_psn_.end()) {
      counters_.unmatched++;
      return;
    }
    auto it = multicasts_.find(p->second.first);
    std::shared_ptr<EchMulticast> m = it == multicasts_.end() ? nullptr : it->second.lock();
    if (!m) {
      return;
    }
    const uint32_t i = p->second.second;
    if (m->outcome_[i] == EchOutcome::kPending && m->tries_[i] == 0) {
      m->rtt_.sample(clock().now() - m->sent_ns_[i]);
    }
    const bool resent = m->tries_[i] > 0 && m->outcome_[i] == EchOutcome::kPending;
    m->finish(i, EchOutcome::kDone);
    if (!resent || (ech.flags & common::ech_flags::kRetransmission) != 0) {
      probe_answered(*m, i);
    } else {
      // The original completed before the copy reached the switch: it was late (behind a software switch's queue,
      // or a receiver the machine ran late), not lost, and so, most likely, are the packets whose timers ran out
      // behind it. None goes at this answer; each waits on its own timer, which resends it only after a timeout
      // without progress on the plane. (Resending them answer after answer sent each just before its original's
      // completion came in: hundreds of copies per 256-token MoE dispatch on the live superpod-8x2.)
      counters_.late_multicast_originals++;
    }
    pump(*m);
    return;
  }
  // A replica for us: written (idempotently: every copy carries the same bytes) and acknowledged every time.
  auto from = accept_from_.find(source_key(ech.window_id, ech.source_id));
  if (from != accept_from_.end() && ((psn - from->second) & kPsnMask) >= (1u << 23)) {
    counters_.stale_replicas++;
    counters_.duplicate_ack_bytes += send_ack(port, pf);
    return;
  }
  if (!ech.addresses(ep_.index()) || !write_checked(pf, frame)) {
    counters_.protection_drops++;
    return;
  }
  counters_.replicas_written++;
  const bool fresh = replicas_seen_[source_key(ech.window_id, ech.source_id)].insert(psn).second;
  if (fresh) {
    ep_.remote_written(ech.source_id, pf.h.reth->rkey, pf.h.reth->virtual_address, pf.payload_size);
  } else {
    counters_.duplicate_replicas++;
  }
  const size_t ack = send_ack(port, pf);
  counters_.duplicate_ack_bytes += fresh ? 0 : ack;
}

// The rkey/bounds/job check, then the write: false (nothing written) when the frame may not touch our memory.
bool EchAgent::write_checked(const common::ParsedFrame& pf, const uint8_t* frame) {
  if (!pf.h.reth) {
    return false;
  }
  const common::Reth& r = *pf.h.reth;
  SymmetricMemory& mem = ep_.memory();
  if (pf.payload_size > 0 && mem.check(r.rkey, r.virtual_address, pf.payload_size, common::job_of_pkey(pf.h.bth.pkey),
                                       false) != AccessError::kOk) {
    return false;
  }
  if (pf.payload_size > 0 && !pf.elided) {
    std::memcpy(mem.translate(r.rkey, r.virtual_address), frame + pf.payload_offset, pf.payload_size);
  }
  return true;
}

size_t EchAgent::send_ack(int port, const common::ParsedFrame& pf) {
  common::FrameHeaders h = headers(port, pf.h.ip.src, static_cast<uint16_t>(pf.h.bth.psn),
                                   static_cast<uint8_t>(Opcode::kAcknowledge), pf.h.bth.pkey, pf.h.bth.psn);
  Ech ech = *pf.h.ech;
  ech.element_count = 0;
  ech.flags = 0;
  if (ech.format == EchFormat::kCompact) {
    ech.set_destination(ep_.index());
  }
  h.ech = ech;
  h.aeth = common::Aeth::ack(0);
  std::vector<uint8_t> f = common::encode_frame(h, nullptr, 0);
  const size_t bytes = f.size();
  ep_.send_frame(port, std::move(f));
  return bytes;
}

common::FrameHeaders EchAgent::headers(int port, uint32_t dst_ip, uint16_t entropy, uint8_t opcode, uint16_t pkey,
                                       uint32_t psn) const {
  common::FrameHeaders h;
  h.eth.src = ep_.port_info(port).mac;
  h.eth.dst = ep_.port_info(port).peer_mac;
  h.ip.src = ep_.config().ip;
  h.ip.dst = dst_ip;
  h.ip.dscp = common::kRoceDscp;
  h.ip.ecn = common::kRoceEcn;
  h.udp.src_port = static_cast<uint16_t>(0xC000 | (entropy & 0x3FFF));
  h.bth.opcode = opcode;
  h.bth.pkey = pkey;
  h.bth.dest_qp = common::kEchQpn;
  h.bth.psn = psn & kPsnMask;
  return h;
}

}  // namespace ifec::endpoint
