// Fifo against std::deque: pushes and pops interleaved across its growth keep the order; nothing allocated empty.
#include <gtest/gtest.h>

#include <deque>
#include <memory>
#include <random>

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

}  // namespace
}  // namespace ifec::common
