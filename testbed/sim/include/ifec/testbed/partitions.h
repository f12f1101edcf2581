// One simulation on several threads: a fabric partitioned by plane (Fabric's plane-clocks constructor). Each plane
// is a partition with its own event loop: its links, switches and GPU ports, and whatever its frames do there. No
// link joins two planes, so between two fabric-wide events the partitions share nothing and run apart; the
// fabric-wide events (link state changes, FARE's rounds and the route installs they make, the traffic's start and
// the re-splitting of flows over planes that follows a route change) run on a control loop of their own. The run
// goes in windows: every partition runs its events before the next control event's time T (the lookahead is the
// distance to it: nothing in a partition can schedule control events), then every partition's time moves to T
// and the control events at T run, on the calling thread, before any partition event at T. That order is the
// one canonical order of equal-time events: the same with one thread or many, so a run gives the same result
// (times, bytes per link, frame-hops, events) whatever the threads.
//
// Links may also join partitions (a server's NVLink-class links between GPUs of different planes): such a link's
// frames arrive through a mailbox (mailbox(from, to)), and the link's delay is the lookahead (set_lookahead): a
// window then also ends a lookahead after the earliest partition event, so nothing a window sends arrives inside
// it. Between windows each partition takes its mailboxes' events in one order, by time, then sending partition,
// then sending order: the same whatever the threads.
//
// The endpoint runtime (collectives, MoE: Cluster with threads) adds one more partition, the GPUs': every endpoint,
// its communicators and their in-process bootstrap share it, and each GPU's links to its switches join it to the
// planes' partitions (the GPU-to-switch delay is the lookahead). Its calls to switches (the control plane's
// reservations and window registrations) are requests (control_requests): they run on the control loop at the
// window's end, in the order made, and their answers come back to the GPUs' partition at that time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ifec/common/sim.h"

namespace ifec::testbed {

class PlanePartitions {
 public:
  // `planes` partitions (>= 1) run by `threads` threads (1..planes; plane p on thread p % threads). Spread over
  // `processes` processes (MPI ranks; 1..planes), this one, `rank`, runs the planes p with p % processes == rank
  // (on its threads) and the control loop, which every process runs alike; the others' partitions stay unrun here.
  // With `gpu_partition`, one more partition (index `planes`, gpu_loop()) that thread 0 runs alone when there are
  // more threads, and rank 0 when there are more processes.
  PlanePartitions(int planes, int threads, int rank = 0, int processes = 1, bool gpu_partition = false);
  ~PlanePartitions();
  PlanePartitions(const PlanePartitions&) = delete;
  PlanePartitions& operator=(const PlanePartitions&) = delete;

  common::EventLoop& control() { return control_; }
  std::vector<common::Clock*> plane_clocks();
  common::EventLoop& gpu_loop();  // the GPUs' partition (gpu_partition only)
  int gpu_partition() const { return gpu_partition_ ? planes() : -1; }
  // What partition `from` schedules for partition `to` (a link's arrivals): held until the window ends.
  common::Clock* mailbox(int from, int to);
  // The shortest delay of a link that joins two partitions (kForever, the default: none does).
  void set_lookahead(common::TimeNs ns);
  int threads() const { return threads_; }
  int partitions() const { return static_cast<int>(loops_.size()); }
  int planes() const { return partitions() - (gpu_partition_ ? 1 : 0); }
  // Runs fn on the control loop at the end of the window partition `from` makes the call in (or at once, when made
  // between windows); calls run in the order (partition, order made). Only partition `from`'s thread may call it.
  std::function<void(std::function<void()>)> control_requests(int from);

  // Runs every event up to and including `until` in windows as above, then sets every time to `until` (when
  // finite); returns how many events ran. An event a partition puts on the control loop earlier than the window's
  // end throws Error (the windows would have run past it).
  uint64_t run(common::TimeNs until = common::kForever);
  // One step of run(until): one window (every partition's events before the next control event or a lookahead
  // past the earliest one) or the control events of one time. False when nothing waits up to `until`.
  bool step(common::TimeNs until = common::kForever);
  common::TimeNs now() const { return control_.now(); }
  common::TimeNs next_event_time() const;
  bool idle() const;
  uint64_t events_run() const;  // this process's loops', the control loop's included
  uint64_t control_events() const { return control_.events_run(); }
  bool owns(int partition) const { return process_of(partition) == rank_; }
  uint64_t windows_run() const { return windows_; }
  // "8 partitions (one per plane) on 2 threads: planes 0 2 4 6 | 1 3 5 7"; over processes: "... on 2 processes
  // x 1 thread: rank 0 planes 0 2 4 6 | rank 1 planes 1 3 5 7"
  std::string describe() const;

 private:
  class Mailbox;
  class Workers;
  int process_of(int partition) const;
  int thread_of(int partition) const;
  common::TimeNs next_partition_event() const;
  void run_requests(common::TimeNs at);              // the control requests made in the window that ends at `at`
  void run_partitions_through(common::TimeNs last);  // every partition's events up to `last`, on the threads
  void deliver_mail();                               // every mailbox's events into their partitions, in order

  common::EventLoop control_;
  std::vector<std::unique_ptr<common::EventLoop>> loops_;     // [partition]: the planes', then the GPUs'
  std::vector<common::EventLoop*> owned_;                     // this process's partitions
  std::vector<std::vector<common::EventLoop*>> by_thread_;    // [thread]: the owned partitions it runs
  std::vector<std::unique_ptr<Mailbox>> mail_;                // [from * partitions + to], made on first use
  std::vector<std::vector<std::function<void()>>> requests_;  // [partition]: control requests of this window
  std::unique_ptr<Workers> workers_;                          // threads 1.. (thread 0 is the caller)
  common::TimeNs lookahead_ = common::kForever;
  common::TimeNs window_last_ = 0;  // the window being run: its partitions' events up to this time
  bool in_window_ = false;
  int threads_;
  int rank_;
  int processes_;
  bool gpu_partition_ = false;
  uint64_t windows_ = 0;
};

}  // namespace ifec::testbed
