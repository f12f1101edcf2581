// IEEE 802.1Qbb priority flow control frames (MAC control, opcode 0x0101): per-priority pause times in quanta
// of 512 bit times. A quanta of 0 resumes that priority.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "ifec/common/ethernet.h"
#include "ifec/common/wire_status.h"

namespace ifec::common {

inline constexpr uint16_t kPfcOpcode = 0x0101;
inline constexpr size_t kPfcFrameSize = 60;  // minimum Ethernet frame without FCS
inline constexpr MacAddress kPfcDestination = {0x01, 0x80, 0xC2, 0x00, 0x00, 0x01};

struct PfcFrame {
  MacAddress src{};
  uint8_t class_enable = 0;          // bit p set: quanta[p] applies
  std::array<uint16_t, 8> quanta{};  // pause time per priority, in 512-bit-time units

  std::vector<uint8_t> encode() const;
  static WireStatus decode(const uint8_t* data, size_t len, PfcFrame* out);
};

// True when the frame is a MAC control frame (EtherType 0x8808), PFC or not.
bool is_mac_control(const uint8_t* data, size_t len);

// Pause duration of `quanta` on a link of `rate_bps`, in nanoseconds (rounded up).
uint64_t pfc_quanta_ns(uint16_t quanta, uint64_t rate_bps);

}  // namespace ifec::common
