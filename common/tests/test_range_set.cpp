// RangeSet and ExpectedRanges: the same bytes counted once, against a byte-by-byte reference, for random arrivals
// inside, across and outside the expected ranges.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "ifec/common/range_set.h"

namespace ifec::common {
namespace {

TEST(RangeSet, CountsEachByteOnceAgainstAByteSet) {
  std::mt19937 rng(5);
  RangeSet rs;
  std::set<uint64_t> ref;
  for (int i = 0; i < 3000; ++i) {
    const uint64_t b = rng() % 5000;
    const uint64_t n = rng() % 64;
    size_t before = ref.size();
    for (uint64_t x = b; x < b + n; ++x) {
      ref.insert(x);
    }
    ASSERT_EQ(rs.insert(b, n), ref.size() - before);
    ASSERT_EQ(rs.bytes(), ref.size());
  }
  EXPECT_TRUE(rs.contains(0, 10) == (ref.count(0) && ref.count(9)));
}

// Rows of 100 bytes with gaps between them, arrivals cut in packets of up to 40 bytes in random order, repeated
// (a retransmission, a multicast replica and its fallback store), straddling rows and gaps, and far outside.
TEST(ExpectedRanges, CountsWhatARangeSetCounts) {
  std::vector<std::pair<uint64_t, uint64_t>> rows;
  for (uint64_t r = 0; r < 50; ++r) {
    rows.push_back({r * 128, 100});  // 28-byte gaps
  }
  rows.push_back({64 * 128, 300});
  rows.push_back({64 * 128 + 100, 50});  // overlaps the one before: merged
  std::shuffle(rows.begin(), rows.end(), std::mt19937(1));
  ExpectedRanges er(rows);
  RangeSet ref;
  std::mt19937 rng(9);
  for (int i = 0; i < 20000; ++i) {
    const uint64_t b = rng() % 9000;
    const uint64_t n = 1 + rng() % 40;
    ASSERT_EQ(er.insert(b, n), ref.insert(b, n)) << "arrival " << b << " + " << n;
    ASSERT_EQ(er.bytes(), ref.bytes());
  }
  EXPECT_EQ(er.insert(1000000, 10), 10u) << "outside every expected range: counted too";
  EXPECT_EQ(ExpectedRanges().insert(5, 5), 5u);
}

}  // namespace
}  // namespace ifec::common
