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
// it. Between windows each partition takes its mailboxes' events in one order, by time, then source (the sending
// partition unless the link says otherwise, below), then sending order: the same whatever the threads.
//
// A run may split planes further, by leaf group (FabricOptions::leaf_groups): the "planes" here are then planes x K
// partitions, each plane's K leaf groups, and every switch-to-switch link goes through mailboxes (a partition's own
// among them) with the sending node as its source, so the run is the same whatever K.
//
// The endpoint runtime (collectives, MoE: Cluster with threads) adds partitions for the GPUs, one per group of GPUs
// (gpu_groups): each GPU's links to its switches join its group's partition to the planes' (the GPU-to-switch delay
// is the lookahead). Frames a GPU sends go through a mailbox of its own (mailbox's `source`: planes + GPU; in leaf
// groups its node index), so mail
// of one time is taken in an order no grouping changes (by time, then source, then sending order). What a GPU does
// to another (Cluster: bootstrap, connection resets, an operation's end) waits for the window's end
// (on_window_end). Calls to switches (the control plane's reservations and window registrations) are byte messages
// (post_message, from between windows): each runs on the control loop at the window's end, in the order posted,
// and its answer (reply) comes back, with the message's source, after that time's control events, in that order.
//
// Spread over MPI processes with the GPUs' partition (mpirun -np N ifec ... --collective, bench moe): rank 0 runs
// the GPUs, ranks 1.. the planes. Each step then starts with an exchange (every process's next event, rank 0's
// messages, whether the caller's run is done: sync), a window ends with one (the frames that cross processes, to
// the process that receives them, and the window's messages, to every process) and so does a control step (the
// answers, to rank 0). Every process runs the same steps, so the run is the one a single process gives.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ifec/common/sim.h"

namespace ifec::testbed {

// The processes one partitioned run spans (MPI ranks: testbed/mpi makes this from MPI_COMM_WORLD). Every process
// runs the same command; each runs its share of the partitions, and rank 0 reports the whole run.
struct Processes {
  int rank = 0;
  int size = 1;
  std::function<void(std::vector<uint64_t>&)> sum;  // element-wise sum over every process, in place (collective)
  // Every process hands out[p] to process p and gets in[p], what process p handed it (a collective call; `in` is
  // sized to the processes). Its own message is swapped into in[rank], not copied.
  using Bytes = std::vector<uint8_t>;
  std::function<void(std::vector<Bytes>& out, std::vector<Bytes>& in)> exchange;
};

class PlanePartitions {
 public:
  // `planes` partitions (>= 1) run by `threads` threads (1..planes; plane p on thread p % threads). Spread over
  // `processes` processes (MPI ranks; 1..planes), this one, `rank`, runs the planes p with p % processes == rank
  // (on its threads) and the control loop, which every process runs alike; the others' partitions stay unrun here.
  // With `gpu_groups` >= 1, that many more partitions (indices planes.., gpu_loop(k)), all on rank 0 when there
  // are more processes; one group has thread 0 to itself when there are more threads, several share the threads
  // with the planes (groups first). Over processes, `procs` carries the exchanges.
  PlanePartitions(int planes, int threads, int rank = 0, int processes = 1, int gpu_groups = 0,
                  const Processes* procs = nullptr);
  ~PlanePartitions();
  PlanePartitions(const PlanePartitions&) = delete;
  PlanePartitions& operator=(const PlanePartitions&) = delete;

  common::EventLoop& control() { return control_; }
  std::vector<common::Clock*> plane_clocks();
  common::EventLoop& gpu_loop(int group = 0);  // GPU group `group`'s partition (gpu_groups >= 1 only)
  int gpu_partition(int group = 0) const { return gpu_groups_ > 0 ? planes() + group : -1; }
  int gpu_groups() const { return gpu_groups_; }
  bool is_gpu_partition(int p) const { return gpu_groups_ > 0 && p >= planes(); }
  // What partition `from` schedules for partition `to` (a link's arrivals): held until the window ends, then taken
  // by time, then `source` (default: `from`; a GPU's own: planes + its index; leaf groups: the sending node), then
  // sending order. `from` may be `to` (a link that always sends through mailboxes, whichever partitions its ends
  // are in, so that its frames arrive in the same order whatever the partitioning).
  common::Clock* mailbox(int from, int to, int source = -1);
  // What describe() calls each of the fabric's partitions when they are not one per plane (leaf groups: "p0
  // leaves 0-15", Fabric's leaf_group_names); describe() then lists them by name.
  void set_partition_names(std::vector<std::string> names) { names_ = std::move(names); }
  // What describe() calls each GPU group ("GPUs 0-31"; default "GPUs" for one, "GPUs k" for several).
  void set_gpu_group_names(std::vector<std::string> names) { group_names_ = std::move(names); }
  // Whether a window's partitions are running (their threads may be in their events).
  bool in_window() const { return in_window_; }
  // Runs after every window, on the calling thread, once the window's mail is in and time() is its last ns.
  void on_window_end(std::function<void()> fn) { on_window_end_ = std::move(fn); }
  // The shortest delay of a link that joins two partitions (kForever, the default: none does).
  void set_lookahead(common::TimeNs ns);
  int threads() const { return threads_; }
  int partitions() const { return static_cast<int>(loops_.size()); }
  int planes() const { return partitions() - gpu_groups_; }
  // Control messages (see above). post_message: between windows, on the calling thread (the GPUs' process); ignored
  // on a process that does not run the GPUs; `source` says whose it is and comes back with its answer. on_message's
  // handler runs on every process's control loop; the process that answers calls reply() from within it;
  // on_reply's handler gets each answer on the GPUs' process.
  void post_message(uint32_t source, std::vector<uint8_t> msg);
  void on_message(std::function<void(const std::vector<uint8_t>&)> fn) { on_message_ = std::move(fn); }
  void reply(std::vector<uint8_t> msg);
  void on_reply(std::function<void(uint32_t source, std::vector<uint8_t>)> fn) { on_reply_ = std::move(fn); }
  // Frames between processes: the sending end of a link from partition `from` to `to` (owned by another process)
  // sends through remote_sender (key: which end receives, the caller's numbering); the receiving process hands
  // each to on_remote_frame's handler at its arrival time, in the mailboxes' order.
  common::LinkPort::Remote remote_sender(int from, int to, uint32_t key, int source = -1);
  void on_remote_frame(std::function<void(uint32_t key, std::vector<uint8_t>&&, uint64_t epoch)> fn) {
    on_remote_frame_ = std::move(fn);
  }
  // Whether partition `to`'s frames from `from` cross processes.
  bool remote(int from, int to) const { return process_of(from) != process_of(to); }
  // A turn of a run loop as the GPUs' process (which runs the driver) sees it: whether its run is done, its deadline,
  // and whether it stops the others serving (Cluster::serve).
  struct Turn {
    bool done = false;
    common::TimeNs deadline = 0;
    bool stop = false;
  };
  // Every process: the next event anywhere and the GPUs' process's messages; returns that process's turn (a
  // collective call over processes; step() makes it when the caller did not). Run loops call it each turn.
  Turn sync(Turn turn);
  // Over processes with something crossing them (the GPUs' partition, or links between partitions of two
  // processes): every step exchanges, as above.
  bool spread() const { return processes_ > 1 && (gpu_groups_ > 0 || crossing_); }
  int rank() const { return rank_; }

  // Runs every event up to and including `until` in windows as above, then sets every time to `until` (when
  // finite); returns how many events ran. An event a partition puts on the control loop earlier than the window's
  // end throws Error (the windows would have run past it).
  uint64_t run(common::TimeNs until = common::kForever);
  // One step of run(until): one window (every partition's events before the next control event or a lookahead
  // past the earliest one) or the control events of one time. False when nothing waits up to `until`.
  bool step(common::TimeNs until = common::kForever);
  common::TimeNs now() const { return control_.now(); }
  // The time every process's partitions have reached: the last window's last nanosecond, or the last control time.
  common::TimeNs time() const { return time_; }
  common::TimeNs next_event_time() const;  // spread: as of the last sync
  bool idle() const;
  uint64_t events_run() const;  // this process's loops', the control loop's included
  uint64_t control_events() const { return control_.events_run(); }
  bool owns(int partition) const { return process_of(partition) == rank_; }
  int process_of(int partition) const;
  uint64_t windows_run() const { return windows_; }
  // "8 partitions (one per plane) on 2 threads: planes 0 2 4 6 | 1 3 5 7"; over processes: "... on 2 processes
  // x 1 thread: rank 0 planes 0 2 4 6 | rank 1 planes 1 3 5 7"; GPU groups: "... GPUs 0 | planes 0 1 GPUs 1"
  std::string describe() const;

 private:
  class Mailbox;
  class Workers;
  struct RemoteFrame {
    int from;
    int to;
    int source;
    common::TimeNs at;
    uint32_t key;
    uint64_t epoch;
    std::vector<uint8_t> frame;
  };
  int thread_of(int partition) const;
  common::TimeNs next_partition_event() const;    // this process's partitions'
  common::TimeNs global_partition_event() const;  // every process's (spread: as of the last sync)
  Mailbox& mail(int from, int to, int source);
  using Message = std::pair<uint32_t, std::vector<uint8_t>>;  // (source, bytes)
  void schedule_messages(std::vector<Message> msgs, common::TimeNs at);
  void exchange_window(common::TimeNs last);         // frames to their processes, the window's messages to every one
  void deliver_replies();                            // the control step's answers to the GPUs' process, in order
  void run_partitions_through(common::TimeNs last);  // every partition's events up to `last`, on the threads
  void deliver_mail();                               // every mailbox's events into their partitions, in order

  common::EventLoop control_;
  std::vector<std::unique_ptr<common::EventLoop>> loops_;   // [partition]: the planes', then the GPUs'
  std::vector<common::EventLoop*> owned_;                   // this process's partitions
  std::vector<std::vector<common::EventLoop*>> by_thread_;  // [thread]: the owned partitions it runs
  // [to]: (source, from) -> its mailbox, made on first use; a map's order is the sources' (then senders')
  std::vector<std::map<std::pair<int, int>, std::unique_ptr<Mailbox>>> mail_;
  const Processes* procs_ = nullptr;
  std::vector<Message> messages_;  // posted since the last exchange (the GPUs' process only)
  std::function<void(const std::vector<uint8_t>&)> on_message_;
  std::function<void(uint32_t, std::vector<uint8_t>)> on_reply_;
  std::function<void()> on_window_end_;
  uint64_t messages_seen_ = 0;    // messages scheduled so far (the same count on every process)
  uint64_t handling_ = 0;         // the message whose handler runs (its answers carry it)
  uint32_t handling_source_ = 0;  // and its source
  struct Reply {
    uint64_t seq;
    uint32_t source;
    std::vector<uint8_t> msg;
  };
  std::vector<Reply> replies_;                    // made in this control step, here
  std::vector<std::vector<RemoteFrame>> outbox_;  // [sending partition]: this window's
  std::function<void(uint32_t, std::vector<uint8_t>&&, uint64_t)> on_remote_frame_;
  common::TimeNs time_ = 0;
  common::TimeNs frontier_ = 0;  // where between-window messages go: the last window's end or control time
  common::TimeNs global_next_ = common::kForever;  // spread: every process's next partition event, at the last sync
  bool synced_ = false;
  std::unique_ptr<Workers> workers_;  // threads 1.. (thread 0 is the caller)
  common::TimeNs lookahead_ = common::kForever;
  common::TimeNs window_last_ = 0;  // the window being run: its partitions' events up to this time
  int threads_;
  int rank_;
  int processes_;
  int gpu_groups_ = 0;
  std::vector<std::string> group_names_;
  std::vector<std::string> names_;  // the fabric's partitions' (set_partition_names); empty: one per plane
  bool in_window_ = false;
  bool crossing_ = false;  // a mailbox joins partitions of two processes
  uint64_t windows_ = 0;
};

}  // namespace ifec::testbed
