// Link selectors and times as users write them: resolved against a topology, bad ones named.
#include <gtest/gtest.h>

#include <string>

#include "ifec/common/checks.h"
#include "ifec/routing/topology.h"
#include "ifec/testbed/link_events.h"

using namespace ifec;

TEST(LinkEvents, ParsesTimesAndLinkSelectorsWithClearErrors) {
  EXPECT_EQ(testbed::parse_time("20us"), 20'000u);
  EXPECT_EQ(testbed::parse_time("1.5ms"), 1'500'000u);
  EXPECT_EQ(testbed::parse_time("42"), 42u);
  EXPECT_THROW(testbed::parse_time("10 parsecs"), common::Error);
  const routing::Topology topo = routing::make_superpod(8, 4);
  EXPECT_EQ(testbed::resolve_links(topo, "gpu5:plane2").size(), 2u);
  EXPECT_EQ(testbed::resolve_links(topo, "gpu5:plane2:sub1").size(), 1u);
  try {
    testbed::resolve_links(topo, "gpu99:plane2");
    FAIL();
  } catch (const common::Error& e) {
    EXPECT_NE(std::string(e.what()).find("gpu99"), std::string::npos) << e.what();
  }
  EXPECT_THROW(testbed::resolve_links(topo, "gpu5:plane9"), common::Error);
  EXPECT_THROW(testbed::parse_link_event(topo, "gpu5:plane2", false), common::Error);
  // Numbers too large for an int are named, never std::out_of_range from std::stoi.
  for (const std::string bad :
       {"99999999999", "gpu5:plane99999999999", "gpu5:plane1:sub99999999999", "gpu5:p1-sw:99999999999"}) {
    try {
      testbed::resolve_links(topo, bad);
      FAIL() << bad;
    } catch (const common::Error& e) {
      EXPECT_NE(std::string(e.what()).find("'" + bad + "'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("is too large"), std::string::npos) << e.what();
    }
  }
}
