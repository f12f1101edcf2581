// MoE dispatch / expert compute / combine over the simulated fabric: every rank's communicator runs its part of
// each phase, point-to-point row stores (per expert, per rank) or IFEC multicast and in-switch reduction.
#include "ifec/testbed/moe_fabric.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>

#include "ifec/common/checks.h"
#include "ifec/testbed/harness.h"

namespace ifec::testbed {

using namespace workloads;  // the MoE layer math (moe.h) this driver moves through the fabric

namespace {

constexpr uint16_t kRecv = 40;     // dispatch receive rows (IFEC: [source rank][token] rows, a symmetric layout)
constexpr uint16_t kCombine = 41;  // combine rows at the source: [token][slot] (stores) or [token] (IFEC)
constexpr uint16_t kInput = 42;    // each rank's own tokens (stores)
constexpr uint16_t kOutput = 43;   // each expert rank's output rows (stores: sent back; IFEC: the contributions)

// Frame bytes the first `ranks` GPUs have sent, per plane.
std::vector<uint64_t> gpu_tx_bytes(Cluster& c, int ranks) {
  std::vector<uint64_t> b(c.fabric().topology().num_planes, 0);
  for (int g = 0; g < ranks; ++g) {
    for (const auto& p : c.fabric().gpu_ports(g)) {
      b.at(p.plane) += p.io->counters().tx_bytes;
    }
  }
  return b;
}

struct PhaseMeter {
  Cluster& c;
  int ranks;
  common::TimeNs t0;
  std::vector<uint64_t> tx0;
  PhaseMeter(Cluster& cluster, int n) : c(cluster), ranks(n), t0(cluster.loop().now()), tx0(gpu_tx_bytes(cluster, n)) {}
  void finish(double* us, uint64_t* wire, std::vector<uint64_t>* per_plane) const {
    *us = (c.loop().now() - t0) / 1e3;
    const std::vector<uint64_t> tx1 = gpu_tx_bytes(c, ranks);
    per_plane->assign(tx1.size(), 0);
    *wire = 0;
    for (size_t p = 0; p < tx1.size(); ++p) {
      (*per_plane)[p] = tx1[p] - tx0[p];
      *wire += (*per_plane)[p];
    }
  }
};

}  // namespace

const char* moe_variant_name(MoeVariant v) {
  switch (v) {
    case MoeVariant::kPerExpert:
      return "per_expert";
    case MoeVariant::kPerRank:
      return "per_rank";
    case MoeVariant::kIfec:
      return "ifec";
  }
  return "?";
}

MoeVariant parse_moe_variant(const std::string& name) {
  for (MoeVariant v : {MoeVariant::kPerExpert, MoeVariant::kPerRank, MoeVariant::kIfec}) {
    if (name == moe_variant_name(v)) {
      return v;
    }
  }
  IFEC_FAIL("unknown MoE variant '" << name << "' (per_expert, per_rank or ifec)");
}

MoeFabricResult run_moe_fabric(Cluster& c, MoeVariant variant, const MoeConfig& cfg, const MoeWeights& w,
                               const at::Tensor& x_in, int ranks, const GpuProfile& profile,
                               const MoeFabricOptions& opts) {
  cfg.validate();
  IFEC_CHECK(ranks >= 1 && ranks <= c.size(), "EP size " << ranks << " outside 1.." << c.size());
  IFEC_CHECK(variant != MoeVariant::kIfec || ranks <= 64,
             "EP size " << ranks << ": the IFEC variant's compact ECH bitmaps hold 64 ranks");
  IFEC_CHECK(x_in.dim() == 2 && x_in.size(1) == cfg.hidden && x_in.size(0) % ranks == 0 && x_in.size(0) > 0,
             "x must be [ranks * tokens, " << cfg.hidden << "], got " << x_in.sizes());
  IFEC_CHECK(x_in.scalar_type() == torch::kFloat32 || x_in.scalar_type() == torch::kBFloat16,
             "x must be fp32 or bf16, got " << x_in.scalar_type());
  const at::Tensor x = x_in.contiguous();
  const int64_t tokens = x.size(0) / ranks;
  const int64_t H = cfg.hidden;
  const int64_t esize = x.element_size();
  const int64_t row = H * esize;
  const common::TimeNs limit = opts.phase_limit_ns;
  MoeFabricResult res;

  // Routing happens where the tokens are; every rank then knows its deliveries (DeepEP's notify step).
  const RoutingPlan plan = gate(x.to(torch::kFloat32), w, cfg);
  const RouteTable table = to_route_table(plan);
  const DispatchLists lists = build_dispatch_lists(table, cfg.experts, ranks);
  res.routed_pairs = table.tokens * table.topk;
  const bool per_expert = variant == MoeVariant::kPerExpert;
  const bool ifec = variant == MoeVariant::kIfec;
  auto list_size = [&](int d) { return per_expert ? lists.per_expert[d].size() : lists.per_rank[d].size(); };
  auto list_token = [&](int d, size_t i) {
    return per_expert ? lists.per_expert[d][i].token : lists.per_rank[d][i].token;
  };
  size_t max_recv = 1;
  for (int d = 0; d < ranks; ++d) {
    max_recv = std::max(max_recv, list_size(d));
  }
  // Where rank d finds delivery i's row after dispatch.
  auto recv_offset = [&](int d, size_t i) -> uint64_t {
    return ifec ? static_cast<uint64_t>(list_token(d, i) * row) : static_cast<uint64_t>(i * row);
  };

  // ---- Dispatch ----
  if (ifec) {
    c.allocate_window(kRecv, static_cast<uint64_t>(ranks * tokens * row));  // sparse: only routed rows are touched
    c.allocate_window(kCombine, static_cast<uint64_t>(tokens * row));
    c.allocate_window(kOutput, static_cast<uint64_t>(max_recv * row));
    for (int r = 0; r < ranks; ++r) {
      std::memcpy(c.window_data(r, kRecv) + r * tokens * row,
                  static_cast<const uint8_t*>(x.data_ptr()) + r * tokens * row, tokens * row);
    }
  } else {
    c.allocate_window(kInput, static_cast<uint64_t>(tokens * row));
    c.allocate_window(kRecv, static_cast<uint64_t>(max_recv * row));
    c.allocate_window(kCombine, static_cast<uint64_t>(tokens * cfg.topk * row));
    c.allocate_window(kOutput, static_cast<uint64_t>(max_recv * row));
    for (int r = 0; r < ranks; ++r) {
      std::memcpy(c.window_data(r, kInput), static_cast<const uint8_t*>(x.data_ptr()) + r * tokens * row, tokens * row);
    }
  }
  std::unique_ptr<IfecCollectives> coll;
  if (ifec) {
    coll = std::make_unique<IfecCollectives>(c);
  }
  auto cleanup = [&] {
    coll.reset();
    for (uint16_t id : {kRecv, kCombine, kInput, kOutput}) {
      c.free_window(id);
    }
  };
  // The endpoint-based phases: every rank stores its rows (its own rows are copied, not sent), in the order listed.
  auto put_rows = [&](uint16_t from_window, uint16_t to_window, std::vector<RowPutSpec> rows, int64_t* logical) {
    BatchPutSpec ps{from_window, to_window, static_cast<uint64_t>(row), std::move(rows)};
    for (const RowPutSpec& r : ps.rows) {
      *logical += r.source == r.destination ? 0 : row;
    }
    const CollectiveResult r = run_put_rows(c, ps, limit);
    return r.ok ? std::string() : r.error;
  };
  {
    PhaseMeter meter(c, ranks);
    std::string err;
    if (ifec) {
      BatchMulticastSpec mc;
      mc.window = kRecv;
      mc.row_bytes = static_cast<uint64_t>(row);
      for (int64_t token = 0; token < table.tokens; ++token) {
        RowMulticast rm;
        rm.source = static_cast<int>(token / tokens);
        rm.offset = static_cast<uint64_t>(token * row);
        for (int d : ranks_of_token(table.row(token), cfg.experts, ranks)) {
          if (d != rm.source) {
            rm.destinations.push_back(d);
          }
        }
        res.dispatch_logical_bytes += static_cast<int64_t>(rm.destinations.size()) * row;
        if (!rm.destinations.empty()) {
          mc.rows.push_back(std::move(rm));
        }
      }
      const CollectiveResult r = coll->multicast_rows(mc, limit);
      err = r.ok ? "" : "dispatch: " + r.error;
      res.fallback_chunks += r.fallback_chunks;
      if (r.fell_back) {
        res.fallback_reason = "dispatch: " + r.fallback_reason;
      }
      for (const std::string& f : r.faults) {
        res.faults.push_back("dispatch: " + f);
      }
    } else {
      std::vector<RowPutSpec> rows;
      for (int d = 0; d < ranks; ++d) {
        for (size_t i = 0; i < list_size(d); ++i) {
          const int64_t token = list_token(d, i);
          rows.push_back({static_cast<int>(token / tokens), static_cast<uint64_t>((token % tokens) * row), d,
                          static_cast<uint64_t>(i * row)});
        }
      }
      err = put_rows(kInput, kRecv, std::move(rows), &res.dispatch_logical_bytes);
      err = err.empty() ? "" : "dispatch: " + err;
    }
    if (!err.empty()) {
      res.error = err;
      cleanup();
      return res;
    }
    meter.finish(&res.dispatch_us, &res.dispatch_wire_bytes, &res.dispatch_wire_per_plane);
  }

  // ---- Expert compute on every rank (LibTorch); its time comes from the GPU profile, the slowest rank's ----
  const std::vector<int64_t> per_expert_tokens = tokens_per_expert(table, cfg.experts);
  res.tokens_per_expert = per_expert_tokens;
  std::vector<at::Tensor> out_rows(ranks);
  for (int d = 0; d < ranks; ++d) {
    const size_t n = list_size(d);
    if (opts.compute) {
      at::Tensor recv = torch::empty({static_cast<int64_t>(n), H}, x.options());
      for (size_t i = 0; i < n; ++i) {
        std::memcpy(static_cast<uint8_t*>(recv.data_ptr()) + i * row, c.window_data(d, kRecv) + recv_offset(d, i), row);
      }
      const at::Tensor out = per_expert ? expert_outputs_for_rank(recv, lists.per_expert[d], w, cfg)
                                        : expert_outputs_for_rank(recv, lists.per_rank[d], w, cfg);
      out_rows[d] = out.to(x.scalar_type()).contiguous();  // combine moves rows in the element type, as DeepEP's
    } else {
      out_rows[d] = torch::zeros({static_cast<int64_t>(n), H}, x.options());
    }
    const int64_t experts_per_rank = cfg.experts / ranks;
    std::vector<int64_t> mine(per_expert_tokens.begin() + d * experts_per_rank,
                              per_expert_tokens.begin() + (d + 1) * experts_per_rank);
    res.compute_us = std::max(res.compute_us, 1e6 * expert_compute_seconds(mine, cfg, profile, esize));
  }

  // ---- Combine ----
  at::Tensor local;                  // IFEC: each source's own rank's part, added locally [ranks * tokens, H] fp32
  for (int d = 0; d < ranks; ++d) {  // every rank's expert outputs, the rows it sends back
    std::memcpy(c.window_data(d, kOutput), out_rows[d].data_ptr(), list_size(d) * row);
  }
  {
    std::string err;
    if (ifec) {
      if (opts.compute) {
        local = torch::zeros({ranks * tokens, H}, torch::kFloat32);  // timing mode: nothing to add up
      }
      BatchReduceSpec rs;
      rs.source_window = kOutput;
      rs.result_window = kCombine;
      rs.dtype = x.scalar_type() == torch::kBFloat16 ? common::EchDtype::kBf16 : common::EchDtype::kFp32;
      rs.row_elements = static_cast<uint32_t>(H);
      std::vector<RowReduce> by_token(static_cast<size_t>(table.tokens));
      for (int d = 0; d < ranks; ++d) {
        for (size_t i = 0; i < list_size(d); ++i) {
          const int64_t token = list_token(d, i);
          const int src = static_cast<int>(token / tokens);
          if (src == d) {
            if (opts.compute) {
              local[token].copy_(out_rows[d][static_cast<int64_t>(i)].to(torch::kFloat32));
            }
            continue;
          }
          by_token[token].destination = src;
          by_token[token].index = static_cast<uint32_t>(token % tokens);
          by_token[token].contributions.push_back({d, static_cast<uint64_t>(i * row)});
          res.combine_logical_bytes += row;
        }
      }
      for (auto& rr : by_token) {
        if (!rr.contributions.empty()) {
          rs.rows.push_back(std::move(rr));
        }
      }
      PhaseMeter meter(c, ranks);
      const CollectiveResult r = coll->reduce_rows(rs, limit);
      err = r.ok ? "" : "combine: " + r.error;
      res.fallback_chunks += r.fallback_chunks;
      if (r.fell_back) {
        res.fallback_reason += (res.fallback_reason.empty() ? "" : "; ") + ("combine: " + r.fallback_reason);
      }
      for (const std::string& f : r.faults) {
        res.faults.push_back("combine: " + f);
      }
      meter.finish(&res.combine_us, &res.combine_wire_bytes, &res.combine_wire_per_plane);
    } else {
      // Every output row goes back to its token's source, into the [token][slot] row of the first slot it covers
      // (per-rank rows already summed that rank's experts).
      std::vector<RowPutSpec> rows;
      for (int d = 0; d < ranks; ++d) {
        for (size_t i = 0; i < list_size(d); ++i) {
          const int64_t token = list_token(d, i);
          const int64_t slot = per_expert ? lists.per_expert[d][i].slot : lists.per_rank[d][i].slots.front();
          rows.push_back({d, static_cast<uint64_t>(i * row), static_cast<int>(token / tokens),
                          static_cast<uint64_t>(((token % tokens) * cfg.topk + slot) * row)});
        }
      }
      PhaseMeter meter(c, ranks);
      err = put_rows(kOutput, kCombine, std::move(rows), &res.combine_logical_bytes);
      err = err.empty() ? "" : "combine: " + err;
      meter.finish(&res.combine_us, &res.combine_wire_bytes, &res.combine_wire_per_plane);
    }
    if (!err.empty()) {
      res.error = err;
      cleanup();
      return res;
    }
  }

  // Each source sums its tokens' rows (unused slots are zero) and adds the shared expert.
  if (opts.compute) {
    std::vector<at::Tensor> ys;
    for (int s = 0; s < ranks; ++s) {
      at::Tensor xs = x.narrow(0, s * tokens, tokens);
      at::Tensor routed;
      if (ifec) {
        routed = torch::from_blob(c.window_data(s, kCombine), {tokens, H}, x.scalar_type()).to(torch::kFloat32) +
                 local.narrow(0, s * tokens, tokens);
      } else {
        routed = torch::from_blob(c.window_data(s, kCombine), {tokens, cfg.topk, H}, x.scalar_type())
                     .to(torch::kFloat32)
                     .sum(1);
      }
      ys.push_back(shared_expert_forward(xs, w) + routed);
    }
    res.output = torch::cat(ys, 0);
  }
  cleanup();
  res.ok = true;
  return res;
}

}  // namespace ifec::testbed
