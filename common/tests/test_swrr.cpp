// SmoothWrr: exact shares of picks (integer weights, any window of sum(weights) picks) and, with costs, of the
// costs: frames of mixed sizes sprayed over equal members put equal bytes on each, however the sizes interleave.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "ifec/common/swrr.h"

namespace ifec::common {
namespace {

TEST(SmoothWrr, PicksInProportionToWeightsWithinEveryWindow) {
  SmoothWrr w({3, 1, 0, 2});
  std::vector<int> counts(4, 0);
  for (int i = 0; i < 600; ++i) {
    counts[w.next()]++;
    if ((i + 1) % 6 == 0) {
      EXPECT_EQ(counts[0], 3 * (i + 1) / 6) << "after " << i + 1 << " picks";
      EXPECT_EQ(counts[1], (i + 1) / 6);
      EXPECT_EQ(counts[2], 0) << "a member of weight 0 is never picked";
      EXPECT_EQ(counts[3], 2 * (i + 1) / 6);
    }
  }
  EXPECT_EQ(SmoothWrr({0, -1}).next(), -1);
}

// A data frame and an ACK in turn: counting picks would send every data frame one way and every ACK the other (a
// Y-cable sub-link with twice the other's bytes); costing them by bytes keeps the two within one large frame.
TEST(SmoothWrr, CostsShareTheCostNotThePicks) {
  SmoothWrr count({1, 1});
  SmoothWrr bytes({1, 1});
  std::vector<double> by_count(2, 0), by_bytes(2, 0);
  for (int i = 0; i < 1000; ++i) {
    const double size = i % 2 == 0 ? 4154 : 78;
    by_count[count.next()] += size;
    by_bytes[bytes.next(size)] += size;
    EXPECT_LE(std::abs(by_bytes[0] - by_bytes[1]), 2 * 4154.0) << "after " << i + 1 << " frames";
  }
  EXPECT_GT(std::abs(by_count[0] - by_count[1]), 1e6) << "the reference: picks alone split the bytes unevenly";

  // Unequal weights and random sizes: each member's bytes within a few of the largest frame of its share.
  SmoothWrr w({3, 1, 2});
  std::vector<double> got(3, 0);
  std::mt19937 rng(5);
  double total = 0;
  for (int i = 0; i < 20000; ++i) {
    const double size = 64 + rng() % 4096;
    got[w.next(size)] += size;
    total += size;
  }
  const double share[3] = {3.0 / 6, 1.0 / 6, 2.0 / 6};
  for (int m = 0; m < 3; ++m) {
    EXPECT_LE(std::abs(got[m] - share[m] * total), 3 * 4160.0) << "member " << m;
  }
}

}  // namespace
}  // namespace ifec::common
