// Endpoints on a simulated fabric: one endpoint per GPU wired to its Fabric ports, FARE weights fed to their QP
// choice and path migration, windows exchanged symmetrically, a connection manager for QP reconnects, and the
// blocking helpers (wait, barrier) a host program or test needs on a virtual clock. Also the TransactionSink
// that lets descriptor-ring proxies drive it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ifec/common/sim.h"
#include "ifec/endpoint/endpoint.h"
#include "ifec/endpoint/sink.h"
#include "ifec/routing/topology.h"
#include "ifec/switchemu/fabric.h"

namespace ifec::workloads {

struct ClusterOptions {
  switchemu::FabricOptions fabric;
  endpoint::EndpointConfig endpoint;        // index and ip are filled per GPU
  int planes = 0;                           // use only the first N planes' ports (0 = all)
  std::optional<routing::IfecParams> ifec;  // replaces the topology's params.ifec (tests, CLI flags)
};

class Cluster {
 public:
  static constexpr uint16_t kBarrierWindow = 0xFFF0;

  Cluster(const routing::Topology& topo, ClusterOptions opts);
  ~Cluster();

  common::EventLoop& loop() { return loop_; }
  switchemu::Fabric& fabric() { return *fabric_; }
  endpoint::Endpoint& ep(int gpu) { return *endpoints_.at(gpu); }
  int size() const { return static_cast<int>(endpoints_.size()); }

  // Collective: every endpoint allocates window `id` of `bytes` (zeroed) for `job`; all learn each other's rkeys.
  // An existing window `id` is replaced by a fresh one.
  void allocate_window(uint16_t id, uint64_t bytes, uint32_t job = 1);
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

 private:
  common::EventLoop loop_;
  routing::Topology topo_;
  ClusterOptions opts_;
  std::unique_ptr<switchemu::Fabric> fabric_;
  std::vector<std::unique_ptr<endpoint::Endpoint>> endpoints_;
  std::vector<std::vector<int>> used_ports_;  // per GPU: fabric port indices its endpoint owns
  uint64_t barrier_epoch_ = 0;
};

// Drives a Cluster from descriptor-ring proxies (CPU backend or GPU). Single-threaded: every proxy feeding it
// must run on the thread that calls progress().
class ClusterSink : public endpoint::TransactionSink {
 public:
  explicit ClusterSink(Cluster& cluster, common::TimeNs slice_ns = 2'000) : cluster_(cluster), slice_ns_(slice_ns) {}
  void submit(int source, const endpoint::Descriptor& d, endpoint::LocalMemory& mem, Done done) override;
  bool progress() override;
  uint64_t submitted() const { return submitted_; }

 private:
  struct Pending {
    endpoint::OpHandle handle;
    Done done;
    std::function<void()> on_ok;  // copy fetched data / results back to the initiator's memory
  };
  Cluster& cluster_;
  common::TimeNs slice_ns_;
  std::vector<Pending> pending_;
  uint64_t submitted_ = 0;
};

}  // namespace ifec::workloads
