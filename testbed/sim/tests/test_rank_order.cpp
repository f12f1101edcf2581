// Ranks that do not move in step: a rank that finishes an operation early starts its next one at once, and its
// stores land at a peer still running the last. The peer must keep them for the operation they belong to (NCCL's
// ranks and the live testbed's processes never wait for each other between operations unless the operation says
// so). References: the bytes each rank sent, and ring sums computed here.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "ifec/testbed/cluster.h"
#include "ifec/testbed/harness.h"

using namespace ifec;
using workloads::Algo;
using workloads::CollectiveResult;
using workloads::Communicator;

namespace {

constexpr uint16_t kA = 1;        // first operation's rows land here
constexpr uint16_t kB = 2;        // second operation's buffer
constexpr uint16_t kScratch = 3;  // the ring's staging
constexpr uint64_t kBig = 4 << 20;
constexpr uint64_t kSmall = 4096;
constexpr uint64_t kCount = 1024;  // fp32 elements of the allreduce

// Operation 1 (row stores): GPU 2 sends 4 MiB to GPU 1, GPU 0 a small row to GPU 3. GPU 0 expects nothing and is
// done as soon as its store is acknowledged, long before GPU 1 has its 4 MiB.
std::vector<workloads::BatchPutArgs> first_op() {
  testbed::BatchPutSpec s{kA, kA, kSmall, {}};
  for (uint64_t off = 0; off < kBig; off += kSmall) {
    s.rows.push_back({2, off, 1, off});
  }
  s.rows.push_back({0, 0, 3, 0});
  return testbed::split_rows(s, 4);
}

float input(int gpu, uint64_t i) { return static_cast<float>(gpu * 1000 + i % 97) * 0.25f; }

}  // namespace

TEST(RankOrder, APeerAlreadyInTheNextOperationLosesNothing) {
  // Operation 2 is a row store (GPU 0 -> GPU 1 into window B) or a ring allreduce over window B (GPU 0 sends its
  // first block to GPU 1 at once). Both reach GPU 1 while it still waits for operation 1's 4 MiB.
  for (bool ring : {false, true}) {
    testbed::Cluster c(routing::make_superpod(4, 2), testbed::ClusterOptions{});
    c.allocate_window(kA, kBig);
    c.allocate_window(kB, kCount * 4);
    workloads::CollArgs ar;
    ar.window = kB;
    ar.count = kCount;
    ar.scratch_window = kScratch;
    c.allocate_window(kScratch, Communicator::scratch_bytes(ar, 4, Algo::kRing));
    for (int g = 0; g < 4; ++g) {
      for (uint64_t i = 0; i < kCount; ++i) {
        const float v = input(g, i);
        std::memcpy(c.window_data(g, kB) + i * 4, &v, 4);
      }
      std::memset(c.window_data(g, kA), 0x10 + g, kBig);
    }
    workloads::CommOptions o;
    o.limit_ns = 50'000'000;
    std::vector<Communicator*> comms = c.communicators({0, 1, 2, 3}, o);
    for (Communicator* cm : comms) {
      cm->set_options(o);  // the harness turns keeping early arrivals off; ranks on their own clocks need it
    }
    auto first = first_op();
    testbed::BatchPutSpec second{kB, kB, 256, {{0, 0, 1, 512}}};
    auto second_args = testbed::split_rows(second, 4);
    std::vector<CollectiveResult> op1(4);
    auto res = c.run_ranks(
        4,
        [&](int r, Communicator::Done done) {
          comms[r]->put_rows(first[r], [&, r, done](CollectiveResult a) {
            op1[r] = a;
            if (!a.ok) {
              done(a);
            } else if (ring) {
              comms[r]->run(ar, Algo::kRing, done);
            } else {
              comms[r]->put_rows(second_args[r], done);
            }
          });
        },
        60'000'000);
    const char* what = ring ? "ring allreduce" : "row store";
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(res[r].ok) << what << ", rank " << r << ": " << res[r].error;
    }
    ASSERT_LT(res[0].start_ns, op1[1].end_ns)
        << "the case must start GPU 0's second operation before GPU 1's first ended";
    EXPECT_EQ(c.window_data(1, kA)[kBig - 1], 0x12) << "GPU 2's rows";
    if (!ring) {
      EXPECT_EQ(std::memcmp(c.window_data(1, kB) + 512, c.window_data(0, kB), 256), 0) << "GPU 0's row at GPU 1";
      continue;
    }
    for (int g = 0; g < 4; ++g) {
      for (uint64_t i = 0; i < kCount; ++i) {
        float got;
        std::memcpy(&got, c.window_data(g, kB) + i * 4, 4);
        const float want = input(0, i) + input(1, i) + input(2, i) + input(3, i);
        ASSERT_NEAR(got, want, 1e-3f * want) << "GPU " << g << " element " << i;
      }
    }
  }
}

// A communicator given its windows (CommOptions::first_window..last_window) keeps only early stores into them: a
// live hostd's point-to-point channels share an endpoint with the world's collectives and hear every store, and
// each idle one kept every store of a large collective (up to a million) until its next transfer.
TEST(RankOrder, ACommunicatorKeepsOnlyStoresIntoItsOwnWindows) {
  testbed::Cluster c(routing::make_superpod(4, 2), testbed::ClusterOptions{});
  workloads::CommOptions o;
  o.first_window = kB;
  o.last_window = kScratch;
  Communicator* cm = c.communicators({0, 1}, o)[1];
  cm->set_options(o);  // (the harness turns keeping early arrivals off)
  for (uint16_t w : {kA, kB, kScratch, uint16_t{kScratch + 1}}) {
    cm->keep_early({0, w, 64, 8});
  }
  std::vector<uint16_t> kept;
  for (const Communicator::Arrival& a : cm->take_early_arrivals()) {
    kept.push_back(a.window);
  }
  EXPECT_EQ(kept, (std::vector<uint16_t>{kB, kScratch}));
  o.last_window = 0;  // any window: every store is kept, as before
  cm->set_options(o);
  cm->keep_early({0, kA, 0, 8});
  EXPECT_EQ(cm->take_early_arrivals().size(), 1u);
}
