// RC queue pair: requester and responder state machines.
#include "ifec/endpoint/qp.h"

#include <algorithm>
#include <cstring>

#include "ifec/common/checks.h"

namespace ifec::endpoint {

using common::FrameHeaders;
using common::NakCode;
using common::Opcode;

namespace {

constexpr size_t kAtomicCacheSize = 256;

uint8_t op(Opcode o) { return static_cast<uint8_t>(o); }

bool is_request(uint8_t opcode) {
  return (opcode >= op(Opcode::kWriteFirst) && opcode <= op(Opcode::kReadRequest)) ||
         opcode == op(Opcode::kCompareSwap) || opcode == op(Opcode::kFetchAdd);
}

}  // namespace

QueuePair::QueuePair(common::Clock& clock, QpConfig cfg, SymmetricMemory& memory, std::function<void()> wake)
    : clock_(clock),
      cfg_(std::move(cfg)),
      memory_(memory),
      wake_(std::move(wake)),
      rto_(cfg_.rto_ns),
      rtt_(cfg_.rto_ns),
      alive_(std::make_shared<bool>(true)) {
  IFEC_CHECK(cfg_.mtu >= 256 && cfg_.mtu <= 4096, "QP MTU " << cfg_.mtu << " outside 256..4096");
  IFEC_CHECK(cfg_.max_outstanding >= 1 && cfg_.max_outstanding < cfg_.responder_window,
             "QP window: max_outstanding " << cfg_.max_outstanding << " must be below the responder window "
                                           << cfg_.responder_window);
  if (cfg_.weak) {
    seen_.assign((cfg_.responder_window + 63) / 64, 0);
  }
}

QueuePair::~QueuePair() { *alive_ = false; }

// ---------------------------------------------------------------------------------------------- requester --

void QueuePair::post(Wqe w) {
  if (error_) {
    // The QP gave up on its peer (retry budget exhausted): fail fast instead of queueing forever.
    if (w.done) {
      w.done(OpStatus::kRetryExceeded, 0);
    }
    return;
  }
  w.psn = next_psn_;
  next_psn_ = psn_add(next_psn_, w.npkts);
  const bool was_empty = sq_.empty();
  sq_.push_back(std::move(w));
  if (!timer_armed_) {
    last_progress_ = std::max(last_progress_, clock_.now());
    arm_timer();
  }
  if (was_empty) {
    send_idx_ = 0;
    send_psn_ = sq_.front().psn;
  }
  wake_();
}

Payload Payload::copy_of(const void* src, size_t n) {
  auto v = std::make_shared<const std::vector<uint8_t>>(static_cast<const uint8_t*>(src),
                                                        static_cast<const uint8_t*>(src) + n);
  return {v, v->data(), n};
}

void QueuePair::post_write(uint64_t va, uint32_t rkey, std::shared_ptr<const std::vector<uint8_t>> data, size_t offset,
                           uint32_t len, WqeDone done) {
  const uint8_t* bytes = data->data();
  const size_t size = data->size();
  post_write(va, rkey, Payload{std::move(data), bytes, size}, offset, len, std::move(done));
}

void QueuePair::post_write(uint64_t va, uint32_t rkey, Payload data, size_t offset, uint32_t len, WqeDone done) {
  IFEC_CHECK(offset + len <= data.size,
             "post_write: bytes [" << offset << ", +" << len << ") outside a payload of " << data.size);
  Wqe w;
  w.kind = Wqe::kWrite;
  w.va = va;
  w.rkey = rkey;
  w.len = len;
  w.data = std::move(data);
  w.data_offset = offset;
  w.npkts = std::max<uint32_t>(1, (len + cfg_.mtu - 1) / cfg_.mtu);
  w.done = std::move(done);
  post(std::move(w));
}

void QueuePair::post_read(uint64_t va, uint32_t rkey, uint8_t* dst, uint32_t len, WqeDone done) {
  Wqe w;
  w.kind = Wqe::kRead;
  w.va = va;
  w.rkey = rkey;
  w.len = len;
  w.read_dst = dst;
  w.npkts = std::max<uint32_t>(1, (len + cfg_.mtu - 1) / cfg_.mtu);
  w.read_got.assign(w.npkts, 0);
  w.done = std::move(done);
  post(std::move(w));
}

void QueuePair::post_atomic(bool compare_swap, uint64_t va, uint32_t rkey, uint64_t swap_or_add, uint64_t compare,
                            WqeDone done) {
  Wqe w;
  w.kind = Wqe::kAtomic;
  w.cas = compare_swap;
  w.va = va;
  w.rkey = rkey;
  w.len = 8;
  w.swap_or_add = swap_or_add;
  w.compare = compare;
  w.done = std::move(done);
  post(std::move(w));
}

bool QueuePair::has_frame() const {
  if (!out_.empty()) {
    return true;
  }
  if (send_idx_ >= sq_.size() || awaiting_peer_) {
    return false;  // peer_reset() wakes us
  }
  if (reconnect_pending_ && psn_diff(sq_[send_idx_].psn, reconnect_psn_) >= 0) {
    return false;  // the reconnect wakes us
  }
  if (psn_diff(send_psn_, go_back_psn()) >= static_cast<int32_t>(cfg_.max_outstanding)) {
    return false;
  }
  return true;  // may still turn out to be only finished WQEs; next_frame() then returns nothing
}

std::vector<uint8_t> QueuePair::next_frame() {
  if (!out_.empty()) {
    std::vector<uint8_t> f = std::move(out_.front());
    out_.pop_front();
    return f;
  }
  return request_frame();
}

std::vector<uint8_t> QueuePair::frame(uint8_t opcode, uint32_t psn, const uint8_t* payload, size_t len,
                                      const std::function<void(FrameHeaders&)>& fill) {
  FrameHeaders h = cfg_.headers;
  h.bth = common::Bth{};
  h.bth.opcode = opcode;
  h.bth.pkey = cfg_.pkey;
  h.bth.dest_qp = cfg_.remote_qpn;
  h.bth.psn = psn;
  if (fill) {
    fill(h);
  }
  return common::encode_frame(h, cfg_.elided_payloads ? nullptr : payload, len);
}

std::vector<uint8_t> QueuePair::request_frame() {
  while (send_idx_ < sq_.size()) {
    Wqe& w = sq_[send_idx_];
    const int32_t k = psn_diff(send_psn_, w.psn);
    const bool past_wqe = w.kind == Wqe::kWrite ? k >= static_cast<int32_t>(w.npkts) : k > 0;
    if (w.finished || past_wqe || k < 0) {
      ++send_idx_;
      if (send_idx_ < sq_.size()) {
        send_psn_ = sq_[send_idx_].psn;
      } else {
        send_psn_ = next_psn_;
      }
      continue;
    }
    if (w.kind == Wqe::kWrite && psn_diff(send_psn_, acked_) <= 0) {
      send_psn_ = psn_add(acked_, 1);  // the responder already has these
      continue;
    }
    if (psn_diff(send_psn_, go_back_psn()) >= static_cast<int32_t>(cfg_.max_outstanding)) {
      return {};  // window full: an ACK will wake us
    }
    if (reconnect_pending_ && psn_diff(w.psn, reconnect_psn_) >= 0) {
      return {};  // after a fatal NAK only work before the failure may still go out
    }
    if (awaiting_peer_) {
      return {};  // renumbered: the peer's responder does not expect these PSNs yet
    }
    const uint32_t psn = send_psn_;
    const bool retransmit = max_sent_ != 0xFFFFFF && psn_diff(psn, max_sent_) <= 0;
    // Nothing was in flight (everything sent so far is acknowledged): an outstanding period starts now, even if the
    // timer of the last one is still armed (it runs out after the QP went idle; counted from that period's last
    // progress, it would time this packet out at once: a spurious retransmission of the next operation's first
    // packets, seen on the live fabric where operations follow each other on the same QPs).
    if (!retransmit && psn_diff(max_sent_, acked_) <= 0) {
      last_progress_ = std::max(last_progress_, clock_.now());
    }
    std::vector<uint8_t> f;
    bool asked = true;  // reads and atomics always ask
    if (w.kind == Wqe::kWrite) {
      const uint32_t off = static_cast<uint32_t>(k) * cfg_.mtu;
      const uint32_t len = std::min(cfg_.mtu, w.len - std::min(w.len, off));
      const uint8_t* payload = w.data.bytes != nullptr ? w.data.bytes + w.data_offset + off : nullptr;
      const bool last = static_cast<uint32_t>(k) + 1 == w.npkts;
      const bool ack_req = last || retransmit || psn % cfg_.ack_every == 0 ||
                           clock_.now() >= last_ack_req_ + std::max<common::TimeNs>(rto_ / 4, 1);
      asked = ack_req;
      uint8_t opcode;
      if (cfg_.weak || w.npkts == 1) {
        opcode = op(Opcode::kWriteOnly);
      } else if (k == 0) {
        opcode = op(Opcode::kWriteFirst);
      } else {
        opcode = op(last ? Opcode::kWriteLast : Opcode::kWriteMiddle);
      }
      f = frame(opcode, psn, payload, len, [&](FrameHeaders& h) {
        h.bth.ack_req = ack_req;
        if (opcode == op(Opcode::kWriteOnly)) {
          h.reth = common::Reth{w.va + off, w.rkey, cfg_.weak ? len : w.len};
        } else if (opcode == op(Opcode::kWriteFirst)) {
          h.reth = common::Reth{w.va, w.rkey, w.len};
        }
      });
      send_psn_ = psn_add(psn, 1);
    } else if (w.kind == Wqe::kRead) {
      f = frame(op(Opcode::kReadRequest), psn, nullptr, 0, [&](FrameHeaders& h) {
        h.bth.ack_req = true;
        h.reth = common::Reth{w.va, w.rkey, w.len};
      });
      send_psn_ = psn_add(psn, w.npkts);
    } else {
      f = frame(op(w.cas ? Opcode::kCompareSwap : Opcode::kFetchAdd), psn, nullptr, 0, [&](FrameHeaders& h) {
        h.bth.ack_req = true;
        h.atomic = common::AtomicEth{w.va, w.rkey, w.swap_or_add, w.compare};
      });
      send_psn_ = psn_add(psn, 1);
    }
    counters_.tx_packets++;
    if (asked) {
      last_ack_req_ = clock_.now();
    }
    if (cfg_.adaptive_rto) {
      note_sent(psn, retransmit);
    }
    if (retransmit) {
      counters_.retransmits++;
      counters_.retransmit_bytes += f.size();
    } else {
      max_sent_ = psn_add(send_psn_, -1);
    }
    if (!timer_armed_) {
      last_progress_ = std::max(last_progress_, clock_.now());  // a new outstanding period starts now
      arm_timer();
    }
    if (resend_left_ > 0 && (--resend_left_ == 0 || psn_diff(send_psn_, recover_psn_) > 0)) {
      resend_left_ = 0;  // the packets a timeout (or a probe's ACK) resends went out: back where the cursor was
      probe_psn_ = psn;
      if (psn_diff(resume_psn_, send_psn_) > 0) {
        seek(resume_psn_);
      }
    }
    return f;
  }
  return {};
}

void QueuePair::note_sent(uint32_t psn, bool retransmit) {
  // Every PSN after the last acknowledged one up to this one may still be acknowledged: they must not share a slot.
  const auto span = static_cast<uint32_t>(std::max(0, psn_diff(psn, acked_)));
  if (span >= sent_at_.size() && sent_at_.size() < kMaxSentRing) {
    size_t size = std::max<size_t>(16, sent_at_.size());
    while (size <= span && size < kMaxSentRing) {
      size *= 2;
    }
    std::vector<uint32_t> psns(size, 0);
    std::vector<common::TimeNs> at(size, 0);
    for (size_t i = 0; i < sent_at_.size(); ++i) {
      const uint32_t q = sent_psn_[i];
      if ((q & (sent_at_.size() - 1)) == i && psn_diff(q, acked_) > 0 && psn_diff(q, psn) < 0) {  // in flight
        psns[q & (size - 1)] = q;
        at[q & (size - 1)] = sent_at_[i];
      }
    }
    sent_psn_.swap(psns);
    sent_at_.swap(at);
  }
  const size_t slot = psn & (sent_at_.size() - 1);
  sent_psn_[slot] = psn;
  sent_at_[slot] = retransmit ? 0 : clock_.now();
}

QueuePair::Wqe* QueuePair::find_wqe(uint32_t psn) {
  for (Wqe& w : sq_) {
    const int32_t k = psn_diff(psn, w.psn);
    if (k >= 0 && k < static_cast<int32_t>(w.npkts)) {
      return &w;
    }
  }
  return nullptr;
}

bool QueuePair::outstanding() const {
  // Unsent work counts too: if the NIC cannot send at all (its link is down), the timer must still run out.
  for (const Wqe& w : sq_) {
    if (!w.finished) {
      return true;
    }
  }
  return false;
}

void QueuePair::acknowledge_through(uint32_t psn) {
  if (sq_.empty() || psn_diff(psn, acked_) <= 0 || psn_diff(psn, next_psn_) >= 0) {
    return;  // stale, duplicate, or for PSNs never sent
  }
  acked_ = psn;
  for (Wqe& w : sq_) {
    if (psn_diff(w.psn, psn) > 0) {
      break;
    }
    if (w.kind == Wqe::kWrite && !w.finished && psn_diff(psn_add(w.psn, w.npkts - 1), psn) <= 0) {
      w.finished = true;
    }
  }
  retries_ = 0;
  if (recovering_) {
    resend_after_probe();
  }
  const size_t slot = sent_at_.empty() ? 0 : psn & (sent_at_.size() - 1);
  const bool sampled = cfg_.adaptive_rto && !sent_at_.empty() && sent_psn_[slot] == psn && sent_at_[slot] != 0;
  if (sampled) {
    rtt_.sample(clock_.now() - sent_at_[slot]);
  }
  // Karn: an ACK of a retransmitted packet is no sample, and the backed-off timeout stays until a valid one.
  if (!cfg_.adaptive_rto || sampled) {
    rto_ = base_rto();
  }
  last_progress_ = clock_.now();
  complete_in_order();
}

uint32_t QueuePair::go_back_psn() const {
  for (const Wqe& w : sq_) {
    if (w.finished) {
      continue;
    }
    if (w.kind == Wqe::kWrite && psn_diff(acked_, w.psn) >= 0) {
      return psn_add(acked_, 1);
    }
    return w.psn;
  }
  return next_psn_;
}

void QueuePair::seek(uint32_t psn) {
  for (size_t i = 0; i < sq_.size(); ++i) {
    const Wqe& w = sq_[i];
    const int32_t k = psn_diff(psn, w.psn);
    if (k < static_cast<int32_t>(w.npkts)) {
      send_idx_ = i;
      send_psn_ = k > 0 && w.kind == Wqe::kWrite ? psn : w.psn;
      return;
    }
  }
  send_idx_ = sq_.size();
  send_psn_ = next_psn_;
}

void QueuePair::go_back(uint32_t psn) {
  resend_left_ = 0;
  for (size_t i = 0; i < sq_.size(); ++i) {
    const Wqe& w = sq_[i];
    const int32_t k = psn_diff(psn, w.psn);
    if (k >= 0 && k < static_cast<int32_t>(w.npkts)) {
      send_idx_ = i;
      send_psn_ = w.kind == Wqe::kWrite ? psn : w.psn;
      wake_();
      return;
    }
  }
}

// Resends `packets` packets from `from` (weak ordering), then goes on where the send cursor was.
void QueuePair::start_resend(uint32_t from, uint32_t packets) {
  const uint32_t resume = resend_left_ > 0 ? resume_psn_ : send_psn_;
  go_back(from);
  resume_psn_ = resume;
  resend_left_ = packets;
  burst_ = static_cast<uint16_t>(packets);
}

// Weak ordering, recovering from a timeout: an ACK that stops exactly at the last packet resent says it arrived,
// and if no ACK passes it for an eighth of the timeout, the packet after it, sent before the timeout, did not: a
// failed link lost a run of them. Resend the next ones then, twice as many as the last burst (a round trip and the
// wait per burst, not a timeout per packet). After a spurious timeout (a queue longer than the timer: nothing lost)
// the originals' ACKs keep passing the packet resent, and nothing more is resent.
void QueuePair::resend_after_probe() {
  if (psn_diff(acked_, recover_psn_) >= 0) {
    recovering_ = false;
    return;
  }
  if (acked_ != probe_psn_ || resend_left_ > 0) {
    return;
  }
  std::weak_ptr<bool> alive = alive_;
  clock_.schedule(clock_.now() + std::max<common::TimeNs>(base_rto() / 8, 1), [this, alive, at = acked_] {
    if (auto a = alive.lock(); a && *a) {
      resend_if_still_missing(at);
    }
  });
}

void QueuePair::resend_if_still_missing(uint32_t at) {
  if (!recovering_ || error_ || acked_ != at || probe_psn_ != at || resend_left_ > 0) {
    return;  // an ACK passed it (or the recovery ended, or a timeout resent meanwhile)
  }
  const Wqe* w = find_wqe(psn_add(acked_, 1));
  if (w == nullptr || w->finished || w->kind != Wqe::kWrite) {
    return;  // (reads and atomics wait for the timer)
  }
  const auto room = static_cast<uint32_t>(psn_diff(recover_psn_, acked_));
  start_resend(psn_add(acked_, 1), std::min<uint32_t>({2u * burst_, 256u, room}));
}

void QueuePair::maybe_reconnect() {
  if (!reconnect_pending_) {
    return;
  }
  // Out of order, work before the failure may still be in flight (and atomics among it must not run twice):
  // reconnect only once all of it finished. In order it already has.
  for (const Wqe& w : sq_) {
    if (psn_diff(w.psn, reconnect_psn_) >= 0) {
      break;
    }
    if (!w.finished) {
      return;
    }
  }
  reconnect_pending_ = false;
  reconnect_after(reconnect_psn_);
}

void QueuePair::reconnect_after(uint32_t failed_psn) {
  // Nothing after the failed request executed (the responder NAKs everything once in error): renumber it from
  // a PSN half the space away, so anything still in flight from before is recognisably stale, and reconnect.
  const uint32_t base = psn_add(next_psn_, 0x400000);
  uint32_t psn = base;
  for (Wqe& w : sq_) {
    if (w.finished) {
      continue;
    }
    w.psn = psn;
    psn = psn_add(psn, w.npkts);
    std::fill(w.read_got.begin(), w.read_got.end(), 0);
    w.read_got_count = 0;
  }
  (void)failed_psn;
  next_psn_ = psn;
  acked_ = psn_add(base, -1);
  max_sent_ = psn_add(base, -1);
  resend_left_ = 0;
  recovering_ = false;
  retries_ = 0;
  rto_ = base_rto();
  last_progress_ = clock_.now();
  timer_armed_ = false;
  ++timer_generation_;
  // Nothing goes out under the new numbering until the peer's responder expects it (peer_reset); the retransmit
  // timer still runs over the waiting work, so a peer that never answers ends in kRetryExceeded, not a hang.
  awaiting_peer_ = static_cast<bool>(reconnect_);
  awaited_psn_ = base;
  complete_in_order();  // reports the failed request (it is at or near the front) and resets the send cursor
  send_idx_ = 0;
  while (send_idx_ < sq_.size() && sq_[send_idx_].finished) {
    ++send_idx_;
  }
  send_psn_ = send_idx_ < sq_.size() ? sq_[send_idx_].psn : next_psn_;
  if (!timer_armed_ && outstanding()) {
    arm_timer();
  }
  if (reconnect_) {
    reconnect_(base);  // may answer peer_reset at once (an in-process peer)
  }
  wake_();
}

void QueuePair::peer_reset(uint32_t psn, bool ok) {
  if (!awaiting_peer_ || psn != awaited_psn_ || error_) {
    return;  // a late answer to an earlier reconnect, or the QP already gave up
  }
  awaiting_peer_ = false;
  if (!ok) {
    fail_all(OpStatus::kRetryExceeded);  // the peer could not be reached to reset its responder
    return;
  }
  retries_ = 0;  // time spent waiting for the peer is not the new requests' retry budget
  rto_ = base_rto();
  last_progress_ = clock_.now();
  wake_();
}

void QueuePair::complete_in_order() {
  while (!sq_.empty() && sq_.front().finished) {
    Wqe w = std::move(sq_.front());
    sq_.pop_front();
    if (send_idx_ > 0) {
      --send_idx_;
    }
    if (w.done) {
      w.done(w.status, w.result);
    }
  }
  if (sq_.empty()) {
    send_idx_ = 0;
    send_psn_ = next_psn_;
    sq_.release_if_empty();
  }
  maybe_reconnect();
  wake_();
}

void QueuePair::arm_timer() {
  if (timer_armed_) {
    return;
  }
  timer_armed_ = true;
  const uint64_t gen = ++timer_generation_;
  std::weak_ptr<bool> alive = alive_;
  clock_.schedule(last_progress_ + rto_, [this, gen, alive] {
    if (auto a = alive.lock(); a && *a) {
      on_timer(gen);
    }
  });
}

void QueuePair::on_timer(uint64_t generation) {
  if (generation != timer_generation_) {
    return;
  }
  timer_armed_ = false;
  if (!outstanding()) {
    return;
  }
  const common::TimeNs now = clock_.now();
  if (now < last_progress_ + rto_) {
    arm_timer();  // progress since arming: wait out the rest of the interval
    return;
  }
  counters_.timeouts++;
  if (++retries_ > cfg_.max_retries) {
    fail_all(OpStatus::kRetryExceeded);
    return;
  }
  rto_ = std::min(rto_ * 2, cfg_.rto_max_ns);
  last_progress_ = now;
  // In order, the responder dropped whatever followed a lost packet: go back N. Out of order (weak) it kept them:
  // resend the oldest unacknowledged packet, then go on where the send cursor was, not the whole window again. A
  // timeout is as often a queue longer than the timer (everything still on its way) as a loss, and a window's
  // copies queued behind the originals would make the next timeouts: a congestion collapse, seen on the live
  // fabric's software switches. Once the lost packet is repaired the ACK covers the successors that arrived.
  if (!cfg_.weak) {
    go_back(go_back_psn());
  } else {
    // What follows a lost run is resend_after_probe's (doubling here as well, on timeouts that found the recovery
    // open after progress, resent packets that had arrived: a ring AllReduce under 1% loss took 11% longer).
    if (!recovering_) {
      recovering_ = true;
      recover_psn_ = max_sent_;
    }
    start_resend(go_back_psn(), 1);
  }
  arm_timer();
}

void QueuePair::fail_all(OpStatus status) {
  error_ = true;
  for (Wqe& w : sq_) {
    if (!w.finished) {
      w.finished = true;
      w.status = status;
    }
  }
  complete_in_order();
}

void QueuePair::on_response(const common::ParsedFrame& pf, const uint8_t* frame) {
  const uint8_t opcode = pf.h.bth.opcode;
  const uint32_t psn = pf.h.bth.psn;
  counters_.rx_responses++;
  if (opcode == op(Opcode::kAcknowledge)) {
    const common::Aeth& a = *pf.h.aeth;
    if (a.kind() == common::AethKind::kAck) {
      acknowledge_through(psn);
      return;
    }
    if (a.kind() != common::AethKind::kNak) {
      counters_.unexpected_responses++;
      return;
    }
    counters_.naks_received++;
    const auto code = static_cast<NakCode>(a.value());
    if (code == NakCode::kPsnSequenceError) {
      // Everything before `psn` arrived; resend from there (a stale NAK is ignored).
      acknowledge_through(psn_add(psn, -1));
      if (psn_diff(psn, acked_) == 1) {
        go_back(psn);
      }
      return;
    }
    // Remote access / invalid request: the responder half is now in error.
    if (!cfg_.weak) {
      acknowledge_through(psn_add(psn, -1));  // in order: everything before it executed
    }
    Wqe* w = find_wqe(psn);
    if (w == nullptr || w->finished) {
      counters_.unexpected_responses++;  // a repeat of a NAK we already acted on
      return;
    }
    w->finished = true;
    w->status = code == NakCode::kRemoteAccessError ? OpStatus::kRemoteAccessError : OpStatus::kInvalidArgument;
    reconnect_pending_ = true;
    reconnect_psn_ = psn;
    maybe_reconnect();
    return;
  }
  Wqe* w = find_wqe(psn);
  if (w == nullptr || w->finished) {
    counters_.unexpected_responses++;
    return;
  }
  if (opcode == op(Opcode::kAtomicAcknowledge)) {
    if (w->kind != Wqe::kAtomic) {
      counters_.unexpected_responses++;
      return;
    }
    w->result = pf.h.atomic_ack->original_data;
    w->finished = true;
    if (!cfg_.weak) {
      // In order, a response also acknowledges every request before it; out of order it says nothing about them.
      acknowledge_through(psn_add(psn, -1));
      if (psn_diff(psn, acked_) > 0) {
        acked_ = psn;
      }
    }
    last_progress_ = clock_.now();
    complete_in_order();
    return;
  }
  // READ response: place by offset; any order, duplicates harmless.
  if (w->kind != Wqe::kRead) {
    counters_.unexpected_responses++;
    return;
  }
  const uint32_t k = static_cast<uint32_t>(psn_diff(psn, w->psn));
  const uint32_t off = k * cfg_.mtu;
  const uint32_t expect = std::min(cfg_.mtu, w->len - std::min(w->len, off));
  if (pf.payload_size != expect) {
    counters_.unexpected_responses++;
    return;
  }
  if (!w->read_got[k]) {
    w->read_got[k] = 1;
    w->read_got_count++;
    if (expect > 0 && !pf.elided) {
      std::memcpy(w->read_dst + off, frame + pf.payload_offset, expect);
    }
  }
  if (!cfg_.weak) {
    acknowledge_through(psn_add(w->psn, -1));  // in order, a READ response acknowledges what came before it
    // Completions there may have posted more work, and a posted WQE may move the queue's ring: look w up again.
    w = find_wqe(psn);
  }
  last_progress_ = clock_.now();
  if (w != nullptr && w->read_got_count == w->npkts) {
    w->finished = true;
    const uint32_t last = psn_add(w->psn, w->npkts - 1);
    if (!cfg_.weak && psn_diff(last, acked_) > 0) {
      acked_ = last;
    }
    complete_in_order();
  }
}

// ---------------------------------------------------------------------------------------------- responder --

void QueuePair::receive(const common::ParsedFrame& pf, const uint8_t* frame) {
  if (is_request(pf.h.bth.opcode)) {
    on_request(pf, frame);
  } else {
    on_response(pf, frame);
  }
}

void QueuePair::attach_external(uint32_t remote_qpn, uint32_t first_request_psn, uint16_t pkey) {
  // A new peer QP (or the same peer attached again after an error): work still queued for the old one fails,
  // and the requester starts clean at next_psn(), which the caller hands the peer as this side's first PSN.
  fail_all(OpStatus::kRetryExceeded);  // completes and removes every queued request
  error_ = false;
  awaiting_peer_ = false;
  reconnect_pending_ = false;
  send_idx_ = 0;
  send_psn_ = next_psn_;
  acked_ = psn_add(next_psn_, -1);
  max_sent_ = acked_;
  resend_left_ = 0;
  recovering_ = false;
  retries_ = 0;
  rto_ = base_rto();
  timer_armed_ = false;
  ++timer_generation_;
  cfg_.remote_qpn = remote_qpn & 0xFFFFFF;
  cfg_.pkey = pkey;
  cfg_.weak = false;
  external_ = true;
  reset_responder(first_request_psn & 0xFFFFFF);
}

void QueuePair::reject_unsupported(uint32_t psn) {
  if (!external_) {
    return;
  }
  counters_.rx_requests++;
  if (fatal_) {
    send_nak(fatal_code_, fatal_psn_);
  } else if (psn_diff(psn, epsn_) == 0) {
    fatal(NakCode::kInvalidRequest, psn);
  }
}

void QueuePair::reset_responder(uint32_t psn) {
  epsn_ = psn;
  nak_pending_ = false;
  fatal_ = false;
  msg_ = {};
  std::fill(seen_.begin(), seen_.end(), uint64_t{0});
}

void QueuePair::fatal(NakCode code, uint32_t psn) {
  fatal_ = true;
  fatal_code_ = code;
  fatal_psn_ = psn;
  if (code == NakCode::kRemoteAccessError) {
    counters_.access_naks_sent++;
  }
  send_nak(code, psn);
}

void QueuePair::on_request(const common::ParsedFrame& pf, const uint8_t* frame) {
  counters_.rx_requests++;
  const uint32_t psn = pf.h.bth.psn;
  const uint8_t opcode = pf.h.bth.opcode;
  if (fatal_ && psn_diff(psn, fatal_psn_) >= 0) {
    // In error: nothing at or after the failed request executes until the requester reconnects, and every such
    // request learns which one failed. Earlier ones (late, out of order) still complete.
    if (pf.h.bth.ack_req || psn == fatal_psn_) {
      send_nak(fatal_code_, fatal_psn_);
    }
    return;
  }
  uint32_t npkts = 1;
  if (opcode == op(Opcode::kReadRequest)) {
    npkts = std::max<uint32_t>(1, (pf.h.reth->dma_length + cfg_.mtu - 1) / cfg_.mtu);
  }
  const int32_t d = psn_diff(psn, epsn_);
  if (d < 0) {
    duplicate(pf);
    return;
  }
  if (d >= static_cast<int32_t>(cfg_.responder_window) ||
      (cfg_.weak && d + static_cast<int64_t>(npkts) > cfg_.responder_window)) {
    counters_.far_psn_drops++;
    return;
  }
  const bool is_write = opcode >= op(Opcode::kWriteFirst) && opcode <= op(Opcode::kWriteOnlyImm);
  if (!cfg_.weak) {
    if (d > 0) {
      counters_.out_of_order++;
      if (!nak_pending_) {
        nak_pending_ = true;
        send_nak(NakCode::kPsnSequenceError, epsn_);
      }
      return;
    }
    nak_pending_ = false;
    if (!execute(pf, frame)) {
      return;
    }
    epsn_ = psn_add(epsn_, npkts);
    if (pf.h.bth.ack_req && is_write) {
      send_ack();
    }
    return;
  }
  // Weak: execute once, in whatever order packets come.
  if (seen(psn)) {
    duplicate(pf);
    return;
  }
  if (d > 0) {
    counters_.out_of_order++;
  }
  if (!execute(pf, frame)) {
    return;
  }
  for (uint32_t i = 0; i < npkts; ++i) {
    set_seen(psn_add(psn, i), true);
  }
  uint32_t advanced = 0;
  while (seen(epsn_)) {
    set_seen(epsn_, false);
    epsn_ = psn_add(epsn_, 1);
    ++advanced;
  }
  // ACK when asked, or when this packet filled a gap (a retransmission may not carry AckReq).
  if (is_write && (pf.h.bth.ack_req || advanced > 1)) {
    send_ack();
  }
}

bool QueuePair::execute(const common::ParsedFrame& pf, const uint8_t* frame) {
  const uint8_t opcode = pf.h.bth.opcode;
  const uint32_t psn = pf.h.bth.psn;
  const uint32_t job = common::job_of_pkey(pf.h.bth.pkey);
  const uint8_t* payload = frame + pf.payload_offset;
  const uint32_t len = static_cast<uint32_t>(pf.payload_size);
  if (opcode == op(Opcode::kWriteFirst) || opcode == op(Opcode::kWriteOnly) || opcode == op(Opcode::kWriteOnlyImm)) {
    const common::Reth& r = *pf.h.reth;
    const bool only = opcode != op(Opcode::kWriteFirst);
    if (memory_.check(r.rkey, r.virtual_address, r.dma_length, job, false) != AccessError::kOk) {
      fatal(NakCode::kRemoteAccessError, psn);  // memory untouched
      return false;
    }
    if (only ? len != r.dma_length : (len != cfg_.mtu || len >= r.dma_length)) {
      fatal(NakCode::kInvalidRequest, psn);  // lengths disagree with the RETH
      return false;
    }
    if (!pf.elided) {
      std::memcpy(memory_.translate(r.rkey, r.virtual_address), payload, len);
    }
    if (on_write_) {
      on_write_(r.rkey, r.virtual_address, len);
    }
    if (only) {
      ++msn_;
    } else {
      msg_.active = true;
      msg_.va = r.virtual_address + len;
      msg_.rkey = r.rkey;
      msg_.remaining = r.dma_length - len;
    }
    return true;
  }
  if (opcode == op(Opcode::kWriteMiddle) || opcode == op(Opcode::kWriteLast) || opcode == op(Opcode::kWriteLastImm)) {
    const bool last = opcode != op(Opcode::kWriteMiddle);
    const bool bad_len = last ? len != msg_.remaining : (len != cfg_.mtu || len >= msg_.remaining);
    if (!msg_.active || bad_len) {
      fatal(NakCode::kInvalidRequest, psn);  // a middle/last without its first, or the wrong length
      return false;
    }
    if (!pf.elided) {
      std::memcpy(memory_.translate(msg_.rkey, msg_.va), payload, len);
    }
    if (on_write_) {
      on_write_(msg_.rkey, msg_.va, len);
    }
    msg_.va += len;
    msg_.remaining -= len;
    if (last) {
      msg_ = {};
      ++msn_;
    }
    return true;
  }
  if (opcode == op(Opcode::kReadRequest)) {
    const common::Reth& r = *pf.h.reth;
    if (memory_.check(r.rkey, r.virtual_address, r.dma_length, job, false) != AccessError::kOk) {
      fatal(NakCode::kRemoteAccessError, psn);
      return false;
    }
    queue_read_responses(psn, r.virtual_address, r.rkey, r.dma_length);
    ++msn_;
    return true;
  }
  const common::AtomicEth& a = *pf.h.atomic;
  if (memory_.check(a.rkey, a.virtual_address, 8, job, true) != AccessError::kOk) {
    fatal(NakCode::kRemoteAccessError, psn);
    return false;
  }
  uint8_t* p = memory_.translate(a.rkey, a.virtual_address);
  uint64_t original;
  std::memcpy(&original, p, 8);
  uint64_t updated = original;
  if (opcode == op(Opcode::kFetchAdd)) {
    updated = original + a.swap_or_add;
  } else if (original == a.compare) {
    updated = a.swap_or_add;
  }
  std::memcpy(p, &updated, 8);
  if (on_write_) {
    on_write_(a.rkey, a.virtual_address, 8);
  }
  atomic_cache_.push_back({psn, original});
  if (atomic_cache_.size() > kAtomicCacheSize) {
    atomic_cache_.pop_front();
  }
  ++msn_;
  send_atomic_ack(psn, original);
  return true;
}

void QueuePair::duplicate(const common::ParsedFrame& pf) {
  counters_.duplicates++;
  const uint8_t opcode = pf.h.bth.opcode;
  const uint32_t psn = pf.h.bth.psn;
  if (opcode == op(Opcode::kReadRequest)) {
    // Reads are idempotent: serve them again (the first responses may have been lost). The request passed the
    // access check when it first executed; memory may only have changed, not its registration.
    const common::Reth& r = *pf.h.reth;
    if (memory_.check(r.rkey, r.virtual_address, r.dma_length, common::job_of_pkey(pf.h.bth.pkey), false) ==
        AccessError::kOk) {
      counters_.read_replays++;
      counters_.duplicate_answer_bytes += queue_read_responses(psn, r.virtual_address, r.rkey, r.dma_length);
    }
    return;
  }
  if (opcode == op(Opcode::kCompareSwap) || opcode == op(Opcode::kFetchAdd)) {
    for (const auto& [cached_psn, original] : atomic_cache_) {
      if (cached_psn == psn) {
        counters_.atomic_replays++;
        counters_.duplicate_answer_bytes += send_atomic_ack(psn, original);  // never execute twice
        return;
      }
    }
    return;  // older than the cache: stale, from before a reconnect
  }
  if (pf.h.bth.ack_req) {
    counters_.duplicate_answer_bytes += send_ack();
  }
}

size_t QueuePair::queue_read_responses(uint32_t psn, uint64_t va, uint32_t rkey, uint32_t len) {
  size_t bytes = 0;
  const uint32_t n = std::max<uint32_t>(1, (len + cfg_.mtu - 1) / cfg_.mtu);
  const uint8_t* src = memory_.translate(rkey, va);
  for (uint32_t k = 0; k < n; ++k) {
    const uint32_t off = k * cfg_.mtu;
    const uint32_t plen = std::min(cfg_.mtu, len - std::min(len, off));
    uint8_t opcode;
    if (n == 1) {
      opcode = op(Opcode::kReadResponseOnly);
    } else if (k == 0) {
      opcode = op(Opcode::kReadResponseFirst);
    } else {
      opcode = op(k + 1 == n ? Opcode::kReadResponseLast : Opcode::kReadResponseMiddle);
    }
    const bool aeth = opcode != op(Opcode::kReadResponseMiddle);
    out_.push_back(frame(opcode, psn_add(psn, k), src + off, plen, [&](FrameHeaders& h) {
      if (aeth) {
        h.aeth = common::Aeth::ack(msn_);
      }
    }));
    bytes += out_.back().size();
  }
  wake_();
  return bytes;
}

size_t QueuePair::send_ack() {
  counters_.acks_sent++;
  out_.push_back(frame(op(Opcode::kAcknowledge), psn_add(epsn_, -1), nullptr, 0,
                       [&](FrameHeaders& h) { h.aeth = common::Aeth::ack(msn_); }));
  wake_();
  return out_.back().size();
}

void QueuePair::send_nak(NakCode code, uint32_t psn) {
  if (code == NakCode::kPsnSequenceError) {
    counters_.seq_naks_sent++;
  } else if (code == NakCode::kInvalidRequest) {
    counters_.invalid_naks_sent++;
  }
  out_.push_back(frame(op(Opcode::kAcknowledge), psn, nullptr, 0,
                       [&](FrameHeaders& h) { h.aeth = common::Aeth::nak(code, msn_); }));
  wake_();
}

size_t QueuePair::send_atomic_ack(uint32_t psn, uint64_t original) {
  out_.push_back(frame(op(Opcode::kAtomicAcknowledge), psn, nullptr, 0, [&](FrameHeaders& h) {
    h.aeth = common::Aeth::ack(msn_);
    h.atomic_ack = common::AtomicAckEth{original};
  }));
  wake_();
  return out_.back().size();
}

}  // namespace ifec::endpoint
