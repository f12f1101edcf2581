// Endpoint-based collectives: ring allreduce / reduce, chain multicast and dissemination barrier as event-driven
// state machines over RC stores (the baseline in-fabric aggregation is measured against, and its fallback path),
// plus the spec helpers shared with the in-fabric path.
//
// Step signalling has RDMA WRITE WITH IMMEDIATE semantics, as NCCL's IB/RoCE transport uses: the receiver learns
// that a slice is complete from its own NIC, by counting the bytes that landed in the slice's destination range,
// so a ring hop costs one one-way trip. (A put_signal would wait for the data's ACK before sending the signal:
// two round trips per hop.) Counting is exact because the responder places every packet of a store once: weak
// QPs drop duplicates by PSN, ordered QPs drop anything behind the expected PSN (qp.cpp, on_request), and the
// remote-write hook runs only when a request executes.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include "ifec/common/checks.h"
#include "ifec/common/numeric.h"
#include "ifec/workloads/cluster.h"
#include "ifec/workloads/collectives.h"

namespace ifec::workloads {

using common::EchDtype;
using common::TimeNs;
using endpoint::OpHandle;
using endpoint::OpState;
using endpoint::OpStatus;

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "allreduce";
    case Collective::kReduce:
      return "reduce";
    case Collective::kMulticast:
      return "multicast";
    case Collective::kBarrier:
      return "barrier";
  }
  return "unknown";
}

Collective parse_collective(const std::string& name) {
  for (Collective c : {Collective::kAllReduce, Collective::kReduce, Collective::kMulticast, Collective::kBarrier}) {
    if (name == collective_name(c)) {
      return c;
    }
  }
  IFEC_FAIL("unknown collective '" << name << "' (expected allreduce, reduce, multicast or barrier)");
}

size_t element_size(EchDtype t) {
  const size_t s = common::ech_dtype_size(t);
  IFEC_CHECK(s != 0, "unknown dtype " << static_cast<int>(t));
  return s;
}

namespace {

// A slice is the unit one store moves: large buffers stream through the ring in 64 KiB pieces (NCCL-like), so a
// member forwards slice k of a block as soon as it arrived instead of waiting for the whole block.
constexpr uint64_t kSliceBytes = 64 * 1024;
// Messages in flight per ring link: each has its own staging slot, reused only after the store that last used it
// completed (see Run::on_remote_write for why the receiver has consumed it by then). A store completes one round
// trip (~2.4 us unloaded on the SuperPoD) plus its queueing after it was posted; 64 x 64 KiB (4 MiB, ~10 us of a
// 400 GB/s GPU's output) covers that with room for the queueing behind the data posted after it.
constexpr uint64_t kSlots = 64;
constexpr uint64_t kBarrierWords = 64;  // one per dissemination round: 2^64 members is plenty

// Where things live in the scratch window (the same on every member).
struct Layout {
  uint64_t slot_bytes = 0;    // staging slot (reduce-scatter only; the other phases write the buffer directly)
  uint64_t barrier_base = 0;  // kBarrierWords round words
  uint64_t total = 0;
};

bool uses_staging(Collective c) { return c == Collective::kAllReduce || c == Collective::kReduce; }

Layout layout_for(const CollectiveSpec& spec) {
  const uint64_t n = std::max<uint64_t>(spec.members.size(), 1);
  Layout l;
  if (uses_staging(spec.kind)) {
    const uint64_t max_block = (spec.count + n - 1) / n * element_size(spec.dtype);
    l.slot_bytes = std::min(kSliceBytes, (max_block + 7) / 8 * 8);  // 8-aligned so the barrier words are too
  }
  l.barrier_base = kSlots * l.slot_bytes;
  l.total = l.barrier_base + kBarrierWords * 8;
  return l;
}

// First element of block b when `count` elements are split into n nearly equal blocks (floor(count * b / n)
// without overflowing).
uint64_t block_begin(uint64_t count, uint64_t n, uint64_t b) { return count / n * b + count % n * b / n; }

enum class Phase : uint8_t { kReduceScatter, kAllGather, kGather, kChain };

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kReduceScatter:
      return "reduce-scatter";
    case Phase::kAllGather:
      return "allgather";
    case Phase::kGather:
      return "gather";
    case Phase::kChain:
      return "chain";
  }
  return "?";
}

// One store of one slice. The bytes sit at the same buffer offset on sender and receiver.
struct Msg {
  Phase phase = Phase::kReduceScatter;
  int step = 0;
  int block = 0;
  uint32_t slice = 0;     // within the block
  uint64_t byte_off = 0;  // from the buffer start
  uint32_t len = 0;
  int unlock_ring = -1;    // the receiver's ring message this arrival makes ready
  int unlock_gather = -1;  // the receiver's gather message this arrival makes ready
  bool ready = false;
  bool done = false;
};

// A message a member receives straight into its buffer (allgather, chain, gather), and its bytes landed so far.
struct InRange {
  uint64_t off = 0;  // from the buffer start
  uint32_t len = 0;
  uint32_t landed = 0;
  int from = -1;        // sender position
  bool gather = false;  // the sender's gather_out (else its ring_out)
  uint32_t index = 0;   // in that list
};

struct HookSlot;

struct Member {
  int gpu = 0;
  int pos = 0;
  int next = -1;  // position this member sends ring / chain messages to
  int prev = -1;  // position whose ring_out arrives here
  uint8_t* buf = nullptr;
  uint8_t* scratch = nullptr;
  std::vector<Msg> ring_out;             // in sequence order (seq = index)
  std::vector<size_t> rs_base, ag_base;  // index of each step's first message in ring_out
  size_t ring_posted = 0;
  size_t ring_done = 0;
  std::vector<char> ring_seen;  // per seq of prev's ring_out
  size_t ring_seen_count = 0;
  // Reduce-scatter arrivals: prev's ring_out[0, rs_in) land in the staging slots, seq s in slot s % kSlots. A
  // slot holds one message at a time (the sender's slot rule), so the bytes landing in slot k belong to
  // slot_seq[k], the oldest of prev's messages for that slot this member has not consumed.
  size_t rs_in = 0;
  std::vector<size_t> slot_seq;
  std::vector<uint32_t> slot_landed;
  std::vector<InRange> in_ranges;  // sorted by offset, disjoint
  std::vector<Msg> gather_out;     // reduce: this member's block to the root
  size_t gather_done = 0;
  uint64_t gather_expected = 0;  // root: slices the others send it
  uint64_t gather_got = 0;       // root: of those, fully landed
  bool gather_complete = true;
  std::shared_ptr<HookSlot> slot;  // this member's endpoint's hook
  int rounds = 0;                  // barrier
  int rounds_done = 0;
  int rounds_sent = 0;
  std::vector<char> round_seen;
  size_t barrier_done = 0;  // barrier stores completed
  bool finished = false;
};

class Run;

// What the endpoint's (never removable) remote-write hook forwards to: the run in progress, if any. Also counts
// the stores and barrier words this endpoint posted for endpoint collectives that have not completed: a run that
// failed or timed out may leave some in flight, and the next run waits for them (see run_endpoint_collective).
struct HookSlot {
  Run* run = nullptr;
  int pos = -1;
  uint64_t in_flight = 0;
};

// One hook per endpoint for the endpoint's lifetime. The hook owns its slot; the registry only observes it, so an
// endpoint destroyed and another allocated at the same address gets a fresh hook. Without `create`, returns null
// for an endpoint that has none.
std::shared_ptr<HookSlot> hook_slot(endpoint::Endpoint& ep, bool create = true);

class Run : public std::enable_shared_from_this<Run> {
 public:
  Run(Cluster& cluster, const CollectiveSpec& spec, uint32_t gen)
      : cluster_(cluster),
        loop_(cluster.loop()),
        spec_(spec),
        lay_(layout_for(spec)),
        esize_(element_size(spec.dtype)),
        gen_(gen),
        n_(static_cast<int>(spec.members.size())) {}

  void build();
  void start();
  void on_remote_write(int pos, int peer, uint16_t window, uint64_t offset, uint64_t len);

  bool done() const { return finished_ == n_; }
  bool failed() const { return failed_; }
  const std::string& error() const { return error_; }
  TimeNs end_ns() const { return end_ns_; }
  std::string describe_stuck() const;
  std::string what() const;

 private:
  using Completion = void (Run::*)(int pos, size_t index, OpStatus status, const std::string& error);

  int root_pos() const;
  uint64_t sig_value(uint64_t seq) const { return (static_cast<uint64_t>(gen_) << 32) | (seq + 1); }
  void add_block_slices(Phase phase, int step, int block, std::vector<Msg>* out) const;
  void link_unlocks();
  void pump(Member& m);
  void post_gather(Member& m, size_t index);
  void send_round(Member& m, int round);
  void watch(const OpHandle& h, Completion fn, int pos, size_t index);
  void ring_sent(int pos, size_t seq, OpStatus status, const std::string& error);
  void gather_sent(int pos, size_t index, OpStatus status, const std::string& error);
  void round_sent(int pos, size_t round, OpStatus status, const std::string& error);
  void landed_in_slot(Member& m, int peer, uint64_t offset, uint64_t len);
  void landed_in_buffer(Member& m, int peer, uint64_t offset, uint64_t len);
  void ring_arrived(int pos, size_t seq);
  void gather_arrived(int pos);
  void round_arrived(int pos, int peer, int round, uint64_t value);
  void advance_barrier(Member& m);
  void check_finished(Member& m);
  void fail(const std::string& why);
  std::string describe(const Msg& msg) const;
  std::string describe(const Member& m) const;
  void link_arrivals();
  // Runs `fn` as its own event at the current time: callbacks come from inside the endpoint's receive and
  // completion paths, and posting new transactions from there would re-enter it.
  template <typename Fn>
  void defer(Fn fn) {
    std::weak_ptr<Run> w = weak_from_this();
    loop_.schedule(loop_.now(), [w, fn = std::move(fn)] {
      if (auto r = w.lock(); r && !r->failed_) {
        fn(*r);
      }
    });
  }

  Cluster& cluster_;
  common::EventLoop& loop_;
  CollectiveSpec spec_;
  Layout lay_;
  size_t esize_;
  uint32_t gen_;
  int n_;
  std::vector<Member> m_;
  int finished_ = 0;
  bool failed_ = false;
  std::string error_;
  TimeNs end_ns_ = 0;
};

std::shared_ptr<HookSlot> hook_slot(endpoint::Endpoint& ep, bool create) {
  static std::mutex mu;
  static std::map<const endpoint::Endpoint*, std::weak_ptr<HookSlot>> registry;
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = registry.begin(); it != registry.end();) {
    it = it->second.expired() ? registry.erase(it) : std::next(it);
  }
  if (auto it = registry.find(&ep); it != registry.end()) {
    if (auto s = it->second.lock()) {
      return s;
    }
  }
  if (!create) {
    return nullptr;
  }
  auto s = std::make_shared<HookSlot>();
  ep.on_remote_write([s](int peer, uint16_t window, uint64_t offset, uint64_t len) {
    if (s->run != nullptr) {
      s->run->on_remote_write(s->pos, peer, window, offset, len);
    }
  });
  registry[&ep] = s;
  return s;
}

int Run::root_pos() const {
  return static_cast<int>(std::find(spec_.members.begin(), spec_.members.end(), spec_.root) - spec_.members.begin());
}

std::string Run::what() const {
  std::ostringstream os;
  os << "endpoint " << collective_name(spec_.kind) << " (" << n_ << " members";
  if (spec_.kind != Collective::kBarrier) {
    os << ", " << spec_.count << " x " << common::ech_dtype_name(spec_.dtype);
    if (uses_staging(spec_.kind)) {
      os << " " << common::ech_redop_name(spec_.op);
    }
  }
  os << ")";
  return os.str();
}

void Run::add_block_slices(Phase phase, int step, int block, std::vector<Msg>* out) const {
  const uint64_t first = block_begin(spec_.count, n_, block);
  const uint64_t last = block_begin(spec_.count, n_, block + 1);
  const uint64_t per_slice = kSliceBytes / esize_;
  uint32_t k = 0;
  for (uint64_t e = first; e < last; e += per_slice, ++k) {
    Msg msg;
    msg.phase = phase;
    msg.step = step;
    msg.block = block;
    msg.slice = k;
    msg.byte_off = e * esize_;
    msg.len = static_cast<uint32_t>(std::min(per_slice, last - e) * esize_);
    out->push_back(msg);
  }
}

void Run::build() {
  m_.resize(n_);
  const int root = root_pos();
  for (int p = 0; p < n_; ++p) {
    Member& m = m_[p];
    m.gpu = spec_.members[p];
    m.pos = p;
    m.slot = hook_slot(cluster_.ep(m.gpu));
    m.scratch = cluster_.window_data(m.gpu, spec_.scratch_window);
    if (spec_.kind != Collective::kBarrier) {
      m.buf = cluster_.window_data(m.gpu, spec_.window) + spec_.offset;
    }
  }
  switch (spec_.kind) {
    case Collective::kAllReduce:
    case Collective::kReduce: {
      for (int p = 0; p < n_; ++p) {
        Member& m = m_[p];
        m.next = (p + 1) % n_;
        m.prev = (p + n_ - 1) % n_;
        // Reduce-scatter: step s sends block p - s; after N-1 steps member p holds block p + 1 reduced.
        for (int s = 0; s < n_ - 1; ++s) {
          m.rs_base.push_back(m.ring_out.size());
          add_block_slices(Phase::kReduceScatter, s, (p - s + n_) % n_, &m.ring_out);
        }
        if (spec_.kind == Collective::kAllReduce) {
          // Allgather: step t forwards block p + 1 - t straight into the next member's buffer.
          for (int t = 0; t < n_ - 1; ++t) {
            m.ag_base.push_back(m.ring_out.size());
            add_block_slices(Phase::kAllGather, t, (p + 1 - t + n_) % n_, &m.ring_out);
          }
        } else if (p != root) {
          // Reduce is in place too: the others' buffers are left holding partial reductions.
          add_block_slices(Phase::kGather, 0, (p + 1) % n_, &m.gather_out);
        }
        for (size_t i = 0;
             i < m.ring_out.size() && m.ring_out[i].step == 0 && m.ring_out[i].phase == Phase::kReduceScatter; ++i) {
          m.ring_out[i].ready = true;  // own data
        }
      }
      if (spec_.kind == Collective::kReduce) {
        m_[root].gather_complete = false;
        for (int p = 0; p < n_; ++p) {
          m_[root].gather_expected += m_[p].gather_out.size();
        }
        if (m_[root].gather_expected == 0) {
          m_[root].gather_complete = true;
        }
      }
      break;
    }
    case Collective::kMulticast: {
      for (int i = 0; i < n_; ++i) {
        const int p = (root + i) % n_;
        Member& m = m_[p];
        m.prev = i == 0 ? -1 : (p + n_ - 1) % n_;
        m.next = i == n_ - 1 ? -1 : (p + 1) % n_;
        if (m.next >= 0) {
          // The whole buffer as one "block" of count elements.
          const uint64_t per_slice = kSliceBytes / esize_;
          uint32_t k = 0;
          for (uint64_t e = 0; e < spec_.count; e += per_slice, ++k) {
            Msg msg;
            msg.phase = Phase::kChain;
            msg.step = i;
            msg.slice = k;
            msg.byte_off = e * esize_;
            msg.len = static_cast<uint32_t>(std::min(per_slice, spec_.count - e) * esize_);
            msg.ready = i == 0;
            m.ring_out.push_back(msg);
          }
        }
      }
      break;
    }
    case Collective::kBarrier: {
      int rounds = 0;
      for (int d = 1; d < n_; d *= 2) {
        ++rounds;
      }
      for (Member& m : m_) {
        m.rounds = rounds;
        m.round_seen.assign(rounds, 0);
      }
      break;
    }
  }
  for (Member& m : m_) {
    if (m.prev >= 0) {
      m.ring_seen.assign(m_[m.prev].ring_out.size(), 0);
    }
  }
  link_unlocks();
  link_arrivals();
}

// Where each member's incoming messages land, so the remote-write hook can attribute every packet to one.
void Run::link_arrivals() {
  for (Member& m : m_) {
    if (m.prev >= 0) {
      const std::vector<Msg>& in = m_[m.prev].ring_out;
      while (m.rs_in < in.size() && in[m.rs_in].phase == Phase::kReduceScatter) {
        ++m.rs_in;
      }
      if (m.rs_in > 0) {
        m.slot_seq.resize(kSlots);
        for (uint64_t k = 0; k < kSlots; ++k) {
          m.slot_seq[k] = k;
        }
        m.slot_landed.assign(kSlots, 0);
      }
      for (size_t seq = m.rs_in; seq < in.size(); ++seq) {
        m.in_ranges.push_back({in[seq].byte_off, in[seq].len, 0, m.prev, false, static_cast<uint32_t>(seq)});
      }
    }
    for (const Member& from : m_) {
      if (from.pos != m.pos && !from.gather_out.empty() && spec_.members[m.pos] == spec_.root) {
        for (size_t i = 0; i < from.gather_out.size(); ++i) {
          const Msg& g = from.gather_out[i];
          m.in_ranges.push_back({g.byte_off, g.len, 0, from.pos, true, static_cast<uint32_t>(i)});
        }
      }
    }
    std::sort(m.in_ranges.begin(), m.in_ranges.end(), [](const InRange& a, const InRange& b) { return a.off < b.off; });
    for (size_t i = 1; i < m.in_ranges.size(); ++i) {
      // Each buffer byte is written at most once per run, which is what makes counting bytes per range exact.
      IFEC_CHECK(
          m.in_ranges[i - 1].off + m.in_ranges[i - 1].len <= m.in_ranges[i].off,
          what() << ": GPU " << m.gpu << " receives overlapping messages at buffer offset " << m.in_ranges[i].off);
    }
  }
}

// What each arrival enables at its receiver: the same slice of the same block one step later.
void Run::link_unlocks() {
  for (Member& s : m_) {
    if (s.next < 0) {
      continue;
    }
    Member& r = m_[s.next];
    for (Msg& msg : s.ring_out) {
      switch (msg.phase) {
        case Phase::kReduceScatter:
          if (msg.step + 1 < n_ - 1) {
            msg.unlock_ring = static_cast<int>(r.rs_base[msg.step + 1] + msg.slice);
          } else if (spec_.kind == Collective::kAllReduce) {
            msg.unlock_ring = static_cast<int>(r.ag_base[0] + msg.slice);
          } else if (!r.gather_out.empty()) {
            msg.unlock_gather = static_cast<int>(msg.slice);
          }
          break;
        case Phase::kAllGather:
          if (msg.step + 1 < n_ - 1) {
            msg.unlock_ring = static_cast<int>(r.ag_base[msg.step + 1] + msg.slice);
          }
          break;
        case Phase::kChain:
          if (r.next >= 0) {
            msg.unlock_ring = static_cast<int>(msg.slice);
          }
          break;
        case Phase::kGather:
          break;
      }
    }
  }
}

void Run::start() {
  for (Member& m : m_) {
    if (spec_.kind == Collective::kBarrier && m.rounds > 0) {
      send_round(m, 0);
    }
    pump(m);
    if (failed_) {
      return;
    }
  }
  for (Member& m : m_) {
    check_finished(m);  // members with nothing to do (count 0, empty blocks)
  }
}

void Run::watch(const OpHandle& h, Completion fn, int pos, size_t index) {
  if (h->done()) {
    // Invalid arguments complete before the call returns.
    const OpStatus status = h->status;
    const std::string error = h->error;
    defer([fn, pos, index, status, error](Run& r) { (r.*fn)(pos, index, status, error); });
    return;
  }
  // Counted until it completes, even if this run is gone by then (weakly: the slot belongs to the endpoint).
  ++m_[pos].slot->in_flight;
  std::weak_ptr<HookSlot> slot = m_[pos].slot;
  std::weak_ptr<Run> w = weak_from_this();
  h->on_done = [w, slot, fn, pos, index](const OpState& st) {
    if (auto s = slot.lock()) {
      --s->in_flight;
    }
    if (auto r = w.lock()) {
      const OpStatus status = st.status;
      const std::string error = st.error;
      r->defer([fn, pos, index, status, error](Run& run) { (run.*fn)(pos, index, status, error); });
    }
  };
}

// Posts ring messages in sequence order while the next one is ready and its slot is free.
void Run::pump(Member& m) {
  endpoint::Endpoint& ep = cluster_.ep(m.gpu);
  while (!failed_ && m.ring_posted < m.ring_out.size()) {
    const size_t seq = m.ring_posted;
    Msg& msg = m.ring_out[seq];
    if (!msg.ready || (seq >= kSlots && !m.ring_out[seq - kSlots].done)) {
      return;
    }
    const uint64_t slot = seq % kSlots;
    const bool staged = msg.phase == Phase::kReduceScatter;
    const uint16_t dst_window = staged ? spec_.scratch_window : spec_.window;
    const uint64_t dst_off = staged ? slot * lay_.slot_bytes : spec_.offset + msg.byte_off;
    OpHandle h = ep.store(m_[m.next].gpu, dst_window, dst_off, m.buf + msg.byte_off, msg.len);
    ++m.ring_posted;
    watch(h, &Run::ring_sent, m.pos, seq);
  }
}

void Run::post_gather(Member& m, size_t index) {
  const Msg& msg = m.gather_out[index];
  OpHandle h =
      cluster_.ep(m.gpu).store(spec_.root, spec_.window, spec_.offset + msg.byte_off, m.buf + msg.byte_off, msg.len);
  watch(h, &Run::gather_sent, m.pos, index);
}

void Run::send_round(Member& m, int round) {
  const Member& to = m_[(m.pos + (1 << round)) % n_];
  const uint64_t value = sig_value(static_cast<uint64_t>(round));
  OpHandle h = cluster_.ep(m.gpu).store(to.gpu, spec_.scratch_window,
                                        lay_.barrier_base + static_cast<uint64_t>(round) * 8, &value, 8);
  m.rounds_sent = round + 1;
  watch(h, &Run::round_sent, m.pos, static_cast<size_t>(round));
}

void Run::fail(const std::string& why) {
  if (!failed_) {
    failed_ = true;
    error_ = what() + ": " + why;
    end_ns_ = loop_.now();
  }
}

void Run::ring_sent(int pos, size_t seq, OpStatus status, const std::string& error) {
  Member& m = m_[pos];
  if (status != OpStatus::kOk) {
    fail("GPU " + std::to_string(m.gpu) + " -> GPU " + std::to_string(m_[m.next].gpu) + ": " +
         describe(m.ring_out[seq]) + " failed: " + endpoint::op_status_name(status) + " " + error);
    return;
  }
  m.ring_out[seq].done = true;
  ++m.ring_done;
  pump(m);
  check_finished(m);
}

void Run::gather_sent(int pos, size_t index, OpStatus status, const std::string& error) {
  Member& m = m_[pos];
  if (status != OpStatus::kOk) {
    fail("GPU " + std::to_string(m.gpu) + " -> root GPU " + std::to_string(spec_.root) + ": " +
         describe(m.gather_out[index]) + " failed: " + endpoint::op_status_name(status) + " " + error);
    return;
  }
  m.gather_out[index].done = true;
  ++m.gather_done;
  check_finished(m);
}

void Run::round_sent(int pos, size_t round, OpStatus status, const std::string& error) {
  Member& m = m_[pos];
  if (status != OpStatus::kOk) {
    fail("GPU " + std::to_string(m.gpu) + ": barrier round " + std::to_string(round) +
         " signal failed: " + endpoint::op_status_name(status) + " " + error);
    return;
  }
  ++m.barrier_done;
  check_finished(m);
}

// Called for every packet (or atomic) landing anywhere in this endpoint, from inside the responder's execution of
// the request: before it sends the ACK that covers the packet.
void Run::on_remote_write(int pos, int peer, uint16_t window, uint64_t offset, uint64_t len) {
  if (failed_) {
    return;
  }
  Member& m = m_[pos];
  if (window == spec_.window) {
    if (offset >= spec_.offset) {
      landed_in_buffer(m, peer, offset - spec_.offset, len);
    }
    return;
  }
  if (window != spec_.scratch_window) {
    return;
  }
  if (offset < lay_.barrier_base) {
    landed_in_slot(m, peer, offset, len);
    return;
  }
  if (len != 8 || offset % 8 != 0 || offset >= lay_.barrier_base + kBarrierWords * 8) {
    return;
  }
  uint64_t value;
  std::memcpy(&value, m.scratch + offset, 8);
  const int round = static_cast<int>((offset - lay_.barrier_base) / 8);
  defer([pos, peer, round, value](Run& r) { r.round_arrived(pos, peer, round, value); });
}

// Slot safety: the sender reuses slot k for message seq + kSlots only after the store of seq completed, i.e. after
// the ACKs of all its packets came back. The responder generates an ACK covering a packet only after executing it,
// and executing the packet that completes the slice calls this hook, which reduces the slice right here, in the
// same call, not in a deferred event. So the slot is consumed before the ACK that frees it is even sent, whatever
// the link latencies. (Only the unlocks, which post new stores, are deferred: posting from inside the responder
// would re-enter the endpoint.)
void Run::landed_in_slot(Member& m, int peer, uint64_t offset, uint64_t len) {
  if (m.rs_in == 0 || lay_.slot_bytes == 0 || peer != m_[m.prev].gpu) {
    return;  // no staging traffic expected here in this run
  }
  const uint64_t slot = offset / lay_.slot_bytes;
  const size_t seq = m.slot_seq[slot];
  const Member& from = m_[m.prev];
  if (seq >= m.rs_in || seq >= from.ring_posted) {
    // Nothing of this run may land in the slot now: the bytes would be counted toward a message not yet sent.
    fail("GPU " + std::to_string(m.gpu) + ": " + std::to_string(len) + " unexpected bytes from GPU " +
         std::to_string(peer) + " in staging slot " + std::to_string(slot) +
         " (left by an earlier run, or placed twice)");
    return;
  }
  const Msg& msg = from.ring_out[seq];
  const uint64_t start = slot * lay_.slot_bytes;
  m.slot_landed[slot] += static_cast<uint32_t>(len);
  if (offset + len > start + msg.len || m.slot_landed[slot] > msg.len) {
    fail("GPU " + std::to_string(m.gpu) + ": bytes from GPU " + std::to_string(peer) + " at scratch offset " +
         std::to_string(offset) + " overrun " + describe(msg) + " in staging slot " + std::to_string(slot));
    return;
  }
  if (m.slot_landed[slot] < msg.len) {
    return;
  }
  common::reduce_into(spec_.dtype, spec_.op, m.buf + msg.byte_off, m.scratch + start, msg.len / esize_);
  m.slot_landed[slot] = 0;
  m.slot_seq[slot] = seq + kSlots;
  const int pos = m.pos;
  defer([pos, seq](Run& r) { r.ring_arrived(pos, seq); });
}

// Allgather, chain and gather messages land in the buffer itself, each in its own range (link_arrivals).
void Run::landed_in_buffer(Member& m, int peer, uint64_t offset, uint64_t len) {
  auto it = std::upper_bound(m.in_ranges.begin(), m.in_ranges.end(), offset,
                             [](uint64_t o, const InRange& r) { return o < r.off; });
  if (it == m.in_ranges.begin()) {
    return;
  }
  InRange& r = *--it;
  if (offset >= r.off + r.len || peer != m_[r.from].gpu) {
    return;  // not a message of this run
  }
  r.landed += static_cast<uint32_t>(len);
  if (offset + len > r.off + r.len || r.landed > r.len) {
    fail("GPU " + std::to_string(m.gpu) + ": bytes from GPU " + std::to_string(peer) + " at buffer offset " +
         std::to_string(offset) + " overrun " +
         describe(r.gather ? m_[r.from].gather_out[r.index] : m_[r.from].ring_out[r.index]));
    return;
  }
  if (r.landed < r.len) {
    return;
  }
  const int pos = m.pos;
  if (r.gather) {
    defer([pos](Run& run) { run.gather_arrived(pos); });
  } else {
    const size_t seq = r.index;
    defer([pos, seq](Run& run) { run.ring_arrived(pos, seq); });
  }
}

void Run::ring_arrived(int pos, size_t seq) {
  Member& m = m_[pos];
  if (m.ring_seen[seq]) {
    return;
  }
  m.ring_seen[seq] = 1;
  ++m.ring_seen_count;
  const Msg& msg = m_[m.prev].ring_out[seq];
  if (msg.unlock_ring >= 0) {
    m.ring_out[msg.unlock_ring].ready = true;
    pump(m);
  }
  if (msg.unlock_gather >= 0) {
    post_gather(m, static_cast<size_t>(msg.unlock_gather));
  }
  check_finished(m);
}

void Run::gather_arrived(int pos) {
  Member& m = m_[pos];
  if (m.gather_complete) {
    return;
  }
  if (++m.gather_got >= m.gather_expected) {
    m.gather_complete = true;
    check_finished(m);
  }
}

void Run::round_arrived(int pos, int peer, int round, uint64_t value) {
  Member& m = m_[pos];
  if (round >= m.rounds || value != sig_value(static_cast<uint64_t>(round)) ||
      peer != m_[(pos - (1 << round) % n_ + n_) % n_].gpu || m.round_seen[round]) {
    return;
  }
  m.round_seen[round] = 1;
  advance_barrier(m);
}

// Dissemination: round r is complete when its signal arrived (it may come early); then send round r + 1.
void Run::advance_barrier(Member& m) {
  while (m.rounds_done < m.rounds && m.round_seen[m.rounds_done] && m.rounds_sent > m.rounds_done) {
    ++m.rounds_done;
    if (m.rounds_done < m.rounds) {
      send_round(m, m.rounds_done);
    }
  }
  check_finished(m);
}

void Run::check_finished(Member& m) {
  if (m.finished || failed_) {
    return;
  }
  const size_t in = m.prev >= 0 ? m_[m.prev].ring_out.size() : 0;
  if (m.ring_seen_count < in || m.ring_done < m.ring_out.size() || m.gather_done < m.gather_out.size() ||
      !m.gather_complete || m.rounds_done < m.rounds || m.barrier_done < static_cast<size_t>(m.rounds)) {
    return;
  }
  m.finished = true;
  if (++finished_ == n_) {
    end_ns_ = loop_.now();
  }
}

std::string Run::describe(const Msg& msg) const {
  std::ostringstream os;
  os << phase_name(msg.phase);
  if (msg.phase == Phase::kReduceScatter || msg.phase == Phase::kAllGather) {
    os << " step " << msg.step;
  }
  if (msg.phase != Phase::kChain) {
    os << " block " << msg.block;
  }
  os << " slice " << msg.slice;
  return os.str();
}

std::string Run::describe(const Member& m) const {
  std::ostringstream os;
  os << "GPU " << m.gpu << " (member " << m.pos << ") ";
  if (spec_.kind == Collective::kBarrier) {
    const int r = m.rounds_done;
    if (r < m.rounds && !m.round_seen[r]) {
      os << "waiting for the barrier round " << r << " signal from GPU " << m_[(m.pos - (1 << r) % n_ + n_) % n_].gpu;
    } else {
      os << "has barrier signals in flight";
    }
    return os.str();
  }
  if (m.prev >= 0 && m.ring_seen_count < m.ring_seen.size()) {
    const size_t seq = static_cast<size_t>(std::find(m.ring_seen.begin(), m.ring_seen.end(), 0) - m.ring_seen.begin());
    const Msg& msg = m_[m.prev].ring_out[seq];
    uint32_t landed = 0;
    if (seq < m.rs_in) {
      landed = m.slot_seq[seq % kSlots] == seq ? m.slot_landed[seq % kSlots] : 0;
    } else {
      for (const InRange& r : m.in_ranges) {
        landed = !r.gather && r.index == seq ? r.landed : landed;
      }
    }
    os << "waiting for " << describe(msg) << " from GPU " << m_[m.prev].gpu << " (" << landed << " of " << msg.len
       << " bytes landed)";
  } else if (m.ring_posted < m.ring_out.size()) {
    const Msg& msg = m.ring_out[m.ring_posted];
    os << "cannot send " << describe(msg) << " to GPU " << m_[m.next].gpu
       << (msg.ready ? " (staging slot still busy)" : " (its data has not arrived)");
  } else if (m.ring_done < m.ring_out.size() || m.gather_done < m.gather_out.size()) {
    os << (m.ring_out.size() - m.ring_done + m.gather_out.size() - m.gather_done) << " store(s) in flight";
  } else if (!m.gather_complete) {
    os << "gather at the root: " << m.gather_got << " of " << m.gather_expected << " slices arrived";
  } else {
    os << "is stuck";
  }
  return os.str();
}

std::string Run::describe_stuck() const {
  std::ostringstream os;
  int listed = 0;
  int stuck = 0;
  for (const Member& m : m_) {
    if (m.finished) {
      continue;
    }
    ++stuck;
    if (listed < 4) {
      os << (listed ? "; " : "") << describe(m);
      ++listed;
    }
  }
  if (stuck > listed) {
    os << "; and " << stuck - listed << " more member(s) unfinished";
  }
  return os.str();
}

// Sets each member's hook slot to this run for its duration (and clears it on every exit path).
class HookGuard {
 public:
  HookGuard(Cluster& cluster, const CollectiveSpec& spec, Run* run) {
    for (int g : spec.members) {
      slots_.push_back(hook_slot(cluster.ep(g)));
      IFEC_CHECK(slots_.back()->run == nullptr,
                 "GPU " << g << " is already running an endpoint collective (they do not nest)");
    }
    for (size_t p = 0; p < slots_.size(); ++p) {
      slots_[p]->run = run;
      slots_[p]->pos = static_cast<int>(p);
    }
  }
  ~HookGuard() {
    for (auto& s : slots_) {
      s->run = nullptr;
    }
  }
  HookGuard(const HookGuard&) = delete;
  HookGuard& operator=(const HookGuard&) = delete;

 private:
  std::vector<std::shared_ptr<HookSlot>> slots_;
};

uint32_t next_generation() {
  // Tags every barrier word, so words left in scratch by an earlier run never match.
  static std::mutex mu;
  static uint32_t gen = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (++gen == 0) {
    gen = 1;
  }
  return gen;
}

}  // namespace

uint64_t ring_scratch_bytes(const CollectiveSpec& spec) { return layout_for(spec).total; }

void validate_spec(Cluster& cluster, const CollectiveSpec& spec) {
  const char* kind = collective_name(spec.kind);
  const int n = static_cast<int>(spec.members.size());
  IFEC_CHECK(n >= 2, kind << ": " << n << " member(s), need 2 or more");
  std::vector<char> seen(cluster.size(), 0);
  for (int g : spec.members) {
    IFEC_CHECK(g >= 0 && g < cluster.size(), kind << ": member GPU " << g << " outside 0.." << cluster.size() - 1);
    IFEC_CHECK(!seen[g], kind << ": member GPU " << g << " listed twice");
    seen[g] = 1;
  }
  IFEC_CHECK(spec.root >= 0 && spec.root < cluster.size() && seen[spec.root],
             kind << ": root GPU " << spec.root << " is not a member");
  const size_t esize = element_size(spec.dtype);
  IFEC_CHECK(
      spec.op == common::EchRedOp::kSum || spec.op == common::EchRedOp::kMin || spec.op == common::EchRedOp::kMax,
      kind << ": unknown reduction op " << static_cast<int>(spec.op));
  if (spec.kind != Collective::kBarrier) {
    IFEC_CHECK(spec.window != spec.scratch_window,
               kind << ": scratch window " << spec.scratch_window << " is the buffer's window");
    for (int g : spec.members) {
      const endpoint::WindowInfo* w = cluster.ep(g).memory().window(spec.window);
      IFEC_CHECK(w != nullptr, kind << ": GPU " << g << " has no window " << spec.window);
      IFEC_CHECK(spec.offset <= w->size && spec.count <= (w->size - spec.offset) / esize,
                 kind << ": buffer of " << spec.count << " x " << esize << " bytes at offset " << spec.offset
                      << " exceeds window " << spec.window << " (" << w->size << " bytes) on GPU " << g);
    }
  }
  const uint64_t need = ring_scratch_bytes(spec);
  for (int g : spec.members) {
    const endpoint::WindowInfo* w = cluster.ep(g).memory().window(spec.scratch_window);
    IFEC_CHECK(w != nullptr, kind << ": GPU " << g << " has no scratch window " << spec.scratch_window);
    IFEC_CHECK(w->size >= need, kind << ": scratch window " << spec.scratch_window << " on GPU " << g << " has "
                                     << w->size << " bytes, needs " << need);
  }
}

CollectiveResult run_endpoint_collective(Cluster& cluster, const CollectiveSpec& spec, TimeNs limit) {
  validate_spec(cluster, spec);
  common::EventLoop& loop = cluster.loop();
  CollectiveResult res;
  res.start_ns = loop.now();
  const TimeNs deadline = limit > common::kForever - res.start_ns ? common::kForever : res.start_ns + limit;
  // Byte counting cannot tell this run's packets from a late one of an earlier run that failed or timed out with
  // stores still in flight (a store that completed has placed all its packets, and duplicates are never placed
  // again). So wait until every store earlier endpoint collectives posted in this cluster completed (or failed):
  // free when the fabric is already quiet, as it is after any run that finished.
  for (int g = 0; g < cluster.size(); ++g) {
    const std::shared_ptr<HookSlot> slot = hook_slot(cluster.ep(g), false);
    while (slot && slot->in_flight > 0) {
      if (loop.idle() || loop.next_event_time() > deadline) {
        res.error = std::string("endpoint ") + collective_name(spec.kind) + ": " + std::to_string(slot->in_flight) +
                    " store(s) of an earlier endpoint collective from GPU " + std::to_string(g) +
                    " still in flight after " + std::to_string(limit) + " ns";
        res.end_ns = loop.now();
        return res;
      }
      loop.run(loop.next_event_time());
    }
  }
  auto run = std::make_shared<Run>(cluster, spec, next_generation());
  run->build();
  HookGuard guard(cluster, spec, run.get());  // declared after `run`: cleared before the run goes away
  run->start();
  while (!run->done() && !run->failed()) {
    if (loop.idle() || loop.next_event_time() > deadline) {
      res.error = run->what() + " did not finish within " + std::to_string(limit) + " ns" +
                  (loop.idle() ? " (the simulation went idle)" : "") + ": " + run->describe_stuck();
      res.end_ns = loop.now();
      return res;
    }
    loop.run(loop.next_event_time());
  }
  if (run->failed()) {
    res.error = run->error();
    res.end_ns = run->end_ns();
    return res;
  }
  res.ok = true;
  res.end_ns = run->end_ns();
  return res;
}

}  // namespace ifec::workloads
