// ifec-hostd's MoE layer: this rank gates its own tokens, the ranks exchange routing tables (DeepEP's notify step,
// over the bootstrap), and each runs its part of dispatch, experts (LibTorch on the CPU) and combine as
// workloads::plan_moe_rank plans it, the same plan the simulator's ranks follow. What LibTorch computes (the
// weights, the tokens and their gate, the experts, the reference) runs on the daemon's LoopWorker, not its loop: a
// layer of 2048 tokens per rank held the loops for minutes, and every BGP session of the fabric flapped.
#include "hostd_moe.h"

#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iomanip>
#include <memory>

#include "daemon_common.h"
#include "ifec/common/checks.h"
#include "ifec/live/epoll_loop.h"
#include "ifec/testbed/moe_rows.h"
#include "ifec/workloads/moe_plan.h"

namespace ifec::live {

namespace {

using namespace workloads;

int64_t or_default(uint32_t v, int64_t d) { return v == 0 ? d : static_cast<int64_t>(v); }

MoeConfig moe_config(const v1::MoeShape& s, int ranks) {
  MoeConfig c;
  c.hidden = or_default(s.hidden(), 512);
  c.inter = or_default(s.inter(), 16);
  c.experts = or_default(s.experts(), 32);
  c.topk = or_default(s.topk(), 8);
  c.groups = or_default(s.groups(), 8);
  c.topk_groups = or_default(s.topk_groups(), 4);
  c.validate();
  IFEC_CHECK(c.experts % ranks == 0, "moe: " << c.experts << " experts do not split over " << ranks << " ranks");
  IFEC_CHECK(c.hidden <= 8192 && c.inter <= 4096,
             "moe: hidden " << c.hidden << " / inter " << c.inter << " above 8192 / 4096 (the experts run on CPUs)");
  return c;
}

// What the layer holds at once at one rank, roughly: the weights drawn in fp32 (and their copy in the row type), the
// tokens drawn (every rank's, up to kDrawBlock rows at a time, in fp32) and every rank's routing table. Refused above
// 3/4 of this machine's memory, where the allocations would meet the kernel's OOM killer instead of an error.
void check_moe_memory(const MoeConfig& c, int64_t tokens, int ranks, bool bf16) {
  const double weights = static_cast<double>(c.experts) * (3.0 * c.hidden * c.inter + c.hidden + 1) * 4;
  const double drawn = std::min<double>(static_cast<double>(tokens) * ranks, kDrawBlock) * c.hidden * 4;
  const double tables = static_cast<double>(tokens) * ranks * c.topk * 12;
  const double need = weights * (bf16 ? 1.5 : 1.0) + drawn + tables;
  const double physical = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  IFEC_CHECK(need <= 0.75 * physical,
             "moe: " << c.experts << " experts of hidden " << c.hidden << " / inter " << c.inter << ", " << tokens
                     << " tokens per rank of " << ranks << ", top-" << c.topk << " need about " << std::fixed
                     << std::setprecision(1) << need / (1 << 30) << " GiB; the limit is 3/4 of this machine's "
                     << physical / (1 << 30) << " GiB");
}

class MoeRun : public std::enable_shared_from_this<MoeRun> {
 public:
  MoeRun(MoeRunContext ctx, const v1::RunRequest& q, std::function<void(v1::RunReply)> reply)
      : ctx_(std::move(ctx)), reply_(std::move(reply)) {
    const int n = ctx_.comm.size();
    cfg_ = moe_config(q.moe(), n);
    tokens_ = or_default(q.moe().tokens(), 32);
    IFEC_CHECK(tokens_ <= 65536, "moe: " << tokens_ << " tokens per rank (at most 65536)");
    const std::string dt = q.dtype().empty() ? "bf16" : q.dtype();
    IFEC_CHECK(dt == "bf16" || dt == "fp32", "moe: dtype '" << dt << "' (rows travel in bf16 or fp32)");
    check_moe_memory(cfg_, tokens_, n, dt == "bf16");
    row_type_ = dt == "bf16" ? torch::kBFloat16 : torch::kFloat32;
    dtype_ = dt == "bf16" ? common::EchDtype::kBf16 : common::EchDtype::kFp32;
    variant_ = parse_moe_variant(q.algo().empty() ? "ifec" : q.algo());
    IFEC_CHECK(variant_ != MoeVariant::kIfec || n <= 64,
               "moe: the IFEC variant's ECH bitmaps hold 64 ranks, not " << n);
    seed_ = q.seed() == 0 ? 1 : q.seed();
    row_.point.mode = "live";
    row_.point.ep = n;
    row_.point.tokens = tokens_;
    row_.simulated_tokens = tokens_;
    row_.variant = moe_variant_name(variant_);
    row_.compute_source = "measured: LibTorch on this host's CPU, one thread";
    row_.tolerance = moe_tolerance(row_type_);
  }

  // Routing happens where the tokens are; the ranks then swap their tables.
  void start() {
    auto self = shared_from_this();
    auto blob = std::make_shared<std::vector<uint8_t>>();
    off_loop(
        "weights and tokens",
        [self, blob, n = ctx_.comm.size(), rank = ctx_.comm.rank()] {
          self->w_ = make_weights(self->cfg_, self->seed_, self->row_type_);
          // This rank's block of the tokens the simulator draws for every rank (the same point compares).
          self->x_ = draw_tokens(self->seed_, n * self->tokens_, self->cfg_.hidden, self->row_type_,
                                 rank * self->tokens_, self->tokens_);
          self->mine_ = gate(self->x_.to(torch::kFloat32), self->w_, self->cfg_);
          const RouteTable t = to_route_table(self->mine_);
          blob->resize(t.expert_ids.size() * 8 + t.weights.size() * 4);
          std::memcpy(blob->data(), t.expert_ids.data(), t.expert_ids.size() * 8);
          std::memcpy(blob->data() + t.expert_ids.size() * 8, t.weights.data(), t.weights.size() * 4);
        },
        [self, blob] {
          self->ctx_.comm.bootstrap().allgather(std::move(*blob), [self](Gathered g) { self->planned(g); });
        });
  }

 private:
  // `work` on the daemon's worker, LibTorch on one thread there (a daemon per GPU on a few cores); then `then` on the
  // loop, or the layer fails naming `what`.
  void off_loop(const std::string& what, std::function<void()> work, std::function<void()> then) {
    auto self = shared_from_this();
    ctx_.worker.post(
        [work = std::move(work)] {
          torch::set_num_threads(1);
          work();
        },
        [self, what, then = std::move(then)](const std::string& e) {
          if (!e.empty()) {
            self->fail(what + ": " + e);
            return;
          }
          try {  // an exception here, on the loop, would leave the caller without a reply
            then();
          } catch (const std::exception& x) {
            self->fail(what + ": " + x.what());
          }
        });
  }

  void fail(const std::string& why) {
    v1::RunReply r;
    r.set_error("moe " + row_.variant + ": " + why);
    reply_(r);
  }

  void planned(const Gathered& g) {
    if (!g.ok) {
      fail("notify (routing tables): " + g.error);
      return;
    }
    const int n = ctx_.comm.size();
    const size_t pairs = static_cast<size_t>(tokens_ * cfg_.topk);
    RouteTable table;
    table.tokens = tokens_ * n;
    table.topk = cfg_.topk;
    for (int r = 0; r < n; ++r) {
      const std::vector<uint8_t>& p = g.parts.at(r);
      if (p.size() != pairs * 12) {
        fail("rank " + std::to_string(r) + " sent a routing table of " + std::to_string(p.size()) + " B, not " +
             std::to_string(pairs * 12) + " (another layer shape?)");
        return;
      }
      const size_t at = table.expert_ids.size();
      table.expert_ids.resize(at + pairs);
      table.weights.resize(at + pairs);
      std::memcpy(table.expert_ids.data() + at, p.data(), pairs * 8);
      std::memcpy(table.weights.data() + at, p.data() + pairs * 8, pairs * 4);
    }
    try {
      lists_ = build_dispatch_lists(table, cfg_.experts, n);
      MoeWindows ids{ctx_.first_window, static_cast<uint16_t>(ctx_.first_window + 1),
                     static_cast<uint16_t>(ctx_.first_window + 2), static_cast<uint16_t>(ctx_.first_window + 3)};
      plan_ = plan_moe_rank(variant_, table, lists_, ctx_.comm.rank(), tokens_,
                            static_cast<uint64_t>(cfg_.hidden * x_.element_size()), dtype_, ids);
      // Checked before the first window: the others are allocated in callbacks, where an error would reach no reply.
      for (const auto& [id, bytes] : plan_.windows) {
        IFEC_CHECK(bytes <= kMaxWindowBytes,
                   "window " << id << " of " << bytes << " B: more than a window holds (4 GiB)");
      }
    } catch (const std::exception& e) {
      fail(e.what());
      return;
    }
    allocate(0);
  }

  void allocate(size_t k) {
    auto self = shared_from_this();
    if (k == plan_.windows.size()) {
      std::memcpy(window(plan_.input_window) + plan_.input_offset, x_.data_ptr(), plan_.row_bytes * tokens_);
      // Every rank holds its input before any rank's first row lands.
      ctx_.comm.bootstrap().barrier(
          [self](Gathered g) { g.ok ? self->dispatch() : self->fail("barrier: " + g.error); });
      return;
    }
    ctx_.comm.allocate_window(plan_.windows[k].first, plan_.windows[k].second,
                              [self, k](const std::string& e) { e.empty() ? self->allocate(k + 1) : self->fail(e); });
  }

  uint8_t* window(uint16_t id) { return ctx_.comm.endpoint().memory().window(id)->data; }

  // Records one phase's time (its data path on the machine's monotonic clock, so the ranks' rows compare), this
  // GPU's frame bytes per plane and what the operation met.
  bool phase(bool dispatch, const CollectiveResult& r) {
    const char* name = dispatch ? "dispatch" : "combine";
    (dispatch ? row_.dispatch_us : row_.combine_us) = (r.end_ns - r.start_ns) / 1e3;
    (dispatch ? row_.dispatch_data_start_ns : row_.combine_data_start_ns) =
        (r.data_start_ns ? r.data_start_ns : r.start_ns) + ctx_.epoch_ns;
    (dispatch ? row_.dispatch_data_end_ns : row_.combine_data_end_ns) =
        (r.data_end_ns ? r.data_end_ns : r.end_ns) + ctx_.epoch_ns;
    uint64_t* wire = dispatch ? &row_.dispatch_wire_bytes : &row_.combine_wire_bytes;
    std::vector<uint64_t>* planes = dispatch ? &row_.dispatch_wire_per_plane : &row_.combine_wire_per_plane;
    const std::vector<uint64_t> tx = ctx_.plane_tx();
    planes->assign(tx.size(), 0);
    *wire = 0;
    for (size_t p = 0; p < tx.size(); ++p) {
      (*planes)[p] = tx[p] - tx0_[p];
      *wire += (*planes)[p];
    }
    const endpoint::Endpoint::Resent again = ctx_.comm.endpoint().resent();
    (dispatch ? row_.dispatch_resent : row_.combine_resent) = again.frames - resent0_.frames;
    (dispatch ? row_.dispatch_resent_bytes : row_.combine_resent_bytes) = again.bytes - resent0_.bytes;
    (dispatch ? row_.dispatch_host_stall_us : row_.combine_host_stall_us) = ctx_.take_worst_late_ns() / 1e3;
    (dispatch ? row_.dispatch_host_cpu_us : row_.combine_host_cpu_us) = (EpollLoop::thread_cpu_ns() - cpu0_) / 1e3;
    const endpoint::EchCounters& ech = ctx_.comm.endpoint().ech().counters();
    row_.ifec_retransmissions += ech.retransmissions - ech0_.retransmissions;
    row_.ifec_busy_naks += ech.busy_naks - ech0_.busy_naks;
    row_.ifec_duplicate_results += ech.duplicate_results - ech0_.duplicate_results;
    row_.fallback_chunks += r.fallback_chunks;
    for (const std::string& f : r.faults) {
      row_.faults.push_back(std::string(name) + ": " + f);
    }
    if (!r.ok) {
      fail(std::string(name) + ": " + r.error);
    }
    return r.ok;
  }

  // Where a phase's bytes and resends count from.
  void start_phase() {
    tx0_ = ctx_.plane_tx();
    resent0_ = ctx_.comm.endpoint().resent();
    ctx_.take_worst_late_ns();
    cpu0_ = EpollLoop::thread_cpu_ns();
    ech0_ = ctx_.comm.endpoint().ech().counters();
  }

  void dispatch() {
    auto self = shared_from_this();
    start_phase();
    endpoint::Endpoint& ep = ctx_.comm.endpoint();
    row_.turns = {ctx_.comm.group_turn(), {ep.stripe_turn()}, {ep.ech().next_psn()}};
    // The experts wait until every rank's dispatch ended: LibTorch on this host's cores would otherwise slow the
    // daemons (switches and hostds on the same few cores) still moving other ranks' rows, and their data path's time.
    auto done = [self](CollectiveResult r) {
      if (self->phase(true, r)) {
        self->ctx_.comm.bootstrap().barrier(
            [self](Gathered g) { g.ok ? self->experts() : self->fail("barrier: " + g.error); });
      }
    };
    if (variant_ == MoeVariant::kIfec) {
      ctx_.comm.multicast_rows(plan_.dispatch_multicast, done);
    } else {
      ctx_.comm.put_rows(plan_.dispatch_put, done);
    }
  }

  void experts() {
    auto self = shared_from_this();
    off_loop(
        "experts",
        [self, recv = window(plan_.ids.recv), out = window(plan_.ids.output)] {
          const auto t0 = std::chrono::steady_clock::now();
          self->expert_rows_ = moe_expert_rows(self->plan_, recv, self->lists_, self->w_, self->cfg_, self->row_type_);
          std::memcpy(out, self->expert_rows_.data_ptr(),
                      self->expert_rows_.numel() * self->expert_rows_.element_size());
          self->row_.compute_us =
              std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        },
        [self] {
          // Every rank's outputs are in place before the first contribution or store of combine.
          self->ctx_.comm.bootstrap().barrier(
              [self](Gathered g) { g.ok ? self->combine() : self->fail("barrier: " + g.error); });
        });
  }

  void combine() {
    auto self = shared_from_this();
    start_phase();
    auto done = [self](CollectiveResult r) {
      if (self->phase(false, r)) {
        self->check();
      }
    };
    if (variant_ == MoeVariant::kIfec) {
      ctx_.comm.reduce_rows(plan_.combine_reduce, done);
    } else {
      ctx_.comm.put_rows(plan_.combine_put, done);
    }
  }

  // This rank's outputs against the single-process layer on its tokens (same routing decision).
  void check() {
    auto self = shared_from_this();
    auto wrong = std::make_shared<int64_t>(0);
    off_loop(
        "check",
        [self, wrong, combined = window(plan_.ids.combine)] {
          const at::Tensor y =
              shared_expert_forward(self->x_, self->w_) +
              moe_routed_output(self->plan_, combined, self->expert_rows_, self->cfg_.hidden, self->row_type_);
          const at::Tensor ref = reference_forward(self->x_, self->w_, self->cfg_, self->mine_);
          self->row_.max_rel_error = moe_max_rel_error(y, ref);
          const double bound = self->row_.tolerance * ref.abs().max().item<double>();
          *wrong = (y - ref).abs().gt(bound).sum().item<int64_t>();
        },
        [self, wrong] { self->finish(*wrong); });
  }

  void finish(int64_t wrong) {
    row_.total_us = row_.dispatch_us + row_.compute_us + row_.combine_us;
    row_.dispatch_logical_bytes = plan_.dispatch_logical_bytes;
    row_.combine_logical_bytes = plan_.combine_logical_bytes;
    common::JsonObject o = testbed::moe_row_record(row_, ctx_.topo.name, "live");
    o.add("rank", ctx_.comm.rank()).add("wrong", wrong);
    v1::RunReply r;
    r.set_ok(row_.ok() && wrong == 0);
    r.set_wrong(static_cast<uint64_t>(wrong));
    if (!r.ok()) {
      r.set_error("moe " + row_.variant + ": " + std::to_string(wrong) + " outputs differ from the reference (max " +
                  "relative error " + std::to_string(row_.max_rel_error) + ")");
    }
    r.set_row_json(o.str());
    reply_(r);
  }

  MoeRunContext ctx_;
  std::function<void(v1::RunReply)> reply_;
  MoeConfig cfg_;
  int64_t tokens_ = 0;
  at::ScalarType row_type_ = torch::kBFloat16;
  common::EchDtype dtype_ = common::EchDtype::kBf16;
  MoeVariant variant_ = MoeVariant::kIfec;
  uint64_t seed_ = 1;
  MoeWeights w_;
  at::Tensor x_;
  RoutingPlan mine_;
  DispatchLists lists_;
  MoeRankPlan plan_;
  at::Tensor expert_rows_;
  std::vector<uint64_t> tx0_;
  endpoint::Endpoint::Resent resent0_;
  endpoint::EchCounters ech0_;
  common::TimeNs cpu0_ = 0;
  testbed::MoeRow row_;
};

}  // namespace

void run_moe(MoeRunContext ctx, const v1::RunRequest& q, std::function<void(v1::RunReply)> reply) {
  std::make_shared<MoeRun>(std::move(ctx), q, std::move(reply))->start();
}

}  // namespace ifec::live
