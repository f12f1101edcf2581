// Endpoints on a simulated fabric: one endpoint per GPU wired to its Fabric ports, FARE weights fed to their QP
// choice and path migration, windows exchanged symmetrically, a connection manager for QP reconnects, and the
// blocking helpers (wait, barrier) a host program or test needs on a virtual clock. It also builds the ranks'
// communicators (an in-process bootstrap and control plane) and drives their parts of an operation to completion.
// Also the TransactionSink that lets descriptor-ring proxies drive it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ifec/common/sim.h"
#include "ifec/endpoint/endpoint.h"
#include "ifec/endpoint/endpoint_sink.h"
#include "ifec/endpoint/sink.h"
#include "ifec/routing/topology.h"
#include "ifec/testbed/fabric.h"
#include "ifec/testbed/in_process.h"
#include "ifec/testbed/message_control.h"
#include "ifec/testbed/partitions.h"
#include "ifec/workloads/communicator.h"

namespace ifec::testbed {

struct ClusterOptions {
  testbed::FabricOptions fabric;
  endpoint::EndpointConfig endpoint;        // index and ip are filled per GPU
  int planes = 0;                           // use only the first N planes' ports (0 = all)
  std::optional<routing::IfecParams> ifec;  // replaces the topology's params.ifec (tests, CLI flags)
  // Rank r's bootstrap answers arrive r x this later: ranks that learn a shared outcome at different times, as on
  // their own clocks in the live testbed (tests of the races that follows from).
  common::TimeNs bootstrap_skew_ns = 0;
  // 0: one event loop for the whole fabric. N >= 1: partitioned (partitions.h): one partition per plane and one per
  // group of GPUs (endpoints, communicators), on N threads; the same result for every N and every grouping (not the
  // one loop's: equal-time events between partitions meet in the mailboxes' order, and what one GPU does to another
  // waits for the window's end).
  int threads = 0;
  // Partitioned: the GPUs in this many groups of consecutive GPUs (0: one per thread; at most one per GPU).
  int gpu_groups = 0;
  // (fabric.leaf_groups K >= 1, partitioned only: the switches' partitions are per plane and leaf group, every
  // switch-to-switch link through mailboxes; the same result for every K >= 1, thread count and grouping.)
  // Spread over MPI processes (threads >= 1): rank 0 runs the GPUs' groups, ranks 1.. the planes; every process makes
  // the same calls on its Cluster, and the GPUs' results (windows, operations, their ports' counters) are rank 0's.
  const Processes* processes = nullptr;
};

class Cluster {
 public:
  static constexpr uint16_t kBarrierWindow = 0xFFF0;

  Cluster(const routing::Topology& topo, ClusterOptions opts);
  // Throws common::Error naming what `opts` cannot run on `topo` (threads, processes, leaf and GPU groups, planes)
  // before anything is made: the constructor calls it, and a sweep checks its options before its first run.
  static void check_options(const routing::Topology& topo, const ClusterOptions& opts);
  ~Cluster();

  // The whole fabric's event loop (not partitioned only; throws otherwise). Run the simulation with
  // run/step/run_until, not this loop's run.
  common::EventLoop& loop();
  // GPU `gpu`'s event loop: what its endpoint's callbacks schedule on and read the time of.
  common::EventLoop& gpu_loop(int gpu) { return *gpu_loops_.at(gpu); }
  // The simulated time of a driver, between steps, in an operation's `done` or an at() event: the same on every
  // process of a spread run (inside a GPU's events, its loop's time is the event's).
  common::TimeNs now() const;
  // Runs `fn` at simulated time `t` (>= now()) as the driver: partitioned, on the control loop (between windows),
  // where it may start operations on every rank.
  void at(common::TimeNs t, std::function<void()> fn);
  // What GPU `gpu` does to other GPUs (or to what drivers share) from within its events: partitioned, `fn` runs
  // after the window, on the calling thread, in an order no grouping or thread count changes (by the time it was
  // asked, then GPU, then the order asked); otherwise at once.
  void later(int gpu, std::function<void()> fn);
  bool idle() const;
  common::TimeNs next_event_time() const;
  uint64_t events_run() const;
  // One step: the events of one time (one loop) or one window (partitioned) up to `until`; false if none waits.
  bool step(common::TimeNs until = common::kForever);
  // Runs until done() holds (checked after every step), the simulation goes idle or its next event is past
  // `deadline`; returns done().
  bool run_until(const std::function<bool()>& done, common::TimeNs deadline);
  void run(common::TimeNs until);  // every event up to `until`
  // Spread over processes: whether this process runs the GPUs (and so the driver: operations, run_until). The
  // others serve() instead, taking every step the GPUs' process takes, until it calls stop_serving() (or its
  // Cluster goes); then both go on alike (counter sums).
  bool runs_gpus() const;
  void serve();
  void stop_serving();
  const PlanePartitions* partitions() const { return parts_.get(); }  // null: one loop
  testbed::Fabric& fabric() { return *fabric_; }
  endpoint::Endpoint& ep(int gpu) { return *endpoints_.at(gpu); }
  int size() const { return static_cast<int>(endpoints_.size()); }

  // Collective: every endpoint allocates window `id` of `bytes` (zeroed) for `job`; all learn each other's rkeys.
  // An existing window `id` is replaced by a fresh one. `shared`: every endpoint's window `id` is the same memory
  // (the timing mode of large runs: stores and sums still cross the fabric, byte for byte, but the values they leave
  // are meaningless, and the memory is one window's, not one per GPU).
  void allocate_window(uint16_t id, uint64_t bytes, uint32_t job = 1, bool shared = false);
  void free_window(uint16_t id);  // every endpoint's window `id`, where it has one
  uint8_t* window_data(int gpu, uint16_t id);

  // Runs simulated time until every handle completes; false if `limit` of simulated time passes first
  // (or nothing is left to run), i.e. a hang the caller must report.
  bool wait(const std::vector<endpoint::OpHandle>& handles, common::TimeNs limit = 1'000'000'000);
  // wait(), then every handle must have succeeded: "" or "WHAT did not finish in N us of simulated time" /
  // "WHAT failed: <the first failing transaction's error>".
  std::string wait_ok(const std::vector<endpoint::OpHandle>& handles, common::TimeNs limit, const std::string& what);
  // Every endpoint quiets, then a dissemination barrier over stores; false on timeout.
  bool barrier(common::TimeNs limit = 1'000'000'000);
  uint64_t barrier_epoch() const { return barrier_epoch_; }

  // The control plane over this fabric's switches (in process; answers are events on this loop).
  common::ControlPlane& control() { return *control_; }
  // The communicators of `gpus` (rank r on GPU gpus[r]), made and initialised on first use and kept; `opts`
  // replaces their options. Throws Error if their initialisation does not finish. Each `stream` is a set of its own
  // (its own bootstrap; one more communicator per endpoint), whose operations may run while another stream's do.
  std::vector<workloads::Communicator*> communicators(const std::vector<int>& gpus,
                                                      const workloads::CommOptions& opts = {}, int stream = 0);
  // Starts every rank's part, start(rank, done), and runs the loop until each rank called done or `limit` passed
  // (a rank that did not finish gets ok = false, naming it and its GPU).
  using RankStart = std::function<void(int rank, workloads::Communicator::Done done)>;
  std::vector<workloads::CollectiveResult> run_ranks(int ranks, const RankStart& start, common::TimeNs limit);

 private:
  void make_partitions(bool spread);
  void make_control(std::map<std::string, switchemu::Switch*> switches);
  void serve_message(const std::vector<uint8_t>& m);
  void run_later();  // between windows: what later() kept, in order
  common::ControlPlane& control_of(int gpu);

  class LaterBootstrap;
  struct RankSet {
    std::unique_ptr<InProcessBootstrap> boot;
    std::vector<std::unique_ptr<workloads::Bootstrap>> views;  // partitioned: each rank's, through later()
    std::vector<std::unique_ptr<workloads::Communicator>> comms;
  };
  struct Later {
    common::TimeNs at;
    std::function<void()> fn;
  };

  struct Unmap {
    uint64_t size = 0;
    void operator()(uint8_t* p) const;
  };

  common::EventLoop loop_;                     // the whole fabric's, when not partitioned
  std::unique_ptr<PlanePartitions> parts_;     // when partitioned
  std::vector<common::EventLoop*> gpu_loops_;  // [gpu]: its loop (its group's, partitioned)
  std::vector<int> group_first_;               // partitioned: [group] its first GPU, then the GPU count
  std::vector<std::vector<Later>> later_;      // [gpu]: asked in this window (written by its group's thread)
  routing::Topology topo_;
  ClusterOptions opts_;
  std::unique_ptr<testbed::Fabric> fabric_;
  std::map<uint16_t, std::unique_ptr<uint8_t, Unmap>> shared_windows_;  // before endpoints_: they point into it
  std::vector<std::unique_ptr<endpoint::Endpoint>> endpoints_;
  std::vector<std::vector<int>> used_ports_;  // per GPU: fabric port indices its endpoint owns
  uint64_t barrier_epoch_ = 0;
  bool stopped_ = false;                           // stop_serving() done
  std::unique_ptr<common::ControlPlane> control_;  // the driver's (partitioned: a MessageControlClient)
  std::vector<std::unique_ptr<MessageControlClient>> gpu_control_;  // partitioned: [gpu] its communicators'
  std::unique_ptr<InProcessControl> switch_control_;  // partitioned: what serves its messages, at the switches
  std::map<std::string, int> switch_partitions_;      // switch name -> its partition (which process answers a call)
  std::map<std::pair<std::vector<int>, int>, RankSet> rank_sets_;  // (GPUs, stream); after endpoints_: go first
};

// Drives a Cluster from descriptor-ring proxies (CPU backend or GPU): an EndpointSink over the cluster's
// endpoints that runs the simulation `slice_ns` further on each progress(). Single-threaded: every proxy feeding it
// must run on the thread that calls progress().
class ClusterSink : public endpoint::EndpointSink {
 public:
  explicit ClusterSink(Cluster& cluster, common::TimeNs slice_ns = 2'000)
      : EndpointSink([&cluster](int source) -> endpoint::Endpoint& { return cluster.ep(source); },
                     [&cluster, slice_ns] {
                       if (!cluster.idle()) {
                         cluster.run(cluster.now() + slice_ns);
                       }
                     }) {}
};

}  // namespace ifec::testbed
