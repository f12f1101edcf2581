// The simulator's own speed: frame-hops (frames sent on any link, by a GPU or a switch) per wall-second of the
// simulation on one core, for raw all-to-all traffic and for AllReduce, best and median of several runs (these
// machines are noisy), beside what bounds it: the bytes the fabric holds on its wires at line rate (a frame that
// arrives after more than a core's cache share of newer frames is read from memory) and the CPU's ICRC path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ifec/routing/topology.h"
#include "ifec/workloads/communicator.h"

namespace ifec::testbed {

struct SpeedScenario {
  std::string topo_path;
  bool allreduce = false;  // false: raw all-to-all, `bytes` per ordered pair; true: AllReduce of `bytes`
  workloads::Algo algo = workloads::Algo::kRing;
  uint64_t bytes = 0;
  int runs = 1;
};

struct SpeedRow {
  SpeedScenario scenario;
  std::string topology;
  int gpus = 0;
  uint64_t frame_hops = 0;  // the same in every run (the simulation is deterministic; checked)
  uint64_t events = 0;
  std::vector<double> seconds;  // each run's simulation, wall-clock
  double point_seconds = 0;     // AllReduce: the last run's whole point (windows, inputs, fp64 reference, checks)
  double wire_bytes = 0;        // wire_bytes_in_flight(topology)
  double best() const;
  double median() const;
  double best_rate() const { return best() > 0 ? frame_hops / best() : 0; }  // frame-hops per second
};

// Bytes on all the fabric's wires at once when every link direction runs at line rate: sum of rate x delay.
double wire_bytes_in_flight(const routing::Topology& topo);

// 64 x 4 all-to-all (1 MiB per pair; 256 KiB quick), the same code on 8 x 2 (64 MiB; 16 MiB quick), and the 64 x 4
// AllReduce, ring and in-fabric (64 MiB; 16 MiB quick), `runs` times each, but at most twice for an AllReduce
// (several seconds a run; the first also pays for the process's first touch of its frame memory, up to a third
// of its time); topologies from `topo_dir`.
std::vector<SpeedScenario> speed_scenarios(const std::string& topo_dir, bool quick, int runs);

// Runs `s` on `topo` s.runs times. Throws Error when a run fails or two runs disagree on the frame-hops.
SpeedRow measure_speed(const routing::Topology& topo, const SpeedScenario& s);

// What the bytes alone cost on this core: building one RDMA WRITE frame of `payload` bytes (ICRC included) and
// verifying one built `bytes_in_flight` bytes of frames earlier (its ICRC read where it lies, out of the cache once
// that exceeds it), frames visited in a scrambled order as arrivals from many links are. Nanoseconds per frame,
// the best of three passes of `frames` each; a frame that fails its check throws Error. In an all-to-all each frame
// makes two hops, so 2e3 / this is the frame-hops per second the simulator could not beat with free events.
double frame_bytes_ns(double bytes_in_flight, size_t payload, int frames);

// What the ring AllReduce's bytes alone cost on this core: the memory work any simulator that carries the data
// must do for `ranks` ranks of `bytes` each (fp32 sum), and nothing else (no events, links, switches, transport or
// ACKs). Each 4 KiB RDMA WRITE frame is built from the sender's buffer (ICRC included), verified once
// `bytes_in_flight` bytes of newer frames were built (or earlier, when the ring's next step needs its bytes) and
// copied where the ring schedule puts it: during reduce-scatter into one of the receiver's kRingSlots staging
// slices, summed into its buffer once the slice is complete; during all-gather into its buffer. The buffers are
// checked to hold the sum after every pass (Error otherwise); the time is the best of `passes`. `bytes` must be
// whole 4 KiB frames per rank and whole kRingSliceBytes slices beyond one; bad arguments are named.
struct RingBytes {
  uint64_t frames = 0;  // data frames: 2 (ranks - 1) blocks of bytes / ranks per rank
  double seconds = 0;
  double ns_per_frame() const;
};
RingBytes ring_bytes(int ranks, uint64_t bytes, double bytes_in_flight, int passes);
// Comment lines putting `b` (measured for `row`'s ring AllReduce) beside the row: the ceiling it sets on
// frame-hops/s at the row's frame-hops per data frame, and what the row spends per data frame.
std::string ring_bytes_note(const SpeedRow& row, const RingBytes& b);
// The same for `row`'s in-fabric AllReduce, from frame_bytes_ns at its bytes on wires (`frame_ns`): each rank's
// contributions and results are 4 KiB frames built and verified once each (a switch ends the one and starts the
// other), so those frames at `frame_ns` each bound the rate, before any reduction, copy or ACK.
std::string ifec_bytes_note(const SpeedRow& row, double frame_ns);

// One line per row, under a header naming the columns.
std::string speed_table(const std::vector<SpeedRow>& rows);

}  // namespace ifec::testbed
