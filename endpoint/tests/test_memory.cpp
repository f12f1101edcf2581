// Symmetric memory: registration errors and the rkey / bounds / job / alignment check.
#include <gtest/gtest.h>

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
