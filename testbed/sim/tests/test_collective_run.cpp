// Collective points on the simulated driver: elided payloads give the run real payloads give (times, bytes per
// plane and per link, frame-hops, events, faults), whatever the algorithm, under loss and a link failure; a
// partitioned run (planes' and GPUs' partitions) is the same run on one thread and on two.
#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

#include "ifec/common/checks.h"
#include "ifec/routing/topology.h"
#include "ifec/testbed/collective_run.h"

using namespace ifec;

namespace {

struct Seen {
  double time_us;
  std::vector<uint64_t> plane_tx, plane_rx;
  std::vector<std::array<uint64_t, 3>> gpu_links;
  uint64_t frame_hops, events, lost, fallback_chunks;
  std::vector<std::string> faults;
  bool ok;
  bool operator==(const Seen& o) const {
    return time_us == o.time_us && plane_tx == o.plane_tx && plane_rx == o.plane_rx && gpu_links == o.gpu_links &&
           frame_hops == o.frame_hops && events == o.events && lost == o.lost && fallback_chunks == o.fallback_chunks &&
           faults == o.faults && ok == o.ok;
  }
};

Seen seen(const testbed::CollectiveRow& r) {
  return {r.time_us,    r.plane_tx_bytes, r.plane_rx_bytes,  r.gpu_links, r.frame_hops,
          r.sim_events, r.frames_lost,    r.fallback_chunks, r.faults,    r.ok};
}

TEST(CollectiveRun, ElidedPayloadsGiveTheSameRunAsRealOnes) {
  const routing::Topology pod8 = routing::make_superpod(8, 2);
  const routing::Topology pod64 = routing::make_superpod(64, 4);
  const routing::Topology tree = routing::make_fat_tree(16, 2, 4, 2);
  struct Case {
    const routing::Topology* topo;
    workloads::Collective kind;
    workloads::Algo algo;
    uint64_t bytes;
    double loss;
    std::vector<std::string> fail;
  };
  using workloads::Algo;
  using workloads::Collective;
  const std::vector<Case> cases = {
      {&pod8, Collective::kAllReduce, Algo::kRing, 1 << 20, 0.01, {"gpu5:plane1:sub0@3us"}},
      {&pod8, Collective::kAllReduce, Algo::kIfec, 1 << 20, 0.01, {"gpu5:plane1@2us"}},
      {&pod8, Collective::kAllReduce, Algo::kBest, 64 << 10, 0.01, {}},
      {&pod8, Collective::kReduce, Algo::kIfec, 256 << 10, 0.02, {}},
      {&pod8, Collective::kMulticast, Algo::kIfec, 256 << 10, 0.02, {}},
      {&pod64, Collective::kAllReduce, Algo::kIfec, 1 << 20, 0, {}},
      {&pod64, Collective::kAllReduce, Algo::kRing, 1 << 20, 0, {}},
      {&tree, Collective::kAllReduce, Algo::kIfec, 256 << 10, 0.01, {}},
  };
  for (const Case& c : cases) {
    testbed::CollectivePoint p;
    p.kind = c.kind;
    p.algo = c.algo;
    p.bytes = c.bytes;
    p.loss = c.loss;
    p.fail = c.fail;
    const testbed::CollectiveRow real = testbed::run_collective_point(*c.topo, p);
    p.elided_payloads = true;
    const testbed::CollectiveRow elided = testbed::run_collective_point(*c.topo, p);
    const std::string what = c.topo->name + " " + workloads::collective_name(c.kind) + " " +
                             workloads::algo_name(c.algo) + " " + std::to_string(c.bytes);
    ASSERT_TRUE(real.ok) << what << ": " << real.error;
    EXPECT_EQ(real.wrong, 0u) << what;
    EXPECT_TRUE(seen(elided) == seen(real))
        << what << ": " << real.time_us << " us real, " << elided.time_us << " us elided; frame-hops "
        << real.frame_hops << " vs " << elided.frame_hops << "; events " << real.sim_events << " vs "
        << elided.sim_events;
  }
}

TEST(CollectiveRun, PartitionedRunsAreTheSameOnOneThreadAndTwo) {
  const routing::Topology pod8 = routing::make_superpod(8, 2);
  const routing::Topology pod64 = routing::make_superpod(64, 4);
  struct Case {
    const routing::Topology* topo;
    workloads::Algo algo;
    uint64_t bytes;
    std::string fail;
  };
  using workloads::Algo;
  const std::vector<Case> cases = {
      {&pod8, Algo::kRing, 1 << 20, "gpu5:plane1:sub0@3us"},
      {&pod8, Algo::kIfec, 1 << 20, "gpu5:plane1@2us"},
      {&pod64, Algo::kRing, 256 << 10, "gpu3:plane1@5us"},
      {&pod64, Algo::kIfec, 1 << 20, "gpu3:plane1@5us"},
  };
  for (const Case& c : cases) {
    testbed::CollectivePoint p;
    p.algo = c.algo;
    p.bytes = c.bytes;
    p.loss = 0.01;
    p.fail = {c.fail};
    p.threads = 1;  // and one GPU group
    const testbed::CollectiveRow one = testbed::run_collective_point(*c.topo, p);
    p.threads = 2;  // and two GPU groups
    const testbed::CollectiveRow two = testbed::run_collective_point(*c.topo, p);
    const std::string what = c.topo->name + " " + workloads::algo_name(c.algo) + " " + std::to_string(c.bytes);
    ASSERT_TRUE(one.ok) << what << ": " << one.error;
    EXPECT_EQ(one.wrong, 0u) << what;
    EXPECT_GT(one.frames_lost, 0u) << what << ": the loss and the failure met frames";
    EXPECT_TRUE(seen(two) == seen(one)) << what << ": " << one.time_us << " us on one thread, " << two.time_us
                                        << " us on two; frame-hops " << one.frame_hops << " vs " << two.frame_hops
                                        << "; events " << one.sim_events << " vs " << two.sim_events;
    EXPECT_EQ(one.windows, two.windows) << what;
    EXPECT_GT(one.windows, 1u) << what;
    const int planes = c.topo->num_planes;
    const int n = c.topo->num_gpus();
    EXPECT_EQ(one.partitions, std::to_string(planes + 1) + " partitions (one per plane and the GPUs') on 1 thread: " +
                                  "GPUs 0-" + std::to_string(n - 1) + " planes 0 1" + (planes == 4 ? " 2 3" : ""));
    EXPECT_EQ(two.partitions, std::to_string(planes + 2) + " partitions (one per plane and per GPU group) on 2 " +
                                  "threads: GPUs 0-" + std::to_string(n / 2 - 1) + " planes 0" +
                                  (planes == 4 ? " 2" : "") + " | GPUs " + std::to_string(n / 2) + "-" +
                                  std::to_string(n - 1) + " planes 1" + (planes == 4 ? " 3" : ""));
    // Any grouping gives the same run: a GPU group each, uneven groups, on one thread and two.
    for (const auto& [threads, groups] : std::vector<std::pair<int, int>>{{1, n}, {2, 3}, {2, 1}}) {
      p.threads = threads;
      p.gpu_groups = groups;
      const testbed::CollectiveRow g = testbed::run_collective_point(*c.topo, p);
      EXPECT_TRUE(seen(g) == seen(one)) << what << ": " << groups << " GPU groups on " << threads
                                        << " threads: " << g.time_us << " us against " << one.time_us << " us; events "
                                        << g.sim_events << " vs " << one.sim_events << " (" << g.partitions << ")";
      if (c.topo == &pod64) break;  // 64 groups: the 8 x 2 case says it
    }
    p.gpu_groups = 0;
    p.threads = 2;
    if (c.topo == &pod8) {  // and elided payloads, partitioned: the same run again
      p.elided_payloads = true;
      const testbed::CollectiveRow elided = testbed::run_collective_point(*c.topo, p);
      EXPECT_TRUE(seen(elided) == seen(one)) << what << ": elided " << elided.time_us << " us";
    }
  }
}

// The switches in leaf groups too: under loss and a leaf-spine link's failure, ring and in-fabric AllReduce give
// one run for every group count >= 1, thread count and GPU grouping (in-fabric reductions at leaves and spines of
// different partitions, their results and retransmissions through the mailboxes).
TEST(CollectiveRun, LeafGroupsGiveTheSameRunWhateverTheGroupsThreadsAndGpuGroups) {
  const routing::Topology tree = routing::make_fat_tree(32, 2, 4, 2);
  for (const workloads::Algo algo : {workloads::Algo::kRing, workloads::Algo::kIfec}) {
    testbed::CollectivePoint p;
    p.algo = algo;
    p.bytes = 256 << 10;
    p.loss = 0.01;
    p.fail = {"p1-leaf2:p1-spine0@2us", "gpu5:plane0@4us"};
    p.threads = 1;
    p.leaf_groups = 1;
    const testbed::CollectiveRow one = testbed::run_collective_point(tree, p);
    const std::string what = std::string(workloads::algo_name(algo));
    ASSERT_TRUE(one.ok) << what << ": " << one.error;
    EXPECT_EQ(one.wrong, 0u) << what;
    EXPECT_GT(one.frames_lost, 0u) << what << ": the loss and the failure met frames";
    EXPECT_EQ(one.partitions,
              "3 partitions (one per plane and leaf group, and the GPUs') on 1 thread: GPUs 0-31, p0 "
              "leaves 0-3, p1 leaves 0-3")
        << what;
    for (const auto& [groups, threads, gpu_groups] : std::vector<std::array<int, 3>>{{2, 2, 0}, {4, 2, 3}, {4, 1, 1}}) {
      p.leaf_groups = groups;
      p.threads = threads;
      p.gpu_groups = gpu_groups;
      const testbed::CollectiveRow r = testbed::run_collective_point(tree, p);
      EXPECT_TRUE(seen(r) == seen(one)) << what << ": " << groups << " leaf groups, " << gpu_groups << " GPU groups on "
                                        << threads << " threads: " << r.time_us << " us against " << one.time_us
                                        << " us; events " << r.sim_events << " vs " << one.sim_events << " ("
                                        << r.partitions << ")";
      EXPECT_EQ(r.windows, one.windows) << what;
    }
    p.elided_payloads = true;  // and elided payloads: the same run again
    const testbed::CollectiveRow elided = testbed::run_collective_point(tree, p);
    EXPECT_TRUE(seen(elided) == seen(one)) << what << ": elided " << elided.time_us << " us";
  }
}

TEST(CollectiveRun, ThreadsBeyondThePartitionsAreRefusedByName) {
  testbed::CollectivePoint p;
  p.bytes = 4096;
  p.threads = 4;  // 8 x 2: two planes and one GPU group, three partitions
  p.gpu_groups = 1;
  try {
    testbed::run_collective_point(routing::make_superpod(8, 2), p);
    FAIL() << "4 threads for 3 partitions ran";
  } catch (const common::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--threads 4 outside 1..3"), std::string::npos) << e.what();
  }
  p.gpu_groups = 9;  // 8 GPUs
  try {
    testbed::run_collective_point(routing::make_superpod(8, 2), p);
    FAIL() << "9 GPU groups of 8 GPUs ran";
  } catch (const common::Error& e) {
    EXPECT_NE(std::string(e.what()).find("GPU groups 9 outside 1..8"), std::string::npos) << e.what();
  }
  p.gpu_groups = 0;
  p.threads = 0;  // leaf groups on one event loop
  p.leaf_groups = 2;
  try {
    testbed::run_collective_point(routing::make_fat_tree(16, 2, 4, 2), p);
    FAIL() << "leaf groups on one event loop ran";
  } catch (const common::Error& e) {
    EXPECT_NE(std::string(e.what()).find("leaf groups (2) on one event loop"), std::string::npos) << e.what();
  }
  p.threads = 1;  // more groups than a plane has leaves
  p.leaf_groups = 5;
  try {
    testbed::run_collective_point(routing::make_fat_tree(16, 2, 4, 2), p);
    FAIL() << "5 leaf groups of 4 leaves ran";
  } catch (const common::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--leaf-groups 5: plane 0 of topology 'fat-tree-16x2' has 4 leaf switches"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
