// MoE dispatch / expert compute / combine over the simulated fabric's RC transactions.
#include "ifec/workloads/moe_fabric.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>

#include "ifec/common/checks.h"

namespace ifec::workloads {

namespace {

constexpr uint16_t kRecv = 40;     // dispatch receive rows, per destination rank
constexpr uint16_t kCombine = 41;  // combine rows, per source rank: [token][slot] rows
constexpr uint16_t kInput = 42;    // each rank's own tokens

uint64_t gpu_tx_bytes(Cluster& c, int ranks) {
  uint64_t b = 0;
  for (int g = 0; g < ranks; ++g) {
    for (const auto& p : c.fabric().gpu_ports(g)) {
      b += p.io->counters().tx_bytes;
    }
  }
  return b;
}

}  // namespace

const char* moe_variant_name(MoeVariant v) { return v == MoeVariant::kPerExpert ? "per_expert" : "per_rank"; }

MoeFabricResult run_moe_fabric(Cluster& c, MoeVariant variant, const MoeConfig& cfg, const MoeWeights& w,
                               const at::Tensor& x_in, int ranks, const GpuProfile& profile) {
  cfg.validate();
  IFEC_CHECK(ranks >= 1 && ranks <= c.size(), "EP size " << ranks << " outside 1.." << c.size());
  IFEC_CHECK(x_in.dim() == 2 && x_in.size(1) == cfg.hidden && x_in.size(0) % ranks == 0,
             "x must be [ranks * tokens, " << cfg.hidden << "], got " << x_in.sizes());
  const at::Tensor x = x_in.contiguous();
  const int64_t tokens = x.size(0) / ranks;
  const int64_t H = cfg.hidden;
  const int64_t esize = x.element_size();
  const int64_t row = H * esize;
  MoeFabricResult res;

  // Routing happens where the tokens are; every rank then knows its deliveries (DeepEP's notify step).
  const RoutingPlan plan = gate(x.to(torch::kFloat32), w, cfg);
  const RouteTable table = to_route_table(plan);
  const DispatchLists lists = build_dispatch_lists(table, cfg.experts, ranks);
  const bool per_expert = variant == MoeVariant::kPerExpert;
  size_t max_recv = 1;
  for (int d = 0; d < ranks; ++d) {
    max_recv = std::max(max_recv, per_expert ? lists.per_expert[d].size() : lists.per_rank[d].size());
  }
  c.allocate_window(kInput, static_cast<uint64_t>(tokens * row));
  c.allocate_window(kRecv, static_cast<uint64_t>(max_recv * row));
  c.allocate_window(kCombine, static_cast<uint64_t>(tokens * cfg.topk * row));
  for (int r = 0; r < ranks; ++r) {
    std::memcpy(c.window_data(r, kInput), static_cast<const uint8_t*>(x.data_ptr()) + r * tokens * row, tokens * row);
  }

  // Dispatch: each delivery is one store of one token row from its source rank into slot i of the destination.
  auto store_row = [&](int src, int dst, uint16_t to_window, uint64_t to_offset, const uint8_t* from,
                       std::vector<endpoint::OpHandle>* hs, int64_t* logical) {
    if (src == dst) {
      std::memcpy(c.window_data(dst, to_window) + to_offset, from, row);  // rank-local: no fabric
      return;
    }
    hs->push_back(c.ep(src).store(dst, to_window, to_offset, from, row));
    *logical += row;
  };
  std::vector<endpoint::OpHandle> hs;
  uint64_t tx0 = gpu_tx_bytes(c, ranks);
  common::TimeNs t0 = c.loop().now();
  for (int d = 0; d < ranks; ++d) {
    const size_t n = per_expert ? lists.per_expert[d].size() : lists.per_rank[d].size();
    for (size_t i = 0; i < n; ++i) {
      const int64_t token = per_expert ? lists.per_expert[d][i].token : lists.per_rank[d][i].token;
      const int src = static_cast<int>(token / tokens);
      store_row(src, d, kRecv, i * row, c.window_data(src, kInput) + (token % tokens) * row, &hs,
                &res.dispatch_logical_bytes);
    }
  }
  if (!c.wait(hs, 10'000'000'000ULL)) {
    res.error = "dispatch did not finish in 10 s of simulated time";
    return res;
  }
  for (const auto& h : hs) {
    if (!h->ok()) {
      res.error = "dispatch store failed: " + h->error;
      return res;
    }
  }
  res.dispatch_us = (c.loop().now() - t0) / 1e3;
  res.dispatch_wire_bytes = gpu_tx_bytes(c, ranks) - tx0;

  // Expert compute on every rank (LibTorch); its time comes from the GPU profile, the slowest rank setting it.
  const std::vector<int64_t> per_expert_tokens = tokens_per_expert(table, cfg.experts);
  std::vector<at::Tensor> outputs(ranks);
  for (int d = 0; d < ranks; ++d) {
    const size_t n = per_expert ? lists.per_expert[d].size() : lists.per_rank[d].size();
    at::Tensor recv = torch::from_blob(c.window_data(d, kRecv), {static_cast<int64_t>(n), H}, x.scalar_type()).clone();
    outputs[d] = per_expert ? expert_outputs_for_rank(recv, lists.per_expert[d], w, cfg)
                            : expert_outputs_for_rank(recv, lists.per_rank[d], w, cfg);
    const int64_t experts_per_rank = cfg.experts / ranks;
    std::vector<int64_t> mine(per_expert_tokens.begin() + d * experts_per_rank,
                              per_expert_tokens.begin() + (d + 1) * experts_per_rank);
    res.compute_us = std::max(res.compute_us, 1e6 * expert_compute_seconds(mine, cfg, profile, esize));
  }

  // Combine: every output row goes back to its token's source, into the [token][slot] row of the first slot it
  // covers (per-rank rows already summed that rank's experts), in the element type, as DeepEP's combine does.
  std::vector<at::Tensor> out_rows(ranks);
  for (int d = 0; d < ranks; ++d) {
    out_rows[d] = outputs[d].to(x.scalar_type()).contiguous();
  }
  hs.clear();
  tx0 = gpu_tx_bytes(c, ranks);
  t0 = c.loop().now();
  for (int d = 0; d < ranks; ++d) {
    const size_t n = per_expert ? lists.per_expert[d].size() : lists.per_rank[d].size();
    for (size_t i = 0; i < n; ++i) {
      const int64_t token = per_expert ? lists.per_expert[d][i].token : lists.per_rank[d][i].token;
      const int64_t slot = per_expert ? lists.per_expert[d][i].slot : lists.per_rank[d][i].slots.front();
      const int src = static_cast<int>(token / tokens);
      const uint64_t to = static_cast<uint64_t>(((token % tokens) * cfg.topk + slot) * row);
      store_row(d, src, kCombine, to, static_cast<const uint8_t*>(out_rows[d].data_ptr()) + i * row, &hs,
                &res.combine_logical_bytes);
    }
  }
  if (!c.wait(hs, 10'000'000'000ULL)) {
    res.error = "combine did not finish in 10 s of simulated time";
    return res;
  }
  for (const auto& h : hs) {
    if (!h->ok()) {
      res.error = "combine store failed: " + h->error;
      return res;
    }
  }
  res.combine_us = (c.loop().now() - t0) / 1e3;
  res.combine_wire_bytes = gpu_tx_bytes(c, ranks) - tx0;

  // Each source sums its tokens' rows (unused slots are zero) and adds the shared expert.
  std::vector<at::Tensor> ys;
  for (int s = 0; s < ranks; ++s) {
    at::Tensor stage =
        torch::from_blob(c.window_data(s, kCombine), {tokens, cfg.topk, H}, x.scalar_type()).to(torch::kFloat32);
    at::Tensor xs = x.narrow(0, s * tokens, tokens);
    ys.push_back(shared_expert_forward(xs, w) + stage.sum(1));
  }
  res.output = torch::cat(ys, 0);
  res.ok = true;
  return res;
}

}  // namespace ifec::workloads
