// RoCEv2 ICRC (IBTA Annex A17.8) over a masked copy of the variant header fields.
#include "ifec/common/icrc.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>

namespace ifec::common {

uint32_t crc32_update(uint32_t crc, const uint8_t* data, size_t len) {
  // zlib's CRC-32 is the same reflected 0x04C11DB7 CRC, braided (several bytes per step); it takes and returns the
  // finalised value, so the raw register is complemented on the way in and out. The simulator computes an ICRC
  // for every frame it puts on a link, so this is its hottest loop.
  while (len > 0) {
    const size_t n = std::min<size_t>(len, 1u << 30);
    crc = ~static_cast<uint32_t>(::crc32(~crc & 0xFFFFFFFFul, data, static_cast<uInt>(n)));
    data += n;
    len -= n;
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
