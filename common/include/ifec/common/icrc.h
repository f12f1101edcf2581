// RoCEv2 Invariant CRC: CRC-32 over 8 bytes of 0xFF (the masked LRH) then IP header .. payload+pad,
// with the variant fields masked to ones: IPv4 TOS (DSCP+ECN), TTL and header checksum, UDP checksum,
// and BTH byte 4 (FECN, BECN, reserved). Stored after the payload in little-endian byte order, like the FCS.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ifec::common {

// How a CRC is computed: the fastest the CPU has (kAuto), or one way only (tests compare them all).
enum class CrcImpl : uint8_t { kAuto, kZlib, kPclmul, kVpclmul };
bool crc_impl_available(CrcImpl impl);
// The implementation kAuto takes for a frame-sized buffer on this CPU, and a name for reports.
CrcImpl crc_impl_in_use();
const char* crc_impl_name(CrcImpl impl);

// `ip` points at the IPv4 header; `len` counts bytes from there up to (not including) the ICRC;
// `bth_offset` is the BTH's offset from `ip` (20 + 8 for plain RoCEv2; more with IP options or ECH).
uint32_t compute_icrc(const uint8_t* ip, size_t len, size_t bth_offset, CrcImpl impl = CrcImpl::kAuto);

// The same ICRC for a frame still in pieces: `headers` (from the IPv4 header up to the payload, `header_len` bytes),
// then `payload`, then `pad` zero bytes. Equal to compute_icrc over the assembled frame; an encoder that has the
// pieces at hand computes it without reading back the bytes it has just stored. compute_icrc's own path for short
// frames (and CPUs without VPCLMULQDQ) is this, with the frame's masked head as `headers`.
uint32_t compute_icrc_parts(const uint8_t* headers, size_t header_len, size_t bth_offset, const uint8_t* payload,
                            size_t payload_len, size_t pad, CrcImpl impl = CrcImpl::kAuto);

// Plain reflected CRC-32 (IEEE 802.3), for tests and reuse: crc32_update(0xFFFFFFFF, ...) ^ 0xFFFFFFFF. `crc` is the
// raw register in and out.
uint32_t crc32_update(uint32_t crc, const uint8_t* data, size_t len, CrcImpl impl = CrcImpl::kAuto);

}  // namespace ifec::common
