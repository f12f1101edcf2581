// IPv4 encode/decode and the RFC 1071 header checksum.
#include "ifec/common/ipv4.h"

#include <cstdio>
#include <cstring>

#include "ifec/common/byte_order.h"

namespace ifec::common {

std::string ipv4_to_string(uint32_t addr) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%u.%u.%u.%u", addr >> 24, (addr >> 16) & 0xFF, (addr >> 8) & 0xFF, addr & 0xFF);
  return buf;
}

uint16_t ipv4_checksum(const uint8_t* header, size_t len) {
  // RFC 1071: the one's complement sum does not depend on byte order, so 32-bit words are added in the host's
  // order into 64 bits, folded, and the 16-bit result put in network order (every parse and hop does this).
  uint64_t sum = 0;
  size_t i = 0;
  for (; i + 4 <= len; i += 4) {
    uint32_t w;
    std::memcpy(&w, header + i, 4);
    sum += w;
  }
  if (i + 2 <= len) {
    uint16_t w;
    std::memcpy(&w, header + i, 2);
    sum += w;
    i += 2;
  }
  if (i < len) {
    const uint8_t last[2] = {header[i], 0};  // an odd byte is the high byte of a word padded with zero
    uint16_t w;
    std::memcpy(&w, last, 2);
    sum += w;
  }
  while (sum >> 16) {
    sum = (sum & 0xFFFF) + (sum >> 16);
  }
  const uint16_t host = static_cast<uint16_t>(sum);
  uint8_t bytes[2];  // stored back in the host's order: the sum's bytes as the header holds them
  std::memcpy(bytes, &host, 2);
  return static_cast<uint16_t>(~load_be16(bytes));
}

void Ipv4Header::encode(uint8_t* out) const {
  out[0] = static_cast<uint8_t>(0x40 | 5);
  out[1] = static_cast<uint8_t>((dscp << 2) | (ecn & 0x3));
  store_be16(out + 2, total_length);
  store_be16(out + 4, identification);
  uint16_t frag =
      static_cast<uint16_t>((dont_fragment ? 0x4000 : 0) | (more_fragments ? 0x2000 : 0) | (fragment_offset & 0x1FFF));
  store_be16(out + 6, frag);
  out[8] = ttl;
  out[9] = protocol;
  store_be16(out + 10, 0);
  store_be32(out + 12, src);
  store_be32(out + 16, dst);
  store_be16(out + 10, ipv4_checksum(out, kSize));
}

Ipv4Header Ipv4Header::decode(const uint8_t* in) {
  Ipv4Header h;
  h.ihl = in[0] & 0x0F;
  h.dscp = in[1] >> 2;
  h.ecn = in[1] & 0x3;
  h.total_length = load_be16(in + 2);
  h.identification = load_be16(in + 4);
  uint16_t frag = load_be16(in + 6);
  h.dont_fragment = (frag & 0x4000) != 0;
  h.more_fragments = (frag & 0x2000) != 0;
  h.fragment_offset = frag & 0x1FFF;
  h.ttl = in[8];
  h.protocol = in[9];
  h.checksum = load_be16(in + 10);
  h.src = load_be32(in + 12);
  h.dst = load_be32(in + 16);
  return h;
}

}  // namespace ifec::common
