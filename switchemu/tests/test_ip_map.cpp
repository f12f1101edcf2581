// IpMap against std::map: random inserts, overwrites and erases (tombstones, growth, rebuilds) agree throughout.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "ifec/switchemu/ip_map.h"

namespace ifec::switchemu {
namespace {

TEST(IpMap, AgreesWithAReferenceMapThroughInsertsOverwritesAndErases) {
  IpMap m;
  std::map<uint32_t, int32_t> ref;
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t ip = 0x0A000000u + rng() % 5000;  // collisions, revisits and erased keys coming back
    const int op = static_cast<int>(rng() % 3);
    if (op < 2) {
      const int32_t v = static_cast<int32_t>(rng() % 1000);
      const auto it = ref.find(ip);
      ASSERT_EQ(m.set(ip, v), it == ref.end() ? -1 : it->second);
      ref[ip] = v;
    } else {
      const auto it = ref.find(ip);
      ASSERT_EQ(m.erase(ip), it == ref.end() ? -1 : it->second);
      ref.erase(ip);
    }
    ASSERT_EQ(m.size(), ref.size());
  }
  for (uint32_t ip = 0x0A000000u; ip < 0x0A000000u + 5000; ++ip) {
    const auto it = ref.find(ip);
    EXPECT_EQ(m.find(ip), it == ref.end() ? -1 : it->second) << ip;
  }
  EXPECT_EQ(IpMap().find(42), -1);
  EXPECT_EQ(IpMap().memory_bytes(), 0u);
}

}  // namespace
}  // namespace ifec::switchemu
