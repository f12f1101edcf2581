// Private: one rank's part of an endpoint-based algorithm as a schedule (the stores it posts, the bytes it expects,
// what each waits for), the executor that runs it on the rank's endpoint, and the builders of each algorithm.
//
// Arrival signalling has RDMA WRITE WITH IMMEDIATE semantics, as NCCL's IB/RoCE transport uses: a rank learns that a
// message is complete from its own NIC, by counting the bytes that landed in the message's destination range, so a
// hop costs one one-way trip. Counting is exact because the responder places every packet of a store once (weak
// QPs drop duplicates by PSN, ordered QPs anything behind the expected PSN) and the remote-write hook runs only when
// a request executes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ifec/common/ech.h"
#include "ifec/workloads/communicator.h"

namespace ifec::workloads::schedule {

// A store this rank posts.
struct Xfer {
  int peer = 0;  // GPU
  uint16_t src_window = 0;
  uint64_t src_offset = 0;
  const uint8_t* src = nullptr;  // instead of (src_window, src_offset): bytes the schedule owns (signal words)
  uint16_t dst_window = 0;
  uint64_t dst_offset = 0;
  uint32_t len = 0;
  std::vector<uint32_t> after_recvs;  // arrivals (reduced, where they reduce) that must be complete first
  int32_t after_xfer = -1;            // a store of ours that must have completed (the staging slot it reuses is free)
};

// Bytes this rank expects from a peer.
struct Recv {
  int peer = 0;  // sender GPU
  uint16_t window = 0;
  uint64_t offset = 0;
  uint32_t len = 0;
  int32_t slot = -1;    // >= 0: a staging slot several Recvs use in turn, in their index order
  bool reduce = false;  // once complete: reduced into the buffer at reduce_offset (element-wise op)
  uint64_t reduce_offset = 0;
  int32_t reduce_after_xfer = -1;  // reduce only once this store of ours was posted (it must send the old value)
};

struct Schedule {
  std::string name;  // "ring allreduce", ...
  uint16_t buffer_window = 0;
  common::EchDtype dtype = common::EchDtype::kFp32;
  common::EchRedOp op = common::EchRedOp::kSum;
  std::vector<Xfer> xfers;
  std::vector<Recv> recvs;
  uint16_t slot_window = 0;  // where the staging slots are
  uint64_t slot_base = 0;
  uint64_t slot_bytes = 0;
  uint32_t slots = 0;
  std::function<void()> finalize;  // run once every store and arrival is complete (one-shot's ordered sum)
  uint64_t signal = 0;             // the value signal stores carry (their `src` points here)
};

// Builds this rank's schedule of `algo` (an endpoint algorithm, not best or ifec) for `a` on `comm`'s ranks.
// Allreduce takes ring, tree, rd or oneshot; reduce, reduce-scatter and all-gather run the ring; broadcast the chain;
// barrier the dissemination.
Schedule build(Communicator& comm, const CollArgs& a, Algo algo);
// Scratch bytes a schedule of `algo` uses in a.scratch_window.
uint64_t scratch_bytes(const CollArgs& a, int ranks, Algo algo);

// Runs one schedule on the communicator's endpoint. Not an operation itself: the schedule operation wraps one, and
// the in-fabric operation runs one for the chunks the fabric could not serve.
class Run {
 public:
  using Finished = std::function<void(bool ok, const std::string& error)>;
  Run(Communicator& comm, Schedule s);
  void start(Finished done);
  // True when the bytes belong to one of this run's receives (false: another run's, or a stranger's).
  bool on_remote_write(int peer, uint16_t window, uint64_t offset, uint64_t len);
  std::string describe_stuck() const;
  const Schedule& schedule() const { return s_; }

 private:
  void post(uint32_t x);
  void posted(uint32_t x);
  void xfer_done(uint32_t x, bool ok, const std::string& error);
  bool arrived(uint32_t r, uint64_t len, int peer);
  void complete(uint32_t r);
  void reduce(uint32_t r);
  void release(const std::vector<uint32_t>& xfers);
  void check_done();
  void fail(const std::string& why);

  Communicator& comm_;
  Schedule s_;
  Finished done_;
  std::vector<uint32_t> waiting_;                    // per xfer: dependencies not yet met
  std::vector<std::vector<uint32_t>> after_recv_;    // recv -> xfers waiting on it
  std::vector<std::vector<uint32_t>> after_xfer_;    // xfer -> xfers waiting for its completion
  std::vector<std::vector<uint32_t>> reduce_waits_;  // xfer -> recvs whose reduce waits for its posting
  std::vector<char> xfer_posted_, xfer_done_;
  std::vector<uint32_t> landed_;
  std::vector<char> recv_landed_, recv_done_;
  size_t xfers_done_ = 0;
  size_t recvs_done_ = 0;
  std::map<std::pair<uint16_t, uint64_t>, uint32_t> by_offset_;  // (window, offset) -> recv without a slot
  std::vector<std::vector<uint32_t>> slot_queue_;                // slot -> recvs in turn
  std::vector<size_t> slot_cursor_;
  bool over_ = false;
  std::shared_ptr<bool> alive_;
};

}  // namespace ifec::workloads::schedule
