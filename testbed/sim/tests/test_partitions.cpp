// The fabric partitioned by plane: the windows' order against hand-made events, and raw traffic giving the same run
// with one thread and two (and, without link events, the same as one event loop for the whole fabric).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ifec/common/checks.h"
#include "ifec/routing/topology.h"
#include "ifec/testbed/partitions.h"
#include "ifec/testbed/traffic_run.h"

using namespace ifec;

// A control event at T runs after every partition event before T and before any at T, with every partition's
// time at T; run(until) leaves every clock at `until`.
TEST(PlanePartitions, ControlEventsRunBetweenWindowsAtTheirTime) {
  testbed::PlanePartitions parts(3, 2);
  std::vector<std::vector<std::string>> log(3);  // one per plane: the planes run on different threads
  auto clocks = parts.plane_clocks();
  for (int p = 0; p < 3; ++p) {
    clocks[p]->schedule(10, [&log, p] { log[p].push_back("@10"); });
    clocks[p]->schedule(20, [&log, p] { log[p].push_back("@20"); });
  }
  parts.control().schedule(20, [&] {
    for (int p = 0; p < 3; ++p) {
      EXPECT_EQ(clocks[p]->now(), 20u) << "plane " << p;
      log[p].push_back("control");
    }
    clocks[1]->schedule(20, [&log] { log[1].push_back("@20 from control"); });
  });
  EXPECT_EQ(parts.run(15), 3u);
  EXPECT_EQ(parts.now(), 15u);
  for (auto* c : clocks) {
    EXPECT_EQ(c->now(), 15u);
  }
  EXPECT_EQ(parts.run(), 5u);
  for (int p = 0; p < 3; ++p) {
    std::vector<std::string> want = {"@10", "control", "@20"};
    if (p == 1) {
      want.push_back("@20 from control");
    }
    EXPECT_EQ(log[p], want) << "plane " << p;
  }
  EXPECT_TRUE(parts.idle());
  EXPECT_EQ(parts.events_run(), 8u);
}

TEST(PlanePartitions, BadThreadCountsAndControlEventsFromAPartitionAreNamed) {
  EXPECT_THROW(testbed::PlanePartitions(4, 0), common::Error);
  try {
    testbed::PlanePartitions(4, 5);
    ADD_FAILURE() << "5 threads for 4 planes accepted";
  } catch (const common::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--threads 5 outside 1..4"), std::string::npos) << e.what();
  }
  testbed::PlanePartitions parts(2, 1);
  parts.control().schedule(100, [] {});
  parts.plane_clocks()[0]->schedule(10, [&parts] { parts.control().schedule(50, [] {}); });
  EXPECT_THROW(parts.run(), common::Error);
}

namespace {

testbed::SimRun run(const routing::Topology& topo, testbed::Pattern p, uint64_t bytes, int threads,
                    const std::vector<testbed::LinkEvent>& events = {}, int leaf_groups = 0, bool elided = false) {
  testbed::SimOptions o;
  o.pattern = p;
  o.bytes = bytes;
  o.progress = false;
  o.threads = threads;
  o.events = events;
  o.leaf_groups = leaf_groups;
  o.elided_payloads = elided;
  return testbed::run_sim(topo, o);
}

// Everything a run reports but its wall-clock figures.
void expect_same_run(const testbed::SimRun& a, const testbed::SimRun& b, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(a.traffic.complete, b.traffic.complete);
  EXPECT_EQ(a.traffic.incomplete_flows, b.traffic.incomplete_flows);
  EXPECT_EQ(a.traffic.completion_ns, b.traffic.completion_ns);
  EXPECT_EQ(a.traffic.packets_sent, b.traffic.packets_sent);
  EXPECT_EQ(a.traffic.packets_delivered, b.traffic.packets_delivered);
  EXPECT_EQ(a.traffic.payload_bytes_delivered, b.traffic.payload_bytes_delivered);
  EXPECT_EQ(a.traffic.wire_bytes_sent, b.traffic.wire_bytes_sent);
  EXPECT_EQ(a.traffic.plane_bytes, b.traffic.plane_bytes);
  EXPECT_EQ(a.traffic.pfc_pauses_at_nics, b.traffic.pfc_pauses_at_nics);
  EXPECT_EQ(a.events, b.events);
  EXPECT_EQ(a.frame_hops, b.frame_hops);
  EXPECT_EQ(a.link_drops, b.link_drops);
  EXPECT_EQ(a.fare_rounds, b.fare_rounds);
  EXPECT_EQ(a.fare_converged_ns, b.fare_converged_ns);
  EXPECT_EQ(a.switches.tx_frames, b.switches.tx_frames);
  EXPECT_EQ(a.switches.ecn_marks, b.switches.ecn_marks);
  EXPECT_EQ(a.switches.pause_sent, b.switches.pause_sent);
  ASSERT_EQ(a.links.size(), b.links.size());
  for (size_t i = 0; i < a.links.size(); ++i) {
    EXPECT_EQ(a.links[i].frames, b.links[i].frames) << "link " << a.links[i].link;
    EXPECT_EQ(a.links[i].utilization, b.links[i].utilization) << "link " << a.links[i].link;
  }
  ASSERT_EQ(a.event_gpus.size(), b.event_gpus.size());
  for (size_t i = 0; i < a.event_gpus.size(); ++i) {
    EXPECT_EQ(a.event_gpus[i].sent, b.event_gpus[i].sent);
    EXPECT_EQ(a.event_gpus[i].received, b.event_gpus[i].received);
  }
}

}  // namespace

TEST(PartitionedTraffic, AllToAllIsTheSameRunOnOneLoopOneThreadAndTwo) {
  for (const auto& [topo, bytes] : {std::pair{routing::make_superpod(8, 2), uint64_t{64 * 1024}},
                                    std::pair{routing::make_superpod(64, 4), uint64_t{16 * 1024}},
                                    std::pair{routing::make_superpod(8, 4), uint64_t{10'000}}}) {
    const testbed::SimRun loop = run(topo, testbed::Pattern::kAllToAll, bytes, 0);
    const testbed::SimRun one = run(topo, testbed::Pattern::kAllToAll, bytes, 1);
    const testbed::SimRun two = run(topo, testbed::Pattern::kAllToAll, bytes, 2);
    EXPECT_TRUE(loop.traffic.complete);
    expect_same_run(one, loop, topo.name + ": one thread vs one loop");
    expect_same_run(two, one, topo.name + ": two threads vs one");
    EXPECT_NE(two.partitions.find("on 2 threads"), std::string::npos) << two.partitions;
  }
}

// A two-tier fat tree under a permutation whose flows end in a short packet, with an uplink failing and coming back
// and a GPU's NIC failing: FARE re-splits flows over planes between the windows, the same with one thread or two
// (raw flows do not retransmit: the frames on the failed links are lost, the same ones in every run).
TEST(PartitionedTraffic, LinkEventsGiveTheSameRunWithOneThreadAndTwo) {
  const routing::Topology topo = routing::make_fat_tree(32, 4, 4, 4);
  std::vector<testbed::LinkEvent> events = {testbed::parse_link_event(topo, "p1-leaf0:p1-spine2@2us", false),
                                            testbed::parse_link_event(topo, "p1-leaf0:p1-spine2@9us", true),
                                            testbed::parse_link_event(topo, "gpu5:plane3@3us", false)};
  const uint64_t bytes = 300'000;  // 73 full packets and a short one
  const testbed::SimRun one = run(topo, testbed::Pattern::kPermutation, bytes, 1, events);
  const testbed::SimRun two = run(topo, testbed::Pattern::kPermutation, bytes, 2, events);
  const testbed::SimRun four = run(topo, testbed::Pattern::kPermutation, bytes, 4, events);
  EXPECT_GT(one.fare_rounds, 0);
  EXPECT_FALSE(one.event_gpus.empty());
  expect_same_run(two, one, "two threads vs one");
  expect_same_run(four, one, "four threads vs one");
}

// Planes split further, by leaf group: a one-plane fat tree (where planes alone give one partition) and a
// four-plane one with link events, in 1, 2 and 4 (or 8) groups of leaves on 1, 2 and 3 threads, with real and
// elided payloads: every run the same. Against one partition per plane: the same bytes delivered (equal-time
// arrivals at a switch may take another order, through the mailboxes).
TEST(PartitionedTraffic, LeafGroupsGiveTheSameRunWhateverTheGroupsAndThreads) {
  const routing::Topology flat = routing::make_fat_tree(64, 1, 8, 4);
  const testbed::SimRun base = run(flat, testbed::Pattern::kAllToAll, 20'000, 1, {}, 1);
  EXPECT_TRUE(base.traffic.complete);
  EXPECT_NE(base.partitions.find("1 partition (one per plane and leaf group) on 1 thread: p0 leaves 0-7"),
            std::string::npos)
      << base.partitions;
  EXPECT_GT(base.windows, 10u) << "windows of a lookahead (500 ns) each";
  for (const auto& [groups, threads] : {std::pair{2, 1}, std::pair{2, 2}, std::pair{8, 3}}) {
    const testbed::SimRun r = run(flat, testbed::Pattern::kAllToAll, 20'000, threads, {}, groups);
    expect_same_run(r, base, std::to_string(groups) + " leaf groups, " + std::to_string(threads) + " threads");
  }
  const testbed::SimRun elided = run(flat, testbed::Pattern::kAllToAll, 20'000, 2, {}, 2, true);
  expect_same_run(elided, base, "elided payloads");
  const testbed::SimRun by_plane = run(flat, testbed::Pattern::kAllToAll, 20'000, 1);
  EXPECT_EQ(by_plane.traffic.payload_bytes_delivered, base.traffic.payload_bytes_delivered);

  const routing::Topology topo = routing::make_fat_tree(32, 4, 4, 4);
  const std::vector<testbed::LinkEvent> events = {testbed::parse_link_event(topo, "p1-leaf0:p1-spine2@2us", false),
                                                  testbed::parse_link_event(topo, "p1-leaf0:p1-spine2@9us", true),
                                                  testbed::parse_link_event(topo, "gpu5:plane3@3us", false)};
  const testbed::SimRun one = run(topo, testbed::Pattern::kPermutation, 300'000, 1, events, 1);
  EXPECT_GT(one.fare_rounds, 0);
  EXPECT_FALSE(one.event_gpus.empty());
  const testbed::SimRun four = run(topo, testbed::Pattern::kPermutation, 300'000, 3, events, 4);
  EXPECT_NE(four.partitions.find("16 partitions (one per plane and leaf group) on 3 threads: p0 leaves 0, p0 leaves "
                                 "3, p1 leaves 2, p2 leaves 1, p3 leaves 0, p3 leaves 3 |"),
            std::string::npos)
      << four.partitions;
  expect_same_run(four, one, "4 leaf groups on 3 threads vs 1 on 1");
}

// Leaf groups a plane cannot give, or without partitions, or more threads than partitions: named.
TEST(PartitionedTraffic, BadLeafGroupsAreNamed) {
  const routing::Topology topo = routing::make_fat_tree(32, 4, 4, 4);
  auto fails_with = [&](int threads, int groups, const std::string& named) {
    try {
      run(topo, testbed::Pattern::kPermutation, 4096, threads, {}, groups);
      ADD_FAILURE() << "no error for " << groups << " leaf groups on " << threads << " threads";
    } catch (const common::Error& e) {
      EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
    }
  };
  fails_with(1, 5, "--leaf-groups 5: plane 0 of topology 'fat-tree-32x4' has 4 leaf switches");
  fails_with(0, 2, "--leaf-groups 2: needs a partitioned run (--threads 1 or more)");
  fails_with(9, 2, "--threads 9 outside 1..8 (one partition per plane and leaf group: 4 planes x 2)");
  EXPECT_THROW(run(routing::make_superpod(8, 2), testbed::Pattern::kAllToAll, 4096, 1, {}, 2), common::Error)
      << "one switch per plane: one leaf";
}

// Shapes leaf groups cannot split are named: a GPU whose ports on one plane hang from leaves of two groups (its
// counters would be two threads'), a cable between two GPUs on a plane. An in-node link between GPUs on every
// plane runs on one event loop (and is refused, by name, partitioned).
TEST(PartitionedTraffic, ShapesLeafGroupsCannotSplitAreNamed) {
  auto error_of = [](const routing::Topology& topo, int threads, int groups) -> std::string {
    try {
      run(topo, testbed::Pattern::kPermutation, 8192, threads, {}, groups);
    } catch (const common::Error& e) {
      return e.what();
    }
    return "no error";
  };
  const std::string head =
      "name: odd\nplanes: 1\ngpus: [g0, g1, g2, g3]\nswitches: [{name: l0, plane: 0}, {name: l1, plane: 0}, "
      "{name: s0, plane: 0}]\nlinks:\n";
  const std::string leaves = "  - {a: g2, b: l0}\n  - {a: g3, b: l1}\n  - {a: l0, b: s0}\n  - {a: l1, b: s0}\n";
  const routing::Topology homed =
      routing::parse_topology(head + leaves + "  - {a: g0, b: l0}\n  - {a: g0, b: l1}\n  - {a: g1, b: l1}\n", "h.yaml");
  EXPECT_TRUE(run(homed, testbed::Pattern::kPermutation, 8192, 1, {}, 1).traffic.complete) << "one group: fine";
  EXPECT_NE(error_of(homed, 2, 2).find("GPU 'g0' has ports on plane 0 under leaves of two groups"), std::string::npos)
      << error_of(homed, 2, 2);
  const routing::Topology cabled = routing::parse_topology(
      head + leaves + "  - {a: g0, b: l0}\n  - {a: g1, b: l1}\n  - {a: g0, b: g1, plane: 0}\n", "c.yaml");
  EXPECT_NE(error_of(cabled, 1, 1).find("joins GPUs 'g0' and 'g1' on plane 0"), std::string::npos)
      << error_of(cabled, 1, 1);

  const routing::Topology every = routing::parse_topology(
      "name: pair\nplanes: 2\ngpus: [g0, g1]\nswitches: [{name: s0, plane: 0}, {name: s1, plane: 1}]\nlinks:\n"
      "  - {a: g0, b: s0}\n  - {a: g1, b: s0}\n  - {a: g0, b: s1}\n  - {a: g1, b: s1}\n"
      "  - {a: g0, b: g1, plane: nvlink}\n",
      "p.yaml");
  EXPECT_TRUE(run(every, testbed::Pattern::kAllToAll, 8192, 0).traffic.complete);
  EXPECT_NE(error_of(every, 1, 0).find("joins GPUs on every plane over NVLink"), std::string::npos)
      << error_of(every, 1, 0);
}

// Events one partition sends another through a mailbox arrive between windows, a lookahead or more later, in one
// order whatever the threads: by time, then sending partition, then sending order (after the receiver's own
// events at that time scheduled in an earlier window); windows end a lookahead after the earliest event.
TEST(PlanePartitions, MailboxesDeliverBetweenWindowsInOneOrder) {
  for (int threads : {1, 3}) {
    testbed::PlanePartitions parts(3, threads);
    parts.set_lookahead(100);
    auto clocks = parts.plane_clocks();
    std::vector<std::string> log;  // written by partition 2 only
    common::Clock* to2_from0 = parts.mailbox(0, 2);
    common::Clock* to2_from1 = parts.mailbox(1, 2);
    clocks[1]->schedule(10, [&] {
      to2_from1->schedule(110, [&] { log.push_back("from 1 @110"); });
      to2_from1->schedule(105, [&] { log.push_back("from 1 @105"); });
    });
    clocks[0]->schedule(10, [&] { to2_from0->schedule(110, [&] { log.push_back("from 0 @110"); }); });
    clocks[2]->schedule(50, [&] { clocks[2]->schedule(110, [&] { log.push_back("own @110"); }); });
    parts.run();
    EXPECT_EQ(log, (std::vector<std::string>{"from 1 @105", "own @110", "from 0 @110", "from 1 @110"}))
        << threads << " threads";
    EXPECT_EQ(parts.windows_run(), 2u) << "[10, 110) and [105, 205)";
  }
  testbed::PlanePartitions parts(2, 1);
  EXPECT_THROW(parts.mailbox(1, 2), common::Error);
  EXPECT_NE(parts.mailbox(1, 1), nullptr);  // a partition's own (a link that always sends through mailboxes)
  EXPECT_THROW(parts.set_lookahead(0), common::Error);
}

// The GPUs' messages: those posted after a window (as Cluster posts what its GPUs asked in it) run on the control
// loop at the window's end, in the order posted, and their answers come back with their source after that time's
// control events, in the same order, on one thread or two.
TEST(PlanePartitions, MessagesRunAtTheWindowsEndAndAnswerInOrder) {
  for (int threads : {1, 2}) {
    testbed::PlanePartitions parts(2, threads, 0, 1, /*gpu_groups=*/1);
    parts.set_lookahead(100);
    common::EventLoop& gpus = parts.gpu_loop();
    std::vector<std::string> log;  // written by the GPUs' partition and the control loop, never at once
    parts.on_message([&](const std::vector<uint8_t>& m) {
      log.push_back("handle " + std::string(m.begin(), m.end()) + " @" + std::to_string(parts.control().now()));
      parts.reply(std::vector<uint8_t>(m.rbegin(), m.rend()));
    });
    parts.on_reply([&](uint32_t source, std::vector<uint8_t> m) {
      log.push_back("answer " + std::string(m.begin(), m.end()) + " to " + std::to_string(source) + " @" +
                    std::to_string(gpus.now()));
    });
    std::vector<std::string> asked;  // in the window
    parts.on_window_end([&] {
      for (size_t i = 0; i < asked.size(); ++i) {
        parts.post_message(static_cast<uint32_t>(i), std::vector<uint8_t>(asked[i].begin(), asked[i].end()));
      }
      asked.clear();
    });
    auto post = [&](const char* s) {
      EXPECT_THROW(parts.post_message(0, {1}), common::Error) << "inside a window";
      asked.push_back(s);
    };
    gpus.schedule(10, [&] { post("ab"); });
    gpus.schedule(30, [&] { post("cd"); });
    parts.plane_clocks()[1]->schedule(40, [] {});
    parts.control().schedule(110, [&] { log.push_back("control @110"); });
    parts.run();
    // The window from 10 runs to 109 (a lookahead past the earliest event): both messages run at 110, after the
    // control event already there, and their answers follow at 110.
    const std::vector<std::string> want = {"control @110", "handle ab @110", "handle cd @110", "answer ba to 0 @110",
                                           "answer dc to 1 @110"};
    EXPECT_EQ(log, want) << threads << " threads";
  }
}
