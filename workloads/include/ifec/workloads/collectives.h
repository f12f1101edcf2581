// The vocabulary of collectives shared by the communicator, its drivers and the reports: which collective, and how
// one finished on a rank (ok or why not, times, what ran, what it met).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ifec/common/ech.h"
#include "ifec/common/interfaces.h"

namespace ifec::workloads {

// kMulticast is the broadcast: every member gets the root's bytes.
enum class Collective : uint8_t { kAllReduce, kReduce, kMulticast, kBarrier, kReduceScatter, kAllGather };
const char* collective_name(Collective c);
// allreduce | reduce | multicast (or broadcast) | barrier | reduce-scatter | all-gather; throws Error naming it.
Collective parse_collective(const std::string& name);

struct CollectiveResult {
  bool ok = false;
  std::string error;
  common::TimeNs start_ns = 0;
  common::TimeNs end_ns = 0;
  // When this rank's data path began (0: at start_ns): an in-fabric operation first waits for its plan (the
  // leader's switch reservations and the bootstrap sharing them; live, gRPC between daemons; simulated, the
  // topology's control_plane_delay_ns). Merged over ranks: the last rank's.
  common::TimeNs data_start_ns = 0;
  // When it ended: the arrival of the frame that finished it (Clock::event_time: live, the kernel's receive
  // timestamp, so a loaded host that ran the handler late does not lengthen it); an in-fabric round's data path ends
  // before the ranks report its outcome over the bootstrap. 0 until the operation finishes.
  common::TimeNs data_end_ns = 0;
  bool fell_back = false;           // in-fabric path could not serve it (no reservation, pool exhausted, anomaly)
  uint64_t fallback_chunks = 0;     // chunks completed on the endpoint-based path instead
  uint64_t anomalies = 0;           // chunks a switch released with the anomaly flag
  std::string fallback_reason;      // why the fabric did not serve (part of) it, when fell_back
  std::vector<std::string> faults;  // what the operation met and did about it, one line each (in-fabric path)
  std::string algo;                 // what ran: ring, tree, rd, oneshot, ifec (collectives), or the batch operation
};

size_t element_size(common::EchDtype t);  // throws Error for an unknown dtype

}  // namespace ifec::workloads
