// Fifo against std::deque: pushes and pops interleaved across its growth keep the order; nothing allocated empty.
#include <gtest/gtest.h>

#include <deque>
#include <memory>
#include <random>
#include <vector>

#include "ifec/common/fifo.h"

namespace ifec::common {
namespace {

TEST(Fifo, KeepsFirstInFirstOutAcrossGrowthAndWrapAround) {
  Fifo<std::unique_ptr<int>> f;
  std::deque<int> ref;
  EXPECT_EQ(f.capacity(), 0u) << "nothing allocated before the first element";
  std::mt19937 rng(3);
  int next = 0;
  for (int i = 0; i < 20000; ++i) {
    if (ref.empty() || rng() % 3 != 0) {
      f.push_back(std::make_unique<int>(next));
      ref.push_back(next++);
    } else {
      ASSERT_EQ(*f.front(), ref.front());
      f.pop_front();
      ref.pop_front();
    }
    ASSERT_EQ(f.size(), ref.size());
  }
  while (!ref.empty()) {
    ASSERT_EQ(*f.front(), ref.front());
    f.pop_front();
    ref.pop_front();
  }
  EXPECT_TRUE(f.empty());
}

TEST(Fifo, IndexesAndIteratesFrontToBackAndGivesItsRingBack) {
  Fifo<int> f;
  for (int i = 0; i < 6; ++i) {
    f.push_back(int{i});
  }
  f.pop_front();
  f.pop_front();
  for (int i = 6; i < 9; ++i) {
    f.push_back(int{i});  // wraps around the ring of 8
  }
  std::vector<int> seen;
  for (int v : f) {
    seen.push_back(v);
  }
  EXPECT_EQ(seen, (std::vector<int>{2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(f[0], 2);
  EXPECT_EQ(f[6], 8);
  f.release_if_empty();
  EXPECT_EQ(f.capacity(), 8u) << "not empty: kept";
  while (!f.empty()) {
    f.pop_front();
  }
  f.release_if_empty();
  EXPECT_EQ(f.capacity(), 0u);
  f.push_back(9);
  EXPECT_EQ(f.front(), 9);
}

}  // namespace
}  // namespace ifec::common
