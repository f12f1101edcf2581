// Endpoint-based algorithms as per-rank schedules: ring (allreduce, reduce, reduce-scatter, all-gather), binary tree
// and recursive doubling and one-shot allreduce, chain broadcast, dissemination barrier; and their executor.
#include "comm_schedule.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <utility>

#include "comm_op.h"
#include "ifec/common/checks.h"
#include "ifec/common/numeric.h"

namespace ifec::workloads::schedule {

namespace {

// A slice (kRingSliceBytes, communicator.h) is the unit one store moves. Each message in flight on a ring link has
// its own staging slot (kRingSlots of them), reused only after the store that last used it completed: by then the
// receiver reduced it, as the reduce runs inside the arrival of its last packet, before the ACK that completes the
// store is even sent.

constexpr uint64_t kSignalWords = 64;  // one per dissemination round

uint64_t align8(uint64_t b) { return (b + 7) / 8 * 8; }

struct Slice {
  uint64_t off = 0;  // bytes from the buffer start
  uint32_t len = 0;
};

struct Builder {
  const CollArgs& a;
  const std::vector<int>& gpus;
  int n;
  int p;
  size_t esize;
  uint64_t slot_bytes = 0;
  Schedule s;

  Builder(const CollArgs& args, const std::vector<int>& g, int rank)
      : a(args), gpus(g), n(static_cast<int>(g.size())), p(rank), esize(element_size(args.dtype)) {
    s.buffer_window = a.window;
    s.dtype = a.dtype;
    s.op = a.op;
  }
  int gpu(int rank) const { return gpus[(rank % n + n) % n]; }

  // Slices of elements [first, last).
  std::vector<Slice> slices(uint64_t first, uint64_t last) const {
    std::vector<Slice> out;
    const uint64_t per = kRingSliceBytes / esize;
    for (uint64_t e = first; e < last; e += per) {
      out.push_back({e * esize, static_cast<uint32_t>(std::min(per, last - e) * esize)});
    }
    return out;
  }
  std::vector<Slice> block(int b) const {
    b = (b % n + n) % n;
    return slices(block_begin(a.count, n, b), block_begin(a.count, n, b + 1));
  }
  void use_slots(uint64_t bytes) {
    slot_bytes = std::min(kRingSliceBytes, align8(bytes));
    s.slot_window = a.scratch_window;
    s.slot_base = 0;
    s.slot_bytes = slot_bytes;
    s.slots = kRingSlots;
  }
  uint32_t xfer(Xfer x) {
    s.xfers.push_back(std::move(x));
    return static_cast<uint32_t>(s.xfers.size() - 1);
  }
  uint32_t recv(Recv r) {
    s.recvs.push_back(r);
    return static_cast<uint32_t>(s.recvs.size() - 1);
  }
  // A store of one slice of the buffer to `to_rank`: into its staging slot for ring position `seq`, or (slot < 0)
  // straight into its buffer at the same offset.
  Xfer slice_xfer(int to_rank, const Slice& sl, int64_t seq, bool staged) const {
    Xfer x;
    x.peer = gpu(to_rank);
    x.src_window = a.window;
    x.src_offset = a.offset + sl.off;
    x.dst_window = staged ? a.scratch_window : a.window;
    x.dst_offset = staged ? (seq % kRingSlots) * slot_bytes : a.offset + sl.off;
    x.len = sl.len;
    x.after_xfer = seq >= kRingSlots ? static_cast<int32_t>(seq - kRingSlots) : -1;
    return x;
  }
  Recv slice_recv(int from_rank, const Slice& sl, int64_t seq, bool staged) const {
    Recv r;
    r.peer = gpu(from_rank);
    r.window = staged ? a.scratch_window : a.window;
    r.offset = staged ? (seq % kRingSlots) * slot_bytes : a.offset + sl.off;
    r.len = sl.len;
    r.slot = staged ? static_cast<int32_t>(seq % kRingSlots) : -1;
    r.reduce = staged;
    r.reduce_offset = a.offset + sl.off;
    return r;
  }
};

// Ring reduce-scatter over n - 1 steps: at step s rank p sends block p - s + shift (reduced so far) to p + 1, which
// reduces it into its own. After it, rank p holds block p + 1 + shift complete. Returns, per step and slice, the
// arrival indices (what the next step's sends wait for); `seq` counts ring messages for the slot rule.
std::vector<std::vector<uint32_t>> ring_reduce_scatter(Builder& b, int shift, int64_t* seq) {
  const int n = b.n, p = b.p;
  std::vector<std::vector<uint32_t>> in(n - 1);
  int64_t mine = *seq;
  int64_t theirs = *seq;
  for (int s = 0; s < n - 1; ++s) {
    for (const Slice& sl : b.block(p - 1 - s + shift)) {
      in[s].push_back(b.recv(b.slice_recv(p - 1, sl, theirs++, true)));
    }
  }
  for (int s = 0; s < n - 1; ++s) {
    const std::vector<Slice> out = b.block(p - s + shift);
    for (size_t k = 0; k < out.size(); ++k) {
      Xfer x = b.slice_xfer(p + 1, out[k], mine++, true);
      if (s > 0) {
        x.after_recvs = {in[s - 1][k]};
      }
      b.xfer(x);
    }
  }
  *seq = mine;
  return in;
}

// Ring all-gather over n - 1 steps: at step t rank p forwards block p - t + shift to p + 1's buffer; `first` are
// the arrivals the step-0 sends wait for (empty: the block is already here).
void ring_all_gather(Builder& b, int shift, const std::vector<uint32_t>& first, int64_t seq) {
  const int n = b.n, p = b.p;
  std::vector<std::vector<uint32_t>> in(n - 1);
  for (int t = 0; t < n - 1; ++t) {
    for (const Slice& sl : b.block(p - 1 - t + shift)) {
      in[t].push_back(b.recv(b.slice_recv(p - 1, sl, 0, false)));
    }
  }
  for (int t = 0; t < n - 1; ++t) {
    const std::vector<Slice> out = b.block(p - t + shift);
    for (size_t k = 0; k < out.size(); ++k) {
      Xfer x = b.slice_xfer(p + 1, out[k], seq++, false);
      if (t > 0) {
        x.after_recvs = {in[t - 1][k]};
      } else if (!first.empty()) {
        x.after_recvs = {first[k]};
      }
      b.xfer(x);
    }
  }
}

void build_ring(Builder& b) {
  const int n = b.n, p = b.p;
  const uint64_t max_block = (b.a.count + n - 1) / n * b.esize;
  int64_t seq = 0;
  switch (b.a.kind) {
    case Collective::kAllReduce: {
      b.s.name = "ring allreduce";
      b.use_slots(max_block);
      const auto in = ring_reduce_scatter(b, 0, &seq);
      ring_all_gather(b, 1, in.empty() ? std::vector<uint32_t>{} : in.back(), seq);
      break;
    }
    case Collective::kReduceScatter: {
      b.s.name = "ring reduce-scatter";
      b.use_slots(max_block);
      ring_reduce_scatter(b, -1, &seq);  // rank p ends with block p
      break;
    }
    case Collective::kAllGather:
      b.s.name = "ring all-gather";
      ring_all_gather(b, 0, {}, 0);
      break;
    case Collective::kReduce: {
      b.s.name = "ring reduce";
      b.use_slots(max_block);
      const auto in = ring_reduce_scatter(b, 0, &seq);
      const int root = b.a.root;
      if (p != root) {  // this rank's complete block to the root's buffer
        const std::vector<Slice> mine = b.block(p + 1);
        for (size_t k = 0; k < mine.size(); ++k) {
          Xfer x = b.slice_xfer(root, mine[k], 0, false);
          x.after_xfer = -1;
          if (!in.empty()) {
            x.after_recvs = {in.back()[k]};
          }
          b.xfer(x);
        }
      } else {
        for (int q = 0; q < n; ++q) {
          for (const Slice& sl : q == root ? std::vector<Slice>{} : b.block(q + 1)) {
            b.recv(b.slice_recv(q, sl, 0, false));
          }
        }
      }
      break;
    }
    default:
      IFEC_FAIL("ring: no ring schedule for " << collective_name(b.a.kind));
  }
}

// Binary tree allreduce, pipelined by slices: children's slices are reduced into the parent's buffer as they come,
// a slice goes up once both children's are in, and the root's final slices come back down into every buffer.
void build_tree(Builder& b) {
  const int n = b.n, p = b.p;
  b.s.name = "tree allreduce";
  const std::vector<Slice> all = b.slices(0, b.a.count);
  b.use_slots(std::min<uint64_t>(kRingSliceBytes, b.a.count * b.esize));
  const int parent = p == 0 ? -1 : (p - 1) / 2;
  std::vector<int> kids;
  for (int c : {2 * p + 1, 2 * p + 2}) {
    if (c < n) {
      kids.push_back(c);
    }
  }
  // Child c's slices land in staging region (c - 2p - 1), slot k % kRingSlots of it.
  auto up_recv = [&](int c, size_t k) {
    Recv r = b.slice_recv(c, all[k], static_cast<int64_t>(k), true);
    const uint64_t region = static_cast<uint64_t>(c - 2 * p - 1) * kRingSlots;
    r.offset = (region + k % kRingSlots) * b.slot_bytes;
    r.slot = static_cast<int32_t>(region + k % kRingSlots);
    return b.recv(r);
  };
  std::vector<std::vector<uint32_t>> from_kids(all.size());
  for (size_t k = 0; k < all.size(); ++k) {
    for (int c : kids) {
      from_kids[k].push_back(up_recv(c, k));
    }
  }
  std::vector<uint32_t> down(all.size(), UINT32_MAX);
  if (parent >= 0) {
    const uint64_t region = static_cast<uint64_t>(p - 2 * parent - 1) * kRingSlots;
    for (size_t k = 0; k < all.size(); ++k) {
      Xfer x = b.slice_xfer(parent, all[k], static_cast<int64_t>(k), true);
      x.dst_offset = (region + k % kRingSlots) * b.slot_bytes;
      x.after_recvs = from_kids[k];
      b.xfer(x);
    }
    for (size_t k = 0; k < all.size(); ++k) {
      down[k] = b.recv(b.slice_recv(parent, all[k], 0, false));
    }
  }
  for (int c : kids) {
    for (size_t k = 0; k < all.size(); ++k) {
      Xfer x = b.slice_xfer(c, all[k], 0, false);
      x.after_xfer = -1;
      x.after_recvs = parent >= 0 ? std::vector<uint32_t>{down[k]} : from_kids[k];
      b.xfer(x);
    }
  }
}

// Recursive doubling: log2 steps of whole-buffer exchanges with rank ^ 2^k, each into its own staging region; ranks
// beyond the largest power of two fold into a partner first and get the result back at the end.
void build_rd(Builder& b) {
  const int n = b.n, p = b.p;
  b.s.name = "recursive-doubling allreduce";
  const uint64_t bytes = b.a.count * b.esize;
  const uint64_t region = align8(bytes);
  int n2 = 1;
  while (n2 * 2 <= n) {
    n2 *= 2;
  }
  const int extras = n - n2;
  auto whole = [&](int to, uint64_t dst_region, bool staged) {
    Xfer x;
    x.peer = b.gpu(to);
    x.src_window = b.a.window;
    x.src_offset = b.a.offset;
    x.dst_window = staged ? b.a.scratch_window : b.a.window;
    x.dst_offset = staged ? dst_region * region : b.a.offset;
    x.len = static_cast<uint32_t>(bytes);
    return x;
  };
  auto whole_recv = [&](int from, uint64_t src_region, bool staged) {
    Recv r;
    r.peer = b.gpu(from);
    r.window = staged ? b.a.scratch_window : b.a.window;
    r.offset = staged ? src_region * region : b.a.offset;
    r.len = static_cast<uint32_t>(bytes);
    r.reduce = staged;
    r.reduce_offset = b.a.offset;
    return r;
  };
  if (p >= n2) {  // fold into p - n2, get the result back
    b.xfer(whole(p - n2, 0, true));
    b.recv(whole_recv(p - n2, 0, false));
    return;
  }
  std::vector<uint32_t> last;
  if (p < extras) {
    last = {b.recv(whole_recv(p + n2, 0, true))};
  }
  for (int k = 0, region_id = 1; (1 << k) < n2; ++k, ++region_id) {
    Xfer x = whole(p ^ (1 << k), static_cast<uint64_t>(region_id), true);
    x.after_recvs = last;
    const uint32_t xi = b.xfer(x);
    Recv r = whole_recv(p ^ (1 << k), static_cast<uint64_t>(region_id), true);
    r.reduce_after_xfer = static_cast<int32_t>(xi);  // our step-k store must leave with the value before it
    last = {b.recv(r)};
  }
  if (p < extras) {
    Xfer x = whole(p + n2, 0, false);
    x.after_recvs = last;
    b.xfer(x);
  }
}

// One-shot: every rank stores its buffer into every other rank's staging region for it, and each rank sums all n
// in rank order (fp32 accumulation, one rounding): bitwise the same result everywhere, one hop of latency.
void build_oneshot(Builder& b, Communicator& comm) {
  const int n = b.n, p = b.p;
  b.s.name = "one-shot allreduce";
  const uint64_t bytes = b.a.count * b.esize;
  const uint64_t region = align8(bytes);
  for (int q = 0; q < n; ++q) {
    if (q == p) {
      continue;
    }
    Xfer x;
    x.peer = b.gpu(q);
    x.src_window = b.a.window;
    x.src_offset = b.a.offset;
    x.dst_window = b.a.scratch_window;
    x.dst_offset = static_cast<uint64_t>(p) * region;
    x.len = static_cast<uint32_t>(bytes);
    b.xfer(x);
    Recv r;
    r.peer = b.gpu(q);
    r.window = b.a.scratch_window;
    r.offset = static_cast<uint64_t>(q) * region;
    r.len = static_cast<uint32_t>(bytes);
    b.recv(r);
  }
  const CollArgs a = b.a;
  endpoint::Endpoint* ep = &comm.endpoint();
  b.s.finalize = [a, n, p, region, ep] {
    uint8_t* buf = ep->memory().window(a.window)->data + a.offset;
    const uint8_t* scratch = ep->memory().window(a.scratch_window)->data;
    std::vector<common::Acc> acc(a.count);
    for (int q = 0; q < n; ++q) {
      common::accumulate(a.dtype, a.op, acc.data(), q == p ? buf : scratch + q * region, a.count, q == 0);
    }
    common::finalize(a.dtype, acc.data(), buf, a.count);
  };
}

// Pipelined chain from the root: each rank forwards slice k as soon as it arrived.
void build_chain(Builder& b) {
  const int n = b.n, p = b.p;
  b.s.name = "chain broadcast";
  const int root = b.a.root;
  const int pos = (p - root + n) % n;
  const std::vector<Slice> all = b.slices(0, b.a.count);
  std::vector<uint32_t> in;
  if (pos > 0) {
    for (const Slice& sl : all) {
      in.push_back(b.recv(b.slice_recv(p - 1, sl, 0, false)));
    }
  }
  if (pos < n - 1) {
    for (size_t k = 0; k < all.size(); ++k) {
      Xfer x = b.slice_xfer(p + 1, all[k], 0, false);
      if (pos > 0) {
        x.after_recvs = {in[k]};
      }
      b.xfer(x);
    }
  }
}

// Dissemination: in round r rank p signals p + 2^r and waits for p - 2^r; round r + 1 starts once round r's signal
// arrived.
void build_barrier(Builder& b) {
  const int n = b.n, p = b.p;
  b.s.name = "dissemination barrier";
  b.s.signal = 1;
  std::vector<uint32_t> last;
  for (int r = 0, d = 1; d < n; ++r, d *= 2) {
    Xfer x;
    x.peer = b.gpu(p + d);
    x.src = reinterpret_cast<const uint8_t*>(&b.s.signal);  // patched to the run's copy (Run::Run)
    x.dst_window = b.a.scratch_window;
    x.dst_offset = static_cast<uint64_t>(r) * 8;
    x.len = 8;
    x.after_recvs = last;
    b.xfer(x);
    Recv rv;
    rv.peer = b.gpu(p - d);
    rv.window = b.a.scratch_window;
    rv.offset = static_cast<uint64_t>(r) * 8;
    rv.len = 8;
    last = {b.recv(rv)};
  }
}

}  // namespace

Schedule build(Communicator& comm, const CollArgs& a, Algo algo) {
  Builder b(a, comm.gpus(), comm.rank());
  switch (a.kind) {
    case Collective::kBarrier:
      build_barrier(b);
      break;
    case Collective::kMulticast:
      build_chain(b);
      break;
    case Collective::kAllReduce:
      if (algo == Algo::kTree) {
        build_tree(b);
      } else if (algo == Algo::kRd) {
        build_rd(b);
      } else if (algo == Algo::kOneShot) {
        build_oneshot(b, comm);
      } else {
        build_ring(b);
      }
      break;
    default:
      build_ring(b);  // reduce, reduce-scatter, all-gather: ring
      break;
  }
  return std::move(b.s);
}

uint64_t scratch_bytes(const CollArgs& a, int n, Algo algo) {
  const uint64_t bytes = a.count * element_size(a.dtype);
  const uint64_t max_block = (a.count + n - 1) / n * element_size(a.dtype);
  const uint64_t words = kSignalWords * 8;
  switch (a.kind) {
    case Collective::kBarrier:
      return words;
    case Collective::kMulticast:
    case Collective::kAllGather:
      return words;
    default:
      break;
  }
  switch (algo) {
    case Algo::kTree:
      return 2 * kRingSlots * std::min(kRingSliceBytes, align8(bytes)) + words;
    case Algo::kRd: {
      int steps = 1;
      for (int d = 1; d * 2 <= n; d *= 2) {
        ++steps;
      }
      return static_cast<uint64_t>(steps) * align8(bytes) + words;
    }
    case Algo::kOneShot:
      return static_cast<uint64_t>(n) * align8(bytes) + words;
    default:
      return kRingSlots * std::min(kRingSliceBytes, align8(max_block)) + words;
  }
}

// ----------------------------------------------------------------------------------------------------- Run --

Run::Run(Communicator& comm, Schedule s) : comm_(comm), s_(std::move(s)), alive_(std::make_shared<bool>(true)) {
  const size_t nx = s_.xfers.size();
  const size_t nr = s_.recvs.size();
  waiting_.assign(nx, 0);
  after_recv_.assign(nr, {});
  after_xfer_.assign(nx, {});
  reduce_waits_.assign(nx, {});
  xfer_posted_.assign(nx, 0);
  xfer_done_.assign(nx, 0);
  landed_.assign(nr, 0);
  recv_landed_.assign(nr, 0);
  recv_done_.assign(nr, 0);
  for (uint32_t x = 0; x < nx; ++x) {
    Xfer& xf = s_.xfers[x];
    if (xf.src != nullptr) {
      xf.src = reinterpret_cast<const uint8_t*>(&s_.signal);  // the schedule's own signal word, wherever it lives
    }
    for (uint32_t r : xf.after_recvs) {
      after_recv_.at(r).push_back(x);
      ++waiting_[x];
    }
    if (xf.after_xfer >= 0) {
      after_xfer_.at(xf.after_xfer).push_back(x);
      ++waiting_[x];
    }
  }
  slot_queue_.assign(s_.slots * 2, {});  // trees use two regions of slots
  slot_cursor_.assign(slot_queue_.size(), 0);
  for (uint32_t r = 0; r < nr; ++r) {
    const Recv& rv = s_.recvs[r];
    if (rv.slot >= 0) {
      slot_queue_.at(rv.slot).push_back(r);
    } else {
      by_offset_[{rv.window, rv.offset}] = r;
    }
    if (rv.reduce_after_xfer >= 0) {
      reduce_waits_.at(rv.reduce_after_xfer).push_back(r);
    }
  }
}

void Run::start(Finished done) {
  done_ = std::move(done);
  for (uint32_t x = 0; x < s_.xfers.size() && !over_; ++x) {
    if (waiting_[x] == 0) {
      post(x);
    }
  }
  check_done();
}

void Run::post(uint32_t x) {
  const Xfer& xf = s_.xfers[x];
  endpoint::Endpoint& ep = comm_.endpoint();
  const uint8_t* src = xf.src != nullptr ? xf.src : ep.memory().window(xf.src_window)->data + xf.src_offset;
  endpoint::OpHandle h = ep.store(xf.peer, xf.dst_window, xf.dst_offset, src, xf.len);
  xfer_posted_[x] = 1;
  std::weak_ptr<bool> alive = alive_;
  common::Clock& clock = comm_.clock();
  auto done = [this, &clock, alive, x](const endpoint::OpState& st) {
    // A store may complete after its run was abandoned and destroyed: touch nothing of the run until `alive` says
    // it is still there (the clock outlives every run).
    const bool ok = st.ok();
    const std::string error = st.error;
    clock.schedule(clock.now(), [this, alive, x, ok, error] {
      if (auto a = alive.lock(); a && *a && !over_) {
        xfer_done(x, ok, error);
      }
    });
  };
  if (h->done()) {
    done(*h);  // invalid arguments complete before the call returns
  } else {
    h->on_done = done;
  }
  posted(x);
}

// Reduces that waited for this store to leave with the old value can run now.
void Run::posted(uint32_t x) {
  for (uint32_t r : reduce_waits_[x]) {
    if (recv_landed_[r] && !recv_done_[r]) {
      complete(r);
    }
  }
}

void Run::xfer_done(uint32_t x, bool ok, const std::string& error) {
  if (!ok) {
    const Xfer& xf = s_.xfers[x];
    fail("store of " + std::to_string(xf.len) + " B to GPU " + std::to_string(xf.peer) + " failed: " + error);
    return;
  }
  xfer_done_[x] = 1;
  ++xfers_done_;
  release(after_xfer_[x]);
  check_done();
}

void Run::release(const std::vector<uint32_t>& xfers) {
  for (uint32_t x : xfers) {
    if (--waiting_[x] == 0 && !over_) {
      post(x);
    }
  }
}

// Every packet landing in this rank's memory during the run, from inside the responder's execution of it.
bool Run::on_remote_write(int peer, uint16_t window, uint64_t offset, uint64_t len) {
  if (over_) {
    return false;
  }
  if (s_.slots > 0 && window == s_.slot_window && offset >= s_.slot_base &&
      offset < s_.slot_base + slot_queue_.size() * s_.slot_bytes) {
    const size_t slot = (offset - s_.slot_base) / s_.slot_bytes;
    const auto& q = slot_queue_[slot];
    return slot_cursor_[slot] < q.size() && arrived(q[slot_cursor_[slot]], len, peer);
  }
  auto it = by_offset_.upper_bound({window, offset});
  if (it == by_offset_.begin()) {
    return false;
  }
  --it;
  const Recv& rv = s_.recvs[it->second];
  return it->first.first == window && offset < rv.offset + rv.len && arrived(it->second, len, peer);
}

bool Run::arrived(uint32_t r, uint64_t len, int peer) {
  const Recv& rv = s_.recvs[r];
  if (peer != rv.peer || recv_landed_[r]) {
    return false;  // not this run's message (another sender, or an earlier run's late bytes)
  }
  landed_[r] += static_cast<uint32_t>(len);
  if (landed_[r] > rv.len) {
    fail("GPU " + std::to_string(peer) + " wrote " + std::to_string(landed_[r]) + " B where " + std::to_string(rv.len) +
         " were expected");
    return true;
  }
  if (landed_[r] < rv.len) {
    return true;
  }
  recv_landed_[r] = 1;
  if (rv.reduce_after_xfer < 0 || xfer_posted_[rv.reduce_after_xfer]) {
    complete(r);
  }
  return true;
}

// The reduce runs right here, inside the arrival of the message's last packet: its slot is consumed before the
// ACK that lets the sender reuse it is even sent. Only the stores it unlocks are deferred.
void Run::complete(uint32_t r) {
  const Recv& rv = s_.recvs[r];
  if (rv.reduce) {
    reduce(r);
  }
  recv_done_[r] = 1;
  ++recvs_done_;
  if (rv.slot >= 0) {
    ++slot_cursor_[rv.slot];
  }
  std::weak_ptr<bool> alive = alive_;
  comm_.clock().schedule(comm_.clock().now(), [this, alive, r] {
    if (auto a = alive.lock(); a && *a && !over_) {
      release(after_recv_[r]);
      check_done();
    }
  });
}

void Run::reduce(uint32_t r) {
  if (comm_.endpoint().config().elided_payloads) {
    return;  // timing only: nothing arrived to add (the reduction's time is not the host's arithmetic)
  }
  const Recv& rv = s_.recvs[r];
  endpoint::SymmetricMemory& mem = comm_.endpoint().memory();
  uint8_t* into = mem.window(s_.buffer_window)->data + rv.reduce_offset;
  const uint8_t* from = mem.window(rv.window)->data + rv.offset;
  common::reduce_into(s_.dtype, s_.op, into, from, rv.len / element_size(s_.dtype));
}

void Run::check_done() {
  if (over_ || xfers_done_ < s_.xfers.size() || recvs_done_ < s_.recvs.size()) {
    return;
  }
  over_ = true;
  *alive_ = false;
  if (s_.finalize) {
    s_.finalize();
  }
  done_(true, "");
}

void Run::fail(const std::string& why) {
  if (over_) {
    return;
  }
  over_ = true;
  *alive_ = false;
  done_(false, s_.name + ": " + why);
}

std::string Run::describe_stuck() const {
  std::ostringstream os;
  for (uint32_t r = 0; r < s_.recvs.size(); ++r) {
    if (!recv_done_[r]) {
      const Recv& rv = s_.recvs[r];
      os << "waiting for " << rv.len << " B from GPU " << rv.peer << " at window " << rv.window << " offset "
         << rv.offset << " (" << landed_[r] << " landed)";
      return os.str();
    }
  }
  size_t posted = 0;
  for (char c : xfer_posted_) {
    posted += c;
  }
  os << (posted - xfers_done_) << " store(s) in flight, " << (s_.xfers.size() - posted) << " not yet posted";
  return os.str();
}

}  // namespace ifec::workloads::schedule

namespace ifec::workloads {

namespace {

// An endpoint-based collective: one schedule run.
class ScheduleOp : public CommOp {
 public:
  ScheduleOp(Communicator& c, const CollArgs& a, Algo algo, Communicator::Done done)
      : CommOp(c, std::move(done)), run_(c, schedule::build(c, a, algo)) {
    res_.algo = run_.schedule().name;
  }
  // Completion is counted in landed bytes. A peer may start first: its stores that landed before this rank's
  // operation existed were kept by the communicator and count here. But bytes cannot tell a late store of an earlier,
  // failed operation from one of this one: after a failure, every rank first waits until its own earlier stores
  // completed (landed or failed), then meets the others at a bootstrap barrier, and drops what landed before it
  // (every rank sees the failure: the time limit fires everywhere); what lands after it is this operation's. Ranks
  // hear the barrier end each in its own time (the live bootstrap answers each over gRPC), so a second barrier
  // follows, which no rank leaves before every rank has stopped dropping: a rank that started at once after the
  // first had its first stores dropped at a peer that had not yet heard it end (acknowledged, so never resent: the
  // live fabric's next operation after a failure hung on two busy cores). The barriers cost no simulated time.
  void start() override {
    if (!comm_.take_fence()) {
      begin_run();  // the communicator offers the kept arrivals next
      return;
    }
    fenced_ = true;
    watch(comm_.endpoint().quiet(), [this](bool, const std::string&) {
      gather({}, [this](Gathered) {
        comm_.take_early_arrivals();
        past_barrier_ = true;
        gather({}, [this](Gathered) {
          defer([this] {
            begin_run();
            for (const Communicator::Arrival& a : std::exchange(after_barrier_, {})) {
              run_.on_remote_write(a.peer, a.window, a.offset, a.len);
            }
          });
        });
      });
    });
  }
  bool on_remote_write(int peer, uint16_t window, uint64_t offset, uint64_t len) override {
    if (started_) {
      return run_.on_remote_write(peer, window, offset, len);
    }
    if (past_barrier_) {
      after_barrier_.push_back({peer, window, offset, len});  // a peer that passed the barrier first
    }
    return true;  // before the barrier: a failed operation's late store, dropped
  }
  std::string describe_stuck() const override {
    return started_ ? run_.describe_stuck() : "waiting for the other ranks at the entry barrier";
  }

 private:
  void begin_run() {
    started_ = true;
    run_.start([this](bool ok, const std::string& error) {
      if (ok) {
        succeed();
      } else {
        fail(error);
      }
    });
  }

  schedule::Run run_;
  bool started_ = false;
  bool past_barrier_ = false;
  std::vector<Communicator::Arrival> after_barrier_;
};

}  // namespace

std::shared_ptr<CommOp> make_schedule_op(Communicator& c, const CollArgs& a, Algo algo, Communicator::Done done) {
  return std::make_shared<ScheduleOp>(c, a, algo, std::move(done));
}

}  // namespace ifec::workloads
