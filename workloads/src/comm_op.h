// Private to the communicator's sources: the base of one rank's part of an operation, and the factories of each
// kind (endpoint schedules, in-fabric reduction, multicast, batch rows).
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <string>

#include "ifec/workloads/communicator.h"

namespace ifec::workloads {

// One rank's part of one operation: started by the communicator, finished exactly once (ok or with the reason),
// fed this rank's arrivals (remote writes) and route changes while it runs.
//
// Ranks on their own clocks do not start an operation together: a peer may already be in the next one, and its
// stores land here while this rank still runs the last. So every arrival is offered to the running operation,
// which says whether it belongs to it; those it does not claim (and those landing between operations) are kept by
// the communicator and offered to the next operation when it begins (once: a peer is at most one operation ahead).
class CommOp : public std::enable_shared_from_this<CommOp> {
 public:
  CommOp(Communicator& comm, Communicator::Done done);
  virtual ~CommOp() = default;
  CommOp(const CommOp&) = delete;
  CommOp& operator=(const CommOp&) = delete;

  void begin();  // arms the time limit, start(), then offers the arrivals kept for it (unless fenced_)
  // True when the store belongs to this operation (counted, or held by it until it knows what it is for).
  virtual bool on_remote_write(int peer_gpu, uint16_t window, uint64_t offset, uint64_t len) { return false; }
  virtual void on_routes_changed() {}
  bool finished() const { return finished_; }
  bool ok() const { return res_.ok; }

 protected:
  virtual void start() = 0;
  // What this rank is waiting for, for the error when the time limit passes.
  virtual std::string describe_stuck() const { return "waiting"; }
  void succeed();
  void fail(const std::string& why);
  // Runs `fn` as its own event while this operation is unfinished (callbacks arrive from inside the endpoint's
  // receive and completion paths, where posting new work would re-enter it).
  void defer(std::function<void()> fn);
  // Calls fn(ok, error) as its own event once the transaction completes (while this operation is unfinished).
  void watch(const endpoint::OpHandle& h, std::function<void(bool ok, const std::string& error)> fn);
  common::TimeNs now() { return comm_.clock().now(); }
  // When the frame whose handling got here arrived (Clock::event_time): where a data path ends.
  common::TimeNs event_time() { return comm_.clock().event_time(); }
  // The bootstrap's allgather; `fn` runs only while this operation is unfinished (it may have timed out and gone),
  // and only when the gather worked (else the operation fails, naming the bootstrap's reason).
  void gather(std::vector<uint8_t> mine, std::function<void(Gathered)> fn);
  // Hands a store this operation held but never claimed to the communicator, for the next operation.
  void pass_on(int peer_gpu, uint16_t window, uint64_t offset, uint64_t len);

  Communicator& comm_;
  CollectiveResult res_;
  bool fenced_ = false;  // start() deals with the kept arrivals itself (after a failure: see ScheduleOp)

 private:
  void finish();
  Communicator::Done done_;
  bool finished_ = false;
};

// Endpoint-based algorithms (comm_schedule.cpp).
std::shared_ptr<CommOp> make_schedule_op(Communicator& c, const CollArgs& a, Algo algo, Communicator::Done done);
// In-fabric reduce / allreduce / barrier (comm_ifec_round.cpp).
std::shared_ptr<CommOp> make_ifec_reduce_op(Communicator& c, const CollArgs& a, Communicator::Done done);
// Broadcast by compact-ECH multicast, and batch multicast (comm_multicast.cpp).
std::shared_ptr<CommOp> make_ifec_broadcast_op(Communicator& c, const CollArgs& a, Communicator::Done done);
std::shared_ptr<CommOp> make_multicast_rows_op(Communicator& c, BatchMulticastArgs a, Communicator::Done done);
// Batch reduction (comm_rows_round.cpp).
std::shared_ptr<CommOp> make_reduce_rows_op(Communicator& c, BatchReduceArgs a, Communicator::Done done);
// Point-to-point row stores (comm_put.cpp).
std::shared_ptr<CommOp> make_put_rows_op(Communicator& c, BatchPutArgs a, Communicator::Done done);

// ECH timers for a window of `window_bytes` in flight per plane at `gbps` (the plane's slowest weight): the first
// timeout at least four drains of the window (at least `floor_first`), and never below one and a half drains after
// round trips are measured (a contribution can wait behind a full window at its sender, its result behind one at
// the switch; early samples, taken before the queues built up, would otherwise pull the timeout under that).
inline void fit_ech_timing(endpoint::EchTiming& t, double window_bytes, double gbps, common::TimeNs floor_first) {
  const double drain_ns = window_bytes * 8 / gbps;
  t.initial_rto_ns = std::max<common::TimeNs>(floor_first, static_cast<common::TimeNs>(4 * drain_ns));
  t.min_rto_ns = std::max<common::TimeNs>(t.min_rto_ns, static_cast<common::TimeNs>(1.5 * drain_ns));
}

// First element of block b when `count` elements are split into n nearly equal blocks.
inline uint64_t block_begin(uint64_t count, uint64_t n, uint64_t b) { return count / n * b + count % n * b / n; }

}  // namespace ifec::workloads
