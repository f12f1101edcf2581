// Endpoint-based collectives: ring allreduce / reduce, chain multicast and dissemination barrier as event-driven
// state machines over RC put_signal transactions (the baseline in-fabric aggregation is measured against, and
// its fallback path), plus the spec helpers shared with the in-fabric path.
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

// A slice is the unit one put_signal moves: large buffers stream through the ring in 64 KiB pieces (NCCL-like),
// so a member forwards slice k of a block as soon as it arrived instead of waiting for the whole block.
constexpr uint64_t kSliceBytes = 64 * 1024;
// Messages in flight per ring link: each has its own staging slot and signal word, reused only after the
// put_signal that last used it completed (its signal landed, so the receiver consumed it). A put_signal needs two
// round trips (data ack, then the signal: ~4.4 us unloaded on the SuperPoD) plus the queueing behind the data
// posted after it; 64 x 64 KiB (4 MiB) keeps a 400 GB/s GPU streaming (32 reached ~70% of it with weak QPs).
constexpr uint64_t kSlots = 64;
constexpr uint64_t kBarrierWords = 64;  // one per dissemination round: 2^64 members is plenty

// Where things live in the scratch window (the same on every member).
struct Layout {
  uint64_t slot_bytes = 0;    // staging slot (reduce-scatter only; the other phases write the buffer directly)
  uint64_t sig_base = 0;      // kSlots signal words, one per slot
  uint64_t gather_word = 0;   // reduce: the root's count of gathered slices (kAdd)
  uint64_t barrier_base = 0;  // kBarrierWords round words
  uint64_t total = 0;
};

bool uses_staging(Collective c) { return c == Collective::kAllReduce || c == Collective::kReduce; }

Layout layout_for(const CollectiveSpec& spec) {
  const uint64_t n = std::max<uint64_t>(spec.members.size(), 1);
  Layout l;
  if (uses_staging(spec.kind)) {
    const uint64_t max_block = (spec.count + n - 1) / n * element_size(spec.dtype);
    l.slot_bytes = std::min(kSliceBytes, (max_block + 7) / 8 * 8);  // 8-aligned so the signal words are too
  }
  l.sig_base = kSlots * l.slot_bytes;
  l.gather_word = l.sig_base + kSlots * 8;
  l.barrier_base = l.gather_word + 8;
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

// One put_signal of one slice. The bytes sit at the same buffer offset on sender and receiver.
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
  std::vector<Msg> gather_out;  // reduce: this member's block to the root
  size_t gather_done = 0;
  uint64_t gather_expected = 0;  // root: slices the others send it
  bool gather_complete = true;
  int rounds = 0;  // barrier
  int rounds_done = 0;
  int rounds_sent = 0;
  std::vector<char> round_seen;
  size_t barrier_done = 0;  // barrier stores completed
  bool finished = false;
};

class Run;

// What the endpoint's (never removable) remote-write hook forwards to: the run in progress, if any.
struct HookSlot {
  Run* run = nullptr;
  int pos = -1;
};

// One hook per endpoint for the endpoint's lifetime. The hook owns its slot; the registry only observes it, so an
// endpoint destroyed and another allocated at the same address gets a fresh hook.
std::shared_ptr<HookSlot> hook_slot(endpoint::Endpoint& ep);

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
  void ring_arrived(int pos, int peer, uint64_t slot, uint64_t value);
  void gather_arrived(int pos);
  void round_arrived(int pos, int peer, int round, uint64_t value);
  void advance_barrier(Member& m);
  void check_finished(Member& m);
  void fail(const std::string& why);
  std::string describe(const Msg& msg) const;
  std::string describe(const Member& m) const;
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

std::shared_ptr<HookSlot> hook_slot(endpoint::Endpoint& ep) {
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
  if (spec_.kind == Collective::kReduce) {
    // Reset the root's gather counter: the others add one per slice delivered. Nothing of this run can have
    // landed yet (no event ran since it was posted).
    std::memset(m_[root_pos()].scratch + lay_.gather_word, 0, 8);
  }
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
  std::weak_ptr<Run> w = weak_from_this();
  h->on_done = [w, fn, pos, index](const OpState& st) {
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
    OpHandle h = ep.put_signal(m_[m.next].gpu, dst_window, dst_off, m.buf + msg.byte_off, msg.len, spec_.scratch_window,
                               lay_.sig_base + slot * 8, sig_value(seq), endpoint::SignalOp::kSet);
    ++m.ring_posted;
    watch(h, &Run::ring_sent, m.pos, seq);
  }
}

void Run::post_gather(Member& m, size_t index) {
  const Msg& msg = m.gather_out[index];
  OpHandle h =
      cluster_.ep(m.gpu).put_signal(spec_.root, spec_.window, spec_.offset + msg.byte_off, m.buf + msg.byte_off,
                                    msg.len, spec_.scratch_window, lay_.gather_word, 1, endpoint::SignalOp::kAdd);
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

void Run::on_remote_write(int pos, int peer, uint16_t window, uint64_t offset, uint64_t len) {
  // Called for every packet landing anywhere in this endpoint: filter cheaply, read the signal word now.
  if (window != spec_.scratch_window || len != 8 || offset < lay_.sig_base || offset % 8 != 0) {
    return;
  }
  const uint8_t* word = m_[pos].scratch + offset;
  uint64_t value;
  std::memcpy(&value, word, 8);
  if (offset < lay_.sig_base + kSlots * 8) {
    const uint64_t slot = (offset - lay_.sig_base) / 8;
    defer([pos, peer, slot, value](Run& r) { r.ring_arrived(pos, peer, slot, value); });
  } else if (offset == lay_.gather_word) {
    defer([pos](Run& r) { r.gather_arrived(pos); });
  } else if (offset < lay_.barrier_base + kBarrierWords * 8) {
    const int round = static_cast<int>((offset - lay_.barrier_base) / 8);
    defer([pos, peer, round, value](Run& r) { r.round_arrived(pos, peer, round, value); });
  }
}

void Run::ring_arrived(int pos, int peer, uint64_t slot, uint64_t value) {
  Member& m = m_[pos];
  // Only this run's sequence numbers from this member's predecessor count; anything else is stale.
  if (m.prev < 0 || peer != m_[m.prev].gpu || (value >> 32) != gen_) {
    return;
  }
  const uint64_t seq = (value & 0xFFFFFFFFull) - 1;
  const std::vector<Msg>& in = m_[m.prev].ring_out;
  if (seq >= in.size() || seq % kSlots != slot || m.ring_seen[seq]) {
    return;
  }
  m.ring_seen[seq] = 1;
  ++m.ring_seen_count;
  const Msg& msg = in[seq];
  if (msg.phase == Phase::kReduceScatter) {
    // Consumed at the instant the signal landed (deferred only within that instant), before its ack can reach the
    // sender, so the slot is free whenever the sender reuses it.
    common::reduce_into(spec_.dtype, spec_.op, m.buf + msg.byte_off, m.scratch + slot * lay_.slot_bytes,
                        msg.len / esize_);
  }
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
  if (m.gpu != spec_.root || m.gather_complete) {
    return;
  }
  uint64_t v;
  std::memcpy(&v, m.scratch + lay_.gather_word, 8);
  if (v >= m.gather_expected) {
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
    os << "waiting for " << describe(m_[m.prev].ring_out[seq]) << " from GPU " << m_[m.prev].gpu;
  } else if (m.ring_posted < m.ring_out.size()) {
    const Msg& msg = m.ring_out[m.ring_posted];
    os << "cannot send " << describe(msg) << " to GPU " << m_[m.next].gpu
       << (msg.ready ? " (staging slot still busy)" : " (its data has not arrived)");
  } else if (m.ring_done < m.ring_out.size() || m.gather_done < m.gather_out.size()) {
    os << (m.ring_out.size() - m.ring_done + m.gather_out.size() - m.gather_done) << " put_signal(s) in flight";
  } else if (!m.gather_complete) {
    uint64_t v;
    std::memcpy(&v, m.scratch + lay_.gather_word, 8);
    os << "gather at the root: " << v << " of " << m.gather_expected << " slices arrived";
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
  // Tags every signal value, so words left in scratch by an earlier run (or arriving late from one) never match.
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
