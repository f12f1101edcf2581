// The report of a raw-traffic run (`./ifec sim --traffic`, the Python package's ifec.sim.run): text, one JSON
// object, or the per-port and per-queue switch counters.
#pragma once

#include <string>

#include "ifec/testbed/traffic_run.h"

namespace ifec::testbed {

std::string to_json(const SimRun& run);
std::string to_text(const SimRun& run);
// Per-port and per-queue switch counters as a table (ports that saw no traffic are left out).
std::string counters_table(const SimRun& run);

}  // namespace ifec::testbed
