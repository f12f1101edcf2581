// Every rank's MoE plan (moe_plan.h) against the others' and against the single-process layer: the rows one rank
// sends are the rows the other ranks expect, logical bytes match the traffic matrix, and moving the bytes as the
// plans say (plain copies and fp32 sums here, no fabric) then summing as the plans say gives the reference output.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

#include "ifec/common/checks.h"
#include "ifec/workloads/moe_plan.h"

using namespace ifec::workloads;
using ifec::common::EchDtype;

namespace {

constexpr int kRanks = 4;
constexpr int64_t kTokens = 12;

struct Layer {
  MoeConfig cfg;
  MoeWeights w;
  at::Tensor x;  // [ranks * tokens, hidden] fp32
  RoutingPlan plan;
  RouteTable table;
  DispatchLists lists;
  Layer() {
    cfg.hidden = 32;
    cfg.inter = 8;
    cfg.experts = 16;
    cfg.groups = 4;
    cfg.topk_groups = 2;
    cfg.topk = 4;
    w = make_weights(cfg, 3);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(9);
    x = at::randn({kRanks * kTokens, cfg.hidden}, gen, at::TensorOptions().dtype(at::kFloat));
    plan = gate(x, w, cfg);
    table = to_route_table(plan);
    lists = build_dispatch_lists(table, cfg.experts, kRanks);
  }
  uint64_t row() const { return static_cast<uint64_t>(cfg.hidden) * 4; }
};

// Each rank's windows, by id.
using Windows = std::vector<std::map<uint16_t, std::vector<uint8_t>>>;

void copy_row(Windows& m, int from, uint16_t fw, uint64_t fo, int to, uint16_t tw, uint64_t to_off, uint64_t n) {
  std::memcpy(m[to][tw].data() + to_off, m[from][fw].data() + fo, n);
}

class MoePlan : public testing::TestWithParam<MoeVariant> {};

TEST_P(MoePlan, RanksAgreeAndMovingTheRowsAsPlannedGivesTheReference) {
  const Layer l;
  const MoeVariant v = GetParam();
  std::vector<MoeRankPlan> plans;
  int64_t dispatch_bytes = 0;
  for (int r = 0; r < kRanks; ++r) {
    plans.push_back(plan_moe_rank(v, l.table, l.lists, r, kTokens, l.row(), EchDtype::kFp32));
    EXPECT_EQ(plans[r].windows, plans[0].windows) << "symmetric windows";
    dispatch_bytes += plans[r].dispatch_logical_bytes;
  }
  // Logical bytes: the traffic matrix without its diagonal (the same rows as per_rank for IFEC).
  std::vector<int> src(kRanks * kTokens);
  for (size_t t = 0; t < src.size(); ++t) {
    src[t] = static_cast<int>(t / kTokens);
  }
  const auto tm = traffic_matrix(l.lists, v == MoeVariant::kPerExpert ? Granularity::kPerExpert : Granularity::kPerRank,
                                 src, l.cfg.hidden, 4);
  int64_t off_diagonal = 0;
  for (int s = 0; s < kRanks; ++s) {
    for (int d = 0; d < kRanks; ++d) {
      off_diagonal += s == d ? 0 : tm[s * kRanks + d];
    }
  }
  EXPECT_EQ(dispatch_bytes, off_diagonal);

  // Move the bytes as planned: windows, inputs, dispatch.
  Windows mem(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    for (const auto& [id, bytes] : plans[r].windows) {
      mem[r][id].assign(bytes, 0);
    }
    std::memcpy(mem[r][plans[r].input_window].data() + plans[r].input_offset,
                static_cast<const uint8_t*>(l.x.data_ptr()) + r * kTokens * l.row(), kTokens * l.row());
  }
  std::vector<uint64_t> expected_in(kRanks, 0), got_in(kRanks, 0);
  for (int r = 0; r < kRanks; ++r) {
    const MoeRankPlan& p = plans[r];
    for (const auto& rw : p.dispatch_multicast.rows) {
      for (int d : rw.destinations) {
        copy_row(mem, r, p.ids.recv, rw.offset, d, p.ids.recv, rw.offset, l.row());
        got_in[d] += l.row();
      }
    }
    for (const RowPut& rp : p.dispatch_put.rows) {
      copy_row(mem, r, p.ids.input, rp.from, rp.destination, p.ids.recv, rp.to, l.row());
      got_in[rp.destination] += rp.destination == r ? 0 : l.row();
    }
    for (const auto& [off, n] : v == MoeVariant::kIfec ? p.dispatch_multicast.incoming : p.dispatch_put.incoming) {
      expected_in[r] += n;
    }
  }
  EXPECT_EQ(got_in, expected_in) << "every rank expects exactly the rows sent to it";

  // Experts, then combine.
  std::vector<at::Tensor> outs;
  for (int r = 0; r < kRanks; ++r) {
    outs.push_back(moe_expert_rows(plans[r], mem[r][plans[r].ids.recv].data(), l.lists, l.w, l.cfg, at::kFloat));
    std::memcpy(mem[r][plans[r].ids.output].data(), outs[r].data_ptr(), outs[r].numel() * 4);
  }
  for (int r = 0; r < kRanks; ++r) {
    const MoeRankPlan& p = plans[r];
    for (const RowPut& rp : p.combine_put.rows) {
      copy_row(mem, r, p.ids.output, rp.from, rp.destination, p.ids.combine, rp.to, l.row());
    }
    for (const RowContribution& c : p.combine_reduce.contribute) {  // the switch's fp32 sum
      auto* dst = reinterpret_cast<float*>(mem[c.destination][p.ids.combine].data() + c.index * l.row());
      const auto* in = reinterpret_cast<const float*>(mem[r][p.ids.output].data() + c.source_offset);
      for (int64_t i = 0; i < l.cfg.hidden; ++i) {
        dst[i] += in[i];
      }
    }
  }
  // A destination's rows list exactly the ranks that contribute to them.
  std::map<std::pair<int, uint32_t>, std::vector<int>> contributors;
  for (int r = 0; r < kRanks; ++r) {
    for (const RowContribution& c : plans[r].combine_reduce.contribute) {
      contributors[{c.destination, c.index}].push_back(r);
    }
  }
  for (int d = 0; d < kRanks; ++d) {
    for (const RowIn& in : plans[d].combine_reduce.mine) {
      EXPECT_EQ(in.contributors, (contributors[{d, in.index}])) << "rank " << d << " row " << in.index;
    }
  }
  std::vector<at::Tensor> ys;
  for (int r = 0; r < kRanks; ++r) {
    const at::Tensor xs = l.x.narrow(0, r * kTokens, kTokens);
    ys.push_back(shared_expert_forward(xs, l.w) +
                 moe_routed_output(plans[r], mem[r][plans[r].ids.combine].data(), outs[r], l.cfg.hidden, at::kFloat));
  }
  const at::Tensor ref = reference_forward(l.x, l.w, l.cfg, l.plan);
  EXPECT_LT(moe_max_rel_error(at::cat(ys, 0), ref), moe_tolerance(at::kFloat));
}

INSTANTIATE_TEST_SUITE_P(Variants, MoePlan,
                         testing::Values(MoeVariant::kPerExpert, MoeVariant::kPerRank, MoeVariant::kIfec),
                         [](const auto& info) { return std::string(moe_variant_name(info.param)); });

// Every rank's plan at once (one pass over the deliveries) is each rank's own plan.
TEST_P(MoePlan, AllRanksAtOnceAreEachRanksOwn) {
  const Layer l;
  const MoeVariant v = GetParam();
  const std::vector<MoeRankPlan> all = plan_moe_ranks(v, l.table, l.lists, kTokens, l.row(), EchDtype::kFp32);
  ASSERT_EQ(all.size(), static_cast<size_t>(kRanks));
  auto puts = [](const BatchPutArgs& a) {
    std::vector<std::tuple<uint64_t, int, uint64_t>> out;
    for (const RowPut& r : a.rows) {
      out.emplace_back(r.from, r.destination, r.to);
    }
    return std::make_pair(out, a.incoming);
  };
  for (int r = 0; r < kRanks; ++r) {
    const MoeRankPlan one = plan_moe_rank(v, l.table, l.lists, r, kTokens, l.row(), EchDtype::kFp32);
    const MoeRankPlan& p = all[r];
    EXPECT_EQ(p.rank, r);
    EXPECT_EQ(p.windows, one.windows);
    EXPECT_EQ(p.recv_offsets, one.recv_offsets);
    EXPECT_EQ(p.own_token, one.own_token);
    EXPECT_EQ(p.dispatch_logical_bytes, one.dispatch_logical_bytes);
    EXPECT_EQ(p.combine_logical_bytes, one.combine_logical_bytes);
    EXPECT_EQ(puts(p.dispatch_put), puts(one.dispatch_put)) << "rank " << r;
    EXPECT_EQ(puts(p.combine_put), puts(one.combine_put)) << "rank " << r;
    if (v != MoeVariant::kIfec) {
      EXPECT_EQ(p.dispatch_put.rows_ahead, moe_rows_ahead(kRanks));
      EXPECT_EQ(p.combine_put.rows_ahead, moe_rows_ahead(kRanks));
    }
    ASSERT_EQ(p.dispatch_multicast.rows.size(), one.dispatch_multicast.rows.size());
    for (size_t i = 0; i < p.dispatch_multicast.rows.size(); ++i) {
      EXPECT_EQ(p.dispatch_multicast.rows[i].offset, one.dispatch_multicast.rows[i].offset);
      EXPECT_EQ(p.dispatch_multicast.rows[i].destinations, one.dispatch_multicast.rows[i].destinations);
    }
    EXPECT_EQ(p.dispatch_multicast.incoming, one.dispatch_multicast.incoming);
    ASSERT_EQ(p.combine_reduce.contribute.size(), one.combine_reduce.contribute.size());
    for (size_t i = 0; i < p.combine_reduce.contribute.size(); ++i) {
      EXPECT_EQ(p.combine_reduce.contribute[i].destination, one.combine_reduce.contribute[i].destination);
      EXPECT_EQ(p.combine_reduce.contribute[i].index, one.combine_reduce.contribute[i].index);
      EXPECT_EQ(p.combine_reduce.contribute[i].source_offset, one.combine_reduce.contribute[i].source_offset);
    }
  }
  // A rank keeps 4096 rows posted over its peers, at least 16 per peer.
  EXPECT_EQ(moe_rows_ahead(4), 1366u);
  EXPECT_EQ(moe_rows_ahead(64), 66u);
  EXPECT_EQ(moe_rows_ahead(256), 17u);
  EXPECT_EQ(moe_rows_ahead(1024), 16u);
}

TEST(MoePlanErrors, NameTheBadValue) {
  const Layer l;
  EXPECT_THROW(
      {
        try {
          plan_moe_rank(MoeVariant::kIfec, l.table, l.lists, kRanks, kTokens, l.row(), EchDtype::kFp32);
        } catch (const ifec::common::Error& e) {
          EXPECT_NE(std::string(e.what()).find("rank 4 outside 0..3"), std::string::npos) << e.what();
          throw;
        }
      },
      ifec::common::Error);
  EXPECT_THROW(plan_moe_rank(MoeVariant::kIfec, l.table, l.lists, 0, kTokens + 1, l.row(), EchDtype::kFp32),
               ifec::common::Error);
  EXPECT_THROW(plan_moe_rank(MoeVariant::kIfec, l.table, l.lists, 0, kTokens, 6, EchDtype::kFp32), ifec::common::Error);
  EXPECT_THROW(parse_moe_variant("sharp"), ifec::common::Error);
}

}  // namespace
