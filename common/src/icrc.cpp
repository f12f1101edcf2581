// RoCEv2 ICRC (IBTA Annex A17.8) over a masked copy of the variant header fields.
#include "ifec/common/icrc.h"

#include <zlib.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "ifec/common/names.h"

namespace ifec::common {

#if defined(__x86_64__)
namespace {

// CRC-32 by carry-less multiplication (Gopal et al., "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ",
// Intel 2009, with the reflected 0x04C11DB7 constants): four 128-bit lanes folded 64 bytes at a time (sixteen, 256
// bytes at a time, with 512-bit VPCLMULQDQ), then into one lane, then 16 bytes at a time, reduced to 64 bits and
// Barrett-reduced to 32. `crc` is the raw register in and out; len >= 64 and a multiple of 16.
#define IFEC_PCLMUL __attribute__((target("pclmul,sse4.1")))

IFEC_PCLMUL inline __m128i load(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// One fold: the lane times x^(distance + 32) and x^(distance - 32), added to the next block.
IFEC_PCLMUL inline __m128i fold(__m128i x, __m128i k, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x11), _mm_clmulepi64_si128(x, k, 0x00)), next);
}

// Fold constants: x^(D+32) and x^(D-32) mod P, bit-reflected and shifted left by one, for a fold over D bits.
constexpr int64_t kFold128Lo = 0x01751997d0, kFold128Hi = 0x00ccaa009e;    // D = 128
constexpr int64_t kFold512Lo = 0x0154442bd4, kFold512Hi = 0x01c6e41596;    // D = 512
constexpr int64_t kFold2048Lo = 0x011542778a, kFold2048Hi = 0x01322d1430;  // D = 2048

IFEC_PCLMUL inline __m128i fold128_constants() { return _mm_set_epi64x(kFold128Hi, kFold128Lo); }

// 512-bit VPCLMULQDQ: sixteen 128-bit lanes in four registers.
#define IFEC_VPCLMUL __attribute__((target("vpclmulqdq,avx512f,avx512vl,pclmul,sse4.1")))

IFEC_VPCLMUL inline __m512i load512(const uint8_t* p) { return _mm512_loadu_si512(reinterpret_cast<const void*>(p)); }

// The same (low, high) pair of 64-bit constants in each 128-bit lane.
IFEC_VPCLMUL inline __m512i lanes(int64_t lo, int64_t hi) { return _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo); }

IFEC_VPCLMUL inline __m512i fold512(__m512i x, __m512i k, __m512i next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x11), _mm512_clmulepi64_epi128(x, k, 0x00), next,
                                   0x96);  // a ^ b ^ c
}

// Four 512-bit registers folded 256 bytes at a time, then into one register, then its four lanes into one: the
// 128-bit state that stands for every byte consumed. `first` holds the first 256 bytes; `buf` and `len` what follows
// them, advanced past the multiples of 64 folded here. Most calls pass first == buf - 256; the ICRC passes its
// masked head there, read in the same pass.
IFEC_VPCLMUL __m128i fold_bulk_avx512(uint32_t crc, const uint8_t* first, const uint8_t*& buf, size_t& len) {
  __m512i x1 = _mm512_xor_si512(load512(first), _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(crc))));
  __m512i x2 = load512(first + 64);
  __m512i x3 = load512(first + 128);
  __m512i x4 = load512(first + 192);
  // Each lane moves 2048 bits per step; then registers 512 bits apart are folded together.
  __m512i k = lanes(kFold2048Lo, kFold2048Hi);
  for (; len >= 256; buf += 256, len -= 256) {
    x1 = fold512(x1, k, load512(buf));
    x2 = fold512(x2, k, load512(buf + 64));
    x3 = fold512(x3, k, load512(buf + 128));
    x4 = fold512(x4, k, load512(buf + 192));
  }
  k = lanes(kFold512Lo, kFold512Hi);
  x1 = fold512(fold512(fold512(x1, k, x2), k, x3), k, x4);
  for (; len >= 64; buf += 64, len -= 64) {
    x1 = fold512(x1, k, load512(buf));
  }
  alignas(64) __m128i lane[4];
  _mm512_store_si512(reinterpret_cast<void*>(lane), x1);
  const __m128i k128 = fold128_constants();
  return fold(fold(fold(lane[0], k128, lane[1]), k128, lane[2]), k128, lane[3]);
}

// The same with four 128-bit lanes, 64 bytes at a time (len >= 64 on entry).
IFEC_PCLMUL __m128i fold_bulk_sse(uint32_t crc, const uint8_t*& buf, size_t& len) {
  __m128i x1 = _mm_xor_si128(load(buf), _mm_cvtsi32_si128(static_cast<int>(crc)));
  __m128i x2 = load(buf + 16);
  __m128i x3 = load(buf + 32);
  __m128i x4 = load(buf + 48);
  buf += 64;
  len -= 64;
  const __m128i k = _mm_set_epi64x(kFold512Hi, kFold512Lo);
  for (; len >= 64; buf += 64, len -= 64) {
    x1 = fold(x1, k, load(buf));
    x2 = fold(x2, k, load(buf + 16));
    x3 = fold(x3, k, load(buf + 32));
    x4 = fold(x4, k, load(buf + 48));
  }
  const __m128i k128 = fold128_constants();
  return fold(fold(fold(x1, k128, x2), k128, x3), k128, x4);
}

// The 128-bit state folded on over the 16-byte blocks left (len a multiple of 16), then reduced to the register.
IFEC_PCLMUL uint32_t fold_rest_and_reduce(__m128i x1, const uint8_t* buf, size_t len) {
  alignas(16) static const uint64_t k5k0[] = {0x0163cd6124, 0x0000000000};  // x^64 mod P
  alignas(16) static const uint64_t poly[] = {0x01db710641, 0x01f7011641};  // P(x)' and Barrett's mu
  const __m128i k = fold128_constants();
  for (; len >= 16; buf += 16, len -= 16) {
    x1 = fold(x1, k, load(buf));
  }
  // 128 -> 64 bits.
  const __m128i mask32 = _mm_setr_epi32(~0, 0, ~0, 0);
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), _mm_clmulepi64_si128(x1, k, 0x10));
  const __m128i k5 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(k5k0));
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k5, 0x00), _mm_srli_si128(x1, 4));
  // Barrett reduction to 32 bits.
  const __m128i p = _mm_load_si128(reinterpret_cast<const __m128i*>(poly));
  __m128i t = _mm_and_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, mask32), p, 0x10), mask32);
  x1 = _mm_xor_si128(x1, _mm_clmulepi64_si128(t, p, 0x00));
  return static_cast<uint32_t>(_mm_extract_epi32(x1, 1));
}

IFEC_PCLMUL uint32_t crc32_pclmul(uint32_t crc, const uint8_t* buf, size_t len, bool wide) {
  __m128i x1;
  if (wide) {
    const uint8_t* first = buf;
    buf += 256;
    len -= 256;
    x1 = fold_bulk_avx512(crc, first, buf, len);
  } else {
    x1 = fold_bulk_sse(crc, buf, len);
  }
  return fold_rest_and_reduce(x1, buf, len);
}

bool have_pclmul() {
  static const bool ok = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return ok;
}

bool have_vpclmul() {
  static const bool ok = have_pclmul() && __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("avx512f") &&
                         __builtin_cpu_supports("avx512vl");
  return ok;
}

}  // namespace
#endif

bool crc_impl_available(CrcImpl impl) {
#if defined(__x86_64__)
  if (impl == CrcImpl::kPclmul) {
    return have_pclmul();
  }
  if (impl == CrcImpl::kVpclmul) {
    return have_vpclmul();
  }
#else
  if (impl == CrcImpl::kPclmul || impl == CrcImpl::kVpclmul) {
    return false;
  }
#endif
  return true;
}

CrcImpl crc_impl_in_use() {
  return crc_impl_available(CrcImpl::kVpclmul)  ? CrcImpl::kVpclmul
         : crc_impl_available(CrcImpl::kPclmul) ? CrcImpl::kPclmul
                                                : CrcImpl::kZlib;
}

namespace {

constexpr Name<CrcImpl> kCrcImplNames[] = {
    {CrcImpl::kZlib, "zlib (table)"},
    {CrcImpl::kPclmul, "PCLMULQDQ (128-bit)"},
    {CrcImpl::kVpclmul, "VPCLMULQDQ (512-bit)"},
};
constexpr Vocabulary kCrcImpls("ICRC implementation", kCrcImplNames);

}  // namespace

const char* crc_impl_name(CrcImpl impl) { return kCrcImpls.name(impl == CrcImpl::kAuto ? crc_impl_in_use() : impl); }

uint32_t crc32_update(uint32_t crc, const uint8_t* data, size_t len, CrcImpl impl) {
  // The simulator computes an ICRC for every frame it puts on a link and checks it at every receiver: this is its
  // hottest loop (37% of the instructions of a 64 x 4 all-to-all with zlib alone). Bulk 16-byte blocks go through
  // carry-less multiplication where the CPU has it (512-bit VPCLMULQDQ from 256 bytes on, else 128-bit PCLMULQDQ);
  // the rest through zlib's CRC-32 (the same reflected 0x04C11DB7 CRC, which takes and returns the finalised
  // value, so the raw register is complemented on the way in and out).
#if defined(__x86_64__)
  const bool wide = (impl == CrcImpl::kAuto || impl == CrcImpl::kVpclmul) && len >= 256 && have_vpclmul();
  if (wide || (impl != CrcImpl::kZlib && len >= 64 && have_pclmul())) {
    const size_t bulk = len & ~size_t{15};
    crc = crc32_pclmul(crc, data, bulk, wide);
    data += bulk;
    len -= bulk;
  }
#endif
  while (len > 0) {
    const size_t n = std::min<size_t>(len, 1u << 30);
    crc = ~static_cast<uint32_t>(::crc32(~crc & 0xFFFFFFFFul, data, static_cast<uInt>(n)));
    data += n;
    len -= n;
  }
  return crc;
}

namespace {

constexpr uint32_t kLrhRegister = 0xDEBB20E3;  // the register after the masked LRH, 8 bytes of 0xFF

// The register that `n` zero bytes turn into `crc`: the CRC's steps run backwards (x is invertible mod P, so each
// step has exactly one predecessor). Prepending n zero bytes to data read from it gives the same CRC.
constexpr uint32_t before_zeros(uint32_t crc, size_t n) {
  for (size_t i = 0; i < 8 * n; ++i) {
    crc = (crc & 0x80000000u) != 0 ? ((crc ^ 0xEDB88320u) << 1) | 1u : crc << 1;
  }
  return crc;
}

template <size_t... N>
constexpr std::array<uint32_t, sizeof...(N)> lrh_registers(std::index_sequence<N...>) {
  return {before_zeros(kLrhRegister, N)...};
}

// [pad]: the start register for an ICRC read after `pad` zero bytes.
constexpr std::array<uint32_t, 64> kPaddedLrhRegister = lrh_registers(std::make_index_sequence<64>{});

// Sets the variant fields of a copy of the headers to ones.
void mask_variant_fields(uint8_t* h, size_t ihl_bytes, size_t bth_offset) {
  h[1] = 0xFF;              // TOS: DSCP + ECN
  h[8] = 0xFF;              // TTL
  h[10] = h[11] = 0xFF;     // header checksum
  h[ihl_bytes + 6] = 0xFF;  // UDP checksum
  h[ihl_bytes + 7] = 0xFF;
  h[bth_offset + 4] = 0xFF;  // BTH FECN, BECN, reserved
}

}  // namespace

uint32_t compute_icrc(const uint8_t* ip, size_t len, size_t bth_offset, CrcImpl impl) {
  // The masked prefix: IP header (TOS, TTL, checksum), UDP header (checksum) and, for ECH frames, the ECH,
  // up to and including BTH byte 4. Everything after it is invariant and is read in place.
  constexpr size_t kMaxMasked = 60 + 8 + 24 + 12;  // IPv4 with options + UDP + ECH + BTH
  const size_t masked_len = bth_offset + 5;
  const size_t ihl_bytes = len > 0 ? size_t{static_cast<uint8_t>(ip[0] & 0x0F)} * 4 : 0;
  // bth_offset first: near 2^64, bth_offset + 5 wrapped to a small length that passed.
  if (bth_offset > kMaxMasked || masked_len > len || masked_len > kMaxMasked || ihl_bytes < 20 ||
      ihl_bytes + 8 > bth_offset) {
    return 0;  // callers validate lengths first; this keeps a bad call in bounds
  }
#if defined(__x86_64__)
  // Frames of 256 bytes and more, in one pass of 512-bit folds: zero bytes in front bring the length to a multiple
  // of 16 (so no byte tail), the start register is moved back over them, and the first 256 bytes are read from a
  // masked copy.
  if ((impl == CrcImpl::kAuto || impl == CrcImpl::kVpclmul) && len >= 256 && have_vpclmul()) {
    const size_t pad = (16 - len % 16) % 16;
    alignas(64) uint8_t first[256];
    std::memset(first, 0, 16);
    std::memcpy(first + pad, ip, 256 - pad);
    mask_variant_fields(first + pad, ihl_bytes, bth_offset);
    const uint8_t* rest = ip + (256 - pad);
    size_t rest_len = len - (256 - pad);
    const __m128i x1 = fold_bulk_avx512(kPaddedLrhRegister[pad], first, rest, rest_len);
    return fold_rest_and_reduce(x1, rest, rest_len) ^ 0xFFFFFFFF;
  }
#endif
  // Otherwise through compute_icrc_parts, which takes a frame of up to 240 bytes in one piece. A longer one goes as
  // a masked head that runs on past the masked fields to a multiple of 16 bytes, at least 64, so carry-less
  // multiplication takes it whole, then the rest in place.
  const size_t whole = std::max<size_t>(64, (masked_len + 15) & ~size_t{15});
  const size_t head = whole <= len ? whole : masked_len;
  const CrcImpl rest_impl = impl == CrcImpl::kVpclmul ? CrcImpl::kAuto : impl;
  return compute_icrc_parts(ip, head, bth_offset, ip + head, len - head, 0, rest_impl);
}

uint32_t compute_icrc_parts(const uint8_t* headers, size_t header_len, size_t bth_offset, const uint8_t* payload,
                            size_t payload_len, size_t pad, CrcImpl impl) {
  // IPv4 with options, UDP, ECH, BTH and extension headers (compute_icrc passes at most 112 bytes here).
  constexpr size_t kMaxHeaders = 60 + 8 + 24 + 12 + 28;
  const size_t ihl_bytes = header_len > 0 ? size_t{static_cast<uint8_t>(headers[0] & 0x0F)} * 4 : 0;
  if (header_len > kMaxHeaders || pad > 3 || bth_offset > kMaxHeaders || bth_offset + 5 > header_len ||
      ihl_bytes < 20 || ihl_bytes + 8 > bth_offset) {
    return 0;  // callers validate lengths first; this keeps a bad call in bounds
  }
  // A short frame (an ACK, a NAK, an atomic, a small store) in one piece: headers, payload and pad copied behind
  // zero bytes that make at least 64, a multiple of 16, which carry-less multiplication takes whole (zlib's loop on
  // the ACKs alone was 2-3% of a ring AllReduce's simulation).
  static constexpr uint8_t kZeros[4] = {0, 0, 0, 0};
  const size_t body = header_len + payload_len + pad;
  if (body <= 240) {
    const size_t lead = body < 64 ? 64 - body : (16 - body % 16) % 16;
    alignas(16) uint8_t whole[256];
    std::memset(whole, 0, lead);
    std::memcpy(whole + lead, headers, header_len);
    if (payload_len > 0) {  // an ACK has no payload (nullptr)
      std::memcpy(whole + lead + header_len, payload, payload_len);
    }
    std::memcpy(whole + lead + header_len + payload_len, kZeros, pad);
    mask_variant_fields(whole + lead, ihl_bytes, bth_offset);
    return crc32_update(kPaddedLrhRegister[lead], whole, lead + body, impl) ^ 0xFFFFFFFF;
  }
  // Otherwise the masked headers behind zero bytes that bring them to a multiple of 16 (the start register moved
  // back over them), so carry-less multiplication takes them whole; then the payload and pad, read where they are.
  const size_t front = (16 - header_len % 16) % 16;
  uint8_t head[16 + kMaxHeaders];
  std::memset(head, 0, front);
  std::memcpy(head + front, headers, header_len);
  mask_variant_fields(head + front, ihl_bytes, bth_offset);
  uint32_t crc = crc32_update(kPaddedLrhRegister[front], head, front + header_len, impl);
  crc = crc32_update(crc, payload, payload_len, impl);
  crc = crc32_update(crc, kZeros, pad, impl);
  return crc ^ 0xFFFFFFFF;
}

}  // namespace ifec::common
