// RoCEv2 ICRC (IBTA Annex A17.8) over a masked copy of the variant header fields.
#include "ifec/common/icrc.h"

#include <array>
#include <cstring>

namespace ifec::common {

namespace {

constexpr uint32_t kPoly = 0xEDB88320;  // reflected 0x04C11DB7

constexpr std::array<std::array<uint32_t, 256>, 4> make_tables() {
  std::array<std::array<uint32_t, 256>, 4> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) {
      c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    }
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (size_t s = 1; s < 4; ++s) {
      t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
  }
  return t;
}

constexpr auto kTables = make_tables();

}  // namespace

uint32_t crc32_update(uint32_t crc, const uint8_t* data, size_t len) {
  // Slicing-by-4: the simulator computes an ICRC for every frame it puts on a link.
  while (len >= 4) {
    crc ^= uint32_t{data[0]} | (uint32_t{data[1]} << 8) | (uint32_t{data[2]} << 16) | (uint32_t{data[3]} << 24);
    crc =
        kTables[3][crc & 0xFF] ^ kTables[2][(crc >> 8) & 0xFF] ^ kTables[1][(crc >> 16) & 0xFF] ^ kTables[0][crc >> 24];
    data += 4;
    len -= 4;
  }
  while (len--) {
    crc = kTables[0][(crc ^ *data++) & 0xFF] ^ (crc >> 8);
  }
  return crc;
}

uint32_t compute_icrc(const uint8_t* ip, size_t len, size_t bth_offset) {
  // The masked prefix: IP header (TOS, TTL, checksum), UDP header (checksum) and, for ECH frames, the ECH,
  // up to and including BTH byte 4. Everything after it is invariant and is read in place.
  constexpr size_t kMaxMasked = 60 + 8 + 24 + 12;  // IPv4 with options + UDP + ECH + BTH
  const size_t masked_len = bth_offset + 5;
  uint32_t crc = 0xFFFFFFFF;
  static constexpr uint8_t kMaskedLrh[8] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
  crc = crc32_update(crc, kMaskedLrh, sizeof(kMaskedLrh));
  const size_t ihl_bytes = len > 0 ? size_t{static_cast<uint8_t>(ip[0] & 0x0F)} * 4 : 0;
  if (masked_len > len || masked_len > kMaxMasked || ihl_bytes < 20 || ihl_bytes + 8 > bth_offset) {
    return 0;  // callers validate lengths first; this keeps a bad call in bounds
  }
  uint8_t buf[kMaxMasked];
  std::memcpy(buf, ip, masked_len);
  buf[1] = 0xFF;              // TOS: DSCP + ECN
  buf[8] = 0xFF;              // TTL
  buf[10] = buf[11] = 0xFF;   // header checksum
  buf[ihl_bytes + 6] = 0xFF;  // UDP checksum
  buf[ihl_bytes + 7] = 0xFF;
  buf[bth_offset + 4] = 0xFF;  // BTH FECN, BECN, reserved
  crc = crc32_update(crc, buf, masked_len);
  crc = crc32_update(crc, ip + masked_len, len - masked_len);
  return crc ^ 0xFFFFFFFF;
}

}  // namespace ifec::common
