// The live driver's event loop: wall-clock time, timers and file descriptors on one thread (a daemon's switch or
// endpoint and everything above it run here), with schedule() callable from any thread (gRPC handlers post their
// work into it). The same Clock the simulator's EventLoop is, so the code above the seams does not change.
#pragma once

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <vector>

#include "ifec/common/interfaces.h"

namespace ifec::live {

class EpollLoop : public common::Clock {
 public:
  EpollLoop();
  ~EpollLoop() override;
  EpollLoop(const EpollLoop&) = delete;
  EpollLoop& operator=(const EpollLoop&) = delete;

  // Nanoseconds since this loop was made (steady clock).
  common::TimeNs now() const override;
  // The steady clock's reading (ns) when this loop was made: now() + epoch_ns() is comparable across the processes
  // of one machine (CLOCK_MONOTONIC).
  common::TimeNs epoch_ns() const {
    return static_cast<common::TimeNs>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(start_.time_since_epoch()).count());
  }
  // Any thread: runs `fn` on the loop's thread once now() >= at.
  void schedule(common::TimeNs at, std::function<void()> fn) override;
  // Loop thread only: calls `fn` whenever `fd` is readable (level-triggered) until unwatch(fd); with `writable`,
  // when it is writable too (a TCP connect completing). Watching a watched fd again replaces its callback.
  void watch(int fd, std::function<void()> fn, bool writable = false);
  void unwatch(int fd);
  // Runs timers and fd callbacks until stop() or the deadline (ns since start) passes; returns callbacks run.
  uint64_t serve(common::TimeNs deadline = common::kForever);
  // Runs what is due and what the fds have ready, without waiting; returns callbacks run.
  uint64_t poll();
  void stop();  // any thread

  // Timers that ran 5 ms or more after their time (the loop busy, or its thread not scheduled: a daemon among many
  // on a few cores, a virtual machine's vCPU descheduled), and how late they were in all: monotonic, any thread.
  // A wall-clock measurement that spans such a stall measured the host as well as the fabric.
  static constexpr common::TimeNs kStallNs = 5'000'000;
  uint64_t stalls() const { return stalls_.load(std::memory_order_relaxed); }
  common::TimeNs stalled_ns() const { return stalled_ns_.load(std::memory_order_relaxed); }
  // The latest any timer ran after its time since the last call (and resets it): a phase's worst stall.
  common::TimeNs take_worst_late_ns() { return worst_late_ns_.exchange(0, std::memory_order_relaxed); }
  // Loop thread: when the frame being handled arrived (loop time; 0: none, or its port has no timestamps), set by
  // whoever hands it to its receiver. What its handling sends may make up the time since (TxGate::catch_up): the
  // reply or the forwarded frame of a loop that woke late is as early as the wire would have had it. Work its
  // handling defers "at once" (a timer due now, scheduled from the loop's thread: a collective's next store, which
  // the message's last packet released) runs with the same arrival time, as if it ran inside the handling.
  void set_arrival_ns(common::TimeNs at) { arrival_ns_ = at; }
  common::TimeNs arrival_ns() const { return arrival_ns_; }
  // The arrival being handled (arrival_ns), on the loop's own thread; now() otherwise.
  common::TimeNs event_time() const override;
  // CPU time the calling thread (a loop's own, called from it) has used: with the stalls, whether a slow phase's
  // loop was busy or not run.
  static common::TimeNs thread_cpu_ns();
  // A clock's reading in ns (CLOCK_REALTIME: the ports' receive timestamps; CLOCK_MONOTONIC: steady_clock, the
  // loops' and the XDP program's).
  static common::TimeNs clock_ns(clockid_t clock);

 private:
  struct Timer {
    common::TimeNs at;
    common::TimeNs due;  // at, or about when it was scheduled if that was later ("at once")
    uint64_t seq;
    std::function<void()> fn;
    common::TimeNs arrival = 0;  // the arrival being handled when it was scheduled "at once" (set_arrival_ns)
    bool operator>(const Timer& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };
  uint64_t run_once(int timeout_ms);
  uint64_t run_due();
  void wake();
  void arm(common::TimeNs at);

  int epfd_ = -1;
  int eventfd_ = -1;
  int timerfd_ = -1;
  common::TimeNs armed_ = common::kForever;
  std::chrono::steady_clock::time_point start_;
  std::mutex mu_;  // guards timers_, seq_, stopped_
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;
  uint64_t seq_ = 0;
  bool stopped_ = false;
  std::atomic<std::thread::id> serving_{};  // the thread in serve(), if any
  std::map<int, std::function<void()>> watched_;
  std::atomic<uint64_t> stalls_{0};
  std::atomic<common::TimeNs> stalled_ns_{0};
  std::atomic<common::TimeNs> worst_late_ns_{0};
  common::TimeNs arrival_ns_ = 0;
  std::atomic<common::TimeNs> last_now_{0};  // the loop's latest clock reading (run_due)
};

// A thread beside a loop for work too long to do on it: drawing or checking hundreds of MiB takes seconds on a loaded
// machine, and a loop held that long neither sends nor reads its BGP keepalives, so its neighbours' hold timers and
// its own expire (every session of a GPU flapped during a 64 MiB AllReduce whose inputs and check ran on the loop).
// Jobs run one at a time, in order; each one's continuation then runs on the loop, with the job's error ("" if
// none). Destroying the worker waits for the job that runs and drops the rest, their continuations too.
class LoopWorker {
 public:
  explicit LoopWorker(EpollLoop& loop);
  ~LoopWorker();
  LoopWorker(const LoopWorker&) = delete;
  LoopWorker& operator=(const LoopWorker&) = delete;

  void post(std::function<void()> job, std::function<void(const std::string& error)> then);  // any thread

 private:
  void serve();

  struct Job {
    std::function<void()> work;
    std::function<void(const std::string&)> then;
  };
  EpollLoop& loop_;
  std::mutex mu_;  // guards jobs_, stopping_
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stopping_ = false;
  std::thread thread_;  // last: started once the rest is made
};

}  // namespace ifec::live
