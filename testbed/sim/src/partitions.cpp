// The windows of a partitioned run: partitions apart on threads, control events between them.
#include "ifec/testbed/partitions.h"

#include <algorithm>
#include <exception>
#include <sstream>
#include <thread>

#include "ifec/common/checks.h"

namespace ifec::testbed {

using common::TimeNs;

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
    if (tp < tc) {  // a window: every partition event before the next control event (or through `until`)
      ++windows_;
      run_partitions_through(tc <= until ? tc - 1 : until);
      IFEC_CHECK(control_.next_event_time() >= tc, "a partition scheduled a control event at "
                                                       << control_.next_event_time()
                                                       << " ns, before the window's end at " << tc << " ns");
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
