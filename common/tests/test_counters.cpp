// Counter sets declared once (counters.h): the fields a list makes, iteration in the list's order, sums, and a set
// through name -> value and back (as gRPC carries the IFEC engine's counters).
#include <gtest/gtest.h>

#include <iterator>
#include <string>
#include <vector>

#include "ifec/common/control.h"
#include "ifec/common/counters.h"
#include "ifec/common/sim.h"

using namespace ifec::common;

namespace {

// clang-format off
#define TEST_COUNTERS(X)      \
  X(frames, "")               \
  X(drops, "frames refused")
// clang-format on

struct TestCounters {
  IFEC_COUNTER_SET(TestCounters, TEST_COUNTERS)
  std::vector<int> other;  // not a counter
};

TEST(CounterSet, IteratesTheListInOrderWithItsHelp) {
  TestCounters c;
  c.frames = 3;
  c.drops = 1;
  std::vector<std::string> seen;
  c.for_each([&](const char* name, uint64_t v) { seen.push_back(std::string(name) + "=" + std::to_string(v)); });
  EXPECT_EQ(seen, (std::vector<std::string>{"frames=3", "drops=1"}));
  EXPECT_STREQ(TestCounters::kCounters[1].help, "frames refused");
  EXPECT_EQ(c.*TestCounters::kCounters[0].member, 3u);
}

TEST(CounterSet, SumsEveryCounterAndNothingElse) {
  TestCounters a, b;
  a.frames = 1;
  b.frames = 2;
  b.drops = 5;
  b.other = {7};
  a += b;
  EXPECT_EQ(a.frames, 3u);
  EXPECT_EQ(a.drops, 5u);
  EXPECT_TRUE(a.other.empty());
}

TEST(CounterSet, IfecCountersRoundTripThroughAMap) {
  IfecCounters c;
  uint64_t v = 1;
  c.for_each([&](const char*, uint64_t& x) { x = v++; });  // every counter distinct
  const auto m = counters_to_map(c);
  EXPECT_EQ(m.size(), std::size(IfecCounters::kCounters));
  EXPECT_EQ(m.at("results_sent"), c.results_sent);
  EXPECT_EQ(m.at("partial_resends"), c.partial_resends);
  const IfecCounters back = counters_from_map<IfecCounters>(m);
  EXPECT_EQ(counters_to_map(back), m);

  auto partial = m;
  partial.erase("anomalies");
  partial["not_a_counter"] = 9;
  const IfecCounters some = counters_from_map<IfecCounters>(partial);
  EXPECT_EQ(some.anomalies, 0u) << "a name the map lacks stays 0";
  EXPECT_EQ(some.contributions, c.contributions);
}

TEST(CounterSet, PortCountersKeepTheirFieldOrder) {
  const PortCounters p{1, 2, 3, 4, 5, 6, 7, 8};  // aggregate initialisation still works, in declaration order
  EXPECT_EQ(p.tx_frames, 1u);
  EXPECT_EQ(p.busy_ps, 8u);
  EXPECT_STREQ(PortCounters::kCounters[7].name, "busy_ps");
}

}  // namespace
