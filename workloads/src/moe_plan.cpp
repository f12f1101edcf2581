// One rank's MoE dispatch/combine plan (moe_plan.h): which rows it sends and receives in each phase, and the local
// steps around them.
#include "ifec/workloads/moe_plan.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>

#include "ifec/common/checks.h"
#include "ifec/common/names.h"

namespace ifec::workloads {

namespace {

constexpr common::Name<MoeVariant> kMoeVariantNames[] = {
    {MoeVariant::kPerExpert, "per_expert"},
    {MoeVariant::kPerRank, "per_rank"},
    {MoeVariant::kIfec, "ifec"},
};
constexpr common::Vocabulary kMoeVariants("MoE variant", kMoeVariantNames);

}  // namespace

const char* moe_variant_name(MoeVariant v) { return kMoeVariants.name(v); }
MoeVariant parse_moe_variant(const std::string& name) { return kMoeVariants.parse(name); }

namespace {

// A rank's dispatch list in the plan's granularity (per expert for that variant, per rank otherwise).
struct ListView {
  const DispatchLists& lists;
  bool per_expert;
  size_t size(int d) const { return per_expert ? lists.per_expert[d].size() : lists.per_rank[d].size(); }
  int64_t token(int d, size_t i) const {
    return per_expert ? lists.per_expert[d][i].token : lists.per_rank[d][i].token;
  }
  // Plan column of the first slot the delivery covers (where a stored combine row lands at the source).
  int64_t slot(int d, size_t i) const {
    return per_expert ? lists.per_expert[d][i].slot : lists.per_rank[d][i].slots.front();
  }
};

// For every token, the ranks that hold it after dispatch (ascending) and its index in each one's per-rank list.
std::vector<std::vector<std::pair<int, size_t>>> holders_of_tokens(const DispatchLists& lists, int64_t tokens) {
  std::vector<std::vector<std::pair<int, size_t>>> h(static_cast<size_t>(tokens));
  for (int d = 0; d < lists.ranks; ++d) {
    for (size_t i = 0; i < lists.per_rank[d].size(); ++i) {
      const int64_t t = lists.per_rank[d][i].token;
      IFEC_CHECK(t >= 0 && t < tokens, "MoE plan: delivery of token " << t << " outside the table's " << tokens);
      h[static_cast<size_t>(t)].emplace_back(d, i);
    }
  }
  return h;
}

// The plans being made: ranks [first, first + plans.size()), each planned in one pass over the layer's deliveries
// (planning every rank of an EP 256 layer rank by rank walked the 8 M deliveries 256 times).
struct Planned {
  int first = 0;
  std::vector<MoeRankPlan>& plans;
  MoeRankPlan* of(int rank) {
    const int i = rank - first;
    return i >= 0 && i < static_cast<int>(plans.size()) ? &plans[static_cast<size_t>(i)] : nullptr;
  }
};

// IFEC: each token row leaves its source once as multicast to the other ranks holding it (at the same offset of
// the receive window everywhere); each output row a rank computed for another rank's token is a contribution to
// that token's in-switch sum, delivered to the source.
void plan_ifec(Planned& pl, const RouteTable& table, const DispatchLists& lists, common::EchDtype dtype) {
  const MoeRankPlan& any = pl.plans.front();
  const uint64_t row = any.row_bytes;
  const uint64_t drow = any.dispatch_row_bytes;
  const int64_t T = any.tokens;
  for (MoeRankPlan& p : pl.plans) {
    p.input_window = p.ids.recv;
    p.input_offset = static_cast<uint64_t>(p.rank * T) * drow;
    p.dispatch_multicast.window = p.ids.recv;
    p.dispatch_multicast.row_bytes = drow;
    BatchReduceArgs& rd = p.combine_reduce;
    rd.source_window = p.ids.output;
    rd.result_window = p.ids.combine;
    rd.scratch_window = common::kRowScratchWindow;
    rd.dtype = dtype;
    rd.row_elements = static_cast<uint32_t>(row / element_size(dtype));
  }
  const auto holders = holders_of_tokens(lists, table.tokens);
  for (int64_t token = 0; token < table.tokens; ++token) {
    const int src = static_cast<int>(token / T);
    const uint64_t at = static_cast<uint64_t>(token) * drow;
    const auto index = static_cast<uint32_t>(token % T);
    RowsOut out{at, {}};
    RowIn in{index, {}};
    for (const auto& [d, i] : holders[static_cast<size_t>(token)]) {
      if (d == src) {
        continue;
      }
      out.destinations.push_back(d);
      in.contributors.push_back(d);
      if (MoeRankPlan* p = pl.of(d)) {
        p->dispatch_multicast.incoming.emplace_back(at, drow);
        p->combine_reduce.contribute.push_back({src, index, static_cast<uint64_t>(i) * row});
        p->combine_logical_bytes += static_cast<int64_t>(row);
      }
    }
    MoeRankPlan* p = pl.of(src);
    if (p != nullptr && !out.destinations.empty()) {
      p->dispatch_logical_bytes += static_cast<int64_t>(out.destinations.size() * drow);
      p->dispatch_multicast.rows.push_back(std::move(out));
      p->combine_reduce.mine.push_back(std::move(in));
    }
  }
  for (MoeRankPlan& p : pl.plans) {
    for (const RankDelivery& d : lists.per_rank[p.rank]) {
      p.recv_offsets.push_back(static_cast<uint64_t>(d.token) * drow);
      p.own_token.push_back(d.token / T == p.rank ? d.token % T : -1);
    }
  }
}

// The baselines: every delivery is a row store from the token's source into the next row of the expert rank's
// receive window, and its output row (the same index of the output window) a store back into the source's
// [token][slot] combine row (the first slot it covers; per-rank rows already summed that rank's experts). Own rows
// are copied, not sent.
void plan_stores(Planned& pl, const ListView& l) {
  const MoeRankPlan& any = pl.plans.front();
  const uint64_t row = any.row_bytes;
  const uint64_t drow = any.dispatch_row_bytes;
  const int64_t T = any.tokens;
  for (MoeRankPlan& p : pl.plans) {
    p.input_window = p.ids.input;
    p.dispatch_put = {p.ids.input, p.ids.recv, drow, {}, {}, moe_rows_ahead(p.ranks)};
    p.combine_put = {p.ids.output, p.ids.combine, row, {}, {}, moe_rows_ahead(p.ranks)};
  }
  for (int d = 0; d < any.ranks; ++d) {
    MoeRankPlan* at_d = pl.of(d);
    for (size_t i = 0; i < l.size(d); ++i) {
      const int64_t token = l.token(d, i);
      const int src = static_cast<int>(token / T);
      const uint64_t recv_at = static_cast<uint64_t>(i) * drow;
      const uint64_t out_at = static_cast<uint64_t>(i) * row;
      const uint64_t combine_at = static_cast<uint64_t>((token % T) * any.topk + l.slot(d, i)) * row;
      if (MoeRankPlan* p = pl.of(src)) {
        p->dispatch_put.rows.push_back({static_cast<uint64_t>(token % T) * drow, d, recv_at});
        p->dispatch_logical_bytes += d == src ? 0 : static_cast<int64_t>(drow);
        if (d != src) {
          p->combine_put.incoming.emplace_back(combine_at, row);
        }
      }
      if (at_d != nullptr) {
        at_d->combine_put.rows.push_back({out_at, src, combine_at});
        at_d->combine_logical_bytes += src == d ? 0 : static_cast<int64_t>(row);
        if (src != d) {
          at_d->dispatch_put.incoming.emplace_back(recv_at, drow);
        }
        at_d->recv_offsets.push_back(recv_at);
        at_d->own_token.push_back(-1);
      }
    }
  }
}

// Plans ranks [first, first + count) of the layer.
std::vector<MoeRankPlan> plan_ranks(MoeVariant v, const RouteTable& table, const DispatchLists& lists, int first,
                                    int count, int64_t tokens_per_rank, uint64_t row_bytes, common::EchDtype dtype,
                                    const MoeWindows& ids, bool fp8_dispatch) {
  IFEC_CHECK(lists.ranks >= 1 && first >= 0 && count >= 1 && first + count <= lists.ranks,
             "MoE plan: rank " << (first < 0 ? first : first + count - 1) << " outside 0.." << lists.ranks - 1);
  IFEC_CHECK(
      tokens_per_rank >= 1 && table.tokens == tokens_per_rank * lists.ranks && lists.tokens == table.tokens,
      "MoE plan: " << table.tokens << " routed tokens are not " << lists.ranks << " ranks x " << tokens_per_rank);
  IFEC_CHECK(row_bytes > 0 && row_bytes % element_size(dtype) == 0,
             "MoE plan: row of " << row_bytes << " B is not a whole number of elements");
  const uint64_t drow =
      fp8_dispatch ? static_cast<uint64_t>(fp8_row_bytes(static_cast<int64_t>(row_bytes / element_size(dtype))))
                   : row_bytes;
  const ListView l{lists, v == MoeVariant::kPerExpert};
  size_t max_recv = 1;
  for (int d = 0; d < lists.ranks; ++d) {
    max_recv = std::max(max_recv, l.size(d));
  }
  const auto T = static_cast<uint64_t>(tokens_per_rank);
  // The receive window of IFEC is sparse: only routed rows are touched.
  const std::vector<std::pair<uint16_t, uint64_t>> windows =
      v == MoeVariant::kIfec ? std::vector<std::pair<uint16_t, uint64_t>>{{ids.recv, lists.ranks * T * drow},
                                                                          {ids.combine, T * row_bytes},
                                                                          {ids.output, max_recv * row_bytes}}
                             : std::vector<std::pair<uint16_t, uint64_t>>{{ids.input, T * drow},
                                                                          {ids.recv, max_recv * drow},
                                                                          {ids.combine, T * table.topk * row_bytes},
                                                                          {ids.output, max_recv * row_bytes}};
  std::vector<MoeRankPlan> plans(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    MoeRankPlan& p = plans[static_cast<size_t>(i)];
    p.variant = v;
    p.rank = first + i;
    p.ranks = lists.ranks;
    p.tokens = tokens_per_rank;
    p.topk = table.topk;
    p.row_bytes = row_bytes;
    p.fp8_dispatch = fp8_dispatch;
    p.dispatch_row_bytes = drow;
    p.ids = ids;
    p.windows = windows;
  }
  Planned pl{first, plans};
  if (v == MoeVariant::kIfec) {
    plan_ifec(pl, table, lists, dtype);
  } else {
    plan_stores(pl, l);
  }
  return plans;
}

}  // namespace

uint32_t moe_rows_ahead(int ranks) {
  const auto peers = static_cast<uint32_t>(std::max(1, ranks - 1));
  return std::max<uint32_t>(16, (kMoeRowsInFlight + peers - 1) / peers);
}

MoeRankPlan plan_moe_rank(MoeVariant v, const RouteTable& table, const DispatchLists& lists, int rank,
                          int64_t tokens_per_rank, uint64_t row_bytes, common::EchDtype dtype, const MoeWindows& ids,
                          bool fp8_dispatch) {
  return std::move(plan_ranks(v, table, lists, rank, 1, tokens_per_rank, row_bytes, dtype, ids, fp8_dispatch).front());
}

std::vector<MoeRankPlan> plan_moe_ranks(MoeVariant v, const RouteTable& table, const DispatchLists& lists,
                                        int64_t tokens_per_rank, uint64_t row_bytes, common::EchDtype dtype,
                                        const MoeWindows& ids, bool fp8_dispatch) {
  return plan_ranks(v, table, lists, 0, lists.ranks, tokens_per_rank, row_bytes, dtype, ids, fp8_dispatch);
}

at::Tensor moe_expert_rows(const MoeRankPlan& p, const uint8_t* recv, const DispatchLists& lists, const MoeWeights& w,
                           const MoeConfig& cfg, at::ScalarType row_type) {
  const auto n = static_cast<int64_t>(p.recv_offsets.size());
  IFEC_CHECK(static_cast<uint64_t>(cfg.hidden * c10::elementSize(row_type)) == p.row_bytes,
             "MoE expert rows: hidden " << cfg.hidden << " in " << row_type << " is not the plan's row of "
                                        << p.row_bytes << " B");
  const uint64_t drow = p.dispatch_row_bytes;
  at::Tensor in = torch::empty({n, static_cast<int64_t>(drow)}, torch::TensorOptions().dtype(torch::kByte));
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(in.data_ptr<uint8_t>() + i * drow, recv + p.recv_offsets[i], drow);
  }
  in = p.fp8_dispatch ? dequantize_fp8_rows(in, cfg.hidden).to(row_type) : in.view(row_type);
  const at::Tensor out = p.variant == MoeVariant::kPerExpert
                             ? expert_outputs_for_rank(in, lists.per_expert[p.rank], w, cfg)
                             : expert_outputs_for_rank(in, lists.per_rank[p.rank], w, cfg);
  return out.to(row_type).contiguous();  // combine moves rows in the element type, as DeepEP's
}

at::Tensor moe_routed_output(const MoeRankPlan& p, const uint8_t* combined, const at::Tensor& expert_rows,
                             int64_t hidden, at::ScalarType row_type) {
  // from_blob views the window; the conversion to fp32 copies it.
  auto* data = const_cast<uint8_t*>(combined);
  if (p.variant != MoeVariant::kIfec) {
    return torch::from_blob(data, {p.tokens, p.topk, hidden}, row_type).to(torch::kFloat32).sum(1);
  }
  at::Tensor routed = torch::from_blob(data, {p.tokens, hidden}, row_type).to(torch::kFloat32);
  for (size_t i = 0; i < p.own_token.size(); ++i) {
    if (p.own_token[i] >= 0) {
      routed[p.own_token[i]] += expert_rows[static_cast<int64_t>(i)].to(torch::kFloat32);
    }
  }
  return routed;
}

double moe_tolerance(at::ScalarType row_type) { return row_type == torch::kBFloat16 ? 2e-2 : 1e-5; }

double moe_max_rel_error(const at::Tensor& out, const at::Tensor& ref) {
  return ((out - ref).abs().max() / ref.abs().max()).item<double>();
}

}  // namespace ifec::workloads
