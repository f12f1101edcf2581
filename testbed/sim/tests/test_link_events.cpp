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
  EXPECT_EQ(testbed::parse_time("2.5e1us"), 25'000u);
  EXPECT_EQ(testbed::parse_time(".5us"), 500u);
  // What std::stod would read but a time is not: hex, leading space, a sign, infinity, a number twice.
  for (const std::string bad : {"0x10us", " 5us", "+5us", "-3us", "infus", "nan", "1e3e3us", "5..1us", "", "us"}) {
    EXPECT_THROW(testbed::parse_time(bad), common::Error) << bad;
  }
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

TEST(LinkEvents, ARestorationMustFindItsLinksDown) {
  const routing::Topology topo = routing::make_superpod(8, 4);
  auto event = [&](const std::string& text, bool up) { return testbed::parse_link_event(topo, text, up); };
  auto error = [](const std::vector<testbed::LinkEvent>& events) -> std::string {
    try {
      testbed::check_link_events(events);
    } catch (const common::Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error({event("gpu5:plane1@1us", false), event("gpu5:plane1@2us", true)}), "");
  EXPECT_EQ(error({event("gpu5:plane1@2us", false), event("gpu5:plane1@2us", true)}), "");  // the list's order
  EXPECT_EQ(error({event("gpu5:plane1@5us", false), event("gpu5:plane1@6us", true), event("gpu5:plane1@7us", false),
                   event("gpu5:plane1@8us", true)}),
            "");
  const std::string named = "restore 'gpu5:plane1@2us': its links are up";
  EXPECT_EQ(error({event("gpu5:plane1@2us", true)}).rfind(named, 0), 0u);  // nothing failed it
  EXPECT_EQ(error({event("gpu5:plane1@5us", false), event("gpu5:plane1@2us", true)}).rfind(named, 0), 0u);  // before
  EXPECT_EQ(error({event("gpu5:plane1:sub0@1us", false), event("gpu5:plane1@2us", true)}), "");  // one of its two
  EXPECT_NE(error({event("gpu5:plane1@2us", true)}).find("its links are up at 2000 ns"), std::string::npos);
}

// A GPU is cut off while every fabric link it has is down: each of its planes, each sub-link of a Y-cable. The report
// names it with the time it lost its last link and, where a restoration ends it, when it got one back.
TEST(LinkEvents, AGpuLeftWithNoFabricLinkIsNamed) {
  const routing::Topology topo = routing::make_superpod(8, 2);
  auto event = [&](const std::string& text, bool up) { return testbed::parse_link_event(topo, text, up); };
  EXPECT_EQ(testbed::cut_off_gpus(topo, {}), "");
  EXPECT_EQ(testbed::cut_off_gpus(topo, {event("gpu0:plane0@1us", false), event("gpu0:plane1:sub0@2us", false)}), "");
  EXPECT_EQ(testbed::cut_off_gpus(topo, {event("gpu0:plane1@2us", false), event("gpu0:plane0@1us", false)}),
            "GPU 0 lost every fabric link at 2000 ns");  // in time order, not the list's
  EXPECT_EQ(testbed::cut_off_gpus(topo, {event("gpu3:plane0@1us", false), event("gpu3:plane1@2us", false),
                                         event("gpu3:plane1:sub1@5us", true), event("gpu6:plane0@7us", false),
                                         event("gpu6:plane1@7us", false)}),
            "GPU 3 lost every fabric link at 2000 ns, restored at 5000 ns; GPU 6 lost every fabric link at 7000 ns");
  // The switch side of a GPU's links names it too.
  EXPECT_EQ(testbed::cut_off_gpus(topo, {event("gpu2:p0-sw@1us", false), event("gpu2:p1-sw@1us", false)}),
            "GPU 2 lost every fabric link at 1000 ns");
}
