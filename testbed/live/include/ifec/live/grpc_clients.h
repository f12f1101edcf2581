// The rank side of the live control plane: common::ControlPlane and workloads::Bootstrap over gRPC (control.proto).
// Every call has a deadline; answers and errors come back as events on the rank's loop, never inside the call, so
// the communicator sees exactly what it sees from the simulator's in-process implementations. A dead or unreachable
// daemon is an error naming it ("p1-sw (172.31.0.10:50051): unreachable: ...") within the deadline.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "ifec/common/control.h"
#include "ifec/live/epoll_loop.h"
#include "ifec/routing/topology.h"
#include "ifec/workloads/bootstrap.h"

namespace grpc {
class Channel;
}

namespace ifec::live {

// Where each daemon listens: node index -> "ip:port" (default: mgmt_address()).
using AddressOf = std::function<std::string(int node)>;

class GrpcControl : public common::ControlPlane {
 public:
  GrpcControl(EpollLoop& loop, const routing::Topology& topo, AddressOf address, common::TimeNs deadline_ns);
  ~GrpcControl() override;

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
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The bootstrap of one rank: allgathers meet at rank 0's hostd (Host.Allgather); `gpus[r]` is rank r's GPU.
class GrpcBootstrap : public workloads::Bootstrap {
 public:
  // `group` != 0: a group of `gpus` only (AllgatherRequest.group), its hub at gpus[0]'s hostd.
  GrpcBootstrap(EpollLoop& loop, const routing::Topology& topo, AddressOf address, int rank, std::vector<int> gpus,
                common::TimeNs deadline_ns, uint32_t group = 0);
  ~GrpcBootstrap() override;
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(gpus_.size()); }
  void allgather(std::vector<uint8_t> mine, std::function<void(workloads::Gathered)> done) override;
  // Starts an operation's allgathers: they are numbered from 0 again under `epoch` (the same on every rank).
  void begin_epoch(uint64_t epoch) {
    epoch_ = epoch;
    seq_ = 0;
  }
  // How long the hub holds the next allgathers' parts for the others' (0: the hub's own 30 s); each call's deadline
  // is that much longer than the bootstrap's own.
  void set_wait(common::TimeNs wait_ns) { wait_ns_ = wait_ns; }

 private:
  EpollLoop& loop_;
  int rank_;
  std::vector<int> gpus_;
  common::TimeNs deadline_ns_;
  common::TimeNs wait_ns_ = 0;
  uint32_t group_ = 0;
  uint64_t epoch_ = 0;
  uint64_t seq_ = 0;
  std::string root_;  // rank 0's hostd, for errors
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<bool> alive_;
};

// Asks the hostd at `address` (`who`, for errors) to reset its responder of QP `qp` toward GPU `requester_gpu` to
// expect `psn` (Host.ResetResponder), trying `attempts` times, each within `deadline_ns`, 200 ms apart while the
// daemon is unreachable. `done` runs on `loop`: "" once reset, else the last error naming the daemon; never once
// `alive` has expired (the caller and its loop are gone).
void reset_peer_responder(EpollLoop& loop, std::weak_ptr<bool> alive, const std::string& who,
                          const std::string& address, int requester_gpu, int qp, uint32_t psn,
                          common::TimeNs deadline_ns, int attempts, std::function<void(const std::string& error)> done);

// Asks the hostd at `address` (`who`, for errors) for its status (Host.Status), waiting at most `deadline_ns`, on the
// calling thread: "" once it answered, else the error naming it ("gpu7 (127.0.0.1:50058): unreachable: ..."). A hub
// asks this of the ranks it waits for (hostd's HostdWatch), from the gRPC thread of a waiting part.
std::string ask_hostd_status(const std::string& who, const std::string& address, common::TimeNs deadline_ns);

// IfecCounters as name -> value (the struct's field names) and back: the one list the gRPC services, ifec ctl and
// the Prometheus metrics use.
std::map<std::string, uint64_t> counter_map(const common::IfecCounters& c);
common::IfecCounters counters_from_map(const std::map<std::string, uint64_t>& m);

}  // namespace ifec::live
