// Symmetric memory: registration errors and the rkey / bounds / job / alignment check.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <vector>

#include "ifec/common/checks.h"
#include "ifec/endpoint/memory.h"

using namespace ifec::endpoint;

TEST(SymmetricMemory, SameWindowSameAddressOnEveryEndpointButDistinctRkeys) {
  SymmetricMemory a(0);
  SymmetricMemory b(1);
  const WindowInfo& wa = a.allocate_window(3, 4096, 1);
  const WindowInfo& wb = b.allocate_window(3, 4096, 1);
  EXPECT_EQ(wa.va, wb.va);
  EXPECT_EQ(wa.va, window_va(3));
  EXPECT_NE(wa.rkey, wb.rkey);
  EXPECT_NE(wa.rkey, 0u);
}

TEST(SymmetricMemory, CheckRejectsEachViolation) {
  SymmetricMemory m(0);
  const WindowInfo w = m.allocate_window(1, 1024, 7);
  EXPECT_EQ(m.check(w.rkey, w.va, 1024, 7, false), AccessError::kOk);
  EXPECT_EQ(m.check(w.rkey, w.va + 1000, 24, 7, false), AccessError::kOk);
  EXPECT_EQ(m.check(w.rkey ^ 1, w.va, 8, 7, false), AccessError::kBadRkey);
  EXPECT_EQ(m.check(w.rkey, w.va + 1000, 25, 7, false), AccessError::kOutOfBounds);
  EXPECT_EQ(m.check(w.rkey, w.va - 1, 8, 7, false), AccessError::kOutOfBounds);
  EXPECT_EQ(m.check(w.rkey, w.va + 2048, 1, 7, false), AccessError::kOutOfBounds);
  EXPECT_EQ(m.check(w.rkey, w.va, ~0ULL, 7, false), AccessError::kOutOfBounds) << "no overflow wrap";
  EXPECT_EQ(m.check(w.rkey, w.va, 8, 8, false), AccessError::kWrongJob);
  EXPECT_EQ(m.check(w.rkey, w.va + 4, 8, 7, true), AccessError::kMisaligned);
  EXPECT_EQ(m.check(w.rkey, w.va + 8, 8, 7, true), AccessError::kOk);
}

TEST(SymmetricMemory, RegistrationErrorsNameTheValue) {
  SymmetricMemory m(2);
  std::vector<uint8_t> buf(64);
  m.register_window(5, buf.data(), buf.size(), 1);
  try {
    m.register_window(5, buf.data(), buf.size(), 1);
    FAIL();
  } catch (const ifec::common::Error& e) {
    EXPECT_NE(std::string(e.what()).find("window 5"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m.register_window(6, buf.data(), 0, 1), ifec::common::Error);
  EXPECT_THROW(m.register_window(7, nullptr, 64, 1), ifec::common::Error);
  EXPECT_THROW(m.register_window(8, buf.data(), 64, 0x8000), ifec::common::Error);
}

// Freed windows' mappings are kept (when asked) and reused zeroed by a later window of the same size, or up to twice
// as large; the oldest go past the limit; by default nothing is kept.
TEST(SymmetricMemory, FreedWindowsAreReusedZeroedWithinTheLimit) {
  constexpr uint64_t kMiB = 1 << 20;
  SymmetricMemory plain(0);
  uint8_t* first = plain.allocate_window(1, kMiB, 1).data;
  first[5] = 7;
  plain.free_window(1);
  plain.allocate_window(2, kMiB, 1);
  EXPECT_EQ(plain.reused_windows(), 0u) << "nothing is kept unless asked";

  SymmetricMemory m(0);
  m.keep_freed_windows(3 * kMiB);
  uint8_t* a = m.allocate_window(1, kMiB, 1).data;
  std::fill(a, a + kMiB, 0xAB);
  m.free_window(1);
  const WindowInfo& again = m.allocate_window(2, kMiB - 100, 1);
  EXPECT_EQ(again.data, a) << "the freed mapping, reused";
  EXPECT_EQ(again.size, kMiB - 100);
  EXPECT_EQ(m.reused_windows(), 1u);
  EXPECT_EQ(std::count(again.data, again.data + again.size, 0), static_cast<long>(again.size)) << "zeroed";
  m.free_window(2);
  m.allocate_window(3, kMiB / 2 - 1, 1);  // less than half the kept mapping: a fresh one
  EXPECT_EQ(m.reused_windows(), 1u);
  m.free_window(3);
  // 1 MiB and 0.5 MiB kept; two more MiB push the oldest (the first 1 MiB) out.
  m.allocate_window(4, 2 * kMiB, 1);
  m.free_window(4);
  m.allocate_window(5, kMiB - 4096, 1);  // the 2 MiB mapping is more than twice that, the 0.5 MiB one too small
  EXPECT_EQ(m.reused_windows(), 1u) << "the 1 MiB mapping was let go for the 2 MiB one";
  m.allocate_window(6, 2 * kMiB, 1);
  EXPECT_EQ(m.reused_windows(), 2u);
  m.allocate_window(7, 8 * kMiB, 1);  // more than the limit: mapped, and unmapped when freed
  m.free_window(7);
  m.allocate_window(8, 8 * kMiB, 1);
  EXPECT_EQ(m.reused_windows(), 2u);
}

// A sparse window's reuse zeroes what its last user wrote and leaves the pages it never touched out of memory.
TEST(SymmetricMemory, AReusedSparseWindowIsZeroedWithoutFaultingInItsUntouchedPages) {
  constexpr uint64_t kSize = 256 * 4096;
  SymmetricMemory m(0);
  m.keep_freed_windows(kSize);
  uint8_t* a = m.allocate_window(1, kSize, 1).data;
  a[3] = 0xCD;
  a[100 * 4096 + 7] = 0xCD;
  m.free_window(1);
  const WindowInfo& b = m.allocate_window(2, kSize, 1);
  ASSERT_EQ(b.data, a);
  std::vector<unsigned char> in(256);
  ASSERT_EQ(mincore(b.data, kSize, in.data()), 0);
  EXPECT_LE(std::count_if(in.begin(), in.end(), [](unsigned char c) { return c & 1; }), 2)
      << "only the two pages written before are in memory";
  EXPECT_EQ(b.data[3], 0);
  EXPECT_EQ(b.data[100 * 4096 + 7], 0);
  EXPECT_EQ(std::count(b.data, b.data + kSize, 0), static_cast<long>(kSize));
}
