// Link failures and restorations as users write them (`--fail gpu5:plane2:sub0@20us`, a point's `fail` list, the
// Python package): link selectors resolved against a topology, times with units.
#pragma once

#include <string>
#include <vector>

#include "ifec/common/interfaces.h"
#include "ifec/routing/topology.h"

namespace ifec::testbed {

struct LinkEvent {
  std::string spec;        // as the user wrote it, for reports
  std::vector<int> links;  // topology link ids
  bool up = false;
  common::TimeNs at = 0;
};

// "10us", "2500ns", "1.5ms", "3s" or a bare number of ns; throws Error naming the text.
// Link events at most this far into a run (a million seconds of simulated time).
constexpr double kMaxEventTimeNs = 1e15;
common::TimeNs parse_time(const std::string& text);

// Link selectors: a link id ("17"), "NODE:NODE" (every link between them), "NODE:NODE:SUB" (one sub-link),
// "GPU:planeP" (the GPU's links on plane P), "GPU:planeP:subS". Throws Error naming the selector.
std::vector<int> resolve_links(const routing::Topology& topo, const std::string& selector);

// "SELECTOR@TIME"
LinkEvent parse_link_event(const routing::Topology& topo, const std::string& text, bool up);

// Throws Error naming a restoration that finds all its links up (no failure before it, or restored already):
// in time order, equal times in the list's order, as a run applies them. A restore before its failure restored
// nothing, and the link stayed down for good.
void check_link_events(const std::vector<LinkEvent>& events);

// The GPUs `events` leave with no working fabric link (NVLink-class links aside), applied as check_link_events
// applies them: "GPU 0 lost every fabric link at 1000 ns" (", restored at 5000 ns" where a restoration ends it),
// joined by "; ", or "" when none. A run that fails names it: a cut-off GPU's flows stay incomplete, and no
// collective it takes part in can finish.
std::string cut_off_gpus(const routing::Topology& topo, const std::vector<LinkEvent>& events);

}  // namespace ifec::testbed
