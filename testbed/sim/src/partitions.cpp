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

PlanePartitions::PlanePartitions(int planes, int threads, int rank, int processes, int gpu_groups,
                                 const Processes* procs)
    : procs_(procs), threads_(threads), rank_(rank), processes_(processes), gpu_groups_(gpu_groups) {
  IFEC_CHECK(planes >= 1, "partitions: " << planes << " planes, expected at least 1");
  IFEC_CHECK(gpu_groups >= 0, "partitions: " << gpu_groups << " GPU groups");
  const int most = planes + gpu_groups;
  const int most_processes = planes + (gpu_groups > 0 ? 1 : 0);  // the GPUs' groups share rank 0
  IFEC_CHECK(processes >= 1 && processes <= most_processes,
             processes << " processes outside 1.." << most_processes << " (" << planes << " partitions of the fabric's "
                       << "switches, by plane or leaf group"
                       << (gpu_groups > 0 ? ", and one process for the GPUs'" : "") << ")");
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
             "--threads " << threads << " outside 1.." << mine << " (" << most << " partitions: " << planes
                          << " of the fabric's" << (gpu_groups > 0 ? " and one per GPU group" : "")
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
  if (gpu_groups_ == 0 || processes_ == 1) {
    return partition % processes_;
  }
  return is_gpu_partition(partition) ? 0 : 1 + partition % (processes_ - 1);
}

int PlanePartitions::thread_of(int partition) const {
  // This process's partitions spread over its threads in order, the GPU groups' first: one GPU group has thread 0
  // to itself (the planes share the others), several take turns with the planes.
  const bool gpus_here = gpu_groups_ > 0 && owns(planes());
  if (gpus_here && is_gpu_partition(partition)) {
    return gpu_groups_ == 1 ? 0 : (partition - planes()) % threads_;
  }
  int index = 0;
  for (int p = 0; p < partition; ++p) {
    index += owns(p) ? 1 : 0;
  }
  if (gpus_here && gpu_groups_ == 1 && threads_ > 1) {
    return 1 + index % (threads_ - 1);
  }
  return (index + (gpus_here ? gpu_groups_ : 0)) % threads_;
}

std::vector<common::Clock*> PlanePartitions::plane_clocks() {
  std::vector<common::Clock*> v;
  for (int p = 0; p < planes(); ++p) {
    v.push_back(loops_[p].get());
  }
  return v;
}

common::EventLoop& PlanePartitions::gpu_loop(int group) {
  IFEC_CHECK(group >= 0 && group < gpu_groups_, "partitions: GPU group " << group << " outside 0.." << gpu_groups_ - 1);
  return *loops_[planes() + group];
}

common::Clock* PlanePartitions::mailbox(int from, int to, int source) {
  const int n = partitions();
  IFEC_CHECK(from >= 0 && from < n && to >= 0 && to < n,
             "mailbox from partition " << from << " to " << to << " (partitions 0.." << n - 1 << ")");
  if (source < 0) {
    source = from;
  }
  if (processes_ > 1 && remote(from, to)) {
    IFEC_CHECK(procs_ != nullptr && procs_->exchange,
               "a link between partitions " << from << " and " << to << " of two processes needs their exchange");
    crossing_ = true;
  }
  return &mail(from, to, source);
}

PlanePartitions::Mailbox& PlanePartitions::mail(int from, int to, int source) {
  mail_.resize(loops_.size());
  std::unique_ptr<Mailbox>& m = mail_[to][{source, from}];
  if (!m) {
    m = std::make_unique<Mailbox>(*loops_[from]);
  }
  return *m;
}

common::LinkPort::Remote PlanePartitions::remote_sender(int from, int to, uint32_t key, int source) {
  IFEC_CHECK(owns(from) && remote(from, to),
             "remote sender from partition " << from << " to " << to << ": not a link leaving this process");
  source = source < 0 ? from : source;
  return [this, from, to, source, key](TimeNs at, std::vector<uint8_t>&& frame, uint64_t epoch) {
    outbox_[from].push_back({from, to, source, at, key, epoch, std::move(frame)});
  };
}

void PlanePartitions::post_message(uint32_t source, std::vector<uint8_t> msg) {
  IFEC_CHECK(!in_window_, "a control message posted inside a window (from a partition's thread)");
  if (gpu_groups_ > 0 && owns(gpu_partition())) {
    messages_.push_back({source, std::move(msg)});
  }
}

void PlanePartitions::reply(std::vector<uint8_t> msg) {
  replies_.push_back({handling_, handling_source_, std::move(msg)});
}

void PlanePartitions::schedule_messages(std::vector<Message> msgs, TimeNs at) {
  for (auto& [source, m] : msgs) {
    const uint64_t seq = ++messages_seen_;
    control_.schedule(at, [this, seq, source = source, m = std::move(m)] {
      handling_ = seq;
      handling_source_ = source;
      if (on_message_) on_message_(m);
      handling_ = 0;
    });
  }
}

namespace {

using Bytes = std::vector<uint8_t>;

void put_messages(common::ByteWriter& w, const std::vector<std::pair<uint32_t, Bytes>>& msgs) {
  w.u32(static_cast<uint32_t>(msgs.size()));
  for (const auto& [source, m] : msgs) {
    w.u32(source);
    w.blob(m);
  }
}

std::vector<std::pair<uint32_t, Bytes>> get_messages(common::ByteReader& r) {
  std::vector<std::pair<uint32_t, Bytes>> msgs(r.count("message count", 8));
  for (auto& [source, m] : msgs) {
    source = r.u32("message source");
    m = r.blob("message");
  }
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
  std::vector<Bytes> out(processes_, mine);
  std::vector<Bytes> in;
  procs_->exchange(out, in);
  global_next_ = common::kForever;
  Turn gpus;
  for (int p = 0; p < processes_; ++p) {
    common::ByteReader r(in[p], "sync from rank " + std::to_string(p));
    global_next_ = std::min(global_next_, r.u64("next event"));
    Turn t;
    t.done = r.boolean("done");
    t.stop = r.boolean("stop");
    t.deadline = r.u64("deadline");
    std::vector<Message> msgs = get_messages(r);
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
  // The window's messages to every process, then the frames for it, each process's message written once at its
  // final size (a window can carry hundreds of megabytes of frames between processes: every copy counts).
  constexpr size_t kFrameHeader = 4 * 3 + 8 + 4 + 8 + 4;  // from, to, source, arrival, key, epoch, blob length
  std::vector<uint32_t> frames(processes_, 0);
  std::vector<size_t> bytes(processes_, 0);
  for (const auto& box : outbox_) {
    for (const RemoteFrame& f : box) {
      const int p = process_of(f.to);
      ++frames[p];
      bytes[p] += kFrameHeader + f.frame.size();
    }
  }
  size_t message_bytes = 8;
  for (const auto& m : messages_) message_bytes += 8 + m.second.size();
  std::vector<Bytes> out(processes_);
  for (int p = 0; p < processes_; ++p) {
    common::ByteWriter w;
    w.reserve(message_bytes + bytes[p]);
    put_messages(w, messages_);
    w.u32(frames[p]);
    for (const auto& box : outbox_) {
      for (const RemoteFrame& f : box) {
        if (process_of(f.to) != p) continue;
        w.i32(f.from);
        w.i32(f.to);
        w.i32(f.source);
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
  std::vector<Bytes> in;
  procs_->exchange(out, in);
  for (int p = 0; p < processes_; ++p) {
    common::ByteReader r(in[p], "window from rank " + std::to_string(p));
    std::vector<Message> msgs = get_messages(r);
    if (p == process_of(gpu_partition())) schedule_messages(std::move(msgs), last + 1);
    for (uint32_t k = r.count("frame count", 36); k > 0; --k) {
      const int from = r.i32("from");
      const int to = r.i32("to");
      const int source = r.i32("source");
      const TimeNs at = r.u64("arrival");
      const uint32_t key = r.u32("key");
      const uint64_t epoch = r.u64("epoch");
      auto frame = std::make_shared<Bytes>(r.blob("frame"));
      IFEC_CHECK(from >= 0 && from < partitions() && to >= 0 && to < partitions() && owns(to) && at > last,
                 "frame from rank " << p << " for partition " << to << " from " << from << " at " << at
                                    << " ns: not this process's, or inside the window that ended at " << last);
      const uint8_t* data = frame->data();
      const size_t bytes = frame->size();
      mail(from, to, source)
          .events_.push_back(
              {at, [this, key, epoch, frame] { on_remote_frame_(key, std::move(*frame), epoch); }, data, bytes});
    }
    r.end("a window's frames");
  }
}

void PlanePartitions::deliver_replies() {
  std::vector<Reply> got = std::move(replies_);
  replies_.clear();
  if (spread() && gpu_groups_ > 0) {  // every process's answers to the GPUs' process
    std::vector<Bytes> out(processes_);
    common::ByteWriter w;
    w.u32(static_cast<uint32_t>(got.size()));
    for (const Reply& a : got) {
      w.u64(a.seq);
      w.u32(a.source);
      w.blob(a.msg);
    }
    out[process_of(gpu_partition())] = w.take();
    std::vector<Bytes> in;
    procs_->exchange(out, in);
    got.clear();
    for (int p = 0; p < processes_; ++p) {
      if (in[p].empty()) continue;
      common::ByteReader r(in[p], "answers from rank " + std::to_string(p));
      for (uint32_t k = r.count("answer count", 16); k > 0; --k) {
        const uint64_t seq = r.u64("message");
        const uint32_t source = r.u32("source");
        got.push_back({seq, source, r.blob("answer")});
      }
      r.end("the answers");
    }
  }
  std::stable_sort(got.begin(), got.end(), [](const Reply& a, const Reply& b) { return a.seq < b.seq; });
  for (Reply& a : got) {
    if (on_reply_) on_reply_(a.source, std::move(a.msg));
  }
}

void PlanePartitions::set_lookahead(TimeNs ns) {
  IFEC_CHECK(ns >= 1, "lookahead " << ns << " ns: a link between partitions needs a delay of at least 1 ns");
  lookahead_ = ns;
}

void PlanePartitions::deliver_mail() {
  std::vector<Mailbox::Event*> in;
  for (size_t to = 0; to < mail_.size(); ++to) {
    in.clear();  // by time; source, sending partition, then order at equal times (a stable sort)
    for (auto& [key, m] : mail_[to]) {
      for (Mailbox::Event& e : m->events_) in.push_back(&e);
    }
    std::stable_sort(in.begin(), in.end(), [](const auto* a, const auto* b) { return a->at < b->at; });
    for (Mailbox::Event* e : in) {
      loops_[to]->schedule_reading(e->at, std::move(e->fn), e->data, e->bytes);
    }
    for (auto& [key, m] : mail_[to]) m->events_.clear();
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
  const char* join = names_.empty() ? " and" : ", and";  // "one per plane and leaf group, and the GPUs'"
  o << loops_.size() << " partition" << (loops_.size() == 1 ? "" : "s") << " (one per plane"
    << (names_.empty() ? "" : " and leaf group") << (gpu_groups_ > 0 ? join : "")
    << (gpu_groups_ == 1  ? " the GPUs'"
        : gpu_groups_ > 1 ? (names_.empty() ? " per GPU group" : " one per GPU group")
                          : "")
    << ") on ";
  // " planes 0 2 4", " GPUs", " GPUs 0-3 planes 1 3": a list's GPU groups, then its planes; the word "planes"
  // once per rank's list, or after a GPU group (`named`: said already). Named partitions (leaf groups) are a list
  // with commas: " GPUs 0-3, p0 leaves 0-1, p1 leaves 0-1".
  auto list = [this, &o](int rank, int thread, bool& named) {
    auto here = [&](int p) { return process_of(p) == rank && (thread < 0 || thread_of(p) == thread); };
    bool first = true;
    for (int p = planes(); p < partitions(); ++p) {
      if (!here(p)) continue;
      const int k = p - planes();
      o << (first || names_.empty() ? " " : ", ")
        << (k < static_cast<int>(group_names_.size()) ? group_names_[k] : "GPUs " + std::to_string(k));
      named = false;
      first = false;
    }
    for (int p = 0; p < planes(); ++p) {
      if (!here(p)) continue;
      if (!names_.empty()) {
        o << (first ? " " : ", ") << names_[p];
      } else {
        o << (named ? " " : " planes ") << p;
      }
      named = true;
      first = false;
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
  in_window_ = true;
  struct Out {
    bool& flag;
    ~Out() { flag = false; }
  } out{in_window_};
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
    for (int k = 0; k < gpu_groups_; ++k) {  // what the GPUs start between windows starts at one time, whatever
      if (owns(gpu_partition(k))) {          // each group's last event was
        loops_[gpu_partition(k)]->advance_to(last);
      }
    }
    if (on_window_end_) on_window_end_();
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
