// The windows of a partitioned run: partitions apart on threads, control events between them.
#include "ifec/testbed/partitions.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <sstream>
#include <thread>

#include "ifec/common/bytes.h"
#include "ifec/common/checks.h"

namespace ifec::testbed {

using common::TimeNs;

// Events one partition schedules for another during a window, in the order scheduled; only the sending partition's
// thread writes it, and the calling thread empties it between windows.
class PlanePartitions::Mailbox : public common::Clock {
 public:
  explicit Mailbox(common::EventLoop& from) : from_(from) {}
  TimeNs now() const override { return from_.now(); }
  void schedule(TimeNs at, std::function<void()> fn) override { events_.push_back({at, std::move(fn), nullptr, 0}); }
  void schedule_reading(TimeNs at, std::function<void()> fn, const void* data, size_t bytes) override {
    events_.push_back({at, std::move(fn), data, bytes});
  }
  struct Event {
    TimeNs at;
    std::function<void()> fn;
    const void* data;
    size_t bytes;
  };
  std::vector<Event> events_;

 private:
  common::EventLoop& from_;
};

// Threads 1.. of a run, kept between windows: each window wakes them (a spin, then a sleep when windows are far
// apart), each runs its partitions, and the caller (thread 0) waits for all of them.
class PlanePartitions::Workers {
 public:
  Workers(int threads, std::function<void(int)> work) : work_(std::move(work)), errors_(threads) {
    for (int t = 1; t < threads; ++t) {
      threads_.emplace_back([this, t] { serve(t); });
    }
  }
  ~Workers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      generation_.fetch_add(1);
    }
    wake_.notify_all();
    for (std::thread& t : threads_) {
      t.join();
    }
  }
  // Runs work(t) on every thread t (0 here) and returns when all are done; rethrows the first error.
  void run_all() {
    pending_.store(static_cast<int>(threads_.size()));
    {
      std::lock_guard<std::mutex> lock(mu_);
      generation_.fetch_add(1);
    }
    wake_.notify_all();
    try {
      work_(0);
    } catch (...) {
      errors_[0] = std::current_exception();
    }
    for (uint64_t spins = 0; pending_.load() > 0; ++spins) {
      if (spins > 4096) std::this_thread::yield();
    }
    for (std::exception_ptr& e : errors_) {
      if (e) {
        std::exception_ptr first = e;
        std::fill(errors_.begin(), errors_.end(), nullptr);
        std::rethrow_exception(first);
      }
    }
  }

 private:
  void serve(int t) {
    uint64_t seen = 0;
    for (;;) {
      for (int spins = 0; generation_.load() == seen && spins < 100'000; ++spins) {
      }
      if (generation_.load() == seen) {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return generation_.load() != seen; });
      }
      seen = generation_.load();
      if (stop_) {
        return;
      }
      try {
        work_(t);
      } catch (...) {
        errors_[t] = std::current_exception();
      }
      pending_.fetch_sub(1);
    }
  }

  std::function<void(int)> work_;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  bool stop_ = false;
};

PlanePartitions::~PlanePartitions() = default;

PlanePartitions::PlanePartitions(int planes, int threads, int rank, int processes, bool gpu_partition,
                                 const Processes* procs)
    : procs_(procs), threads_(threads), rank_(rank), processes_(processes), gpu_partition_(gpu_partition) {
  IFEC_CHECK(planes >= 1, "partitions: " << planes << " planes, expected at least 1");
  const int most = planes + (gpu_partition ? 1 : 0);
  IFEC_CHECK(processes >= 1 && processes <= most,
             processes << " processes outside 1.." << most << " (one partition per plane"
                       << (gpu_partition ? " and the GPUs'" : "") << ", " << planes << " planes)");
  IFEC_CHECK(rank >= 0 && rank < processes, "rank " << rank << " outside 0.." << processes - 1);
  for (int p = 0; p < most; ++p) {
    loops_.push_back(std::make_unique<common::EventLoop>());
  }
  outbox_.resize(most);
  IFEC_CHECK(!spread() || (procs != nullptr && procs->exchange), "partitions over processes need their exchange");
  for (int p = 0; p < most; ++p) {
    if (owns(p)) {
      owned_.push_back(loops_[p].get());
    }
  }
  const int mine = static_cast<int>(owned_.size());
  IFEC_CHECK(threads >= 1 && threads <= mine,
             "--threads " << threads << " outside 1.." << mine << " (one partition per plane"
                          << (gpu_partition ? " and the GPUs'" : "") << ", " << most << " partitions"
                          << (processes > 1 ? ", " + std::to_string(mine) + " in this process" : "") << ")");
  by_thread_.resize(threads);
  for (int p = 0; p < most; ++p) {
    if (owns(p)) {
      by_thread_[thread_of(p)].push_back(loops_[p].get());
    }
  }
  if (threads > 1) {
    workers_ = std::make_unique<Workers>(threads, [this](int t) {
      for (common::EventLoop* l : by_thread_[t]) {
        l->run(window_last_);
      }
    });
  }
}

int PlanePartitions::process_of(int partition) const {
  if (!gpu_partition_ || processes_ == 1) {
    return partition % processes_;
  }
  return partition == planes() ? 0 : 1 + partition % (processes_ - 1);
}

int PlanePartitions::thread_of(int partition) const {
  // This process's partitions in order, spread over its threads; the GPUs' partition has thread 0 to itself.
  const bool gpus_here = gpu_partition_ && owns(planes());
  if (gpus_here && partition == planes()) {
    return 0;
  }
  int index = 0;
  for (int p = 0; p < partition; ++p) {
    index += owns(p) ? 1 : 0;
  }
  if (gpus_here && threads_ > 1) {
    return 1 + index % (threads_ - 1);
  }
  return index % threads_;
}

std::vector<common::Clock*> PlanePartitions::plane_clocks() {
  std::vector<common::Clock*> v;
  for (int p = 0; p < planes(); ++p) {
    v.push_back(loops_[p].get());
  }
  return v;
}

common::EventLoop& PlanePartitions::gpu_loop() {
  IFEC_CHECK(gpu_partition_, "partitions: no GPUs' partition (made without gpu_partition)");
  return *loops_[planes()];
}

common::Clock* PlanePartitions::mailbox(int from, int to) {
  const int n = partitions();
  IFEC_CHECK(from >= 0 && from < n && to >= 0 && to < n && from != to,
             "mailbox from partition " << from << " to " << to << " (partitions 0.." << n - 1 << ", two different)");
  if (processes_ > 1 && remote(from, to)) {
    IFEC_CHECK(procs_ != nullptr && procs_->exchange,
               "a link between partitions " << from << " and " << to << " of two processes needs their exchange");
    crossing_ = true;
  }
  return &mail(from, to);
}

PlanePartitions::Mailbox& PlanePartitions::mail(int from, int to) {
  const size_t n = loops_.size();
  mail_.resize(n * n);
  std::unique_ptr<Mailbox>& m = mail_[static_cast<size_t>(from) * n + to];
  if (!m) {
    m = std::make_unique<Mailbox>(*loops_[from]);
  }
  return *m;
}

common::LinkPort::Remote PlanePartitions::remote_sender(int from, int to, uint32_t key) {
  IFEC_CHECK(owns(from) && remote(from, to),
             "remote sender from partition " << from << " to " << to << ": not a link leaving this process");
  return [this, from, to, key](TimeNs at, std::vector<uint8_t>&& frame, uint64_t epoch) {
    outbox_[from].push_back({from, to, at, key, epoch, std::move(frame)});
  };
}

void PlanePartitions::post_message(std::vector<uint8_t> msg) {
  if (gpu_partition_ && owns(gpu_partition())) {
    messages_.push_back(std::move(msg));
  }
}

void PlanePartitions::reply(std::vector<uint8_t> msg) { replies_.push_back({handling_, std::move(msg)}); }

void PlanePartitions::schedule_messages(std::vector<std::vector<uint8_t>> msgs, TimeNs at) {
  for (auto& m : msgs) {
    const uint64_t seq = ++messages_seen_;
    control_.schedule(at, [this, seq, m = std::move(m)] {
      handling_ = seq;
      if (on_message_) on_message_(m);
      handling_ = 0;
    });
  }
}

namespace {

using Bytes = std::vector<uint8_t>;

void put_messages(common::ByteWriter& w, const std::vector<Bytes>& msgs) {
  w.u32(static_cast<uint32_t>(msgs.size()));
  for (const Bytes& m : msgs) w.blob(m);
}

std::vector<Bytes> get_messages(common::ByteReader& r) {
  std::vector<Bytes> msgs(r.count("message count", 4));
  for (Bytes& m : msgs) m = r.blob("message");
  return msgs;
}

}  // namespace

PlanePartitions::Turn PlanePartitions::sync(Turn turn) {
  synced_ = true;
  if (!spread()) {
    schedule_messages(std::move(messages_), frontier_);
    messages_.clear();
    return turn;
  }
  // To every process: this one's next partition event, and from the GPUs' process its turn and messages.
  common::ByteWriter w;
  w.u64(next_partition_event());
  w.boolean(turn.done);
  w.boolean(turn.stop);
  w.u64(turn.deadline);
  put_messages(w, messages_);
  const Bytes mine = w.take();
  messages_.clear();
  const std::vector<Bytes> in = procs_->exchange(std::vector<Bytes>(processes_, mine));
  global_next_ = common::kForever;
  Turn gpus;
  for (int p = 0; p < processes_; ++p) {
    common::ByteReader r(in[p], "sync from rank " + std::to_string(p));
    global_next_ = std::min(global_next_, r.u64("next event"));
    Turn t;
    t.done = r.boolean("done");
    t.stop = r.boolean("stop");
    t.deadline = r.u64("deadline");
    std::vector<Bytes> msgs = get_messages(r);
    r.end("a sync");
    if (p == process_of(gpu_partition())) {
      gpus = t;
      schedule_messages(std::move(msgs), frontier_);
    }
  }
  return gpus;
}

void PlanePartitions::exchange_window(TimeNs last) {
  if (!spread()) {
    schedule_messages(std::move(messages_), last + 1);
    messages_.clear();
    return;
  }
  std::vector<Bytes> out(processes_);
  for (int p = 0; p < processes_; ++p) {  // the window's messages to every process, then the frames for it
    common::ByteWriter w;
    put_messages(w, messages_);
    uint32_t frames = 0;
    for (const auto& box : outbox_) {
      for (const RemoteFrame& f : box) frames += process_of(f.to) == p ? 1 : 0;
    }
    w.u32(frames);
    for (const auto& box : outbox_) {
      for (const RemoteFrame& f : box) {
        if (process_of(f.to) != p) continue;
        w.i32(f.from);
        w.i32(f.to);
        w.u64(f.at);
        w.u32(f.key);
        w.u64(f.epoch);
        w.blob(f.frame);
      }
    }
    out[p] = w.take();
  }
  messages_.clear();
  for (auto& box : outbox_) box.clear();
  const std::vector<Bytes> in = procs_->exchange(out);
  for (int p = 0; p < processes_; ++p) {
    common::ByteReader r(in[p], "window from rank " + std::to_string(p));
    std::vector<Bytes> msgs = get_messages(r);
    if (p == process_of(gpu_partition())) schedule_messages(std::move(msgs), last + 1);
    for (uint32_t k = r.count("frame count", 32); k > 0; --k) {
      const int from = r.i32("from");
      const int to = r.i32("to");
      const TimeNs at = r.u64("arrival");
      const uint32_t key = r.u32("key");
      const uint64_t epoch = r.u64("epoch");
      auto frame = std::make_shared<Bytes>(r.blob("frame"));
      IFEC_CHECK(from >= 0 && from < partitions() && to >= 0 && to < partitions() && owns(to) && at > last,
                 "frame from rank " << p << " for partition " << to << " from " << from << " at " << at
                                    << " ns: not this process's, or inside the window that ended at " << last);
      const uint8_t* data = frame->data();
      const size_t bytes = frame->size();
      mail(from, to).events_.push_back(
          {at, [this, key, epoch, frame] { on_remote_frame_(key, std::move(*frame), epoch); }, data, bytes});
    }
    r.end("a window's frames");
  }
}

void PlanePartitions::deliver_replies() {
  std::vector<std::pair<uint64_t, Bytes>> got = std::move(replies_);
  replies_.clear();
  if (spread() && gpu_partition_) {  // every process's answers to the GPUs' process
    std::vector<Bytes> out(processes_);
    common::ByteWriter w;
    w.u32(static_cast<uint32_t>(got.size()));
    for (const auto& [seq, msg] : got) {
      w.u64(seq);
      w.blob(msg);
    }
    out[process_of(gpu_partition())] = w.take();
    const std::vector<Bytes> in = procs_->exchange(out);
    got.clear();
    for (int p = 0; p < processes_; ++p) {
      if (in[p].empty()) continue;
      common::ByteReader r(in[p], "answers from rank " + std::to_string(p));
      for (uint32_t k = r.count("answer count", 12); k > 0; --k) {
        const uint64_t seq = r.u64("message");
        got.push_back({seq, r.blob("answer")});
      }
      r.end("the answers");
    }
  }
  std::stable_sort(got.begin(), got.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [seq, msg] : got) {
    if (on_reply_) on_reply_(std::move(msg));
  }
}

void PlanePartitions::set_lookahead(TimeNs ns) {
  IFEC_CHECK(ns >= 1, "lookahead " << ns << " ns: a link between partitions needs a delay of at least 1 ns");
  lookahead_ = ns;
}

void PlanePartitions::deliver_mail() {
  const size_t n = loops_.size();
  for (size_t to = 0; to < n && !mail_.empty(); ++to) {
    std::vector<Mailbox::Event*> in;  // by time; sending partition then order at equal times (a stable sort)
    for (size_t from = 0; from < n; ++from) {
      if (const auto& m = mail_[from * n + to]) {
        for (Mailbox::Event& e : m->events_) in.push_back(&e);
      }
    }
    std::stable_sort(in.begin(), in.end(), [](const auto* a, const auto* b) { return a->at < b->at; });
    for (Mailbox::Event* e : in) {
      loops_[to]->schedule_reading(e->at, std::move(e->fn), e->data, e->bytes);
    }
    for (size_t from = 0; from < n; ++from) {
      if (const auto& m = mail_[from * n + to]) m->events_.clear();
    }
  }
}

bool PlanePartitions::idle() const { return control_.idle() && global_partition_event() == common::kForever; }

uint64_t PlanePartitions::events_run() const {
  uint64_t n = control_.events_run();
  for (const auto* l : owned_) {
    n += l->events_run();
  }
  return n;
}

std::string PlanePartitions::describe() const {
  std::ostringstream o;
  o << loops_.size() << " partition" << (loops_.size() == 1 ? "" : "s") << " (one per plane"
    << (gpu_partition_ ? " and the GPUs'" : "") << ") on ";
  // " planes 0 2 4", " GPUs", " GPUs planes 1 3": the word "planes" once per rank's list (`named`: said already)
  auto list = [this, &o](int rank, int thread, bool& named) {
    for (int p = 0; p < partitions(); ++p) {
      if (process_of(p) != rank || (thread >= 0 && thread_of(p) != thread)) continue;
      if (p == gpu_partition()) {
        o << " GPUs";
        continue;
      }
      o << (named ? " " : " planes ") << p;
      named = true;
    }
  };
  if (processes_ > 1) {
    o << processes_ << " processes x " << threads_ << " thread" << (threads_ == 1 ? "" : "s") << ":";
    for (int r = 0; r < processes_; ++r) {
      o << (r == 0 ? "" : " |") << " rank " << r;
      bool named = false;
      list(r, -1, named);
    }
    return o.str();
  }
  o << threads_ << " thread" << (threads_ == 1 ? "" : "s") << ":";
  bool named = false;
  for (int t = 0; t < threads_; ++t) {
    o << (t == 0 ? "" : " |");
    list(rank_, t, named);
  }
  return o.str();
}

TimeNs PlanePartitions::next_partition_event() const {
  TimeNs t = common::kForever;
  for (const auto* l : owned_) {
    t = std::min(t, l->next_event_time());
  }
  return t;
}

void PlanePartitions::run_partitions_through(TimeNs last) {
  window_last_ = last;
  if (workers_) {
    workers_->run_all();  // the calling thread runs thread 0's share (it alone sees an interrupt check)
    return;
  }
  for (common::EventLoop* l : by_thread_[0]) {
    l->run(last);
  }
}

TimeNs PlanePartitions::global_partition_event() const { return spread() ? global_next_ : next_partition_event(); }

TimeNs PlanePartitions::next_event_time() const {
  return std::min(control_.next_event_time(), global_partition_event());
}

bool PlanePartitions::step(TimeNs until) {
  if (!synced_) {
    sync({});
  }
  synced_ = false;
  const TimeNs tc = control_.next_event_time();
  const TimeNs tp = global_partition_event();
  if (std::min(tc, tp) == common::kForever || std::min(tc, tp) > until) {
    return false;
  }
  if (tp < tc) {  // a window: every partition event before the next control event (or through `until`), and
                  // within a lookahead of the earliest one
    const TimeNs end = lookahead_ == common::kForever ? tc : std::min(tc, tp + lookahead_);
    const TimeNs last = std::min(end - 1, until);
    ++windows_;
    run_partitions_through(last);
    IFEC_CHECK(control_.next_event_time() >= tc, "a partition scheduled a control event at "
                                                     << control_.next_event_time() << " ns, before the window's end at "
                                                     << tc << " ns");
    exchange_window(last);
    deliver_mail();
    time_ = std::max(time_, last);
    frontier_ = last + 1;
    return true;
  }
  for (auto* l : owned_) {
    l->advance_to(tc);
  }
  control_.run(tc);
  time_ = std::max(time_, tc);
  frontier_ = std::max(frontier_, tc);
  deliver_replies();
  return true;
}

uint64_t PlanePartitions::run(TimeNs until) {
  const uint64_t before = events_run();
  while (step(until)) {
  }
  if (until != common::kForever) {
    for (auto* l : owned_) {
      l->advance_to(std::max(l->now(), until));
    }
    control_.run(until);
  }
  return events_run() - before;
}

}  // namespace ifec::testbed
