// IPv4 header (20 bytes, options only tolerated on decode) and its one's-complement header checksum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ifec::common {

std::string ipv4_to_string(uint32_t addr);

struct Ipv4Header {
  static constexpr size_t kSize = 20;  // without options; that is what encode() writes
  static constexpr uint8_t kProtocolUdp = 17;

  uint8_t ihl = 5;  // header length in 32-bit words; decode() keeps what it read
  uint8_t dscp = 0;
  uint8_t ecn = 0;  // 0 Not-ECT, 1 ECT(1), 2 ECT(0), 3 CE
  uint16_t total_length = 0;
  uint16_t identification = 0;
  bool dont_fragment = true;
  bool more_fragments = false;
  uint16_t fragment_offset = 0;
  uint8_t ttl = 64;
  uint8_t protocol = kProtocolUdp;
  uint16_t checksum = 0;
  uint32_t src = 0;
  uint32_t dst = 0;

  // Writes 20 bytes with the checksum computed over them (the checksum field is ignored).
  void encode(uint8_t* out) const;
  // Reads the fixed 20 bytes; the caller checks ihl, version and checksum against the buffer.
  static Ipv4Header decode(const uint8_t* in);
};

static_assert(Ipv4Header::kSize == 20, "IPv4 header without options is 20 bytes");

// RFC 1071 one's-complement sum over `len` bytes, returned complemented (0 when verifying a correct header).
uint16_t ipv4_checksum(const uint8_t* header, size_t len);

}  // namespace ifec::common
