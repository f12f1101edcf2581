// Private to the communicator's sources: what every in-fabric round is built from: the reduction spec's common
// fields, lanes toward the plan's groups, pieces spread over planes by load, and planes given up when lost.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "comm_plan.h"
#include "ifec/endpoint/ech_agent.h"
#include "ifec/workloads/communicator.h"

namespace ifec::workloads {

// Live bandwidth (Gb/s) of this rank's ports on `plane`.
double my_plane_gbps(Communicator& c, int plane);
// The loopback of this rank's switch on `plane` (one tier: the plane's; two tier: its leaf), or 0 when it has none.
uint32_t loopback_of_switch(Communicator& c, int plane);

// This rank's part of a reduction of `what`'s groups, before lanes and chunks.
endpoint::EchReduceSpec reduce_spec(Communicator& c, const GroupOp& what, uint16_t source_window);

// The lanes of one spec: one per (plane, group), added the first time a chunk goes there, this rank contributing
// as its member index on that plane (member_index).
class Lanes {
 public:
  Lanes(Communicator& c, endpoint::EchReduceSpec& spec) : comm_(c), spec_(spec) {}
  uint32_t lane(int plane, uint16_t group, uint32_t window);

 private:
  Communicator& comm_;
  endpoint::EchReduceSpec& spec_;
  std::map<std::pair<int, uint16_t>, uint32_t> index_;
};

// Spreads pieces over planes: each to the plane least loaded in bytes relative to its bandwidth (the first of
// equals), so pieces of unequal size still fill the planes evenly.
class LoadSpreader {
 public:
  explicit LoadSpreader(std::vector<double> gbps) : gbps_(std::move(gbps)), load_(gbps_.size(), 0) {}
  size_t place(double bytes);  // an index into the planes given

 private:
  std::vector<double> gbps_;
  std::vector<double> load_;
};

std::vector<int> all_planes(const Communicator& c);

// Gives up those of `planes` this rank can no longer use (its link is down, or FARE has no path to a rank on it),
// on an EchReduction or EchMulticast: nothing more waits for them there.
template <typename Ech>
void give_up_lost_planes(const Communicator& c, Ech& ech, const std::vector<int>& planes) {
  for (int p : planes) {
    if (const std::string why = c.plane_problem(p); !why.empty()) {
      ech.give_up_plane(p, why);
    }
  }
}

}  // namespace ifec::workloads
