// A collective point as both drivers run and check it: what to run (CollectivePoint), every member's input as a
// pure function of (seed, member, element), the check of the outputs against an fp64 reference, and the row the
// point gives (time, nccl-tests bandwidths, wire bytes per plane, fallbacks, faults) printed in the nccl-tests
// layout or as JSON. The simulated driver runs points in testbed/sim (collective_run.h); each live ifec-hostd runs
// its own rank's part and checks its own result with the same functions.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "ifec/common/ech.h"
#include "ifec/common/json.h"
#include "ifec/workloads/communicator.h"

namespace ifec::testbed {

using workloads::Algo;
using workloads::Collective;

// The state a fabric carries from one operation to the next that decides which sub-link each frame takes: the
// in-fabric group counter of the first rank's communicator (chunk c of group g travels sub-link (c + g) mod n, up
// and down), and each member's endpoint stripe rotor (which QP a store's stripes start on) and next multicast PSN (a
// multicast packet goes up the sub-link of its PSN; the switch sprays its replicas by its own rotation). A row records
// where its operation started; a point starts there (a replay of a trace) or, where a field is -1 or empty, from a
// fresh fabric's.
struct Turns {
  int group = -1;
  std::vector<uint64_t> stripe;     // per member, in member order
  std::vector<uint32_t> multicast;  // per member
};

struct CollectivePoint {
  Collective kind = Collective::kAllReduce;
  Algo algo = Algo::kIfec;  // ring|tree|rd|oneshot|best (endpoint algorithms) or ifec
  uint64_t bytes = 0;
  common::EchDtype dtype = common::EchDtype::kFp32;
  common::EchRedOp op = common::EchRedOp::kSum;
  double loss = 0;
  uint64_t seed = 1;
  std::vector<std::string> fail;  // "SELECTOR@TIME", relative to the operation's start
  bool reproducible = false;
  uint32_t slot_pool = 8192;    // slots per switch
  uint32_t slot_budget = 128;   // slots per group asked of each switch (in-fabric path)
  int members = 0;              // 0: every GPU of the topology
  int root = 0;                 // reduce's destination, broadcast's source: a member
  bool corrupt_output = false;  // checks the checker: one output element is changed before the comparison
  bool live_timing = false;     // the live daemons' timers (live_timing.h): to compare with a live fabric
  // Frames carry headers and lengths only (the simulated driver's elided payloads): the same times and bytes as
  // real payloads, nothing computed or checked; the row says "timing only".
  bool elided_payloads = false;
  int threads = 0;  // the simulated driver's ClusterOptions::threads (0: one event loop; N: partitioned on N threads)
  int gpu_groups = 0;   // and its GPU groups (0: one per thread); the same rows for every grouping
  int leaf_groups = 0;  // the switches by plane (0) or by plane and leaf group (FabricOptions::leaf_groups)
  Turns start;          // where the carried state starts (a replay sets the traced operation's); fresh by default
};

struct CollectiveRow {
  CollectivePoint point;
  bool ok = false;
  std::string error;
  std::string ran;  // the algorithm that ran (best: the one its cost model chose)
  uint64_t count = 0;
  double time_us = 0;  // simulated
  // The data path's time: from when it began to when it ended (the last member's, workloads::CollectiveResult's
  // data_start_ns and data_end_ns), on the driver's clock (simulated ns, or the machine's monotonic clock live).
  double data_us = 0;
  common::TimeNs data_start_ns = 0;
  common::TimeNs data_end_ns = 0;
  double algbw_gbs = 0;
  double busbw_gbs = 0;
  uint64_t wrong = 0;                    // elements outside the tolerance of the path's rounding
  double max_rel_error = 0;              // against the fp64 reference
  std::vector<uint64_t> plane_tx_bytes;  // frame bytes the members sent, per plane
  std::vector<uint64_t> plane_rx_bytes;  // frame bytes the members received, per plane
  // Per link of the members: (topology link id, bytes the GPU sent on it, bytes it received on it).
  std::vector<std::array<uint64_t, 3>> gpu_links;
  std::string partitions;  // the simulated driver's partitions ("" on one event loop)
  uint64_t windows = 0;    // and the windows it ran them in
  uint64_t fallback_chunks = 0;
  bool fell_back = false;
  uint64_t anomalies = 0;
  // What the operation met: frames lost on links (injected loss / links down), link events, and the
  // operation's own account of what it did about them (planes given up, results copied, chunks redone).
  uint64_t frames_lost = 0;
  uint64_t frames_lost_link_down = 0;
  std::vector<std::string> faults;
  // Packets the members sent again (RC retransmissions, ECH contributions and multicast packets) and their frame
  // bytes; the in-fabric protocol's retransmissions, busy NAKs and duplicate results (all summed over the members).
  uint64_t resent = 0;
  uint64_t resent_bytes = 0;
  uint64_t ifec_retransmissions = 0;
  uint64_t ifec_busy_naks = 0;
  uint64_t ifec_duplicate_results = 0;
  // Live only: how late the rank's event loop ran its latest timer during the operation (the host not running the
  // daemon) and the CPU time the loop's thread used.
  double host_stall_us = 0;
  double host_cpu_us = 0;
  double wall_seconds = 0;  // the whole point: windows, inputs, the simulation, the fp64 reference and checks
  // The simulation alone: its wall time, events run, and frame-hops (frames sent on any link, GPU or switch end).
  double sim_seconds = 0;
  uint64_t sim_events = 0;
  uint64_t frame_hops = 0;
  bool modelled = false;  // extrapolated from simulated rows, not simulated
  Turns turns;            // the carried state the operation started from (a live rank's row: its own)
};

// Writes elements first..first+count-1 of the input member `member` of a point starts with to `out`: each element a
// function of (seed, dtype, member, element index) only, so the check regenerates every member's rather than
// keeping copies, and live ranks check their own result the same way.
void collective_input(const CollectivePoint& p, int member, uint64_t count, uint8_t* out, uint64_t first = 0);
// Elements of the result buffers `outputs` (count elements each) outside the rounding bound of the fp64 reference
// of members 0..n-1's inputs (rounds_per_step: the endpoint path rounds once per ring step; the switch once;
// broadcast: the reference is member `source`'s input).
struct OutputCheck {
  uint64_t wrong = 0;
  double max_rel_error = 0;
};
// Elements [lo, hi) only where given (a reduce-scatter's block).
OutputCheck check_outputs(const CollectivePoint& p, int n, uint64_t count, bool rounds_per_step,
                          const std::vector<const uint8_t*>& outputs, int source = 0, uint64_t lo = 0,
                          uint64_t hi = UINT64_MAX);

// nccl-tests' bus bandwidth factor: 2 (n - 1) / n for AllReduce, 1 for the others.
double busbw_factor(Collective kind, int members);
// The row's fields that come from an operation's result on `members` ranks, whichever driver ran it: ok, the
// algorithm that ran, fallbacks and anomalies, the operation's faults (appended), its time and bandwidths.
void record_result(CollectiveRow& row, const workloads::CollectiveResult& res, int members);
// check_outputs on the row's point into the row: the wrong elements and the largest error; a row with a wrong
// element is not ok, and its error says so. outputs[i] is member first_member + i's buffer: an all-gather's every
// block must equal its owner's input bit for bit, a reduce-scatter's own block the reference.
void record_check(CollectiveRow& row, int members, bool rounds_per_step, const std::vector<const uint8_t*>& outputs,
                  int source = 0, int first_member = 0);

std::string rows_header();
// The row, then one indented "#   fault: ..." line per fault it met.
std::string row_text(const CollectiveRow& r);
// One comment line on how fast the simulator ran the point (wall times vary: kept out of row_text, which a
// serial and a parallel sweep must print alike).
std::string simulator_text(const CollectiveRow& r);
std::string row_json(const CollectiveRow& r, const std::string& topology, const std::string& driver = "sim");
// The row's resent, in-fabric retry and host fields (resent ... host_cpu_us) into `o`: row_json's, and a live
// all-to-all row's.
void add_retries(common::JsonObject& o, const CollectiveRow& r);

}  // namespace ifec::testbed
