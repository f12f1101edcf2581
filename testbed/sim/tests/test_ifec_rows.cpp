// Batch multicast and batch reduction over rows (the MoE dispatch/combine primitives) against references: random
// destination and contributor sets, loss, a small slot budget (RNR NAK back-pressure), a contributor that never
// arrives (point-to-point fallback), a fabric without IFEC switches, and bad specs.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "ifec/common/checks.h"
#include "ifec/common/numeric.h"
#include "ifec/testbed/harness.h"

using namespace ifec;
using common::EchDtype;

namespace {

constexpr uint16_t kSrc = 5;
constexpr uint16_t kDst = 6;

testbed::ClusterOptions options(double loss, uint64_t seed, uint32_t pool = 8192) {
  testbed::ClusterOptions o;
  o.fabric.loss = loss;
  o.fabric.seed = seed;
  o.ifec = routing::IfecParams{};
  o.ifec->slot_pool = pool;
  o.ifec->slot_timeout_ns = 1'000'000;
  o.endpoint.ordering = endpoint::Ordering::kWeak;
  o.endpoint.rto_ns = 30'000;
  return o;
}

uint64_t gpu_tx(testbed::Cluster& c) {
  uint64_t b = 0;
  for (int g = 0; g < c.size(); ++g) {
    for (const auto& p : c.fabric().gpu_ports(g)) {
      b += p.io->counters().tx_bytes;
    }
  }
  return b;
}

// n GPUs x tokens rows of row_bytes at offset (src * tokens + t) * row_bytes; each row to a random destination set.
testbed::BatchMulticastSpec random_multicast(int n, int tokens, uint32_t row_bytes, std::mt19937& rng) {
  testbed::BatchMulticastSpec s;
  s.window = kDst;
  s.row_bytes = row_bytes;
  for (int src = 0; src < n; ++src) {
    for (int t = 0; t < tokens; ++t) {
      testbed::RowMulticast r;
      r.source = src;
      r.offset = (uint64_t(src) * tokens + t) * row_bytes;
      for (int d = 0; d < n; ++d) {
        if (d != src && rng() % 3 == 0) {
          r.destinations.push_back(d);
        }
      }
      s.rows.push_back(r);
    }
  }
  return s;
}

class BatchMulticast : public testing::TestWithParam<double> {};

TEST_P(BatchMulticast, EveryDestinationGetsItsRowsAndNobodyElseDoes) {
  const double loss = GetParam();
  const int n = 8, tokens = 24;
  const uint32_t row = 10000;  // 3 packets at MTU 4096
  std::mt19937 rng(7);
  testbed::Cluster c(routing::make_superpod(n, 2), options(loss, 3));
  testbed::IfecCollectives ifec(c);
  c.allocate_window(kDst, uint64_t(n) * tokens * row);
  const auto spec = random_multicast(n, tokens, row, rng);
  for (const auto& r : spec.rows) {
    uint8_t* p = c.window_data(r.source, kDst) + r.offset;
    for (uint32_t i = 0; i < row; ++i) {
      p[i] = static_cast<uint8_t>(rng() | 1);  // never zero, so a missing row shows
    }
  }
  const uint64_t tx0 = gpu_tx(c);
  const auto res = ifec.multicast_rows(spec, 2'000'000'000);
  ASSERT_TRUE(res.ok) << res.error;
  uint64_t delivered = 0;
  for (const auto& r : spec.rows) {
    const uint8_t* want = c.window_data(r.source, kDst) + r.offset;
    for (int d = 0; d < n; ++d) {
      if (d == r.source) {
        continue;
      }
      const bool dest = std::count(r.destinations.begin(), r.destinations.end(), d) > 0;
      const uint8_t* got = c.window_data(d, kDst) + r.offset;
      if (dest) {
        EXPECT_EQ(std::memcmp(got, want, row), 0) << "row of " << r.source << " at " << r.offset << " on " << d;
        delivered += row;
      } else {
        EXPECT_EQ(std::count(got, got + row, 0), row) << "row of " << r.source << " leaked to " << d;
      }
    }
  }
  if (loss == 0) {
    // Each row leaves its source once (plus headers and ACKs), however many destinations it has.
    const double sent = static_cast<double>(gpu_tx(c) - tx0);
    const double once = static_cast<double>(spec.rows.size()) * row;
    EXPECT_GT(sent, once);
    EXPECT_LT(sent, once * 1.10) << "delivered " << delivered << " B";
    EXPECT_GT(static_cast<double>(delivered), 2 * once);
    EXPECT_FALSE(res.fell_back);
  }
}

INSTANTIATE_TEST_SUITE_P(Loss, BatchMulticast, testing::Values(0.0, 0.01));

struct ReduceCase {
  EchDtype dtype;
  double loss;
  uint32_t slots;
  int suppressed;              // a contributor that never arrives, or -1
  common::TimeNs skew_ns = 0;  // rank r learns the batch r x skew late (results reach it before it expects them)
};

class BatchReduce : public testing::TestWithParam<ReduceCase> {};

TEST_P(BatchReduce, EachRowIsTheSumOfItsContributors) {
  const ReduceCase pc = GetParam();
  const int n = 8, tokens = 20;
  const uint32_t elems = 3000;  // 2 chunks in bf16, 3 in fp32
  const size_t es = workloads::element_size(pc.dtype);
  std::mt19937 rng(11);
  testbed::ClusterOptions co = options(pc.loss, 5);
  co.bootstrap_skew_ns = pc.skew_ns;
  testbed::Cluster c(routing::make_superpod(n, 2), co);
  workloads::IfecOptions io;
  io.slots_per_plane = pc.slots;
  testbed::IfecCollectives ifec(c, io);
  if (pc.suppressed >= 0) {
    ifec.suppress_contributions(pc.suppressed);
  }
  // Contributions: contributor g's row for (dest, t) at ((dest * tokens) + t) * row in its source window.
  const uint64_t row = uint64_t(elems) * es;
  c.allocate_window(kSrc, uint64_t(n) * tokens * row);
  c.allocate_window(kDst, uint64_t(tokens) * row);
  std::normal_distribution<float> nd(0, 1);
  for (int g = 0; g < n; ++g) {
    uint8_t* p = c.window_data(g, kSrc);
    for (uint64_t i = 0; i < uint64_t(n) * tokens * elems; ++i) {
      common::Acc a;
      a.f = nd(rng);
      common::store_element(pc.dtype, a, p, i);
    }
  }
  testbed::BatchReduceSpec spec;
  spec.source_window = kSrc;
  spec.result_window = kDst;
  spec.dtype = pc.dtype;
  spec.row_elements = elems;
  for (int d = 0; d < n; ++d) {
    for (int t = 0; t < tokens; ++t) {
      testbed::RowReduce r;
      r.destination = d;
      r.index = static_cast<uint32_t>(t);
      for (int g = 0; g < n; ++g) {
        if (g != d && rng() % 2 == 0) {
          r.contributions.push_back({g, (uint64_t(d) * tokens + t) * row});
        }
      }
      spec.rows.push_back(r);
    }
  }
  const auto res = ifec.reduce_rows(spec, 2'000'000'000);
  ASSERT_TRUE(res.ok) << res.error;
  // Reference: fp32 sum of the contributions in contributor order, rounded once to the element type.
  double max_err = 0;
  for (const auto& r : spec.rows) {
    const uint8_t* got = c.window_data(r.destination, kDst) + r.index * row;
    for (uint32_t i = 0; i < elems; ++i) {
      float want = 0;
      for (const auto& [g, off] : r.contributions) {
        want += common::load_element(pc.dtype, c.window_data(g, kSrc) + off, i).f;
      }
      common::Acc w;
      w.f = want;
      std::vector<uint8_t> rounded(es);
      common::store_element(pc.dtype, w, rounded.data(), 0);
      const float ref = common::load_element(pc.dtype, rounded.data(), 0).f;
      const float v = common::load_element(pc.dtype, got, i).f;
      max_err = std::max(max_err, double(std::abs(v - ref)) / (1 + std::abs(ref)));
    }
  }
  // Arrival order changes fp32 rounding a little; the element type's rounding then hides it (or not, by one ulp).
  EXPECT_LT(max_err, pc.dtype == EchDtype::kFp32 ? 1e-5 : 1e-2);
  if (pc.slots < 16) {
    // A 4-slot budget pushes back (RNR NAKs); slots that wait too long for a backed-off contributor time out and
    // are redone point to point, so only the result is asserted.
    EXPECT_GT(ifec.stats().busy_naks, 0u);
  } else if (pc.suppressed >= 0) {
    EXPECT_TRUE(res.fell_back);
    EXPECT_GT(res.fallback_chunks, 0u);
  } else if (pc.loss == 0) {
    EXPECT_FALSE(res.fell_back) << res.fallback_reason;
  }
  if (pc.skew_ns > 0) {
    // Results that reached a destination before it started were kept, and the reduction took every one of them
    // when it started there (rather than waiting for the switch to send them again).
    uint64_t early = 0, taken = 0;
    for (int g = 0; g < n; ++g) {
      early += c.ep(g).ech().counters().early_results;
      taken += c.ep(g).ech().counters().early_results_taken;
    }
    EXPECT_GT(early, 0u) << "the case must exercise early results";
    EXPECT_EQ(taken, early);
  }
  for (int sw = 0; sw < c.fabric().num_switches(); ++sw) {
    EXPECT_EQ(c.fabric().switch_at(sw).ifec()->free_slots(), 8192u) << "every slot released";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BatchReduce,
    testing::Values(ReduceCase{EchDtype::kFp32, 0, 128, -1}, ReduceCase{EchDtype::kBf16, 0, 128, -1},
                    ReduceCase{EchDtype::kBf16, 0.01, 128, -1}, ReduceCase{EchDtype::kFp32, 0, 4, -1},
                    ReduceCase{EchDtype::kFp32, 0.01, 4, -1}, ReduceCase{EchDtype::kFp32, 0, 128, 3},
                    ReduceCase{EchDtype::kFp32, 0, 128, -1, 100'000},
                    // The last rank learns the fallback's scratch keys last: every piece for it has landed by then,
                    // and it must still send its own before it finishes.
                    ReduceCase{EchDtype::kFp32, 0, 128, 3, 100'000}));

TEST(BatchReduce, RejectsBadSpecsNamingTheValue) {
  testbed::Cluster c(routing::make_superpod(4, 1), options(0, 1));
  testbed::IfecCollectives ifec(c);
  c.allocate_window(kSrc, 4096);
  c.allocate_window(kDst, 4096);
  testbed::BatchReduceSpec spec;
  spec.source_window = kSrc;
  spec.result_window = kDst;
  spec.row_elements = 256;
  spec.rows.push_back({1, 0, {{1, 0}}});
  EXPECT_THROW(
      {
        try {
          ifec.reduce_rows(spec);
        } catch (const common::Error& e) {
          EXPECT_NE(std::string(e.what()).find("GPU 1 contributes to its own row"), std::string::npos) << e.what();
          throw;
        }
      },
      common::Error);
  spec.rows = {{1, 4, {{2, 0}}}};  // row 4 at 1 KiB each: beyond the 4 KiB window
  EXPECT_THROW(ifec.reduce_rows(spec), common::Error);
  spec.rows = {{9, 0, {{2, 0}}}};
  EXPECT_THROW(ifec.reduce_rows(spec), common::Error);
  // Still usable after the refusals.
  spec.rows = {{1, 0, {{2, 0}, {3, 0}}}};
  for (int g : {2, 3}) {
    float* p = reinterpret_cast<float*>(c.window_data(g, kSrc));
    for (int i = 0; i < 256; ++i) {
      p[i] = float(g * 1000 + i);
    }
  }
  const auto res = ifec.reduce_rows(spec);
  ASSERT_TRUE(res.ok) << res.error;
  const float* out = reinterpret_cast<const float*>(c.window_data(1, kDst));
  for (int i = 0; i < 256; ++i) {
    ASSERT_EQ(out[i], float(5000 + 2 * i));
  }
}

TEST(BatchReduce, WithoutIfecSwitchesEverythingIsSummedAtTheDestination) {
  auto o = options(0, 1);
  o.fabric.ifec = false;
  testbed::Cluster c(routing::make_superpod(4, 1), o);
  testbed::IfecCollectives ifec(c);
  c.allocate_window(kSrc, 4096);
  c.allocate_window(kDst, 4096);
  testbed::BatchReduceSpec spec;
  spec.source_window = kSrc;
  spec.result_window = kDst;
  spec.row_elements = 1000;
  spec.rows = {{0, 0, {{1, 0}, {2, 0}, {3, 0}}}};
  for (int g = 1; g < 4; ++g) {
    float* p = reinterpret_cast<float*>(c.window_data(g, kSrc));
    for (int i = 0; i < 1000; ++i) {
      p[i] = float(g) + 0.5f * i;
    }
  }
  const auto res = ifec.reduce_rows(spec);
  ASSERT_TRUE(res.ok) << res.error;
  EXPECT_TRUE(res.fell_back);
  EXPECT_NE(res.fallback_reason.find("plane 0"), std::string::npos) << res.fallback_reason;
  const float* out = reinterpret_cast<const float*>(c.window_data(0, kDst));
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(out[i], 6.0f + 1.5f * i);
  }
}

}  // namespace
