// RoCEv2 Invariant CRC: CRC-32 over 8 bytes of 0xFF (the masked LRH) then IP header .. payload+pad,
// with the variant fields masked to ones: IPv4 TOS (DSCP+ECN), TTL and header checksum, UDP checksum,
// and BTH byte 4 (FECN, BECN, reserved). Stored after the payload in little-endian byte order, like the FCS.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ifec::common {

// `ip` points at the IPv4 header; `len` counts bytes from there up to (not including) the ICRC;
// `bth_offset` is the BTH's offset from `ip` (20 + 8 for plain RoCEv2; more with IP options or ECH).
uint32_t compute_icrc(const uint8_t* ip, size_t len, size_t bth_offset);

// Plain reflected CRC-32 (IEEE 802.3), for tests and reuse: crc32_update(0xFFFFFFFF, ...) ^ 0xFFFFFFFF.
uint32_t crc32_update(uint32_t crc, const uint8_t* data, size_t len);

}  // namespace ifec::common
