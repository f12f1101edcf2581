// The rank-local proof: the communicator's AllReduce (in-fabric and ring) and the MoE dispatch/combine pair
// (batch multicast of token rows, batch reduction of expert outputs back to their sources) run with every rank on
// its own thread under the wall-clock driver, the switches on one more, frames crossing in-memory links, and
// results equal to host references. The live testbed runs exactly these calls, one process per rank.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "ifec/testbed/threaded.h"

using namespace ifec;
using testbed::ThreadedCluster;
using workloads::Algo;
using workloads::Communicator;

namespace {

constexpr std::chrono::milliseconds kLimit{20000};

// Generous timers: threads on a loaded 2-core machine answer in milliseconds, not microseconds.
testbed::ClusterOptions wall_clock_options() {
  testbed::ClusterOptions o;
  o.endpoint.ordering = endpoint::Ordering::kWeak;
  o.endpoint.rto_ns = 20'000'000;
  o.ifec = routing::IfecParams{};
  o.ifec->slot_timeout_ns = 500'000'000;
  o.ifec->result_retransmit_ns = 10'000'000;
  return o;
}

workloads::CommOptions comm_options() {
  workloads::CommOptions c;
  c.ifec.timing.initial_rto_ns = 10'000'000;
  c.ifec.timing.min_rto_ns = 5'000'000;
  c.ifec.timing.max_rto_ns = 80'000'000;
  c.ifec.timing.busy_retry_ns = 200'000;
  c.limit_ns = 15'000'000'000ULL;
  return c;
}

void expect_all_ok(const std::vector<workloads::CollectiveResult>& rs, const std::string& what) {
  for (size_t r = 0; r < rs.size(); ++r) {
    EXPECT_TRUE(rs[r].ok) << what << ", rank " << r << ": " << rs[r].error;
  }
}

// Every rank allocates window `id` through its communicator (keys exchanged over the bootstrap).
void allocate(ThreadedCluster& tc, uint16_t id, uint64_t bytes) {
  expect_all_ok(tc.run(
                    [id, bytes](int, Communicator& c, Communicator::Done done) {
                      c.allocate_window(id, bytes, [done](const std::string& err) {
                        workloads::CollectiveResult r;
                        r.ok = err.empty();
                        r.error = err;
                        done(r);
                      });
                    },
                    kLimit),
                "allocate window " + std::to_string(id));
}

float* floats(endpoint::Endpoint& ep, uint16_t window) {
  return reinterpret_cast<float*>(ep.memory().window(window)->data);
}

TEST(Threaded, AllReduceInFabricAndRingEqualTheHostSum) {
  ThreadedCluster tc(routing::make_superpod(4, 2), wall_clock_options(), comm_options());
  constexpr uint64_t kCount = 20000;  // 20 chunks of 1024 floats over two planes
  allocate(tc, 1, kCount * 4);
  allocate(tc, 2, Communicator::scratch_bytes({workloads::Collective::kAllReduce, 0, 1, 0, kCount}, 4, Algo::kRing));
  for (Algo algo : {Algo::kIfec, Algo::kRing}) {
    std::vector<double> ref(kCount, 0.0);
    for (int r = 0; r < tc.size(); ++r) {
      tc.on_rank(r, [&](endpoint::Endpoint& ep) {
        float* p = floats(ep, 1);
        for (uint64_t i = 0; i < kCount; ++i) {
          p[i] = static_cast<float>((r + 1) * 0.25 + (i % 97) * 0.5);
          ref[i] += p[i];
        }
      });
    }
    workloads::CollArgs a;
    a.count = kCount;
    const auto rs = tc.run([&](int, Communicator& c, Communicator::Done done) { c.run(a, algo, done); }, kLimit);
    expect_all_ok(rs, workloads::algo_name(algo));
    EXPECT_EQ(rs[0].algo, workloads::algo_name(algo));
    for (const auto& r : rs) {
      EXPECT_FALSE(r.fell_back) << "served in the switches: " << r.fallback_reason;
    }
    for (int r = 0; r < tc.size(); ++r) {
      tc.on_rank(r, [&](endpoint::Endpoint& ep) {
        const float* p = floats(ep, 1);
        for (uint64_t i = 0; i < kCount; ++i) {
          ASSERT_NEAR(p[i], ref[i], 1e-4 * std::abs(ref[i]) + 1e-6)
              << workloads::algo_name(algo) << " rank " << r << " element " << i;
        }
      });
    }
  }
}

// MoE-shaped traffic: every rank owns kTokens token rows; each token goes to kTopK other ranks (its experts'
// owners). Dispatch multicasts each row to those ranks (same offset everywhere); each destination computes an
// "expert output" (the row scaled by its rank + 1); combine sums the outputs of a token's ranks in the fabric and
// delivers them to the token's source.
TEST(Threaded, MoeDispatchAndCombineEqualTheHostReference) {
  ThreadedCluster tc(routing::make_superpod(8, 2), wall_clock_options(), comm_options());
  const int n = tc.size();
  constexpr int kTokens = 6, kTopK = 3, kHidden = 1536;  // rows of 6 KiB: two chunks each
  constexpr uint64_t kRow = kHidden * 4;
  std::mt19937 rng(7);
  std::vector<std::vector<std::vector<int>>> dests(n);  // [source][token] -> destination ranks
  for (int s = 0; s < n; ++s) {
    for (int t = 0; t < kTokens; ++t) {
      std::vector<int> others;
      for (int d = 0; d < n; ++d) {
        if (d != s) {
          others.push_back(d);
        }
      }
      std::shuffle(others.begin(), others.end(), rng);
      dests[s].push_back({others.begin(), others.begin() + kTopK});
    }
  }
  auto row_offset = [&](int s, int t) { return (uint64_t(s) * kTokens + t) * kRow; };
  const uint64_t window = uint64_t(n) * kTokens * kRow;
  allocate(tc, 3, window);                    // token rows: source s's token t at row_offset(s, t) on every rank
  allocate(tc, 4, window);                    // expert outputs, same layout
  allocate(tc, 5, uint64_t(kTokens) * kRow);  // combined rows at their source
  for (int r = 0; r < n; ++r) {
    tc.on_rank(r, [&](endpoint::Endpoint& ep) {
      float* x = floats(ep, 3);
      for (int t = 0; t < kTokens; ++t) {
        for (int h = 0; h < kHidden; ++h) {
          x[row_offset(r, t) / 4 + h] = static_cast<float>(r * 100 + t) + h * 0.01f;
        }
      }
    });
  }
  // Dispatch: this rank's rows out, the rows routed to it in.
  auto dispatch = tc.run(
      [&](int r, Communicator& c, Communicator::Done done) {
        workloads::BatchMulticastArgs a;
        a.window = 3;
        a.row_bytes = kRow;
        for (int t = 0; t < kTokens; ++t) {
          a.rows.push_back({row_offset(r, t), dests[r][t]});
        }
        for (int s = 0; s < n; ++s) {
          for (int t = 0; t < kTokens; ++t) {
            if (std::count(dests[s][t].begin(), dests[s][t].end(), r)) {
              a.incoming.emplace_back(row_offset(s, t), kRow);
            }
          }
        }
        c.multicast_rows(std::move(a), done);
      },
      kLimit);
  expect_all_ok(dispatch, "dispatch");
  for (const auto& r : dispatch) {
    EXPECT_EQ(r.fallback_chunks, 0u) << "every row replicated by the switches: " << r.fallback_reason;
  }
  // Experts: every received row, scaled by (rank + 1), into the output window.
  for (int r = 0; r < n; ++r) {
    tc.on_rank(r, [&](endpoint::Endpoint& ep) {
      const float* x = floats(ep, 3);
      float* y = floats(ep, 4);
      for (int s = 0; s < n; ++s) {
        for (int t = 0; t < kTokens; ++t) {
          if (!std::count(dests[s][t].begin(), dests[s][t].end(), r)) {
            continue;
          }
          for (int h = 0; h < kHidden; ++h) {
            const float want = static_cast<float>(s * 100 + t) + h * 0.01f;
            ASSERT_EQ(x[row_offset(s, t) / 4 + h], want) << "dispatch: rank " << r << " token " << s << "." << t;
            y[row_offset(s, t) / 4 + h] = x[row_offset(s, t) / 4 + h] * float(r + 1);
          }
        }
      }
    });
  }
  // Combine: each source's tokens summed over their ranks' outputs, in the fabric.
  auto combine = tc.run(
      [&](int r, Communicator& c, Communicator::Done done) {
        workloads::BatchReduceArgs a;
        a.source_window = 4;
        a.result_window = 5;
        a.scratch_window = 6;
        a.row_elements = kHidden;
        for (int t = 0; t < kTokens; ++t) {
          a.mine.push_back({static_cast<uint32_t>(t), dests[r][t]});
        }
        for (int s = 0; s < n; ++s) {
          for (int t = 0; t < kTokens; ++t) {
            if (std::count(dests[s][t].begin(), dests[s][t].end(), r)) {
              a.contribute.push_back({s, static_cast<uint32_t>(t), row_offset(s, t)});
            }
          }
        }
        c.reduce_rows(std::move(a), done);
      },
      kLimit);
  expect_all_ok(combine, "combine");
  for (const auto& r : combine) {
    EXPECT_EQ(r.fallback_chunks, 0u) << "every row summed in the switches: " << r.fallback_reason;
  }
  for (int r = 0; r < n; ++r) {
    tc.on_rank(r, [&](endpoint::Endpoint& ep) {
      const float* out = floats(ep, 5);
      for (int t = 0; t < kTokens; ++t) {
        double scale = 0;
        for (int d : dests[r][t]) {
          scale += d + 1;
        }
        for (int h = 0; h < kHidden; ++h) {
          const double want = (r * 100 + t + h * 0.01f) * scale;
          ASSERT_NEAR(out[t * kHidden + h], want, 1e-5 * std::abs(want)) << "combine: rank " << r << " token " << t;
        }
      }
    });
  }
}

}  // namespace
