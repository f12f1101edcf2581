// Private to the communicator's sources: the batch reduction's plan (MoE combine). Every rank learns what it needs
// of every destination's rows and checks its own part against them; the leader reserves one group per destination on
// every one-tier plane all ranks share, with a slot budget from the switch's free pool (all of a plane's groups or
// none); every rank then numbers every destination's chunks alike (row order, least-loaded plane).
#pragma once

#include <algorithm>
#include <cstdint>
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

// What this rank needs of the batch's rows: its own (as destination, by index), and of other destinations' rows
// those it contributes to (each one's position among its destination's rows with contributors, which numbers its
// chunks, and its contributor count, every chunk's `expected`), and which ranks have rows. Learned in one pass over
// the rows every rank published, and only that kept: a 256-rank MoE combine of 4096 tokens per rank publishes 1 M
// rows, and every rank holding all of them (and a map of their 4 M chunks) was 80 GB in one simulated process.
class RowBook {
 public:
  static std::vector<uint8_t> encode(const std::vector<RowIn>& mine);
  // Learns from every rank's rows (`g`) and checks this rank's part (`a`) against them: what is wrong, or "".
  std::string learn(Communicator& c, const BatchReduceArgs& a, const RowChunks& ch, const Gathered& g);
  // This rank's rows, by index.
  const std::vector<RowIn>& mine() const { return mine_; }
  const RowIn* mine(uint32_t index) const;
  // A row this rank contributes to: its position among its destination's rows with contributors, and their count.
  struct Contribution {
    int destination = 0;
    uint32_t index = 0;
    uint32_t position = 0;
    uint32_t contributors = 0;
  };
  const Contribution* contribution(int destination, uint32_t index) const;
  const std::vector<int>& destinations() const { return destinations_; }  // the ranks with rows
  uint32_t longest() const { return longest_; }  // the most rows with contributors any destination has

 private:
  // Scans destination d's published rows for the ones this rank contributes to (contributions_ from `first`, all
  // to d, by index); "" or what does not match.
  std::string scan(Communicator& c, int d, const std::vector<uint8_t>& part, size_t first);
  // This rank's own part: its rows' window and contributor lists, its contributions' source window.
  std::string check(Communicator& c, const BatchReduceArgs& a, const RowChunks& ch) const;

  std::vector<RowIn> mine_;
  std::vector<Contribution> contributions_;  // by (destination, index)
  std::vector<int> destinations_;
  uint32_t longest_ = 0;
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
// relative to its bandwidth. Every row has the same chunks, so where a chunk goes depends only on its row's position
// among its destination's rows with contributors: one sequence serves every destination, and every rank derives the
// same plane and per-plane sequence for every chunk.
class ChunkPlaces {
 public:
  void number(Communicator& c, const Plan& plan, const RowBook& rows, const RowChunks& ch);
  const ChunkPlace& at(uint32_t position, uint32_t chunk) const;

 private:
  uint32_t per_row_ = 1;
  std::vector<ChunkPlace> place_;  // [position * per_row + chunk]
};

}  // namespace ifec::workloads
