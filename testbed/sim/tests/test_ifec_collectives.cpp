// In-fabric collectives against references: every dtype and op, N = 2/8/64, loss, a failed plane, an exhausted
// slot pool, a missing contributor, NaN inputs, reproducible mode, multicast, barrier, bad ECH frames, and two-tier
// planes (128 ranks: leaf groups of their own ranks; leaves or spines over 64 members refused by name).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "ifec/common/numeric.h"
#include "ifec/testbed/harness.h"

using namespace ifec;
using common::EchDtype;
using common::EchRedOp;
using workloads::Collective;

namespace {

constexpr uint16_t kBuf = 1;
constexpr uint16_t kScratch = 2;

struct Harness {
  std::unique_ptr<testbed::Cluster> cluster;
  std::unique_ptr<testbed::IfecCollectives> ifec;
  std::vector<std::vector<uint8_t>> inputs;  // per GPU
};

testbed::ClusterOptions cluster_options(double loss, uint64_t seed, uint32_t pool = 8192, bool repro = false) {
  testbed::ClusterOptions o;
  o.fabric.loss = loss;
  o.fabric.seed = seed;
  o.ifec = routing::IfecParams{};
  o.ifec->slot_pool = pool;
  o.ifec->reproducible = repro;
  o.ifec->slot_timeout_ns = 1'000'000;
  o.endpoint.ordering = endpoint::Ordering::kWeak;
  o.endpoint.rto_ns = 30'000;
  return o;
}

testbed::CollectiveSpec spec_for(Collective kind, int n, uint64_t count, EchDtype t, EchRedOp op, int root = 0) {
  testbed::CollectiveSpec s;
  s.kind = kind;
  for (int i = 0; i < n; ++i) {
    s.members.push_back(i);
  }
  s.root = root;
  s.window = kBuf;
  s.offset = 64;
  s.count = count;
  s.dtype = t;
  s.op = op;
  s.scratch_window = kScratch;
  return s;
}

// Fills every member's buffer with random inputs of dtype t (small integers for int32 sums, to stay meaningful).
Harness make_setup(const routing::Topology& topo, const testbed::CollectiveSpec& s, testbed::ClusterOptions o,
                   uint32_t seed) {
  Harness st;
  st.cluster = std::make_unique<testbed::Cluster>(topo, o);
  const size_t es = workloads::element_size(s.dtype);
  st.cluster->allocate_window(kBuf, s.offset + s.count * es + 64);
  st.cluster->allocate_window(kScratch, std::max<uint64_t>(4096, testbed::ring_scratch_bytes(s)));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int g = 0; g < st.cluster->size(); ++g) {
    std::vector<uint8_t> in(s.count * es);
    for (size_t i = 0; i < s.count; ++i) {
      common::Acc a;
      if (s.dtype == EchDtype::kInt32) {
        a.i = static_cast<int32_t>(rng() % 2001) - 1000;
      } else {
        a.f = normal(rng);
      }
      common::store_element(s.dtype, a, in.data(), i);
    }
    if (!in.empty()) {  // a barrier has no input: memcpy from an empty vector's null data is UB
      std::memcpy(st.cluster->window_data(g, kBuf) + s.offset, in.data(), in.size());
    }
    st.inputs.push_back(std::move(in));
  }
  st.ifec = std::make_unique<testbed::IfecCollectives>(*st.cluster);
  return st;
}

// Reference in double (floats) or exact wrap-around int32, over the members' inputs.
std::vector<double> reference(const Harness& st, const testbed::CollectiveSpec& s) {
  std::vector<double> ref(s.count);
  for (size_t i = 0; i < s.count; ++i) {
    for (size_t m = 0; m < s.members.size(); ++m) {
      const common::Acc a = common::load_element(s.dtype, st.inputs[s.members[m]].data(), i);
      const double v = s.dtype == EchDtype::kInt32 ? a.i : a.f;
      if (m == 0) {
        ref[i] = v;
      } else if (s.op == EchRedOp::kSum) {
        ref[i] =
            s.dtype == EchDtype::kInt32
                ? static_cast<int32_t>(static_cast<uint32_t>(static_cast<int32_t>(ref[i])) + static_cast<uint32_t>(a.i))
                : ref[i] + v;
      } else if (s.op == EchRedOp::kMin) {
        ref[i] = std::min(ref[i], v);
      } else {
        ref[i] = std::max(ref[i], v);
      }
    }
  }
  return ref;
}

// Tolerance per dtype: sums of N inputs accumulated in fp32 and rounded once to the element type.
double tolerance(EchDtype t, size_t n) {
  switch (t) {
    case EchDtype::kFp32:
      return 1e-5 * n;
    case EchDtype::kBf16:
      return 1.0 / 128 * 2;  // one bf16 rounding of a value of magnitude ~sqrt(n)
    case EchDtype::kFp16:
      return 1.0 / 1024 * 4;
    case EchDtype::kInt32:
      return 0;
  }
  return 0;
}

// `ring_rounding`: the endpoint path (fallback) rounds to the element type at every step, like NCCL, so its
// error grows with N: allow N roundings instead of one.
void expect_result(const Harness& st, const testbed::CollectiveSpec& s, const std::vector<int>& holders,
                   bool ring_rounding = false) {
  const std::vector<double> ref = reference(st, s);
  const double tol = tolerance(s.dtype, s.members.size()) * (ring_rounding ? s.members.size() : 1);
  for (int g : holders) {
    const uint8_t* out = st.cluster->window_data(g, kBuf) + s.offset;
    size_t bad = 0;
    for (size_t i = 0; i < s.count; ++i) {
      const common::Acc a = common::load_element(s.dtype, out, i);
      const double v = s.dtype == EchDtype::kInt32 ? a.i : a.f;
      const double scale = std::max(1.0, std::fabs(ref[i]));
      if (!(std::fabs(v - ref[i]) <= tol * scale)) {
        if (bad++ < 3) {
          ADD_FAILURE() << "GPU " << g << " element " << i << ": " << v << " vs reference " << ref[i];
        }
      }
    }
    EXPECT_EQ(bad, 0u) << "GPU " << g;
  }
}

std::vector<int> all_members(const testbed::CollectiveSpec& s) { return s.members; }

}  // namespace

class IfecAllReduce : public testing::TestWithParam<std::tuple<EchDtype, EchRedOp>> {};

TEST_P(IfecAllReduce, EqualsReferenceOn8Gpus) {
  const auto [dtype, op] = GetParam();
  const auto s = spec_for(Collective::kAllReduce, 8, 5000, dtype, op);
  Harness st = make_setup(routing::make_superpod(8, 2), s, cluster_options(0, 1), 3);
  const auto r = st.ifec->run(s);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_FALSE(r.fell_back);
  expect_result(st, s, all_members(s));
}

INSTANTIATE_TEST_SUITE_P(Types, IfecAllReduce,
                         testing::Combine(testing::Values(EchDtype::kFp32, EchDtype::kBf16, EchDtype::kFp16,
                                                          EchDtype::kInt32),
                                          testing::Values(EchRedOp::kSum, EchRedOp::kMin, EchRedOp::kMax)),
                         [](const auto& info) {
                           return std::string(common::ech_dtype_name(std::get<0>(info.param))) + "_" +
                                  common::ech_redop_name(std::get<1>(info.param));
                         });

TEST(IfecCollectives, AllReduceOn2And64Gpus) {
  {
    const auto s = spec_for(Collective::kAllReduce, 2, 3000, EchDtype::kBf16, EchRedOp::kSum);
    Harness st = make_setup(routing::make_superpod(2, 2), s, cluster_options(0, 1), 5);
    ASSERT_TRUE(st.ifec->run(s).ok);
    expect_result(st, s, all_members(s));
  }
  const auto s = spec_for(Collective::kAllReduce, 64, 4096, EchDtype::kFp32, EchRedOp::kSum);
  Harness st = make_setup(routing::make_superpod(64, 4), s, cluster_options(0, 1), 6);
  const auto r = st.ifec->run(s);
  ASSERT_TRUE(r.ok) << r.error;
  expect_result(st, s, all_members(s));
}

class IfecLoss : public testing::TestWithParam<double> {};

TEST_P(IfecLoss, AllReduceReduceBarrierUnderLoss) {
  const double loss = GetParam();
  for (Collective kind : {Collective::kAllReduce, Collective::kReduce, Collective::kBarrier}) {
    const auto s = spec_for(kind, 8, kind == Collective::kBarrier ? 0 : 20000, EchDtype::kFp32, EchRedOp::kSum, 3);
    Harness st = make_setup(routing::make_superpod(8, 4), s, cluster_options(loss, 11), 7);
    const auto r = st.ifec->run(s, 2'000'000'000);
    ASSERT_TRUE(r.ok) << workloads::collective_name(kind) << ": " << r.error;
    if (kind == Collective::kAllReduce) {
      expect_result(st, s, all_members(s));
    } else if (kind == Collective::kReduce) {
      expect_result(st, s, {3});
    }
    if (loss > 0 && kind != Collective::kBarrier) {
      EXPECT_GT(st.ifec->stats().retransmissions + st.ifec->stats().duplicate_results, 0u) << "loss was repaired";
    }
    // What the GPUs report as repairs (a MoE row's resent bytes): every ECH resend, one frame each, a whole
    // contribution (at most an MTU of payload and its headers) or an empty barrier arrival, and an ACK (headers
    // only) for every copy of a result that had landed already.
    endpoint::Endpoint::Resent again;
    uint64_t copies = 0;
    for (int g = 0; g < st.cluster->size(); ++g) {
      again.frames += st.cluster->ep(g).resent().frames;
      again.bytes += st.cluster->ep(g).resent().bytes;
      copies += st.cluster->ep(g).ech().counters().duplicate_results;
    }
    if (loss == 0 || kind != Collective::kBarrier) {  // a barrier's few frames may all get through
      EXPECT_EQ(again.frames == 0, loss == 0) << workloads::collective_name(kind);
    }
    EXPECT_GE(again.bytes, again.frames * 60);
    EXPECT_LE(again.bytes, again.frames * (st.cluster->fabric().topology().params.mtu + 120) + copies * 120);
  }
}

INSTANTIATE_TEST_SUITE_P(Loss, IfecLoss, testing::Values(0.0, 0.01, 0.05));

// 1 MiB over 8 GPUs under 1% loss: a lost contribution is asked for by its switch when another member's timer runs
// out (it has the member's later chunks), and a lost result is sent again when its member acknowledged a later one,
// so the whole AllReduce takes less than the loss-free time plus two initial timeouts (315-502 us over seeds 1-3
// before the switch said what it lacked, against 6.5 us loss-free), and no chunk waits for the slot timeout.
TEST(IfecCollectives, TheSwitchAsksForWhatWasLostAndTheAllReduceRecoversWithinTwoTimeouts) {
  const auto s = spec_for(Collective::kAllReduce, 8, 1 << 18, EchDtype::kFp32, EchRedOp::kSum, 2);
  for (uint64_t seed : {1, 2, 3}) {
    Harness clean = make_setup(routing::make_superpod(8, 2), s, cluster_options(0, seed), 9);
    const auto c = clean.ifec->run(s, 2'000'000'000);
    Harness st = make_setup(routing::make_superpod(8, 2), s, cluster_options(0.01, seed), 9);
    const auto r = st.ifec->run(s, 2'000'000'000);
    ASSERT_TRUE(c.ok && r.ok) << c.error << r.error;
    expect_result(st, s, all_members(s));
    uint64_t asked = 0, answered = 0, lost_results = 0;
    for (int sw = 0; sw < st.cluster->fabric().num_switches(); ++sw) {
      asked += st.cluster->fabric().switch_at(sw).ifec()->counters().resend_requests;
      lost_results += st.cluster->fabric().switch_at(sw).ifec()->counters().lost_results;
    }
    for (int g = 0; g < st.cluster->size(); ++g) {
      answered += st.cluster->ep(g).ech().counters().resend_requests;
    }
    printf("seed %lu: %.1f us (loss-free %.1f us), %lu asked, %lu lost results\n", static_cast<unsigned long>(seed),
           (r.end_ns - r.start_ns) / 1e3, (c.end_ns - c.start_ns) / 1e3, static_cast<unsigned long>(asked),
           static_cast<unsigned long>(lost_results));
    EXPECT_GT(asked + lost_results, 0u) << "seed " << seed;
    EXPECT_LE(answered, asked) << "seed " << seed;
    EXPECT_EQ(st.ifec->stats().anomalies, 0u) << "seed " << seed;
    EXPECT_LT(r.end_ns - r.start_ns, (c.end_ns - c.start_ns) + 2 * st.ifec->options().timing.initial_rto_ns)
        << "seed " << seed;
  }
}

// GPU `gpu`'s links (both ends) at 1/`factor` of their rate: a gray failure the plan does not know of.
void slow_down_gpu(Harness& st, int gpu, uint64_t factor) {
  const routing::Topology& topo = st.cluster->fabric().topology();
  for (size_t id = 0; id < topo.links.size(); ++id) {
    const routing::Link& l = topo.links[id];
    if (topo.nodes[l.a].gpu_index == gpu || topo.nodes[l.b].gpu_index == gpu) {
      common::Link& link = st.cluster->fabric().link(static_cast<int>(id));
      link.set_rate_bps(link.config().rate_bps / factor);
    }
  }
}

// A chunk queued longer than its timer while the operation's other chunks complete is not sent again: the timer
// runs out only after a timeout without progress of the whole operation (as an RC QP's). Here GPU 7's links run
// at an eighth of their configured rate (a gray failure the plan does not know of, as a software switch slower
// than its links), so every chunk's result waits behind far more than the timeout fitted to the configured rate;
// results still come, one per GPU-7 chunk time. A timer per chunk, as before, sent 1,116 contributions and 16
// multicast packets again here (256 KiB). Nor is a contribution refused for a busy slot: GPU 7 acknowledges each
// result late, so a slot is freed late, and with a member's window three quarters of the group's slot budget the
// others' next chunks found their slots still held (1 MiB: 26,880 RNR NAKs, each a contribution sent again); with
// half the budget, the slot a member's next chunk needs was freed before that member could send it.
TEST(IfecCollectives, ChunksQueuedLongerThanTheTimerAreNotResentWhileTheOperationProgresses) {
  for (Collective kind : {Collective::kAllReduce, Collective::kMulticast}) {
    const auto s = spec_for(kind, 8, 1 << 20, EchDtype::kFp32, EchRedOp::kSum, 2);
    Harness st = make_setup(routing::make_superpod(8, 2), s, cluster_options(0, 1), 9);
    slow_down_gpu(st, 7, 8);
    st.ifec->options().timing.initial_rto_ns = 2'000;  // the fit to the window's drain time only
    st.ifec->options().timing.min_rto_ns = 2'000;
    const auto r = st.ifec->run(s, 2'000'000'000);
    const char* name = workloads::collective_name(kind);
    ASSERT_TRUE(r.ok) << name << ": " << r.error;
    if (kind == Collective::kAllReduce) {
      expect_result(st, s, all_members(s));
    }
    for (int g = 0; kind == Collective::kMulticast && g < 8; ++g) {
      EXPECT_EQ(std::memcmp(st.cluster->window_data(g, kBuf) + s.offset, st.inputs[2].data(), st.inputs[2].size()), 0)
          << "GPU " << g;
    }
    uint64_t result_resends = 0;
    for (int sw = 0; sw < st.cluster->fabric().num_switches(); ++sw) {
      result_resends += st.cluster->fabric().switch_at(sw).ifec()->counters().result_resends;
    }
    EXPECT_EQ(st.ifec->stats().retransmissions, 0u) << name;
    EXPECT_EQ(result_resends, 0u) << name;
    EXPECT_EQ(st.ifec->stats().busy_naks, 0u) << name;
    printf("%s: %lu sent again by the GPUs, %lu results by the switches, %lu busy NAKs\n", name,
           static_cast<unsigned long>(st.ifec->stats().retransmissions), static_cast<unsigned long>(result_resends),
           static_cast<unsigned long>(st.ifec->stats().busy_naks));
  }
}

// A multicast source far from its switches (100 us of propagation on its links, which the timers fitted to the
// window's drain time do not know of): every packet's first timer runs out before any completion, and the first
// packet goes again. Its original completes before the copy reaches the switch, and the switch's completion says
// so (no retransmission flag): that is no probe's answer. The packets whose timers ran out behind the first were
// late, not lost, and wait on their own timers, which see the completions coming. Resending the next one at each
// such answer, as a lost probe's answer does, sent the whole window again, each copy just before its original's
// completion came in (here 258 copies of 256 packets, 4 now; on the live superpod-8x2, hundreds per MoE dispatch).
TEST(IfecCollectives, AMulticastWhoseOriginalsWereLateNotLostSendsNoWindowAgain) {
  const auto s = spec_for(Collective::kMulticast, 8, 1 << 18, EchDtype::kFp32, EchRedOp::kSum, 2);
  routing::Topology topo = routing::make_superpod(8, 2);
  for (routing::Link& l : topo.links) {
    if (topo.nodes[l.a].gpu_index == 2 || topo.nodes[l.b].gpu_index == 2) {
      l.delay_ns = 100'000;
    }
  }
  Harness st = make_setup(topo, s, cluster_options(0, 1), 9);
  st.ifec->options().timing.initial_rto_ns = 2'000;  // the fit to the window's drain time only
  st.ifec->options().timing.min_rto_ns = 2'000;
  const auto r = st.ifec->run(s, 2'000'000'000);
  ASSERT_TRUE(r.ok) << r.error;
  for (int g = 0; g < 8; ++g) {
    EXPECT_EQ(std::memcmp(st.cluster->window_data(g, kBuf) + s.offset, st.inputs[2].data(), st.inputs[2].size()), 0)
        << "GPU " << g;
  }
  const endpoint::EchCounters& c = st.cluster->ep(2).ech().counters();
  printf("%lu packets, %.1f us, %lu sent again, %lu of them answered before their copy came\n",
         static_cast<unsigned long>(c.multicast_sent - c.retransmissions), (r.end_ns - r.start_ns) / 1e3,
         static_cast<unsigned long>(c.retransmissions), static_cast<unsigned long>(c.late_multicast_originals));
  EXPECT_GT(c.late_multicast_originals, 0u) << "the first timers must run out before any completion";
  EXPECT_LE(c.retransmissions, 4u);  // a probe per plane (and its retry), not the window
}

// A member so slow that the operation makes no progress for many timeouts (GPU 7's links at 1/256 of their rate:
// a host a loaded machine runs late): the other GPUs' timers run out again and again; one chunk per plane goes
// again at a time, the next on its answer, and the switch answers a resent contribution it holds as held (the
// slot waits for GPU 7), after which that chunk waits for its result; the result timers resend to a silent member
// one result at a time. Resending every chunk whose timer ran out, and every unacknowledged result, sent 11,972
// contributions and 1,576 results again here (2,142 and 292 now: with a member's window half the slot budget,
// 2,462 and 336 with three quarters). GPU 7's results pass each other on its Y-cable's two slow sub-links, so it
// acknowledges later ones first: a result presumed lost for that goes again once, not on every timer round
// (16,302 such copies on the two switches, about 64 per result, ran the RC copies to GPU 7 out of retries; 118 now).
TEST(IfecCollectives, AMemberLateForManyTimeoutsCostsOneProbePerPlaneNotTheWindow) {
  const auto s = spec_for(Collective::kAllReduce, 8, 1 << 18, EchDtype::kFp32, EchRedOp::kSum, 2);
  Harness st = make_setup(routing::make_superpod(8, 2), s, cluster_options(0, 1), 9);
  slow_down_gpu(st, 7, 256);
  st.ifec->options().timing.initial_rto_ns = 2'000;
  st.ifec->options().timing.min_rto_ns = 2'000;
  const auto r = st.ifec->run(s, 2'000'000'000);
  ASSERT_TRUE(r.ok) << r.error;
  expect_result(st, s, all_members(s));
  uint64_t held = 0, result_resends = 0, lost = 0;
  for (int sw = 0; sw < st.cluster->fabric().num_switches(); ++sw) {
    held += st.cluster->fabric().switch_at(sw).ifec()->counters().held_answers;
    result_resends += st.cluster->fabric().switch_at(sw).ifec()->counters().result_resends;
    lost += st.cluster->fabric().switch_at(sw).ifec()->counters().lost_results;
  }
  printf("%lu sent again by the GPUs, %lu answered as held, %lu results sent again, %lu presumed lost\n",
         static_cast<unsigned long>(st.ifec->stats().retransmissions), static_cast<unsigned long>(held),
         static_cast<unsigned long>(result_resends), static_cast<unsigned long>(lost));
  EXPECT_LT(st.ifec->stats().retransmissions, 3000u);
  EXPECT_GT(held, 0u);
  EXPECT_LT(result_resends, 500u);
  EXPECT_LT(lost, 500u);
}

// Members that start apart (rank r r x 30 us late: the live testbed's first AllReduce after bring-up, its daemons
// sharing two cores) draw resends from a first timeout of a few drains of the window, before any round trip is
// measured; IfecOptions::reduce_initial_rto_ns (the live testbed's 100 ms) waits the start out.
TEST(IfecCollectives, AFirstTimeoutLongerThanTheMembersStartSpreadResendsNothing) {
  const auto s = spec_for(Collective::kAllReduce, 8, 1 << 18, EchDtype::kFp32, EchRedOp::kSum, 2);
  uint64_t resent[2] = {};
  for (int longer = 0; longer < 2; ++longer) {
    testbed::ClusterOptions o = cluster_options(0, 1);
    o.bootstrap_skew_ns = 30'000;
    Harness st = make_setup(routing::make_superpod(8, 2), s, o, 9);
    st.ifec->options().reduce_initial_rto_ns = longer ? 1'000'000 : 0;
    const auto r = st.ifec->run(s, 2'000'000'000);
    ASSERT_TRUE(r.ok) << r.error;
    expect_result(st, s, all_members(s));
    resent[longer] = st.ifec->stats().retransmissions;
  }
  printf("first timeout from the window's drain: %lu resent; 1 ms: %lu\n", static_cast<unsigned long>(resent[0]),
         static_cast<unsigned long>(resent[1]));
  EXPECT_GT(resent[0], 0u) << "the start spread must outlast the drain-based first timeout";
  EXPECT_EQ(resent[1], 0u);
}

TEST(IfecCollectives, MulticastReachesEveryDestinationOnceUnderLoss) {
  for (double loss : {0.0, 0.05}) {
    const auto s = spec_for(Collective::kMulticast, 8, 40000, EchDtype::kFp32, EchRedOp::kSum, 2);
    Harness st = make_setup(routing::make_superpod(8, 2), s, cluster_options(loss, 13), 8);
    const auto r = st.ifec->run(s, 2'000'000'000);
    ASSERT_TRUE(r.ok) << r.error;
    for (int g = 0; g < 8; ++g) {
      EXPECT_EQ(std::memcmp(st.cluster->window_data(g, kBuf) + s.offset, st.inputs[2].data(), st.inputs[2].size()), 0)
          << "GPU " << g << " loss " << loss;
    }
    uint64_t replicas = 0;
    for (int sw = 0; sw < st.cluster->fabric().num_switches(); ++sw) {
      replicas += st.cluster->fabric().switch_at(sw).ifec()->counters().multicast_replicas;
    }
    const uint64_t packets = (40000 * 4 + 4095) / 4096;
    if (loss == 0) {
      EXPECT_EQ(replicas, packets * 7) << "one replica per destination per packet";
    }
  }
}

TEST(IfecCollectives, SaysWhichBytesCrossTheWire) {
  // In-switch AllReduce: each GPU sends its buffer once and receives the result once (plus headers).
  const uint64_t count = 256 * 1024;  // 1 MiB of fp32
  const auto s = spec_for(Collective::kAllReduce, 8, count, EchDtype::kFp32, EchRedOp::kSum);
  Harness st = make_setup(routing::make_superpod(8, 2), s, cluster_options(0, 1), 9);
  auto bytes_out = [&](int g) {
    uint64_t b = 0;
    for (const auto& p : st.cluster->fabric().gpu_ports(g)) {
      b += p.io->counters().tx_bytes;
    }
    return b;
  };
  const uint64_t before = bytes_out(0);
  ASSERT_TRUE(st.ifec->run(s).ok);
  const double sent = static_cast<double>(bytes_out(0) - before);
  const double payload = count * 4.0;
  EXPECT_GT(sent, payload);
  EXPECT_LT(sent, payload * 1.05) << "about one copy of the buffer, not 2(N-1)/N = 1.75 copies";
}

TEST(IfecCollectives, ReproducibleModeIsBitwiseIdenticalWhateverTheArrivalOrder) {
  const auto s = spec_for(Collective::kAllReduce, 8, 3000, EchDtype::kFp32, EchRedOp::kSum);
  std::vector<uint8_t> first;
  for (uint64_t seed : {1, 2, 3, 4, 5}) {
    // Different seeds and loss reshuffle which contribution reaches the switch first.
    Harness st = make_setup(routing::make_superpod(8, 2), s, cluster_options(0.02, seed, 8192, true), 21);
    ASSERT_TRUE(st.ifec->run(s, 2'000'000'000).ok);
    std::vector<uint8_t> out(st.cluster->window_data(5, kBuf) + s.offset,
                             st.cluster->window_data(5, kBuf) + s.offset + s.count * 4);
    if (first.empty()) {
      first = out;
      // And it is exactly the fixed contributor-order fp32 sum.
      std::vector<common::Acc> acc(s.count);
      for (int m = 0; m < 8; ++m) {
        common::accumulate(EchDtype::kFp32, EchRedOp::kSum, acc.data(), st.inputs[m].data(), s.count, m == 0);
      }
      std::vector<uint8_t> expect(s.count * 4);
      common::finalize(EchDtype::kFp32, acc.data(), expect.data(), s.count);
      EXPECT_EQ(out, expect);
    } else {
      EXPECT_EQ(out, first) << "seed " << seed;
    }
  }
}

TEST(IfecCollectives, NanInputIsFlaggedCountedAndPropagated) {
  const auto s = spec_for(Collective::kAllReduce, 4, 2000, EchDtype::kFp32, EchRedOp::kSum);
  Harness st = make_setup(routing::make_superpod(4, 2), s, cluster_options(0, 1), 4);
  const float nan = NAN;
  std::memcpy(st.cluster->window_data(2, kBuf) + s.offset + 4 * 17, &nan, 4);
  const auto r = st.ifec->run(s);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_GT(r.anomalies, 0u);
  uint64_t non_finite = 0;
  for (int sw = 0; sw < st.cluster->fabric().num_switches(); ++sw) {
    non_finite += st.cluster->fabric().switch_at(sw).ifec()->counters().non_finite_inputs;
  }
  EXPECT_EQ(non_finite, 1u);
  float v;
  std::memcpy(&v, st.cluster->window_data(0, kBuf) + s.offset + 4 * 17, 4);
  EXPECT_TRUE(std::isnan(v));
}

TEST(IfecCollectives, UnreservedOrWrongJobFramesAreDroppedAndCounted) {
  const auto s = spec_for(Collective::kAllReduce, 4, 1000, EchDtype::kFp32, EchRedOp::kSum);
  Harness st = make_setup(routing::make_superpod(4, 2), s, cluster_options(0, 1), 4);
  // A contribution for a group nobody reserved, then one claiming another job.
  testbed::Cluster& c = *st.cluster;
  endpoint::Endpoint& e = c.ep(1);
  for (uint32_t job : {1u, 9u}) {
    common::FrameHeaders h;
    h.eth.src = e.port_info(0).mac;
    h.eth.dst = e.port_info(0).peer_mac;
    h.ip.src = e.config().ip;
    h.ip.dst = c.fabric().switch_ip(c.fabric().switch_of_plane(1, 0));
    common::Ech ech;
    ech.format = common::EchFormat::kStandard;
    ech.op = common::EchOp::kAllReduce;
    ech.job_id = job;
    ech.group_id = 777;
    ech.element_count = 4;
    h.ech = ech;
    h.bth.opcode = static_cast<uint8_t>(common::Opcode::kWriteOnly);
    h.bth.pkey = static_cast<uint16_t>(0x8000 | 1);
    h.reth = common::Reth{0, 0, 16};
    const uint8_t zeros[16] = {};
    e.send_frame(0, common::encode_frame(h, zeros, 16));
  }
  c.loop().run(c.loop().now() + 50'000);
  const int sw = c.fabric().switch_of_plane(1, 0);
  EXPECT_EQ(c.fabric().switch_at(sw).ifec()->counters().unreserved_drops, 2u);
  EXPECT_EQ(c.fabric().switch_at(sw).ifec()->counters().contributions, 0u);
  ASSERT_TRUE(st.ifec->run(s).ok) << "the engine still serves real groups";
  expect_result(st, s, all_members(s));
}

TEST(IfecFallback, SlotPoolExhaustedRunsOnTheEndpointPathWithTheSameResult) {
  const auto s = spec_for(Collective::kAllReduce, 8, 5000, EchDtype::kFp32, EchRedOp::kSum);
  Harness st = make_setup(routing::make_superpod(8, 2), s, cluster_options(0, 1, /*pool=*/16), 12);
  const auto r = st.ifec->run(s);  // asks 128 slots per plane; each switch has 16
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_TRUE(r.fell_back);
  EXPECT_EQ(st.ifec->stats().fallback_operations, 1u);
  expect_result(st, s, all_members(s));
}

TEST(IfecFallback, MissingContributorTimesOutAndTheEndpointsFinish) {
  const auto s = spec_for(Collective::kAllReduce, 8, 6000, EchDtype::kBf16, EchRedOp::kSum);
  Harness st = make_setup(routing::make_superpod(8, 2), s, cluster_options(0, 1), 14);
  st.ifec->suppress_contributions(5);
  const auto r = st.ifec->run(s, 5'000'000'000);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_TRUE(r.fell_back);
  EXPECT_GT(r.anomalies, 0u);
  EXPECT_GT(r.fallback_chunks, 0u);
  expect_result(st, s, all_members(s), /*ring_rounding=*/true);
}

TEST(IfecFallback, RanksLearningRoundOutcomesAtDifferentTimesLoseNoStores) {
  // Rank r learns every exchanged outcome r x 20 us late: a rank that already resolved a round copies results to
  // a rank that has not (heavy loss, one try per chunk: results some ranks got and others gave up), or starts the
  // endpoint path for a missing contributor's chunks, before the other knows what to expect. Those stores must be
  // held and claimed, not dropped.
  for (bool missing : {false, true}) {
    const auto s = spec_for(Collective::kAllReduce, 8, 20000, EchDtype::kFp32, EchRedOp::kSum);
    testbed::ClusterOptions o = cluster_options(missing ? 0 : 0.1, 21);
    o.bootstrap_skew_ns = 20'000;
    Harness st = make_setup(routing::make_superpod(8, 2), s, o, 16);
    if (missing) {
      st.ifec->suppress_contributions(3);
    } else {
      st.ifec->options().timing.max_retries = 0;
    }
    const auto r = st.ifec->run(s, 5'000'000'000);
    ASSERT_TRUE(r.ok) << (missing ? "missing contributor: " : "loss: ") << r.error;
    EXPECT_GT(r.fallback_chunks, 0u) << "the case must exercise copies or the endpoint path";
    expect_result(st, s, all_members(s), /*ring_rounding=*/true);
  }
}

TEST(IfecFallback, FailedPlaneBeforeAndDuringTheOperation) {
  for (bool during : {false, true}) {
    const auto s = spec_for(Collective::kAllReduce, 8, 60000, EchDtype::kFp32, EchRedOp::kSum);
    Harness st = make_setup(routing::make_superpod(8, 4), s, cluster_options(0.01, 3), 15);
    testbed::Cluster& c = *st.cluster;
    const routing::Topology& topo = c.fabric().topology();
    for (const auto& l : topo.links) {
      if (topo.nodes[l.a].gpu_index == 6 && l.plane == 2) {
        c.fabric().schedule_link_state(l.id, false, c.loop().now() + (during ? 5'000 : 0));
      }
    }
    if (!during) {
      c.loop().run(c.loop().now() + 100'000);
    }
    const auto r = st.ifec->run(s, 5'000'000'000);
    ASSERT_TRUE(r.ok) << (during ? "during: " : "before: ") << r.error;
    expect_result(st, s, all_members(s));
  }
}

// A plane whose switch stops answering in the middle of an operation (its reservations gone, so every ECH frame is
// dropped as unreserved: a gray failure FARE does not see) is given up once one resent chunk per GPU has run out its
// tries, and its chunks are redone in the next round; the chunks waiting on that probe do not each run out a budget
// of their own in turn.
TEST(IfecFallback, APlaneThatStopsAnsweringIsGivenUpAfterOneResendsBudget) {
  const auto s = spec_for(Collective::kAllReduce, 8, 1 << 18, EchDtype::kFp32, EchRedOp::kSum);
  Harness st = make_setup(routing::make_superpod(8, 2), s, cluster_options(0, 1), 9);
  st.ifec->options().timing.initial_rto_ns = 2'000;
  st.ifec->options().timing.min_rto_ns = 2'000;
  testbed::Cluster& c = *st.cluster;
  const common::TimeNs start = c.loop().now();
  c.loop().schedule(start + 3'000, [&c] {
    for (int sw = 0; sw < c.fabric().num_switches(); ++sw) {
      switchemu::IfecEngine* e = c.fabric().switch_at(sw).ifec();
      if (c.fabric().topology().nodes[c.fabric().switch_node(sw)].plane == 1) {
        for (const common::GroupReservation& g : e->reservations()) {
          e->release(g.job, g.group);
        }
      }
    }
  });
  const auto r = st.ifec->run(s, 2'000'000'000);
  ASSERT_TRUE(r.ok) << r.error;
  ASSERT_FALSE(r.faults.empty());
  EXPECT_NE(r.faults[0].find("plane 1 given up (GPU"), std::string::npos) << r.faults[0];
  EXPECT_NE(r.faults[0].find("no answer from the switch on plane 1 to 20 resends"), std::string::npos) << r.faults[0];
  expect_result(st, s, all_members(s));  // the next round re-reserves plane 1 and redoes its chunks there
  // One resend's budget (20 tries, the timeout doubling to 8x; 1.2 ms here) and a second round; each of a plane's 32
  // chunks in turn would take 32 times that.
  EXPECT_LT(r.end_ns - r.start_ns, 3'000'000u);
}

TEST(IfecCollectives, SlotsAreReusedWhenTheBudgetIsSmallerThanTheChunkCount) {
  // 60 chunks through 4 slots per plane under loss: every slot is reused many times, after its acknowledgements.
  const auto s = spec_for(Collective::kAllReduce, 4, 60 * 1024, EchDtype::kFp32, EchRedOp::kSum);
  Harness st = make_setup(routing::make_superpod(4, 2), s, cluster_options(0.02, 5), 10);
  st.ifec->options().slots_per_plane = 4;
  const auto r = st.ifec->run(s, 5'000'000'000);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_FALSE(r.fell_back);
  expect_result(st, s, all_members(s));
  uint64_t acks = 0;
  for (int sw = 0; sw < st.cluster->fabric().num_switches(); ++sw) {
    acks += st.cluster->fabric().switch_at(sw).ifec()->counters().acks_received;
  }
  EXPECT_GE(acks, 4u * 50) << "results were acknowledged so slots could be freed";
}

class IfecLossTypes : public testing::TestWithParam<std::tuple<EchDtype, double>> {};

TEST_P(IfecLossTypes, AllReduceEveryTypeUnderLossWithSpraying) {
  const auto [dtype, loss] = GetParam();
  const auto s = spec_for(Collective::kAllReduce, 8, 12000, dtype, EchRedOp::kSum);
  Harness st = make_setup(routing::make_superpod(8, 2), s, cluster_options(loss, 17), 19);
  const auto r = st.ifec->run(s, 2'000'000'000);
  ASSERT_TRUE(r.ok) << r.error;
  expect_result(st, s, all_members(s));
}

INSTANTIATE_TEST_SUITE_P(Types, IfecLossTypes,
                         testing::Combine(testing::Values(EchDtype::kFp32, EchDtype::kBf16, EchDtype::kFp16,
                                                          EchDtype::kInt32),
                                          testing::Values(0.01, 0.05)),
                         [](const auto& info) {
                           return std::string(common::ech_dtype_name(std::get<0>(info.param))) + "_loss" +
                                  std::to_string(static_cast<int>(std::get<1>(info.param) * 100));
                         });

namespace {

uint64_t partial_bytes(testbed::Cluster& c) {
  uint64_t b = 0;
  for (int sw = 0; sw < c.fabric().num_switches(); ++sw) {
    b += c.fabric().switch_at(sw).ifec()->counters().partial_bytes;
  }
  return b;
}

double max_error(const Harness& st, const testbed::CollectiveSpec& s, int gpu) {
  const std::vector<double> ref = reference(st, s);
  double worst = 0;
  for (size_t i = 0; i < s.count; ++i) {
    const common::Acc a = common::load_element(s.dtype, st.cluster->window_data(gpu, kBuf) + s.offset, i);
    worst = std::max(worst, std::fabs(a.f - ref[i]));
  }
  return worst;
}

}  // namespace

TEST(IfecTwoTier, LeafPartialsMeetAtASpineAndFp32PartialsArePreciser) {
  // 16 GPUs, 2 planes, 4 leaves x 2 spines per plane: every chunk is reduced at 4 leaves, then at one spine.
  const routing::Topology topo = routing::make_fat_tree(16, 2, 4, 2);
  const auto s = spec_for(Collective::kAllReduce, 16, 8000, EchDtype::kBf16, EchRedOp::kSum);
  double err[2];
  uint64_t bytes[2];
  for (int fp32 = 1; fp32 >= 0; --fp32) {
    testbed::ClusterOptions o = cluster_options(0, 1);
    o.ifec->upstream_fp32 = fp32 != 0;  // the switches' setting (params.ifec in a topology file)
    Harness st = make_setup(topo, s, o, 23);
    const auto r = st.ifec->run(s, 2'000'000'000);
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_FALSE(r.fell_back) << "a two-tier plane is served in the fabric";
    expect_result(st, s, all_members(s), /*ring_rounding=*/!fp32);  // bf16 partials add a rounding per level
    err[fp32] = max_error(st, s, 9);
    bytes[fp32] = partial_bytes(*st.cluster);
  }
  EXPECT_GT(bytes[1], 0u);
  EXPECT_EQ(bytes[1], 2 * bytes[0]) << "fp32 partials are twice the bf16 bytes";
  EXPECT_LE(err[1], err[0]) << "fp32 partials round once, at the leaf on the way out";
}

TEST(IfecTwoTier, ReduceToARootOnAnotherLeafUnderLoss) {
  const routing::Topology topo = routing::make_fat_tree(16, 2, 4, 2);
  const auto s = spec_for(Collective::kReduce, 16, 6000, EchDtype::kFp32, EchRedOp::kSum, /*root=*/13);
  Harness st = make_setup(topo, s, cluster_options(0.02, 3), 29);
  const auto r = st.ifec->run(s, 5'000'000'000);
  ASSERT_TRUE(r.ok) << r.error;
  expect_result(st, s, {13});
}

TEST(IfecCollectives, ReduceMulticastBarrierOn64Gpus) {
  const routing::Topology topo = routing::make_superpod(64, 4);
  for (Collective kind : {Collective::kReduce, Collective::kMulticast, Collective::kBarrier}) {
    const auto s = spec_for(kind, 64, kind == Collective::kBarrier ? 0 : 3000, EchDtype::kBf16, EchRedOp::kSum, 17);
    Harness st = make_setup(topo, s, cluster_options(0.01, 2), 31);
    const auto r = st.ifec->run(s, 2'000'000'000);
    ASSERT_TRUE(r.ok) << workloads::collective_name(kind) << ": " << r.error;
    EXPECT_FALSE(r.fell_back) << workloads::collective_name(kind);
    if (kind == Collective::kReduce) {
      expect_result(st, s, {17});
    } else if (kind == Collective::kMulticast) {
      for (int g = 0; g < 64; ++g) {
        ASSERT_EQ(std::memcmp(st.cluster->window_data(g, kBuf) + s.offset, st.inputs[17].data(), st.inputs[17].size()),
                  0)
            << "GPU " << g;
      }
    }
  }
}

namespace {

// The sum of one IFEC counter over every switch of the fabric.
template <typename Field>
uint64_t switch_counter(testbed::Cluster& c, Field field) {
  uint64_t n = 0;
  for (int sw = 0; sw < c.fabric().num_switches(); ++sw) {
    n += c.fabric().switch_at(sw).ifec()->counters().*field;
  }
  return n;
}

}  // namespace

// 128 ranks on a two-tier fat tree (8 leaves of 16 GPUs x 4 spines per plane): each leaf's group lists only its own
// 16 GPUs, numbered 0..15 (a rank's ECH contributor id is its index under its leaf), and the spine's lists the 8
// leaves; a group of every rank (128 members) would be refused. Every chunk is served in the fabric.
TEST(IfecTwoTier, OperationsOf128RanksGroupOnlyEachLeafsOwnRanks) {
  const routing::Topology topo = routing::make_fat_tree(128, 2, 8, 4);
  for (Collective kind : {Collective::kAllReduce, Collective::kReduce, Collective::kBarrier}) {
    const std::string what = workloads::collective_name(kind);
    const auto s = spec_for(kind, 128, kind == Collective::kBarrier ? 0 : 6000, EchDtype::kFp32, EchRedOp::kSum, 100);
    Harness st = make_setup(topo, s, cluster_options(0, 1), 37);
    const auto r = st.ifec->run(s, 2'000'000'000);
    ASSERT_TRUE(r.ok) << what << ": " << r.error;
    EXPECT_FALSE(r.fell_back) << what << ": " << r.fallback_reason;
    EXPECT_EQ(r.fallback_chunks, 0u) << what;
    EXPECT_EQ(switch_counter(*st.cluster, &common::IfecCounters::reservation_failures), 0u) << what;
    EXPECT_EQ(switch_counter(*st.cluster, &common::IfecCounters::malformed_drops), 0u)
        << what << ": every contributor id names a member of its leaf's group";
    if (kind == Collective::kAllReduce) {
      expect_result(st, s, all_members(s));
      const uint64_t chunks = (6000 + 1023) / 1024;
      EXPECT_EQ(switch_counter(*st.cluster, &common::IfecCounters::contributions), chunks * (128 + 8))
          << "each rank's chunk at its leaf, each leaf's partial at its spine, once each";
    } else if (kind == Collective::kReduce) {
      expect_result(st, s, {100});
    }
  }
}

// The same 128 ranks under 1% loss everywhere, then with GPU 70's link on plane 1 failing mid-operation, and with
// a leaf's uplinks on plane 0 failing mid-operation: results and acknowledgements reach the right member of the right
// leaf when they are repaired, copied between ranks, or redone on the planes left.
TEST(IfecTwoTier, AllReduceOf128RanksUnderLossAndALinkFailure) {
  const routing::Topology topo = routing::make_fat_tree(128, 2, 8, 4);
  struct Case {
    const char* what;
    double loss;
    int gpu;   // its link on plane 1 fails (or -1)
    int leaf;  // p0-leaf<leaf>'s uplinks fail (or -1)
  };
  for (const Case& k : {Case{"1% loss", 0.01, -1, -1}, Case{"GPU 70's link on plane 1", 0, 70, -1},
                        Case{"p0-leaf5's uplinks", 0.005, -1, 5}}) {
    const auto s = spec_for(Collective::kAllReduce, 128, 60000, EchDtype::kFp32, EchRedOp::kSum);
    Harness st = make_setup(topo, s, cluster_options(k.loss, 7), 41);
    testbed::Cluster& c = *st.cluster;
    const routing::Topology& t = c.fabric().topology();
    const std::string leaf = "p0-leaf" + std::to_string(k.leaf);
    for (const auto& l : t.links) {
      const bool gpu_link = k.gpu >= 0 && t.nodes[l.a].gpu_index == k.gpu && l.plane == 1;
      const bool uplink = k.leaf >= 0 && (t.nodes[l.a].name == leaf || t.nodes[l.b].name == leaf) &&
                          t.nodes[l.a].kind == routing::NodeKind::kSwitch &&
                          t.nodes[l.b].kind == routing::NodeKind::kSwitch;
      if (gpu_link || uplink) {
        c.fabric().schedule_link_state(l.id, false, c.loop().now() + 2'000);  // mid-operation (about 5 us)
      }
    }
    const auto r = st.ifec->run(s, 5'000'000'000);
    ASSERT_TRUE(r.ok) << k.what << ": " << r.error;
    expect_result(st, s, all_members(s));
    if (k.loss > 0) {
      EXPECT_GT(st.ifec->stats().retransmissions + st.ifec->stats().duplicate_results, 0u) << k.what;
    }
    if (k.gpu >= 0 || k.leaf >= 0) {
      const bool redone = std::any_of(r.faults.begin(), r.faults.end(), [](const std::string& f) {
        return f.find("redone in the fabric on plane(s)") != std::string::npos;
      });
      EXPECT_TRUE(redone) << k.what << ": the failure met the operation, and the plane left finished it";
      EXPECT_GT(r.fallback_chunks, 0u) << k.what << ": results copied between ranks";
    }
  }
}

// A group holds at most 64 members: a leaf with 80 of the ranks, or a spine above 65 leaves, is refused by name and
// count, and the operation runs on the endpoint path with the same result.
TEST(IfecTwoTier, ALeafOrSpineWithMoreThan64MembersIsRefusedByName) {
  struct Case {
    routing::Topology topo;
    std::string why;
  };
  for (const Case& k : {Case{routing::make_fat_tree(160, 1, 2, 2), "p0-leaf0 has 80 of the communicator's ranks"},
                        Case{routing::make_fat_tree(130, 1, 65, 1), "p0-spine0 would have 65 leaves as members"}}) {
    const int n = k.topo.num_gpus();
    const auto s = spec_for(Collective::kAllReduce, n, 3000, EchDtype::kFp32, EchRedOp::kSum);
    Harness st = make_setup(k.topo, s, cluster_options(0, 1), 43);
    const auto r = st.ifec->run(s, 2'000'000'000);
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_TRUE(r.fell_back);
    EXPECT_NE(r.fallback_reason.find(k.why), std::string::npos) << r.fallback_reason;
    EXPECT_NE(r.fallback_reason.find("more than a group's 64"), std::string::npos) << r.fallback_reason;
    EXPECT_EQ(switch_counter(*st.cluster, &common::IfecCounters::reservations), 0u) << "refused before any reservation";
    expect_result(st, s, all_members(s), /*ring_rounding=*/true);
  }
}
