// ECH v1: both formats against the byte layout in docs/ech-v1.md, and every validation rule.
#include <gtest/gtest.h>

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
      {"version 2", 0, 0x20, false, WireError::kEchBadVersion},
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
      {"expected contributors 65", 17, 65, true, WireError::kEchBadField},
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
