// One RC queue pair: requester (PSNs, go-back-N, retransmission timeout with backoff, in-order completion) and
// responder (ePSN, coalesced ACKs, sequence/access NAKs, duplicate handling, exactly-once atomics) in one object.
//
// Two reception disciplines:
//  - in order (partial and strong ordering modes): IBTA RC. The responder executes only PSN == ePSN; a packet
//    ahead of it is dropped with one PSN-sequence-error NAK per gap, and the requester goes back to that PSN.
//    Stores travel as WRITE FIRST/MIDDLE/LAST/ONLY.
//  - weak (spraying): packets may arrive in any order. Every store packet is a self-placing WRITE ONLY with its
//    own RETH (direct data placement), the responder executes any PSN inside its window once (a bitmap remembers
//    which), and cumulative ACKs plus the retransmission timeout repair losses: a timeout resends the oldest
//    unacknowledged packet; while packets sent before it are still missing, an ACK that stops at the last one
//    resent (none passing it for an eighth of the timeout) sends the next ones, doubling (resend_after_probe).
// READ responses are placed by PSN offset in both disciplines, so a retransmitted READ is harmless; atomic
// results are cached by PSN so a duplicate is answered from the cache, never executed twice.
//
// Errors follow IBTA: a remote access (or invalid request) NAK puts the responder half into an error state that
// NAKs every later request with the same PSN, so no later ACK can hide the failure. The requester fails that one
// work request, renumbers the ones after it (none of which executed) from a fresh PSN far from the old ones, and
// asks its connection manager to reset the peer's responder half to that PSN, sending nothing new until the
// manager confirms: the A->B direction reconnects, B->A is untouched. Paths are not part of the QP: the endpoint may
// move a QP to another port (as IB's automatic path migration does) when its port loses its route, and PSNs, caches and
// exactly-once semantics carry over.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ifec/common/counters.h"
#include "ifec/common/fifo.h"
#include "ifec/common/frame.h"
#include "ifec/common/interfaces.h"
#include "ifec/common/rtt.h"
#include "ifec/endpoint/memory.h"
#include "ifec/endpoint/sink.h"

namespace ifec::endpoint {

struct QpConfig {
  uint32_t local_qpn = 0;
  uint32_t remote_qpn = 0;
  uint16_t pkey = 0xFFFF;
  uint32_t mtu = 4096;
  bool weak = false;
  common::TimeNs rto_ns = 100'000;
  common::TimeNs rto_max_ns = 4'000'000;
  // Measure round trips (Jacobson/Karels, packets sent once only) and wait srtt + 4 rttvar when that is longer than
  // rto_ns: the live testbed's software switches queue for milliseconds. Off in the simulator (its figures).
  bool adaptive_rto = false;
  int max_retries = 10;
  uint32_t max_outstanding = 512;  // PSNs in flight before the requester waits for ACKs
  // AckReq at least every this many packets, and on the first packet sent a quarter of the timeout after the last
  // request: a QP whose packets trickle out of a shared port (one turn in many) hears from its responder before its
  // timer runs out, instead of resending what was never lost.
  uint32_t ack_every = 32;
  uint32_t responder_window = 4096;  // PSNs ahead of ePSN a responder accepts (weak) or NAKs (in order)
  common::FrameHeaders headers;      // Ethernet/IPv4/UDP template of this QP's path (its port, its UDP port)
  // A simulation whose payloads are elided (common::encode_frame): frames go out with their headers and lengths
  // only; what arrives is checked (rkey, bounds, lengths) but not written.
  bool elided_payloads = false;
};

// clang-format off
#define IFEC_QP_COUNTERS(X)                                            \
  X(tx_packets, "")                                                    \
  X(retransmits, "")                                                   \
  X(retransmit_bytes, "frame bytes of the packets sent again")         \
  X(timeouts, "")                                                      \
  X(naks_received, "")                                                 \
  X(rx_requests, "")                                                   \
  X(rx_responses, "")                                                  \
  X(acks_sent, "")                                                     \
  X(seq_naks_sent, "")                                                 \
  X(access_naks_sent, "")                                              \
  X(invalid_naks_sent, "")                                             \
  X(duplicates, "")                                                    \
  X(duplicate_answer_bytes, "frame bytes answering duplicates")        \
  X(out_of_order, "")                                                  \
  X(far_psn_drops, "requests too far ahead of ePSN: dropped")          \
  X(atomic_replays, "duplicate atomics answered from the cache")       \
  X(read_replays, "")                                                  \
  X(unexpected_responses, "responses matching no outstanding request")
// clang-format on

struct QpCounters {
  IFEC_COUNTER_SET(QpCounters, IFEC_QP_COUNTERS)
};

// Called once per work request when it completes; `result` is the fetched value for atomics.
using WqeDone = std::function<void(OpStatus status, uint64_t result)>;

// The bytes a write sends: `bytes[0..size)`, valid while `keep` lives. A copy owns them (store: a GPU store's value
// is taken when it is issued); a view does not (RDMA WRITE from registered memory: the NIC reads the source as it
// builds frames, so the caller leaves it unchanged, and registered, until the write completes).
struct Payload {
  std::shared_ptr<const void> keep;
  const uint8_t* bytes = nullptr;
  size_t size = 0;

  static Payload copy_of(const void* src, size_t n);
  static Payload view(const void* src, size_t n) { return {nullptr, static_cast<const uint8_t*>(src), n}; }
};

class QueuePair {
 public:
  QueuePair(common::Clock& clock, QpConfig cfg, SymmetricMemory& memory, std::function<void()> wake);
  QueuePair(const QueuePair&) = delete;
  QueuePair& operator=(const QueuePair&) = delete;
  ~QueuePair();

  // Requester side. `data` is shared so a striped store can hand slices of one buffer to several QPs; the write
  // sends data[offset, offset + len).
  void post_write(uint64_t va, uint32_t rkey, Payload data, size_t offset, uint32_t len, WqeDone done);
  void post_write(uint64_t va, uint32_t rkey, std::shared_ptr<const std::vector<uint8_t>> data, size_t offset,
                  uint32_t len, WqeDone done);
  void post_read(uint64_t va, uint32_t rkey, uint8_t* dst, uint32_t len, WqeDone done);
  void post_atomic(bool compare_swap, uint64_t va, uint32_t rkey, uint64_t swap_or_add, uint64_t compare, WqeDone done);

  bool has_frame() const;
  // Next frame to transmit (responses first, then requests within the window); empty when none.
  std::vector<uint8_t> next_frame();
  // A parsed frame addressed to this QP.
  void receive(const common::ParsedFrame& pf, const uint8_t* frame);

  // Resets the responder half to expect `psn` next (the peer requester reconnected after a fatal NAK).
  void reset_responder(uint32_t psn);
  // Replaces the Ethernet/IP/UDP template (path migration to another port).
  void set_headers(const common::FrameHeaders& h) { cfg_.headers = h; }
  // Called when the requester renumbered after a fatal NAK: the peer's responder must expect `psn` next. Until
  // peer_reset(psn, true) says it does, no request goes out (the timer still runs: no answer ends in
  // kRetryExceeded); peer_reset(psn, false) fails the waiting work at once. Without a handler nothing waits.
  void on_reconnect(std::function<void(uint32_t psn)> fn) { reconnect_ = std::move(fn); }
  void peer_reset(uint32_t psn, bool ok);
  bool awaiting_peer() const { return awaiting_peer_; }
  // Called after a request wrote into local memory (WRITE payload or atomic result): rkey, VA, length.
  void on_write(std::function<void(uint32_t rkey, uint64_t va, uint64_t len)> fn) { on_write_ = std::move(fn); }

  bool idle() const { return sq_.empty() && out_.empty(); }
  bool failed() const { return error_; }
  const QpCounters& counters() const { return counters_; }
  const QpConfig& config() const { return cfg_; }
  uint32_t expected_psn() const { return epsn_; }
  uint32_t next_psn() const { return next_psn_; }
  // Pairs this QP with a peer that is not one of the project's endpoints (a real RDMA stack: testbed/rxe): the
  // peer's QP number, the PSN of its first request, the partition key both use; messages go in order
  // (WRITE FIRST/MIDDLE/LAST, as a real peer sends and expects), not self-placed.
  void attach_external(uint32_t remote_qpn, uint32_t first_request_psn, uint16_t pkey);
  // A request this responder does not implement (SEND: it has no receive queue). Toward an external peer: NAK
  // Invalid Request for the expected PSN, as an RC responder must (the QP is in error until the peer reconnects).
  // The project's own endpoints never send one: there it is only counted (a stray frame must not break the QP).
  void reject_unsupported(uint32_t psn);
  bool external() const { return external_; }

 private:
  struct Wqe {
    enum Kind : uint8_t { kWrite, kRead, kAtomic } kind = kWrite;
    uint32_t psn = 0;
    uint32_t npkts = 1;
    uint64_t va = 0;
    uint32_t rkey = 0;
    uint32_t len = 0;
    Payload data;
    size_t data_offset = 0;
    uint8_t* read_dst = nullptr;
    std::vector<uint8_t> read_got;
    uint32_t read_got_count = 0;
    bool cas = false;
    uint64_t swap_or_add = 0;
    uint64_t compare = 0;
    bool finished = false;
    OpStatus status = OpStatus::kOk;
    uint64_t result = 0;
    WqeDone done;
  };

  // requester
  void post(Wqe w);
  std::vector<uint8_t> request_frame();
  void on_response(const common::ParsedFrame& pf, const uint8_t* frame);
  void acknowledge_through(uint32_t psn);
  void go_back(uint32_t psn);
  uint32_t go_back_psn() const;
  Wqe* find_wqe(uint32_t psn);
  void complete_in_order();
  void arm_timer();
  void on_timer(uint64_t generation);
  void fail_all(OpStatus status);
  bool outstanding() const;

  // responder
  void on_request(const common::ParsedFrame& pf, const uint8_t* frame);
  // Executes one request; returns false when it was NAKed fatally (the responder is then in error).
  bool execute(const common::ParsedFrame& pf, const uint8_t* frame);
  void fatal(common::NakCode code, uint32_t psn);
  void reconnect_after(uint32_t failed_psn);
  void maybe_reconnect();
  void duplicate(const common::ParsedFrame& pf);
  // Each queues its frames and returns their bytes.
  size_t queue_read_responses(uint32_t psn, uint64_t va, uint32_t rkey, uint32_t len);
  size_t send_ack();
  void send_nak(common::NakCode code, uint32_t psn);
  size_t send_atomic_ack(uint32_t psn, uint64_t original);
  std::vector<uint8_t> frame(uint8_t opcode, uint32_t psn, const uint8_t* payload, size_t len,
                             const std::function<void(common::FrameHeaders&)>& fill);

  common::Clock& clock_;
  QpConfig cfg_;
  SymmetricMemory& memory_;
  std::function<void()> wake_;
  QpCounters counters_;

  // requester state
  // Fifo, not deque: nothing allocated until used (a 256-rank all-to-all makes 0.5 M QPs). Unlike a deque's, its
  // elements move when it grows: no Wqe reference is held across a completion (which may post).
  common::Fifo<Wqe> sq_;
  size_t send_idx_ = 0;
  uint32_t next_psn_ = 0;      // next PSN to assign
  bool external_ = false;      // attach_external(): a real RDMA peer
  uint32_t send_psn_ = 0;      // next PSN to transmit
  uint32_t acked_ = 0xFFFFFF;  // last PSN the responder acknowledged (cumulative)
  uint32_t max_sent_ = 0xFFFFFF;
  // After a timeout: the packets resent (resend_left_ of them, from the oldest unacknowledged), then the send cursor
  // returns to resume_psn_ (where it was).
  uint32_t resume_psn_ = 0;
  uint32_t resend_left_ = 0;
  // Weak ordering's recovery (see on_timer and resend_after_probe): from a timeout until the ACK passes
  // recover_psn_ (the highest PSN sent before it). probe_psn_ is the last packet resent, in a burst of burst_.
  bool recovering_ = false;
  uint16_t burst_ = 0;
  uint32_t recover_psn_ = 0;
  uint32_t probe_psn_ = 0;
  void start_resend(uint32_t from, uint32_t packets);
  void resend_after_probe();
  void resend_if_still_missing(uint32_t at);
  void seek(uint32_t psn);  // the send cursor to `psn` (a PSN of a queued WQE, or next_psn_)
  bool error_ = false;
  int retries_ = 0;
  common::TimeNs rto_;
  common::TimeNs base_rto() const { return std::min(rtt_.rto(cfg_.rto_ns), cfg_.rto_max_ns); }
  common::RttEstimator rtt_;
  // Send times of the PSNs in flight (Karn: 0 once retransmitted), at psn % size: the ring grows (a power of two, at
  // most kMaxSentRing) so the PSNs in flight never share a slot; a QP that keeps a few packets out keeps a few.
  static constexpr uint32_t kMaxSentRing = 8192;
  void note_sent(uint32_t psn, bool retransmit);
  std::vector<uint32_t> sent_psn_;
  std::vector<common::TimeNs> sent_at_;
  common::TimeNs last_progress_ = 0;
  common::TimeNs last_ack_req_ = 0;  // when this QP last sent a packet carrying AckReq
  uint64_t timer_generation_ = 0;
  bool timer_armed_ = false;
  std::shared_ptr<bool> alive_;
  std::function<void(uint32_t)> reconnect_;
  std::function<void(uint32_t, uint64_t, uint64_t)> on_write_;
  bool reconnect_pending_ = false;
  uint32_t reconnect_psn_ = 0;
  bool awaiting_peer_ = false;  // renumbered, the peer's responder not yet reset to awaited_psn_
  uint32_t awaited_psn_ = 0;

  // responder state
  uint32_t epsn_ = 0;
  uint32_t msn_ = 0;
  bool nak_pending_ = false;
  bool fatal_ = false;  // responder half in error after an access / invalid-request NAK
  common::NakCode fatal_code_ = common::NakCode::kRemoteAccessError;
  uint32_t fatal_psn_ = 0;
  struct {
    bool active = false;
    bool discard = false;
    uint64_t va = 0;
    uint32_t rkey = 0;
    uint32_t remaining = 0;
  } msg_;
  // Weak: PSNs in [epsn_, epsn_ + window) already executed, one bit each at psn % window.
  std::vector<uint64_t> seen_;
  bool seen(uint32_t psn) const {
    const uint32_t i = psn % cfg_.responder_window;
    return (seen_[i / 64] >> (i % 64)) & 1;
  }
  void set_seen(uint32_t psn, bool on) {
    const uint32_t i = psn % cfg_.responder_window;
    seen_[i / 64] = on ? seen_[i / 64] | (1ULL << (i % 64)) : seen_[i / 64] & ~(1ULL << (i % 64));
  }
  common::Fifo<std::pair<uint32_t, uint64_t>> atomic_cache_;
  common::Fifo<std::vector<uint8_t>> out_;
};

// 24-bit PSN arithmetic.
inline uint32_t psn_add(uint32_t psn, int64_t n) { return static_cast<uint32_t>((int64_t{psn} + n) & 0xFFFFFF); }
inline int32_t psn_diff(uint32_t a, uint32_t b) {
  int32_t d = static_cast<int32_t>((a - b) & 0xFFFFFF);
  return d >= 0x800000 ? d - 0x1000000 : d;
}

}  // namespace ifec::endpoint
