// ECH v1 and v2 (compact with a bitmap base): every format against the byte layout in docs/ech-v1.md, and every
// validation rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "ifec/common/ech.h"

using namespace ifec::common;

namespace {

Ech compact() {
  Ech e;
  e.format = EchFormat::kCompact;
  e.op = EchOp::kMulticast;
  e.source_id = 1;
  e.window_id = 3;
  e.dest_bitmap = (1ULL << 2) | (1ULL << 5) | (1ULL << 63);
  return e;
}

Ech standard() {
  Ech e;
  e.format = EchFormat::kStandard;
  e.op = EchOp::kAllReduce;
  e.flags = ech_flags::kStrongOrdering | ech_flags::kAnomaly;
  e.job_id = 0x01020304;
  e.group_id = 0x0506;
  e.contributor_id = 0x0708;
  e.chunk_index = 0x090A0B0C;
  e.dtype = EchDtype::kBf16;
  e.redop = EchRedOp::kMax;
  e.element_count = 0x0D0E;
  e.window_id = 0x0F10;
  return e;
}

std::vector<uint8_t> bytes_of(const Ech& e) {
  std::vector<uint8_t> v(e.size());
  e.encode(v.data());
  return v;
}

WireStatus decode(const std::vector<uint8_t>& v, Ech* out) { return Ech::decode(v.data(), v.size(), out); }

}  // namespace

TEST(Ech, CompactLayoutByteByByte) {
  const std::vector<uint8_t> expect = {0x10, 0x01, 0x00, 0x04, 0x00, 0x01, 0x00, 0x03,
                                       0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x24};
  EXPECT_EQ(bytes_of(compact()), expect);
  Ech d;
  ASSERT_TRUE(decode(expect, &d).ok());
  EXPECT_EQ(d.format, EchFormat::kCompact);
  EXPECT_EQ(d.source_id, 1);
  EXPECT_EQ(d.window_id, 3);
  EXPECT_EQ(d.dest_bitmap, compact().dest_bitmap);
}

TEST(Ech, StandardLayoutByteByByte) {
  const std::vector<uint8_t> expect = {0x11, 0x03, 0xA0, 0x06, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,
                                       0x09, 0x0A, 0x0B, 0x0C, 0x22, 0x00, 0x0D, 0x0E, 0x0F, 0x10, 0x00, 0x00};
  EXPECT_EQ(bytes_of(standard()), expect);
  Ech d;
  ASSERT_TRUE(decode(expect, &d).ok());
  EXPECT_EQ(d.op, EchOp::kAllReduce);
  EXPECT_EQ(d.flags, ech_flags::kStrongOrdering | ech_flags::kAnomaly);
  EXPECT_EQ(d.job_id, 0x01020304u);
  EXPECT_EQ(d.group_id, 0x0506);
  EXPECT_EQ(d.contributor_id, 0x0708);
  EXPECT_EQ(d.chunk_index, 0x090A0B0Cu);
  EXPECT_EQ(d.dtype, EchDtype::kBf16);
  EXPECT_EQ(d.redop, EchRedOp::kMax);
  EXPECT_EQ(d.element_count, 0x0D0E);
  EXPECT_EQ(d.window_id, 0x0F10);
}

TEST(Ech, RejectsEachMalformedField) {
  struct Case {
    const char* what;
    size_t offset;
    uint8_t value;
    bool use_standard;
    WireError expect;
  };
  const Case cases[] = {
      {"version 3", 0, 0x30, false, WireError::kEchBadVersion},
      {"version 2 standard", 0, 0x21, true, WireError::kEchBadFormat},
      {"version 2 at v1's length", 0, 0x20, false, WireError::kEchBadLength},
      {"version 0", 0, 0x00, false, WireError::kEchBadVersion},
      {"format 2", 0, 0x12, false, WireError::kEchBadFormat},
      {"compact length 5 words", 3, 5, false, WireError::kEchBadLength},
      {"standard length 4 words", 3, 4, true, WireError::kEchBadLength},
      {"compact reduce", 1, 2, false, WireError::kEchBadOperation},
      {"op 0", 1, 0, true, WireError::kEchBadOperation},
      {"op 5", 1, 5, true, WireError::kEchBadOperation},
      {"reserved flag bit", 2, 0x01, false, WireError::kEchBadField},
      {"source id 64", 5, 64, false, WireError::kEchBadField},
      {"dtype 4", 16, 0x40, true, WireError::kEchBadField},
      {"redop 3", 16, 0x03, true, WireError::kEchBadField},
      {"reserved byte 23", 23, 1, true, WireError::kEchBadField},
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> v = bytes_of(c.use_standard ? standard() : compact());
    v[c.offset] = c.value;
    Ech d;
    WireStatus st = decode(v, &d);
    EXPECT_EQ(st.error, c.expect) << c.what << ": got " << st.message();
  }
}

// v2: the compact header with a bitmap base, for sources and destinations past endpoint 63.
Ech compact_v2() {
  Ech e = compact();
  e.source_id = 300;
  e.bitmap_base = 64;
  e.dest_bitmap = (1ULL << 2) | (1ULL << 5);
  return e;
}

TEST(Ech, CompactV2LayoutByteByByte) {
  const std::vector<uint8_t> expect = {0x20, 0x01, 0x00, 0x05, 0x01, 0x2C, 0x00, 0x03, 0x00, 0x40,
                                       0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x24};
  EXPECT_EQ(bytes_of(compact_v2()), expect);
  Ech d;
  ASSERT_TRUE(decode(expect, &d).ok());
  EXPECT_EQ(d.source_id, 300);
  EXPECT_EQ(d.bitmap_base, 64);
  EXPECT_EQ(d.dest_bitmap, compact_v2().dest_bitmap);
  EXPECT_EQ(d.size(), Ech::kCompactV2Size);
  EXPECT_TRUE(d.addresses(66));
  EXPECT_TRUE(d.addresses(69));
  EXPECT_FALSE(d.addresses(2)) << "bit 2 is endpoint 66, not 2";
  EXPECT_FALSE(d.addresses(67));
}

// Senders use v1 whenever it can carry the header, so fabrics of up to 64 GPUs send v1's bytes; each header has one
// encoding, so a v2 header v1 could carry is refused.
TEST(Ech, CompactUsesV2OnlyPastEndpoint63) {
  Ech e = compact();
  EXPECT_EQ(bytes_of(e).size(), Ech::kCompactSize);
  e.set_destination(63);
  EXPECT_EQ(e.bitmap_base, 0);
  EXPECT_EQ(bytes_of(e).size(), Ech::kCompactSize);
  e.set_destination(130);
  EXPECT_EQ(e.bitmap_base, 128);
  EXPECT_EQ(e.dest_bitmap, 1ULL << 2);
  EXPECT_EQ(bytes_of(e)[0], 0x20);
  Ech src64 = compact();
  src64.source_id = 64;
  EXPECT_EQ(bytes_of(src64).size(), Ech::kCompactV2Size);

  std::vector<uint8_t> v = bytes_of(compact_v2());
  Ech d;
  std::vector<uint8_t> as_v1 = v;
  as_v1[4] = 0;
  as_v1[5] = 1;  // source 1
  as_v1[9] = 0;  // base 0
  EXPECT_EQ(decode(as_v1, &d).error, WireError::kEchBadField) << "v1's header sent as v2";
  std::vector<uint8_t> reserved = v;
  reserved[11] = 1;
  EXPECT_EQ(decode(reserved, &d).error, WireError::kEchBadField);
  std::vector<uint8_t> past = v;
  past[8] = 0xFF;
  past[9] = 0xFF;  // base 65535 + bit 5
  EXPECT_EQ(decode(past, &d).error, WireError::kEchBadField);
  std::vector<uint8_t> empty = v;
  std::fill(empty.begin() + 12, empty.end(), 0);
  EXPECT_EQ(decode(empty, &d).error, WireError::kEchBadField);
  for (size_t n = 0; n < v.size(); ++n) {
    std::vector<uint8_t> cut(v.begin(), v.begin() + n);
    EXPECT_EQ(Ech::decode(cut.data(), cut.size(), &d).error, WireError::kTruncated) << "length " << n;
  }
}

TEST(Ech, RejectsEmptyBitmapAndBarrierWithElements) {
  Ech e = compact();
  e.dest_bitmap = 0;
  Ech d;
  EXPECT_EQ(decode(bytes_of(e), &d).error, WireError::kEchBadField);
  Ech b = standard();
  b.op = EchOp::kBarrier;
  b.element_count = 1;
  EXPECT_EQ(decode(bytes_of(b), &d).error, WireError::kEchBadField);
  b.element_count = 0;
  EXPECT_TRUE(decode(bytes_of(b), &d).ok());
}

TEST(Ech, TruncatedAtEveryLength) {
  for (const Ech& e : {compact(), standard()}) {
    std::vector<uint8_t> v = bytes_of(e);
    for (size_t n = 0; n < v.size(); ++n) {
      std::vector<uint8_t> cut(v.begin(), v.begin() + n);  // a fresh allocation: ASan sees any overread
      Ech d;
      EXPECT_EQ(Ech::decode(cut.data(), cut.size(), &d).error, WireError::kTruncated) << "length " << n;
    }
  }
}

TEST(Ech, DtypeSizes) {
  EXPECT_EQ(ech_dtype_size(EchDtype::kFp32), 4u);
  EXPECT_EQ(ech_dtype_size(EchDtype::kInt32), 4u);
  EXPECT_EQ(ech_dtype_size(EchDtype::kFp16), 2u);
  EXPECT_EQ(ech_dtype_size(EchDtype::kBf16), 2u);
}
