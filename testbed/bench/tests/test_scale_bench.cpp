// The scale bench's child runs against the same run in this process: the figures come back whole, the peak memory
// is the child's own, and a child that fails reports why without taking the bench down.
#include <gtest/gtest.h>

#include <cstdlib>

#include "ifec/routing/topology.h"
#include "ifec/testbed/collective_run.h"
#include "ifec/testbed/scale_bench.h"
#include "ifec/testbed/traffic_run.h"

using namespace ifec;

TEST(ScaleBench, ChildReportsTheSameRunAsThisProcess) {
  testbed::ScaleScenario s;
  s.topo_path = IFEC_TOPOLOGY_DIR "/superpod-8x2.yaml";
  s.pattern = testbed::Pattern::kPermutation;
  s.bytes = 256 * 1024;
  const testbed::ScaleRow row = testbed::measure_scale(s, false);
  ASSERT_EQ(row.error, "");
  testbed::SimOptions o;
  o.pattern = s.pattern;
  o.bytes = s.bytes;
  o.progress = false;
  const routing::Topology topo = routing::load_topology(s.topo_path);
  const testbed::SimRun r = testbed::run_sim(topo, o);
  EXPECT_TRUE(row.complete);
  EXPECT_EQ(row.gpus, 8);
  EXPECT_EQ(row.links, static_cast<int>(topo.links.size()));
  EXPECT_EQ(row.switches, static_cast<int>(topo.nodes.size()) - 8);
  EXPECT_EQ(row.frame_hops, r.frame_hops);
  EXPECT_EQ(row.events, r.events);
  EXPECT_EQ(row.routing_bytes, r.routing_bytes);
  EXPECT_EQ(row.traffic_bytes, r.traffic_bytes);
  EXPECT_EQ(row.link_bytes, r.link_bytes);
  EXPECT_GT(row.link_bytes, topo.links.size() * sizeof(common::Link));
  EXPECT_GT(row.routing_bytes, 0u);
  EXPECT_GT(row.peak_bytes, 1u << 20);  // a process's resident set is megabytes at least
  EXPECT_GT(row.sim_seconds, 0);
  EXPECT_GT(row.rate(), 0);
  // The table names the scenario and has no target line for a scenario without one.
  std::vector<testbed::ScaleRow> rows = {row};
  const std::string t = testbed::scale_table(rows);
  EXPECT_NE(t.find("superpod-8x2.yaml permutation 256 KiB/GPU real"), std::string::npos) << t;
  EXPECT_EQ(t.find("# target"), std::string::npos) << t;
}

TEST(ScaleBench, AFailingChildGivesARowNamingWhy) {
  testbed::ScaleScenario s;
  s.topo_path = "/nonexistent/fabric.yaml";
  s.target_rate = 1e6;
  const testbed::ScaleRow row = testbed::measure_scale(s, false);
  EXPECT_NE(row.error.find("/nonexistent/fabric.yaml"), std::string::npos) << row.error;
  std::vector<testbed::ScaleRow> rows = {row};
  const std::string t = testbed::scale_table(rows);
  EXPECT_NE(t.find("FAILED"), std::string::npos) << t;
  EXPECT_EQ(t.find("# target"), std::string::npos) << t;  // no target judged on a run that did not happen
}

TEST(ScaleBench, TargetsAreJudgedFromTheFigures) {
  testbed::ScaleRow r;
  r.scenario.topo_path = "x/fabric.yaml";
  r.scenario.target_peak_bytes = 3e9;
  r.scenario.target_rate = 1.5e6;
  r.gpus = 2048;
  r.frame_hops = 4'000'000;
  r.sim_seconds = 2;             // 2 M frame-hops/s: met
  r.peak_bytes = 3'500'000'000;  // over 3 GB: not met
  r.complete = true;
  std::vector<testbed::ScaleRow> rows = {r};
  const std::string t = testbed::scale_table(rows);
  EXPECT_NE(t.find("peak 3.50 GB (at most 3.0: NOT MET), 2.00 M frame-hops/s (at least 1.5: met)"), std::string::npos)
      << t;
  rows[0].scenario.target_seconds = 300;
  rows[0].setup_seconds = 100;
  rows[0].sim_seconds = 250;  // 350 s in all: not met
  const std::string late = testbed::scale_table(rows);
  EXPECT_NE(late.find("350.0 s setup and simulation (at most 300: NOT MET)"), std::string::npos) << late;
}

// Given the machine's price of a fresh page, the table says it, shows how much fresh memory each run touched, and
// beside a rate target estimates the rate without those first touches: 100,000 pages at 16 us are 1.6 s of 2 s.
TEST(ScaleBench, FirstTouchesOfFreshPagesAreShownAndTakenOutOfTheRateAsAnEstimate) {
  testbed::ScaleRow r;
  r.scenario.topo_path = "x/fabric.yaml";
  r.scenario.target_rate = 1.5e6;
  r.frame_hops = 4'000'000;
  r.sim_seconds = 2;
  r.sim_page_faults = 100'000;
  r.complete = true;
  std::vector<testbed::ScaleRow> rows = {r};
  const std::string t = testbed::scale_table(rows, 16'000);
  EXPECT_NE(t.find("a fresh 4 KiB page costs 16.00 us"), std::string::npos) << t;
  EXPECT_NE(t.find(" 0.41 "), std::string::npos) << "touch GB: 100,000 pages of 4 KiB\n" << t;
  EXPECT_NE(t.find("2.00 M frame-hops/s (at least 1.5: met) [about 1.6 s of the 2.0 s simulating were first touches "
                   "of 0.41 GB of fresh pages at 16.0 us each: 10.00 M frame-hops/s without them, an estimate]"),
            std::string::npos)
      << t;
  const std::string plain = testbed::scale_table(rows);
  EXPECT_EQ(plain.find("fresh 4 KiB page"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("an estimate"), std::string::npos) << plain;
}

// Two threads against one on the same traffic: the speedup is the ratio of the rates, judged against its target;
// a row of other traffic is not compared.
TEST(ScaleBench, SpeedupIsOverTheSameTrafficOnOneThread) {
  testbed::ScaleRow one;
  one.scenario.topo_path = "x/fabric.yaml";
  one.scenario.threads = 1;
  one.gpus = 64;
  one.frame_hops = 1'000'000;
  one.sim_seconds = 1;
  one.complete = true;
  testbed::ScaleRow two = one;
  two.scenario.threads = 2;
  two.scenario.target_speedup = 1.7;
  two.sim_seconds = 0.625;  // 1.6x
  testbed::ScaleRow other = two;
  other.scenario.bytes = 4096;
  std::vector<testbed::ScaleRow> rows = {one, two, other};
  const std::string t = testbed::scale_table(rows);
  EXPECT_DOUBLE_EQ(rows[1].speedup, 1.6);
  EXPECT_EQ(rows[2].speedup, 0);
  EXPECT_NE(t.find("fabric.yaml permutation 2 MiB/GPU real, 2 threads: 1.60x one thread (at least 1.7x: NOT MET)"),
            std::string::npos)
      << t;
}

// Pairs measured back to back (measure_speedup): the speedup is over the median pair's one-thread run, not the
// table's earlier one-thread row, and the line gives every pair's ratio and what plain arithmetic got on as many
// threads at the time.
TEST(ScaleBench, APairedSpeedupIsOverTheOneThreadRunJustBeforeIt) {
  testbed::ScaleRow one;
  one.scenario.topo_path = "x/fabric.yaml";
  one.scenario.threads = 1;
  one.frame_hops = 1'000'000;
  one.sim_seconds = 1;  // 1 M frame-hops/s, minutes earlier
  one.complete = true;
  testbed::ScaleRow two = one;
  two.scenario.threads = 2;
  two.scenario.target_speedup = 1.7;
  two.sim_seconds = 0.5;            // 2 M
  two.paired_one_rate = 1'250'000;  // 1.6x
  two.host_parallelism = 1.93;
  two.pair_speedups = {1.55, 1.6, 1.8};  // the kept pair's is the median
  std::vector<testbed::ScaleRow> rows = {one, two};
  const std::string t = testbed::scale_table(rows);
  EXPECT_DOUBLE_EQ(rows[1].speedup, 1.6);
  EXPECT_NE(t.find("2 threads: 1.60x one thread (at least 1.7x: NOT MET) [the median of 3 alternated pairs: 1.55x "
                   "1.60x 1.80x; over 1.25 M frame-hops/s on one, run just before; plain arithmetic on 2 threads got "
                   "1.93x one then]"),
            std::string::npos)
      << t;
}

// Plain arithmetic on one thread against itself is about 1x, and two threads get at most about 2x (bounds wide
// enough for a loaded machine: ctest runs two tests at once on two cores).
TEST(ScaleBench, HostParallelismOfOneThreadIsOne) {
  const double one = testbed::host_parallelism(1);
  EXPECT_GT(one, 0.4);
  EXPECT_LT(one, 2.5);
  const double two = testbed::host_parallelism(2);
  EXPECT_GT(two, 0.2);
  EXPECT_LT(two, 3.0);
}

// Over two MPI processes (where Open MPI is installed): the figures come back from ifec-cli's JSON report and are
// the one-process run's.
TEST(ScaleBench, MpirunScenarioReportsTheOneProcessRun) {
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "mpirun is not installed (./ifec setup installs Open MPI)";
  }
  testbed::ScaleScenario s;
  s.topo_path = IFEC_TOPOLOGY_DIR "/superpod-8x2.yaml";
  s.pattern = testbed::Pattern::kAllToAll;
  s.bytes = 64 * 1024;
  s.threads = 1;
  const testbed::ScaleRow one = testbed::measure_scale(s, false);
  s.processes = 2;
  const testbed::ScaleRow two = testbed::measure_scale(s, false, IFEC_CLI);
  ASSERT_EQ(one.error, "");
  ASSERT_EQ(two.error, "") << two.error;
  EXPECT_TRUE(two.complete);
  EXPECT_EQ(two.frame_hops, one.frame_hops);
  EXPECT_EQ(two.events, one.events);
  EXPECT_GT(two.sim_seconds, 0);
  EXPECT_NE(s.describe().find("mpirun -np 2"), std::string::npos) << s.describe();

  // Leaf groups: the processes' partitions are a plane's leaf groups (the flag reaches ifec-cli).
  s.topo_path = IFEC_TOPOLOGY_DIR "/fat-tree-64x4.yaml";
  s.leaf_groups = 2;
  s.processes = 0;
  const testbed::ScaleRow grouped = testbed::measure_scale(s, false);
  s.processes = 2;
  const testbed::ScaleRow spread = testbed::measure_scale(s, false, IFEC_CLI);
  ASSERT_EQ(spread.error, "") << spread.error;
  EXPECT_EQ(spread.events, grouped.events);
  EXPECT_EQ(spread.frame_hops, grouped.frame_hops);
  EXPECT_EQ(s.describe(), "fat-tree-64x4.yaml alltoall 64 KiB/pair real, mpirun -np 2, 2 leaf groups");
  s.leaf_groups = 9;  // more than a plane's 8 leaves: ifec-cli under mpirun names it, so the flag reached it
  const testbed::ScaleRow bad = testbed::measure_scale(s, false, IFEC_CLI);
  EXPECT_NE(bad.error, "");
}

// A speedup scenario runs kSpeedupPairs alternated pairs and keeps the pair of the median ratio: the row's rate over
// its one-thread run is that median, and every pair ran the same traffic.
TEST(ScaleBench, ASpeedupKeepsThePairOfTheMedianRatio) {
  testbed::ScaleScenario s;
  s.topo_path = IFEC_TOPOLOGY_DIR "/superpod-8x2.yaml";
  s.pattern = testbed::Pattern::kAllToAll;
  s.bytes = 64 * 1024;
  s.threads = 2;
  s.target_speedup = 1.7;
  const testbed::ScaleRow row = testbed::measure_speedup(s, false);
  ASSERT_EQ(row.error, "");
  const testbed::ScaleRow one = testbed::measure_scale(
      [&] {
        testbed::ScaleScenario o = s;
        o.threads = 1;
        return o;
      }(),
      false);
  EXPECT_EQ(row.frame_hops, one.frame_hops);
  ASSERT_EQ(row.pair_speedups.size(), size_t{testbed::kSpeedupPairs});
  ASSERT_GT(row.paired_one_rate, 0);
  EXPECT_DOUBLE_EQ(row.rate() / row.paired_one_rate, row.pair_speedups[testbed::kSpeedupPairs / 2]);
  EXPECT_GT(row.host_parallelism, 0) << "the pair's row says what plain arithmetic got";
}

// The pair kept is the one whose ratio is the median, wherever it came in the runs, and every ratio is listed.
TEST(ScaleBench, MedianPairKeepsTheMiddleRatioWhereverItRan) {
  std::vector<testbed::ScaleRow> pairs(3);
  const double ratios[3] = {1.8, 1.55, 1.6};  // run order: the median came last
  for (int i = 0; i < 3; ++i) {
    pairs[i].frame_hops = 1'000'000;
    pairs[i].sim_seconds = 0.5;  // 2 M frame-hops/s
    pairs[i].paired_one_rate = 2e6 / ratios[i];
    pairs[i].events = 100 + i;  // which run this is
  }
  const testbed::ScaleRow row = testbed::median_pair(pairs);
  EXPECT_EQ(row.events, 102u);
  EXPECT_EQ(row.pair_speedups, (std::vector<double>{2e6 / (2e6 / 1.55), 2e6 / (2e6 / 1.6), 2e6 / (2e6 / 1.8)}));
  EXPECT_THROW(testbed::median_pair({}), std::exception);
}

// An AllReduce scenario: the child's figures and outcome are the same point run in this process.
TEST(ScaleBench, AllReduceScenarioReportsTheSamePointAsThisProcess) {
  testbed::ScaleScenario s;
  s.topo_path = IFEC_TOPOLOGY_DIR "/superpod-8x2.yaml";
  s.bytes = 256 * 1024;
  s.elided_payloads = true;
  s.allreduce = "ifec";
  s.threads = 2;  // partitioned: the GPUs' partition beside the planes'
  const testbed::ScaleRow row = testbed::measure_scale(s, false);
  ASSERT_EQ(row.error, "");
  testbed::CollectivePoint p;
  p.algo = workloads::Algo::kIfec;
  p.bytes = s.bytes;
  p.elided_payloads = true;
  p.threads = 1;  // the same run on one thread
  const testbed::CollectiveRow r = testbed::run_collective_point(routing::load_topology(s.topo_path), p);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_TRUE(row.complete);
  EXPECT_EQ(row.frame_hops, r.frame_hops);
  EXPECT_EQ(row.events, r.sim_events);
  char want[128];
  std::snprintf(want, sizeof(want), "ran ifec: %.2f us simulated", r.time_us);
  EXPECT_EQ(row.result.rfind(want, 0), 0u) << row.result;
  std::vector<testbed::ScaleRow> rows = {row};
  const std::string t = testbed::scale_table(rows);
  EXPECT_NE(t.find("# superpod-8x2.yaml allreduce ifec 256 KiB/GPU elided, 2 threads: " + row.result),
            std::string::npos)
      << t;
  EXPECT_FALSE(row.one_loop);
  s.allreduce = "spiral";
  EXPECT_NE(testbed::measure_scale(s, false).error.find("spiral"), std::string::npos);
}
