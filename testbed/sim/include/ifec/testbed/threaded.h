// The wall-clock, multi-threaded driver of the simulated fabric: every rank (endpoint + communicator) runs on its
// own thread with its own RealtimeLoop, and the fabric (switches and links) on one more. Ranks reach the fabric
// through in-memory bridge ports (frames cross threads as posted events, the link model serializes them on the
// fabric's thread), each other through the in-process bootstrap, and switches through the in-process control plane:
// the same seams the live testbed fills with AF_PACKET ports, a host-daemon bootstrap and gRPC. Running the
// communicator's operations here, unchanged, is the proof that they are rank-local.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "ifec/testbed/cluster.h"
#include "ifec/testbed/fabric.h"
#include "ifec/testbed/in_process.h"
#include "ifec/workloads/communicator.h"

namespace ifec::testbed {

class ThreadedCluster {
 public:
  // opts.fabric and opts.endpoint as for Cluster; `comm` for every rank's communicator. Starts the threads and
  // initialises the communicators (throws Error if they do not come up within a few seconds).
  ThreadedCluster(const routing::Topology& topo, ClusterOptions opts, workloads::CommOptions comm = {});
  ~ThreadedCluster();  // stops every loop and joins the threads
  ThreadedCluster(const ThreadedCluster&) = delete;
  ThreadedCluster& operator=(const ThreadedCluster&) = delete;

  int size() const { return static_cast<int>(ranks_.size()); }

  using RankFn = std::function<void(int rank, workloads::Communicator& comm, workloads::Communicator::Done done)>;
  // Runs fn on every rank's own thread; waits (wall clock) until every rank called done or `limit` passed (a rank
  // that did not finish gets ok = false, naming it).
  std::vector<workloads::CollectiveResult> run(const RankFn& fn, std::chrono::milliseconds limit);
  // Runs fn(endpoint) on rank r's thread and waits for it: set-up and read-back of a rank's memory.
  void on_rank(int r, const std::function<void(endpoint::Endpoint&)>& fn);

 private:
  class BridgePort;
  struct Rank {
    std::unique_ptr<common::RealtimeLoop> loop;
    std::vector<std::unique_ptr<BridgePort>> ports;
    std::unique_ptr<endpoint::Endpoint> ep;
    std::unique_ptr<InProcessControl> control;
    std::unique_ptr<workloads::Communicator> comm;
    std::thread thread;
  };

  std::chrono::steady_clock::time_point start_;
  routing::Topology topo_;
  common::RealtimeLoop fabric_loop_;
  std::unique_ptr<Fabric> fabric_;
  InProcessBootstrap boot_;
  std::vector<Rank> ranks_;
  std::thread fabric_thread_;
};

}  // namespace ifec::testbed
