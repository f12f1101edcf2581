// epoll + eventfd + a timer heap: the live daemons' single-threaded driver.
#include "ifec/live/epoll_loop.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <thread>

#include "ifec/common/checks.h"

namespace ifec::live {

EpollLoop::EpollLoop() : start_(std::chrono::steady_clock::now()) {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  eventfd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  timerfd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  IFEC_CHECK(epfd_ >= 0 && eventfd_ >= 0 && timerfd_ >= 0,
             "event loop: epoll/eventfd/timerfd: " << std::strerror(errno));
  for (int fd : {eventfd_, timerfd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    IFEC_CHECK(epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) == 0, "event loop: epoll_ctl: " << std::strerror(errno));
  }
}

EpollLoop::~EpollLoop() {
  close(timerfd_);
  close(eventfd_);
  close(epfd_);
}

// Arms the timer fd at `at` (ns since start; steady_clock is CLOCK_MONOTONIC), or disarms it.
void EpollLoop::arm(common::TimeNs at) {
  if (at == armed_) {
    return;
  }
  armed_ = at;
  itimerspec its{};
  if (at != common::kForever) {
    const auto abs = std::chrono::duration_cast<std::chrono::nanoseconds>(start_.time_since_epoch()).count() +
                     static_cast<int64_t>(std::max<common::TimeNs>(at, 1));
    its.it_value.tv_sec = abs / 1'000'000'000;
    its.it_value.tv_nsec = abs % 1'000'000'000;
  }
  timerfd_settime(timerfd_, TFD_TIMER_ABSTIME, &its, nullptr);
}

common::TimeNs EpollLoop::now() const {
  return static_cast<common::TimeNs>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count());
}

common::TimeNs EpollLoop::event_time() const {
  const common::TimeNs t = now();
  const bool own = std::this_thread::get_id() == serving_.load(std::memory_order_relaxed);
  return own && arrival_ns_ != 0 ? std::min(arrival_ns_, t) : t;
}

void EpollLoop::schedule(common::TimeNs at, std::function<void()> fn) {
  const bool own = std::this_thread::get_id() == serving_.load(std::memory_order_relaxed);
  // Deferred handling of an arrival keeps its arrival time (only the loop's thread reads arrival_ns_).
  // "At once" is judged against the loop's last look at the clock first (most such timers are for 0), and the clock
  // read only where that does not tell.
  const common::TimeNs arrival =
      own && arrival_ns_ != 0 && (at <= last_now_.load(std::memory_order_relaxed) || at <= now()) ? arrival_ns_ : 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Its lateness counts from `at`, or for one due already from the loop's last look at the clock (no clock read
    // per timer on the hot path: a paced port schedules one per frame).
    timers_.push(Timer{at, std::max(at, last_now_.load(std::memory_order_relaxed)), seq_++, std::move(fn), arrival});
  }
  // The loop's own thread re-arms the timer before it waits again: only other threads need to wake it (an eventfd
  // write per frame sent was a syscall on the hot path).
  if (!own) {
    wake();
  }
}

void EpollLoop::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(eventfd_, &one, sizeof one);
}

void EpollLoop::watch(int fd, std::function<void()> fn, bool writable) {
  epoll_event ev{};
  ev.events = writable ? EPOLLIN | EPOLLOUT : EPOLLIN;
  ev.data.fd = fd;
  const bool known = watched_.count(fd) > 0;
  IFEC_CHECK(epoll_ctl(epfd_, known ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev) == 0,
             "event loop: cannot watch fd " << fd << ": " << std::strerror(errno));
  watched_[fd] = std::move(fn);
}

void EpollLoop::unwatch(int fd) {
  if (watched_.erase(fd) > 0) {
    epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
  }
}

void EpollLoop::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }
  wake();
}

uint64_t EpollLoop::run_due() {
  uint64_t n = 0;
  common::TimeNs t = 0;
  for (;;) {
    std::function<void()> fn;
    common::TimeNs arrival = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // A timer due by the pass's last look at the clock runs without another (a forwarded frame's tx-ready is one
      // such; a read costs about 25 ns on a VM): its lateness counts to that look.
      if (n == 0 || timers_.empty() || timers_.top().at > t) {
        t = now();
        last_now_.store(t, std::memory_order_relaxed);
        if (timers_.empty() || timers_.top().at > t) {
          return n;
        }
      }
      const common::TimeNs late = t - timers_.top().due;
      if (late > worst_late_ns_.load(std::memory_order_relaxed)) {
        worst_late_ns_.store(late, std::memory_order_relaxed);
      }
      if (late >= kStallNs) {
        stalls_.fetch_add(1, std::memory_order_relaxed);
        stalled_ns_.fetch_add(late, std::memory_order_relaxed);
      }
      fn = std::move(const_cast<Timer&>(timers_.top()).fn);
      arrival = timers_.top().arrival;
      timers_.pop();
    }
    arrival_ns_ = arrival;
    fn();
    arrival_ns_ = 0;
    ++n;
  }
}

common::TimeNs EpollLoop::clock_ns(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<common::TimeNs>(ts.tv_sec) * 1'000'000'000 + static_cast<common::TimeNs>(ts.tv_nsec);
}

common::TimeNs EpollLoop::thread_cpu_ns() { return clock_ns(CLOCK_THREAD_CPUTIME_ID); }

uint64_t EpollLoop::run_once(int timeout_ms) {
  epoll_event evs[64];
  const int k = epoll_wait(epfd_, evs, 64, timeout_ms);
  uint64_t n = 0;
  for (int i = 0; i < k; ++i) {
    const int fd = evs[i].data.fd;
    if (fd == eventfd_ || fd == timerfd_) {
      uint64_t v;
      [[maybe_unused]] ssize_t r = read(fd, &v, sizeof v);
      if (fd == timerfd_) {
        armed_ = common::kForever;
      }
      continue;
    }
    auto it = watched_.find(fd);
    if (it != watched_.end()) {
      auto fn = it->second;  // the callback may unwatch its own fd
      fn();
      ++n;
    }
  }
  return n + run_due();
}

uint64_t EpollLoop::poll() { return run_due() + run_once(0); }

uint64_t EpollLoop::serve(common::TimeNs deadline) {
  serving_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  struct Clear {
    std::atomic<std::thread::id>& id;
    ~Clear() { id.store(std::thread::id(), std::memory_order_relaxed); }
  } clear{serving_};
  uint64_t n = 0;
  for (;;) {
    common::TimeNs next;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) {
        stopped_ = false;
        return n;
      }
      next = timers_.empty() ? common::kForever : timers_.top().at;
    }
    const common::TimeNs t = now();
    if (t > deadline) {
      return n;
    }
    arm(std::min(next, deadline == common::kForever ? common::kForever : deadline + 1));
    const int timeout_ms = next <= t ? 0 : -1;
    n += run_once(timeout_ms);
  }
}

LoopWorker::LoopWorker(EpollLoop& loop) : loop_(loop), thread_([this] { serve(); }) {}

LoopWorker::~LoopWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    jobs_.clear();
  }
  cv_.notify_one();
  thread_.join();
}

void LoopWorker::post(std::function<void()> job, std::function<void(const std::string&)> then) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(Job{std::move(job), std::move(then)});
  }
  cv_.notify_one();
}

void LoopWorker::serve() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (stopping_) {
        return;
      }
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    std::string error;
    try {
      job.work();
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "an exception that is not a std::exception";
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {  // a stopping worker's loop may be going too
      loop_.schedule(0, [then = std::move(job.then), error] { then(error); });
    }
  }
}

}  // namespace ifec::live
