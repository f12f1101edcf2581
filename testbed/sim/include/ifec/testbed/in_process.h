// The in-process implementations of what ranks reach outside their endpoint: a bootstrap hub for N ranks in one
// process, and a control plane that calls switches' IFEC engines directly. Both answer through a Poster, so the
// same code serves N ranks on one simulated event loop and ranks on their own threads (wall-clock loops).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ifec/common/control.h"
#include "ifec/common/sim.h"
#include "ifec/routing/topology.h"
#include "ifec/switchemu/switch.h"
#include "ifec/workloads/bootstrap.h"

namespace ifec::testbed {

// Runs a callback on the loop (and thread) that owns something, as its own event.
using Poster = std::function<void(std::function<void()>)>;
Poster poster_of(common::EventLoop& loop);  // same thread: schedule at now

// The bootstrap of N ranks in one process: allgathers complete when every rank contributed, and each rank's callback
// is posted to its own loop. Thread-safe.
class InProcessBootstrap {
 public:
  explicit InProcessBootstrap(int size);
  ~InProcessBootstrap();
  // Rank r's view; `post` delivers its callbacks. Valid as long as this hub.
  workloads::Bootstrap& rank(int r, Poster post);
  int size() const { return size_; }

 private:
  class RankView;
  // Every rank's callback gets the one gathered copy, shared: each rank's own copy is made when its answer runs
  // (256 ranks' copies of a 40 MB gather, all waiting at once, were 10 GB).
  using Shared = std::shared_ptr<const workloads::Gathered>;
  struct Round {
    std::vector<std::vector<uint8_t>> parts;
    std::vector<std::function<void(Shared)>> done;
    int arrived = 0;
  };
  void contribute(int r, std::vector<uint8_t> mine, std::function<void(Shared)> done);

  int size_;
  std::mutex mu_;
  std::vector<std::unique_ptr<RankView>> ranks_;
  std::vector<uint64_t> calls_;  // per rank: allgathers made so far (the k-th call of each rank meets the others')
  std::map<uint64_t, Round> rounds_;
};

// The control plane over switches in this process: calls run on the switches' loop (`at_switch`), answers come
// back through the caller's (`reply`).
class InProcessControl : public common::ControlPlane {
 public:
  InProcessControl(const routing::Topology& topo, std::map<std::string, switchemu::Switch*> switches,
                   std::function<void(int link, bool up)> set_link, Poster at_switch, Poster reply);

  void reserve(const std::string& sw, const common::GroupReservation& r, Done done) override;
  void release(const std::string& sw, uint32_t job, uint16_t group, Done done) override;
  void register_window(const std::string& sw, const common::WindowRegistration& w, Done done) override;
  void free_slots(const std::string& sw, std::function<void(const common::ControlReply<uint32_t>&)> done) override;
  void counters(const std::string& sw,
                std::function<void(const common::ControlReply<common::IfecCounters>&)> done) override;
  void set_link_state(int link, bool up, Done done) override;
  void fare_weights(const std::string& sw, int dest_gpu,
                    std::function<void(const common::ControlReply<std::vector<common::PortWeight>>&)> done) override;

 private:
  // Runs `fn(engine)` at the switch; `error` names what was wrong when the switch is unknown or runs no engine.
  void at(const std::string& sw, std::function<void(switchemu::IfecEngine&)> fn,
          std::function<void(const common::ControlError&)> error);

  const routing::Topology& topo_;
  std::map<std::string, switchemu::Switch*> switches_;
  std::function<void(int, bool)> set_link_;
  Poster at_switch_;
  Poster reply_;
};

}  // namespace ifec::testbed
