// Private to the communicator's sources: the chunks of a batch reduction the fabric did not deliver (no plane, a
// contributor that never arrived, a result lost, slot timeouts), summed at their destination from point-to-point
// stores of their contributors' pieces into a scratch window there (fp32, one rounding, as the switch does).
//
// Every rank publishes its undelivered chunks with their contributors (encode_undelivered); PieceRecovery then learns
// all of them, sizes the scratch, sends this rank's pieces, counts the pieces landing here and sums them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "comm_rows_plan.h"
#include "ifec/common/range_set.h"
#include "ifec/endpoint/ech_agent.h"
#include "ifec/workloads/communicator.h"

namespace ifec::workloads {

using RowChunk = std::pair<uint32_t, uint32_t>;  // (row index, chunk)

// This rank's undelivered chunks as a destination: those without a plane, and those `recv` (whose chunk i is
// received[i]) did not finish; with the anomaly notices the batch met here.
std::vector<uint8_t> encode_undelivered(const Communicator& c, const RowBook& rows, const RowChunks& ch,
                                        const ChunkPlaces& places, const endpoint::EchReduction& recv,
                                        const std::vector<RowChunk>& received, uint64_t anomalies);

class PieceRecovery {
 public:
  PieceRecovery(Communicator& c, const BatchReduceArgs& a, const RowChunks& ch, uint16_t scratch)
      : comm_(c), a_(a), ch_(ch), scratch_(scratch) {}

  uint16_t scratch() const { return scratch_; }
  // Every rank's undelivered chunks (their anomaly notices added to `anomalies`); returns how many in all.
  uint64_t learn(const Gathered& g, uint64_t& anomalies);
  size_t mine() const { return failed_[comm_.rank()].size(); }
  // Starts counting the pieces that land here (a peer stores its pieces as soon as it learns this scratch's key,
  // which may be before this rank hears back from the same exchange); returns the scratch bytes they need.
  uint64_t collect();
  // Posts this rank's pieces to every destination, handing each store to `posted` (which calls stored() when done).
  void send(const std::function<void(const endpoint::OpHandle&)>& posted);
  void stored() { --out_; }
  // True when the store is a piece for this rank's scratch.
  bool claim(uint16_t window, uint64_t offset, uint64_t len);
  bool all_in() const { return in_.bytes() >= expected_; }
  // Every piece here and every store of this rank's done (peers that learned the scratch keys first may fill this
  // rank's scratch before it posts its own pieces), not yet summed.
  bool ready() const { return sent_ && out_ == 0 && all_in() && !summed_; }
  // Sums each undelivered chunk of this rank's into its result row.
  void sum();
  std::string describe() const;

 private:
  Communicator& comm_;
  const BatchReduceArgs& a_;
  const RowChunks& ch_;
  uint16_t scratch_;
  struct Failed {
    uint32_t index = 0;
    uint32_t chunk = 0;
    std::vector<int> contributors;
  };
  // [destination] its undelivered chunks; its scratch holds their pieces in this order, each chunk's contributors
  // in row order.
  std::vector<std::vector<Failed>> failed_;
  size_t out_ = 0;
  bool sent_ = false;
  common::RangeSet in_;
  uint64_t expected_ = 0;
  bool collecting_ = false;
  bool summed_ = false;
};

}  // namespace ifec::workloads
