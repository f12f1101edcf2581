// ACK Extended Transport Header: syndrome (ACK / RNR NAK / NAK with code) and 24-bit MSN.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ifec::common {

enum class AethKind : uint8_t { kAck = 0, kRnrNak = 1, kReserved = 2, kNak = 3 };

// NAK codes (IBTA Vol 1, Table 45), in the low 5 bits of the syndrome when the kind is kNak.
enum class NakCode : uint8_t {
  kPsnSequenceError = 0,
  kInvalidRequest = 1,
  kRemoteAccessError = 2,
  kRemoteOperationalError = 3,
  kInvalidRdRequest = 4,
};

struct Aeth {
  static constexpr size_t kSize = 4;
  static constexpr uint8_t kCreditInvalid = 0x1F;  // "no credit count" for ACKs

  uint8_t syndrome = kCreditInvalid;
  uint32_t msn = 0;  // 24 bits

  AethKind kind() const { return static_cast<AethKind>((syndrome >> 5) & 0x3); }
  uint8_t value() const { return syndrome & 0x1F; }  // credit count, RNR timer or NAK code

  static Aeth ack(uint32_t msn, uint8_t credits = kCreditInvalid) {
    return Aeth{static_cast<uint8_t>(credits & 0x1F), msn & 0xFFFFFF};
  }
  // Receiver not ready; `timer` is the IBTA RNR timer code (1: 0.01 ms), a hint the sender may refine.
  static Aeth rnr_nak(uint8_t timer, uint32_t msn = 0) {
    return Aeth{static_cast<uint8_t>(0x20 | (timer & 0x1F)), msn & 0xFFFFFF};
  }
  static Aeth nak(NakCode code, uint32_t msn) {
    return Aeth{static_cast<uint8_t>(0x60 | static_cast<uint8_t>(code)), msn & 0xFFFFFF};
  }

  void encode(uint8_t* out) const;
  static Aeth decode(const uint8_t* in);
};

static_assert(Aeth::kSize == 1 + 3, "AETH is 4 bytes");

}  // namespace ifec::common
