// Protocol constants both ends of the wire share (endpoints, switches, the IFEC engine, raw traffic generators),
// so each is spelled once: the RC queue pairs' numbering, the ECH frames' destination QP, the job <-> P_Key mapping,
// the RoCE traffic class, the default payload of one aggregation slot, and the window ids the runtime reserves.
#pragma once

#include <cstdint>
#include <optional>

namespace ifec::common {

// BTH destination QP of every ECH frame: not an RC queue pair; endpoints and switches dispatch ECH by its header.
inline constexpr uint32_t kEchQpn = 0xFFFFFE;

// RC queue pairs: endpoint E's QP toward peer P on sub-port k is numbered rc_qpn(P, k), and P's toward E is
// rc_qpn(E, k), so a frame's destination QPN names its sender and sub-port. No endpoint QP is numbered below
// kFirstRcQpn (InfiniBand keeps QPs 0 and 1 for itself).
inline constexpr uint32_t kFirstRcQpn = 0x100;
inline constexpr uint32_t kMaxQpsPerPeer = 64;  // sub-ports per endpoint, at most
inline constexpr uint32_t rc_qpn(uint32_t peer, uint32_t index) { return kFirstRcQpn + peer * kMaxQpsPerPeer + index; }
struct RcQp {
  uint32_t peer = 0;
  uint32_t index = 0;
};
// The (peer, index) an RC QPN names, or nullopt when it is outside the RC numbering (below it, or the ECH QPN).
inline constexpr std::optional<RcQp> decode_rc_qpn(uint32_t qpn) {
  if (qpn < kFirstRcQpn || qpn >= kEchQpn) {
    return std::nullopt;
  }
  return RcQp{(qpn - kFirstRcQpn) / kMaxQpsPerPeer, (qpn - kFirstRcQpn) % kMaxQpsPerPeer};
}

// A job is its partition: P_Key = full-membership bit | 15-bit job id (the switch and the responder check it).
inline constexpr uint32_t kMaxJob = 0x7FFF;
inline constexpr uint16_t pkey_of_job(uint32_t job) { return static_cast<uint16_t>(0x8000 | (job & kMaxJob)); }
inline constexpr uint32_t job_of_pkey(uint16_t pkey) { return pkey & kMaxJob; }

// RoCE's traffic class: DSCP 26 is the lossless (PFC) priority throughout the fabric; ECN-capable transport.
inline constexpr uint8_t kRoceDscp = 26;
inline constexpr uint8_t kRoceEcn = 2;  // ECT(0)

// Payload one aggregation slot holds: one chunk, one RoCE MTU (the topology can lower it).
inline constexpr uint32_t kDefaultSlotBytes = 4096;

// Window ids the runtime keeps for itself (workloads use ids below 0xFF00).
inline constexpr uint16_t kFirstReservedWindow = 0xFF00;
inline constexpr uint16_t kRowScratchWindow =
    0xFFE1;                                         // batch reduction fallback: contributions summed at the destination
inline constexpr uint16_t kBarrierWindow = 0xFFF0;  // the harness's store-based barrier words

}  // namespace ifec::common
