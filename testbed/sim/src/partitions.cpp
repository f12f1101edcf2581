// The windows of a partitioned run: partitions apart on threads, control events between them.
#include "ifec/testbed/partitions.h"

#include <algorithm>
#include <exception>
#include <sstream>
#include <thread>

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

PlanePartitions::~PlanePartitions() = default;

PlanePartitions::PlanePartitions(int planes, int threads, int rank, int processes)
    : threads_(threads), rank_(rank), processes_(processes) {
  IFEC_CHECK(planes >= 1, "partitions: " << planes << " planes, expected at least 1");
  IFEC_CHECK(processes >= 1 && processes <= planes,
             processes << " processes outside 1.." << planes << " (one partition per plane, " << planes << " planes)");
  IFEC_CHECK(rank >= 0 && rank < processes, "rank " << rank << " outside 0.." << processes - 1);
  const int mine = (planes - rank + processes - 1) / processes;
  IFEC_CHECK(threads >= 1 && threads <= mine,
             "--threads " << threads << " outside 1.." << mine << " (one partition per plane, " << planes << " planes"
                          << (processes > 1 ? ", " + std::to_string(mine) + " in this process" : "") << ")");
  for (int p = 0; p < planes; ++p) {
    planes_.push_back(std::make_unique<common::EventLoop>());
    if (owns(p)) {
      owned_.push_back(planes_.back().get());
    }
  }
}

std::vector<common::Clock*> PlanePartitions::plane_clocks() {
  std::vector<common::Clock*> v;
  for (auto& l : planes_) {
    v.push_back(l.get());
  }
  return v;
}

common::Clock* PlanePartitions::mailbox(int from, int to) {
  const int n = partitions();
  IFEC_CHECK(from >= 0 && from < n && to >= 0 && to < n && from != to,
             "mailbox from partition " << from << " to " << to << " (partitions 0.." << n - 1 << ", two different)");
  IFEC_CHECK(processes_ == 1, "a link between partitions over MPI processes (not built: frames would cross them)");
  mail_.resize(static_cast<size_t>(n) * n);
  std::unique_ptr<Mailbox>& m = mail_[static_cast<size_t>(from) * n + to];
  if (!m) {
    m = std::make_unique<Mailbox>(*planes_[from]);
  }
  return m.get();
}

void PlanePartitions::set_lookahead(TimeNs ns) {
  IFEC_CHECK(ns >= 1, "lookahead " << ns << " ns: a link between partitions needs a delay of at least 1 ns");
  lookahead_ = ns;
}

void PlanePartitions::deliver_mail() {
  const size_t n = planes_.size();
  for (size_t to = 0; to < n && !mail_.empty(); ++to) {
    std::vector<Mailbox::Event*> in;  // by time; sending partition then order at equal times (a stable sort)
    for (size_t from = 0; from < n; ++from) {
      if (const auto& m = mail_[from * n + to]) {
        for (Mailbox::Event& e : m->events_) in.push_back(&e);
      }
    }
    std::stable_sort(in.begin(), in.end(), [](const auto* a, const auto* b) { return a->at < b->at; });
    for (Mailbox::Event* e : in) {
      planes_[to]->schedule_reading(e->at, std::move(e->fn), e->data, e->bytes);
    }
    for (size_t from = 0; from < n; ++from) {
      if (const auto& m = mail_[from * n + to]) m->events_.clear();
    }
  }
}

bool PlanePartitions::idle() const {
  return control_.idle() && std::all_of(owned_.begin(), owned_.end(), [](const auto* l) { return l->idle(); });
}

uint64_t PlanePartitions::events_run() const {
  uint64_t n = control_.events_run();
  for (const auto* l : owned_) {
    n += l->events_run();
  }
  return n;
}

std::string PlanePartitions::describe() const {
  std::ostringstream o;
  o << planes_.size() << " partition" << (planes_.size() == 1 ? "" : "s") << " (one per plane) on ";
  if (processes_ > 1) {
    o << processes_ << " processes x " << threads_ << " thread" << (threads_ == 1 ? "" : "s") << ":";
    for (int r = 0; r < processes_; ++r) {
      o << (r == 0 ? "" : " |") << " rank " << r << " planes";
      for (size_t p = r; p < planes_.size(); p += processes_) {
        o << " " << p;
      }
    }
    return o.str();
  }
  o << threads_ << " thread" << (threads_ == 1 ? "" : "s") << ":";
  for (int t = 0; t < threads_; ++t) {
    o << (t == 0 ? " planes" : " |");
    for (size_t p = t; p < planes_.size(); p += threads_) {
      o << " " << p;
    }
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
  auto work = [this, last](int thread) {
    for (size_t p = thread; p < owned_.size(); p += threads_) {
      owned_[p]->run(last);
    }
  };
  std::vector<std::exception_ptr> errors(threads_);
  std::vector<std::thread> workers;
  for (int th = 1; th < threads_; ++th) {
    workers.emplace_back([&, th] {
      try {
        work(th);
      } catch (...) {
        errors[th] = std::current_exception();
      }
    });
  }
  try {
    work(0);  // the calling thread's share (it alone sees an interrupt check, e.g. Python's Ctrl-C)
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (std::thread& w : workers) {
    w.join();
  }
  for (const std::exception_ptr& e : errors) {
    if (e) {
      std::rethrow_exception(e);
    }
  }
}

uint64_t PlanePartitions::run(TimeNs until) {
  const uint64_t before = events_run();
  for (;;) {
    const TimeNs tc = control_.next_event_time();
    const TimeNs tp = next_partition_event();
    if (std::min(tc, tp) == common::kForever || std::min(tc, tp) > until) {
      break;
    }
    if (tp < tc) {  // a window: every partition event before the next control event (or through `until`), and
                    // within a lookahead of the earliest one
      const TimeNs end = lookahead_ == common::kForever ? tc : std::min(tc, tp + lookahead_);
      ++windows_;
      run_partitions_through(std::min(end - 1, until));
      deliver_mail();
      IFEC_CHECK(control_.next_event_time() >= tc, "a partition scheduled a control event at "
                                                       << control_.next_event_time()
                                                       << " ns, before the window's end at " << tc << " ns");
      if (end < tc) {
        continue;
      }
    }
    if (tc > until) {
      break;
    }
    for (auto* l : owned_) {
      l->advance_to(tc);
    }
    control_.run(tc);
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
