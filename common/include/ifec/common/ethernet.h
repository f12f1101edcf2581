// Ethernet II header (no 802.1Q tag): destination, source, EtherType.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace ifec::common {

using MacAddress = std::array<uint8_t, 6>;

std::string mac_to_string(const MacAddress& mac);

struct EthernetHeader {
  static constexpr size_t kSize = 14;
  static constexpr uint16_t kEtherTypeIpv4 = 0x0800;
  static constexpr uint16_t kEtherTypeMacControl = 0x8808;  // PFC pause frames

  MacAddress dst{};
  MacAddress src{};
  uint16_t ethertype = kEtherTypeIpv4;

  void encode(uint8_t* out) const;
  static EthernetHeader decode(const uint8_t* in);
};

static_assert(EthernetHeader::kSize == 6 + 6 + 2, "Ethernet II header is 14 bytes");

}  // namespace ifec::common
