// UDP header. RoCEv2 runs on destination port 4791; ECH frames on the project's own port (see ech.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ifec::common {

struct UdpHeader {
  static constexpr size_t kSize = 8;
  static constexpr uint16_t kRoceV2Port = 4791;

  uint16_t src_port = 0xC000;  // RoCEv2 uses the source port as flow entropy
  uint16_t dst_port = kRoceV2Port;
  uint16_t length = 0;
  uint16_t checksum = 0;  // RoCEv2 over IPv4 sends 0 (no checksum); the ICRC protects the payload

  void encode(uint8_t* out) const;
  static UdpHeader decode(const uint8_t* in);
};

static_assert(UdpHeader::kSize == 8, "UDP header is 8 bytes");

}  // namespace ifec::common
