// Private to the communicator's sources: how an in-fabric reduce / allreduce / barrier is cut into chunks, and the
// leader's plan of one of its rounds: a group on every plane every rank reaches (one tier: on the plane's switch;
// two tier: on each leaf the ranks meet, its members the ranks under it, and a spine group above those leaves, its
// members the leaves), all of a plane's groups or none.
#pragma once

#include <cstdint>

#include "comm_plan.h"
#include "ifec/workloads/communicator.h"

namespace ifec::workloads {

common::EchOp ech_op(Collective c);
// What the operation's groups compute, in place in its window.
GroupOp ifec_group_op(const CollArgs& a);

// The operation's chunks: chunk k holds the same bytes on every plane and in every round.
class IfecChunks {
 public:
  IfecChunks(const Communicator& c, const CollArgs& a);
  uint32_t count() const { return count_; }
  size_t element_bytes() const { return esize_; }
  size_t per_chunk() const { return epc_; }                                               // elements of a full chunk
  uint64_t offset(uint32_t k) const { return static_cast<uint64_t>(k) * epc_ * esize_; }  // in the buffer, bytes
  uint16_t elements(uint32_t k) const;                                                    // 0 for a barrier
  uint64_t bytes(uint32_t k) const { return static_cast<uint64_t>(elements(k)) * esize_; }
  bool barrier() const { return kind_ == Collective::kBarrier; }
  // Whether a rank gets the result (reduce: only the root).
  bool needs_result(int rank) const { return kind_ != Collective::kReduce || rank == root_; }

 private:
  Collective kind_;
  int root_;
  uint64_t elements_;  // of the whole buffer
  size_t esize_ = 4;
  size_t epc_ = 1;
  uint32_t count_ = 0;
};

// The leader's plan of a round of `a`: `then` gets the plan to share and the groups to release after the round.
void plan_ifec_round(Communicator& c, const CollArgs& a, const IfecChunks& chunks, PlanBuilder::Then then);

}  // namespace ifec::workloads
