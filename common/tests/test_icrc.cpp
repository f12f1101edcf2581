// ICRC against a frame computed by hand (Python zlib over the masked bytes) and the masking rules one by one.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "ifec/common/icrc.h"

using namespace ifec::common;

namespace {

// IPv4 (ECT(0), TTL 64) / UDP 0xC000 -> 4791 / BTH WRITE_ONLY qp 0x11 psn 42 / RETH va 0x1000 rkey 0x1234 len 8 /
// "ABCDEFGH" / ICRC 0x3FB0ED87 (little-endian on the wire). Computed independently with Python's zlib.crc32 over
// 8 x 0xFF + the masked headers + payload.
const std::vector<uint8_t> kWriteOnly = {
    0x45, 0x02, 0x00, 0x44, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x26, 0xa5, 0x0a, 0x00, 0x00, 0x01, 0x0a,
    0x00, 0x00, 0x02, 0xc0, 0x00, 0x12, 0xb7, 0x00, 0x30, 0x00, 0x00, 0x0a, 0x40, 0xff, 0xff, 0x00, 0x00,
    0x00, 0x11, 0x80, 0x00, 0x00, 0x2a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x12,
    0x34, 0x00, 0x00, 0x00, 0x08, 0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x87, 0xed, 0xb0, 0x3f};
constexpr uint32_t kExpectedIcrc = 0x3FB0ED87;
constexpr size_t kBthOffset = 28;

uint32_t icrc_of(const std::vector<uint8_t>& f) { return compute_icrc(f.data(), f.size() - 4, kBthOffset); }

// CRC-32 a bit at a time, written from the reflected polynomial alone: the reference for every fast path.
uint32_t bitwise(uint32_t crc, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int b = 0; b < 8; ++b) {
      crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
  }
  return crc;
}

// `n` pseudo-random bytes that start like an IPv4 header with a 20-byte header.
std::vector<uint8_t> random_ipv4_bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> bytes(n);
  for (uint8_t& b : bytes) {
    seed = seed * 1103515245u + 12345u;
    b = static_cast<uint8_t>(seed >> 16);
  }
  bytes[0] = 0x45;
  return bytes;
}

// The ICRC by its definition: the variant fields of a 20-byte IPv4 header, UDP and the BTH at `bth` set to ones,
// then the bitwise CRC over 8 bytes of 0xFF and the masked bytes.
uint32_t icrc_by_definition(std::vector<uint8_t> masked, size_t bth) {
  for (size_t off : {size_t{1}, size_t{8}, size_t{10}, size_t{11}, size_t{26}, size_t{27}, bth + 4}) {
    masked[off] = 0xFF;
  }
  const uint8_t ff[8] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
  return bitwise(bitwise(0xFFFFFFFFu, ff, 8), masked.data(), masked.size()) ^ 0xFFFFFFFFu;
}

}  // namespace

TEST(Crc32, StandardCheckValue) {
  const char* s = "123456789";
  EXPECT_EQ(crc32_update(0xFFFFFFFF, reinterpret_cast<const uint8_t*>(s), 9) ^ 0xFFFFFFFF, 0xCBF43926u);
}

// The bulk path (carry-less multiplication where the CPU has it) against a bit-at-a-time CRC-32 written from the
// polynomial alone: every length from 0 to 600 bytes (the 64-byte folds, the 16-byte folds and the byte tail),
// larger ones, odd alignments and register values other than the initial one, by every implementation this CPU has.
TEST(Crc32, EveryLengthAndAlignmentEqualsTheBitwiseDefinition) {
  std::vector<uint8_t> data(10000 + 16);
  uint32_t x = 12345;
  for (uint8_t& b : data) {
    x = x * 1103515245u + 12345u;
    b = static_cast<uint8_t>(x >> 16);
  }
  int tried = 0;
  for (CrcImpl impl : {CrcImpl::kAuto, CrcImpl::kZlib, CrcImpl::kPclmul, CrcImpl::kVpclmul}) {
    if (!crc_impl_available(impl)) {
      continue;  // e.g. no VPCLMULQDQ on this CPU
    }
    ++tried;
    const int id = static_cast<int>(impl);
    for (size_t len = 0; len <= 600; ++len) {
      for (size_t align : {size_t{0}, size_t{3}}) {
        const uint32_t seed = len % 2 ? 0xFFFFFFFFu : 0x12345678u;
        ASSERT_EQ(crc32_update(seed, data.data() + align, len, impl), bitwise(seed, data.data() + align, len))
            << len << " bytes at offset " << align << ", implementation " << id;
      }
    }
    for (size_t len : {4096, 4177, 9000, 10000}) {
      ASSERT_EQ(crc32_update(0xFFFFFFFFu, data.data() + 7, len, impl), bitwise(0xFFFFFFFFu, data.data() + 7, len))
          << len << " bytes, implementation " << id;
    }
  }
  EXPECT_GE(tried, 2);
}

// The ICRC's own definition, bit by bit: CRC-32 over 8 bytes of 0xFF, then a copy of the frame with the variant
// fields set to ones. Against it, every implementation at every length from the masked prefix up (one-pass path
// from 256 bytes on, with each of the 16 front paddings), for plain RoCEv2 and ECH-sized BTH offsets.
TEST(Icrc, EveryLengthEqualsTheBitwiseDefinition) {
  const std::vector<uint8_t> frame = random_ipv4_bytes(4200, 777);
  std::vector<size_t> lengths;
  for (size_t len = 33; len <= 700; ++len) {
    lengths.push_back(len);
  }
  for (size_t len = 4080; len <= 4200; ++len) {
    lengths.push_back(len);
  }
  for (size_t bth : {size_t{28}, size_t{52}}) {  // UDP then BTH; UDP, a 24-byte ECH, then BTH
    for (size_t len : lengths) {
      if (len < bth + 5) {
        continue;
      }
      const uint32_t want =
          icrc_by_definition(std::vector<uint8_t>(frame.begin(), frame.begin() + static_cast<long>(len)), bth);
      for (CrcImpl impl : {CrcImpl::kAuto, CrcImpl::kZlib, CrcImpl::kPclmul, CrcImpl::kVpclmul}) {
        if (crc_impl_available(impl)) {
          ASSERT_EQ(compute_icrc(frame.data(), len, bth, impl), want)
              << len << " bytes, BTH at " << bth << ", implementation " << static_cast<int>(impl);
        }
      }
    }
  }
}

TEST(Icrc, MatchesHandComputedFrame) { EXPECT_EQ(icrc_of(kWriteOnly), kExpectedIcrc); }

TEST(Icrc, FromPiecesEqualsTheBitwiseDefinitionOfTheAssembledFrame) {
  // The hand-computed frame: 56 bytes of headers (IPv4, UDP, BTH, RETH), 8 of payload, no pad.
  EXPECT_EQ(compute_icrc_parts(kWriteOnly.data(), 56, kBthOffset, kWriteOnly.data() + 56, 8, 0), kExpectedIcrc);
  const std::vector<uint8_t> frame = random_ipv4_bytes(4400, 4242);
  std::vector<size_t> payloads;
  for (size_t n = 0; n <= 300; ++n) {
    payloads.push_back(n);
  }
  for (size_t n = 4080; n <= 4100; ++n) {
    payloads.push_back(n);
  }
  // BTH only; BTH + RETH; a 24-byte ECH, BTH and RETH (header lengths that are and are not multiples of 16).
  for (auto [headers, bth] : {std::pair<size_t, size_t>{40, 28}, {56, 28}, {80, 52}}) {
    for (size_t n : payloads) {
      const size_t pad = (4 - n % 4) % 4;
      std::vector<uint8_t> assembled(frame.begin(), frame.begin() + static_cast<long>(headers + n));
      assembled.insert(assembled.end(), pad, 0);
      const uint32_t want = icrc_by_definition(assembled, bth);
      ASSERT_EQ(compute_icrc_parts(frame.data(), headers, bth, frame.data() + headers, n, pad), want)
          << headers << " header bytes, payload " << n << ", pad " << pad;
      ASSERT_EQ(compute_icrc(assembled.data(), assembled.size(), bth), want);
    }
  }
  // Out of range: nothing read, 0 returned.
  EXPECT_EQ(compute_icrc_parts(frame.data(), 20, kBthOffset, frame.data(), 8, 0), 0u);
  EXPECT_EQ(compute_icrc_parts(frame.data(), 56, kBthOffset, frame.data(), 8, 4), 0u);
}

TEST(Icrc, SeedEqualsCrcOfMaskedLrh) {
  // Linux rxe starts from 0xDEBB20E3: the CRC register after 8 bytes of 0xFF. Same thing, said two ways.
  const uint8_t ff[8] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
  EXPECT_EQ(crc32_update(0xFFFFFFFF, ff, 8), 0xDEBB20E3u);
}

TEST(Icrc, VariantFieldsDoNotChangeIt) {
  struct Case {
    size_t offset;
    const char* field;
  };
  const Case variant[] = {{1, "IPv4 TOS"},
                          {8, "IPv4 TTL"},
                          {10, "IPv4 checksum hi"},
                          {11, "IPv4 checksum lo"},
                          {26, "UDP checksum hi"},
                          {27, "UDP checksum lo"},
                          {kBthOffset + 4, "BTH FECN/BECN/resv"}};
  for (const Case& c : variant) {
    std::vector<uint8_t> f = kWriteOnly;
    f[c.offset] ^= 0xC3;
    EXPECT_EQ(icrc_of(f), kExpectedIcrc) << c.field << " is variant and must be masked";
  }
}

TEST(Icrc, InvariantFieldsChangeIt) {
  const size_t invariant[] = {0, 2, 12, 16, 20, 22, 24, kBthOffset, kBthOffset + 7, kBthOffset + 11, 40, 56, 63};
  for (size_t off : invariant) {
    std::vector<uint8_t> f = kWriteOnly;
    f[off] ^= 0x01;
    EXPECT_NE(icrc_of(f), kExpectedIcrc) << "byte " << off << " is invariant and must be covered";
  }
}

TEST(Icrc, RejectsInconsistentOffsetsWithoutReadingOutOfBounds) {
  EXPECT_EQ(compute_icrc(kWriteOnly.data(), 10, kBthOffset), 0u) << "length shorter than the masked prefix";
  EXPECT_EQ(compute_icrc(kWriteOnly.data(), kWriteOnly.size() - 4, 20), 0u) << "BTH inside the UDP header";
}
