// The speed bench's counts against hand-computed ones: bytes on the wires, frame-hops of an all-to-all.
#include <gtest/gtest.h>

#include <algorithm>

#include "ifec/common/checks.h"
#include "ifec/common/icrc.h"
#include "ifec/testbed/sim_speed.h"

using namespace ifec;

// 8 GPUs x 2 planes x 2 sub-links of 400 Gb/s (800 Gb/s ports split in two), 500 ns each way: 32 links, 2
// directions, 25,000 bytes each.
TEST(SimSpeed, WireBytesAreRateTimesDelayOverEveryLinkDirection) {
  EXPECT_DOUBLE_EQ(testbed::wire_bytes_in_flight(routing::make_superpod(8, 2, 800, 2, 500)), 1'600'000.0);
  EXPECT_DOUBLE_EQ(testbed::wire_bytes_in_flight(routing::make_superpod(8, 2, 800, 2, 50)), 160'000.0);
}

// Every ordered pair sends bytes / MTU frames, each crossing GPU -> switch -> GPU: two frame-hops. The same count
// in every run (the runs are compared inside measure_speed), and each run's time recorded.
TEST(SimSpeed, AllToAllFrameHopsAreTwoPerFrameAndEqualInEveryRun) {
  const routing::Topology topo = routing::make_superpod(8, 2);
  testbed::SpeedScenario s;
  s.bytes = 64 * 1024;
  s.runs = 2;
  const testbed::SpeedRow r = testbed::measure_speed(topo, s);
  const uint64_t frames = 8 * 7 * (s.bytes / topo.params.mtu);
  EXPECT_EQ(r.frame_hops, 2 * frames);
  EXPECT_GE(r.events, r.frame_hops);  // a transmission's end and an arrival per frame-hop, at least
  ASSERT_EQ(r.seconds.size(), 2u);
  EXPECT_GT(r.best(), 0);
  EXPECT_LE(r.best(), r.median());
  EXPECT_GT(r.best_rate(), 0);
}

// In-fabric AllReduce: every GPU sends its bytes to a switch and gets the result back, at least bytes / MTU data
// frames each way per GPU (ACKs and control frames come on top).
TEST(SimSpeed, AllReduceCountsAtLeastItsDataFramesAndBadRunCountsAreRefused) {
  const routing::Topology topo = routing::make_superpod(8, 2);
  testbed::SpeedScenario s;
  s.allreduce = true;
  s.algo = workloads::Algo::kIfec;
  s.bytes = 256 * 1024;
  const testbed::SpeedRow r = testbed::measure_speed(topo, s);
  EXPECT_GE(r.frame_hops, 8 * 2 * (s.bytes / topo.params.mtu));
  EXPECT_GE(r.point_seconds, r.best());  // the whole point includes the simulation
  s.runs = 0;
  EXPECT_THROW(testbed::measure_speed(topo, s), common::Error);
}

// The named scenarios: the all-to-alls run as often as asked, an AllReduce at most twice; quick sizes are smaller.
TEST(SimSpeed, ScenariosRunTheAllToAllsAsAskedAndEachAllReduceAtMostTwice) {
  for (int runs : {1, 5}) {
    for (bool quick : {false, true}) {
      const std::vector<testbed::SpeedScenario> s = testbed::speed_scenarios("topos", quick, runs);
      ASSERT_EQ(s.size(), 4u);
      EXPECT_EQ(s[0].topo_path, "topos/superpod-64x4.yaml");
      EXPECT_EQ(s[0].bytes, quick ? 256u << 10 : 1u << 20);
      EXPECT_EQ(s[1].bytes, quick ? 16u << 20 : 64u << 20);
      for (const testbed::SpeedScenario& x : s) {
        EXPECT_EQ(x.runs, x.allreduce ? std::min(runs, 2) : runs);
      }
      EXPECT_EQ(s[2].algo, workloads::Algo::kRing);
      EXPECT_EQ(s[3].algo, workloads::Algo::kIfec);
    }
  }
}

// The bytes-alone figure builds and verifies real frames (a frame failing its ICRC would throw), is positive and
// finite, and bad arguments are named.
TEST(SimSpeed, FrameBytesCostIsMeasuredOnRealFramesAndBadArgumentsAreRefused) {
  const double ns = testbed::frame_bytes_ns(1e6, 4096, 2000);
  EXPECT_GT(ns, 0);
  EXPECT_LT(ns, 1e6);  // a millisecond per 4 KiB frame would mean the loop is broken, not slow
  EXPECT_GT(testbed::frame_bytes_ns(0, 64, 100), 0);  // one frame, built and verified in turn
  EXPECT_THROW(testbed::frame_bytes_ns(1e6, 0, 100), common::Error);
  EXPECT_THROW(testbed::frame_bytes_ns(1e6, 5000, 100), common::Error);
  EXPECT_THROW(testbed::frame_bytes_ns(1e6, 4096, 0), common::Error);
  EXPECT_THROW(testbed::frame_bytes_ns(-1, 4096, 10), common::Error);
}

// The report names the fastest implementation this CPU has, which is the one kAuto uses.
TEST(SimSpeed, TheIcrcImplementationNamedIsTheFastestAvailable) {
  using common::CrcImpl;
  const CrcImpl used = common::crc_impl_in_use();
  EXPECT_TRUE(common::crc_impl_available(used));
  EXPECT_STREQ(common::crc_impl_name(CrcImpl::kAuto), common::crc_impl_name(used));
  if (used != CrcImpl::kVpclmul) {
    EXPECT_FALSE(common::crc_impl_available(CrcImpl::kVpclmul));
  }
  if (used == CrcImpl::kZlib) {
    EXPECT_FALSE(common::crc_impl_available(CrcImpl::kPclmul));
  }
  EXPECT_STRNE(common::crc_impl_name(CrcImpl::kZlib), common::crc_impl_name(CrcImpl::kPclmul));
  EXPECT_STRNE(common::crc_impl_name(CrcImpl::kPclmul), common::crc_impl_name(CrcImpl::kVpclmul));
}

// The ring's bytes alone: every rank ends with the sum (checked inside after each pass, an Error otherwise), with
// frames delivered at once or 1 MB of frames later; 2 (n - 1) blocks of frames per rank, blocks smaller than a
// slice included; bad arguments are named.
TEST(SimSpeed, RingBytesAloneSumEveryBufferAndCountTheRingsFrames) {
  for (const double in_flight : {0.0, 1e6}) {
    const testbed::RingBytes r = testbed::ring_bytes(4, 4 * 128 * 1024, in_flight, 2);
    EXPECT_EQ(r.frames, 2u * 3 * 4 * (128 * 1024 / 4096));
    EXPECT_GT(r.seconds, 0);
    EXPECT_NEAR(r.ns_per_frame(), r.seconds * 1e9 / static_cast<double>(r.frames), 1e-6);
  }
  EXPECT_EQ(testbed::ring_bytes(8, 8 * 4096, 1e5, 1).frames, 2u * 7 * 8);  // one frame per block
  EXPECT_THROW(testbed::ring_bytes(1, 4096, 0, 1), common::Error);
  EXPECT_THROW(testbed::ring_bytes(4, 4 * 4096 + 4, 0, 1), common::Error);            // not whole frames
  EXPECT_THROW(testbed::ring_bytes(2, 2 * (64 * 1024 + 4096), 0, 1), common::Error);  // not whole slices
  EXPECT_THROW(testbed::ring_bytes(4, 4 * 4096, -1, 1), common::Error);
  EXPECT_THROW(testbed::ring_bytes(4, 4 * 4096, 0, 0), common::Error);
  EXPECT_THROW(testbed::ring_bytes(64, uint64_t{1} << 30, 0, 1), common::Error);  // 64 GiB to allocate
}

// The note's figures by hand: 3000 frame-hops over 1000 data frames that take 1 ms alone is 3 hops per frame and a
// ceiling of 3 M frame-hops/s; a best run of 2 ms spends 2000 ns per frame. Nothing measured is refused.
TEST(SimSpeed, RingBytesNoteComputesTheCeilingFromTheRowsFrameHops) {
  testbed::SpeedRow row;
  row.scenario.allreduce = true;
  row.scenario.bytes = 16 << 20;
  row.topology = "superpod-64x4";
  row.gpus = 64;
  row.frame_hops = 3000;
  row.seconds = {0.003, 0.002};
  testbed::RingBytes b;
  b.frames = 1000;
  b.seconds = 0.001;
  const std::string note = testbed::ring_bytes_note(row, b);
  for (const char* want : {"16 MiB on 64 ranks (superpod-64x4)", "1000 frames", "1000 ns per frame",
                           "3.00 frame-hops per data frame", "ceiling of 3.00 M frame-hops/s", "spends 2000 ns"}) {
    EXPECT_NE(note.find(want), std::string::npos) << want << " not in:\n" << note;
  }
  EXPECT_THROW(testbed::ring_bytes_note(row, testbed::RingBytes{}), common::Error);
}

// In-fabric by hand: 4 ranks x 8 KiB are 8 contributions and 8 results, 16 frames; at 1000 ns each they take 16 us,
// so 24 frame-hops (1.5 per frame) cap the rate at 1.5 M/s; a best run of 32 us spends 2000 ns per frame.
TEST(SimSpeed, IfecBytesNoteCountsContributionsAndResults) {
  testbed::SpeedRow row;
  row.scenario.allreduce = true;
  row.scenario.algo = workloads::Algo::kIfec;
  row.scenario.bytes = 8192;
  row.topology = "t";
  row.gpus = 4;
  row.frame_hops = 24;
  row.seconds = {32e-6};
  const std::string note = testbed::ifec_bytes_note(row, 1000);
  for (const char* want : {"8 KiB on 4 ranks (t)", "its 16 contributions and", "1.50 frame-hops",
                           "ceiling of 1.50 M frame-hops/s", "spends 2000 ns"}) {
    EXPECT_NE(note.find(want), std::string::npos) << want << " not in:\n" << note;
  }
  EXPECT_THROW(testbed::ifec_bytes_note(row, 0), common::Error);
}
