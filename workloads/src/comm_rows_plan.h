// Private to the communicator's sources: the batch reduction's plan (MoE combine). Every rank learns every
// destination's rows and checks its own part against them; the leader reserves one group per destination on every
// one-tier plane all ranks share, with a slot budget from the switch's free pool (all of a plane's groups or none);
// every rank then numbers every destination's chunks alike (row order, least-loaded plane).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "comm_plan.h"
#include "ifec/workloads/communicator.h"

namespace ifec::workloads {

// How every row is cut into chunks (one slot each).
struct RowChunks {
  RowChunks(const Communicator& c, const BatchReduceArgs& a);
  uint32_t elements(uint32_t chunk) const {
    return std::min<uint32_t>(chunk_elems, row_elements - chunk * chunk_elems);
  }
  uint64_t chunk_bytes() const { return uint64_t{chunk_elems} * esize; }

  uint32_t row_elements = 0;
  size_t esize = 4;
  uint32_t chunk_elems = 1;
  uint32_t per_row = 1;
  uint64_t row_bytes = 0;
};

// Every destination's rows, as each rank published its own.
class RowBook {
 public:
  static std::vector<uint8_t> encode(const std::vector<RowIn>& mine);
  void learn(const Gathered& g);
  const std::vector<RowIn>& of(int destination) const { return rows_[destination]; }
  const RowIn* find(int destination, uint32_t index) const;
  std::vector<int> destinations() const;  // the ranks with rows
  // What is wrong with this rank's part (its rows, its contributions, their windows) against the others', or "".
  std::string check(Communicator& c, const BatchReduceArgs& a, const RowChunks& ch) const;

 private:
  std::vector<std::vector<RowIn>> rows_;  // [destination rank], by index
};

// The group of `destination` on every plane of the plan.
inline uint16_t rows_group(uint16_t base, int destination) { return static_cast<uint16_t>(base + destination); }
// What every group of the batch computes.
GroupOp rows_group_op(const BatchReduceArgs& a);

// The leader's plan (its group: the base of the destinations' groups; its weights: 0, each rank weighs the planes
// itself): `then` gets the plan to share and the groups to release after the batch.
void plan_rows(Communicator& c, const BatchReduceArgs& a, const RowBook& rows, PlanBuilder::Then then);

// Where one chunk of one destination's row travels.
struct ChunkPlace {
  int plane = -1;  // an index into the plan's planes; -1: none (point to point)
  uint32_t seq = 0;
};

// Every destination's chunks over the plan's planes in row-index order, each to the plane least loaded in bytes
// relative to its bandwidth: every rank derives the same plane and per-plane sequence for every chunk.
class ChunkPlaces {
 public:
  void number(Communicator& c, const Plan& plan, const RowBook& rows, const RowChunks& ch);
  const ChunkPlace& at(int destination, uint32_t index, uint32_t chunk) const;

 private:
  std::vector<std::map<std::pair<uint32_t, uint32_t>, ChunkPlace>> place_;  // [destination][(row index, chunk)]
};

}  // namespace ifec::workloads
