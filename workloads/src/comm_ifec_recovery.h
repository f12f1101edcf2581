// Private to the communicator's sources: what an in-fabric reduction does after a round. Every rank reports what it
// received; from all reports every rank decides alike which results are copied from a rank holding them and which
// chunks nobody received (redone in the next round); after the last round the rest runs on the endpoint path from
// the untouched inputs. Stores that land before this rank knows what they are for are held meanwhile.
//
// A new in-fabric operation with the same promise (a result lands at most once per rank, the endpoint path only
// ever reduces inputs) reports with encode_report, decides with resolve_round, and composes ResultCopies,
// EndpointPath and HeldStores as IfecReduceOp does.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm_ifec_plan.h"
#include "comm_schedule.h"
#include "ifec/common/range_set.h"
#include "ifec/endpoint/ech_agent.h"
#include "ifec/workloads/communicator.h"

namespace ifec::workloads {

// One rank's account of a round.
struct RoundReport {
  std::vector<uint8_t> has;  // per chunk of the round: its result is here
  uint32_t anomalies = 0;
  uint32_t given_up = 0;
  std::map<int, std::string> planes_lost;
};

// This rank's report of the round `red` ran (its chunk t: the round's t-th chunk).
RoundReport report_round(const endpoint::EchReduction& red, const IfecChunks& ch, int rank, int ranks);
std::vector<uint8_t> encode_report(const RoundReport& r);
RoundReport decode_report(const std::vector<uint8_t>& bytes, const std::string& what);

// What a round left, decided alike on every rank from every rank's report.
struct RoundResolution {
  struct Copy {
    uint32_t chunk = 0;
    int holder = 0;
    std::vector<int> lacking;
  };
  std::vector<Copy> copies;    // results one rank holds and others lack
  std::vector<uint32_t> redo;  // chunks nobody received: every rank still holds its input
  uint64_t anomalies = 0;
  uint64_t given_up = 0;
  uint64_t copied = 0;                     // results to copy, one per rank lacking one
  std::map<int, std::string> planes_lost;  // the first reason given for each

  // The round's fault line ("" when it met nothing).
  std::string faults(int round) const;
};

// `todo`: the round's chunks, in the order of the reports.
RoundResolution resolve_round(const Gathered& g, const std::vector<uint32_t>& todo, const IfecChunks& ch);

// The results copied after a round: the holder stores, the ranks lacking them count what lands.
class ResultCopies {
 public:
  ResultCopies(Communicator& c, const CollArgs& a, const IfecChunks& ch) : comm_(c), a_(a), ch_(ch) {}
  // Posts this rank's copies as a holder (the stores, for the operation to watch, each then stored()) and learns
  // the ones it receives.
  std::vector<endpoint::OpHandle> start(const std::vector<RoundResolution::Copy>& copies);
  // The last round's copies all landed: none is expected until the next resolution.
  void forget_incoming() { from_.clear(); }
  // True when the store is a copy this rank waits for (then counted).
  bool claim(int peer, uint16_t window, uint64_t offset, uint64_t len);
  void stored() { --out_; }
  bool all_in() const { return in_.bytes() == bytes_in_; }
  bool settled() const { return out_ == 0 && all_in(); }

 private:
  Communicator& comm_;
  const CollArgs& a_;
  const IfecChunks& ch_;
  std::map<uint64_t, int> from_;  // chunk byte offset -> the GPU that sends it here
  common::RangeSet in_;
  uint64_t bytes_in_ = 0;
  size_t out_ = 0;
};

// What no round finished, run on the endpoint ring from the ranks' untouched inputs, one contiguous run of chunks
// after another.
class EndpointPath {
 public:
  EndpointPath(Communicator& c, const CollArgs& a, const IfecChunks& ch) : comm_(c), a_(a), ch_(ch) {}
  // Cuts `chunks` (ascending) into contiguous runs; returns how many chunks they hold.
  uint64_t plan(const std::vector<uint32_t>& chunks);
  // Starts the next run (false when none is left); `done` gets its end, an error naming its chunks.
  bool run_next(schedule::Run::Finished done);
  bool running() const { return run_ != nullptr; }
  bool on_remote_write(int peer, uint16_t window, uint64_t offset, uint64_t len) {
    return run_->on_remote_write(peer, window, offset, len);
  }
  std::string describe_stuck() const { return run_->describe_stuck(); }

 private:
  Communicator& comm_;
  const CollArgs& a_;
  const IfecChunks& ch_;
  std::vector<std::pair<uint32_t, uint32_t>> runs_;  // [first, end) chunks
  std::unique_ptr<schedule::Run> run_;
};

// Stores that landed before this rank knew what they are for: with ranks on their own clocks, a faster rank resolves
// a round (and copies results here, or starts the endpoint path, or its next run) before this rank has.
class HeldStores {
 public:
  void hold(const Communicator::Arrival& a) { held_.push_back(a); }
  void clear() { held_.clear(); }
  // Offers every held store to `claim` again; those it does not take stay held, in order.
  void replay(const std::function<bool(const Communicator::Arrival&)>& claim);
  // Hands every store still held to `pass_on` (a peer already in the next operation on the same buffers).
  void pass_on(const std::function<void(const Communicator::Arrival&)>& pass_on);

 private:
  std::vector<Communicator::Arrival> held_;
};

}  // namespace ifec::workloads
