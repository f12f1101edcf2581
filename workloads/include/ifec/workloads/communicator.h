// A rank's communicator (NCCL's model): built from its own endpoint, a bootstrap and a control-plane client, and
// nothing else. Every collective is this rank's own part of it: its sends, its receives, its completions. N ranks
// may share one simulated event loop (testbed/sim's harness) or run one per process (the live testbed).
//
// Calls are asynchronous: each starts this rank's part and calls `done` (as its own event on the rank's clock) when
// this rank is finished with it. Ranks call the same collectives in the same order, with the same arguments
// (except where noted). Operations run one at a time per communicator.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ifec/common/control.h"
#include "ifec/endpoint/endpoint.h"
#include "ifec/routing/topology.h"
#include "ifec/workloads/bootstrap.h"
#include "ifec/workloads/collectives.h"

namespace ifec::workloads {

// Endpoint-based algorithms and the in-fabric one. `best` runs the endpoint algorithm a cost model of this fabric
// says is fastest at the size (ring when bandwidth-bound; recursive doubling, a binary tree or one-shot below the
// crossovers): see choose_algorithm().
enum class Algo : uint8_t { kRing, kTree, kRd, kOneShot, kBest, kIfec };
const char* algo_name(Algo a);
Algo parse_algo(const std::string& name);  // ring|tree|rd|oneshot|best|ifec; throws Error naming the value

// The ring's unit of transfer and its staging depth: a buffer streams through in slices of kRingSliceBytes
// (NCCL-like: a rank forwards a slice as soon as it arrived), and each reduce-scatter slice lands in one of
// kRingSlots staging slots per rank, reused only after the store that last used it completed. 64 x 64 KiB covers a
// round trip plus queueing at 400 GB/s.
inline constexpr uint64_t kRingSliceBytes = 64 * 1024;
inline constexpr uint32_t kRingSlots = 64;

struct IfecOptions {
  uint32_t job = 1;
  uint32_t slots_per_plane = 128;   // slot budget asked of each plane's switch per group
  uint32_t multicast_window = 256;  // multicast packets in flight per plane
  uint32_t row_window = 64;         // batch reduction: contributions in flight per plane, in the batch's global order
  int max_rounds = 3;               // in-fabric rounds (the first and redos) before the endpoint path takes the rest
  endpoint::EchTiming timing;       // retransmission and RNR back-off of contributions and packets
  // In-fabric reductions' first timeout, before round trips are measured. 0: four slot budgets' drain at the plane's
  // rate, at least timing.min_rto_ns (no fan-in: safe where only links delay an answer, as simulated). The live
  // testbed sets timing.initial_rto_ns: its daemons share cores and a first large operation's answers took 20-40 ms
  // there, so 20 ms resent 58-134 contributions of a first 1 MiB AllReduce on superpod-8x2.
  common::TimeNs reduce_initial_rto_ns = 0;
  uint16_t first_group = 1;  // a new communicator's group counter (group_turn); a replay sets the traced one
};

struct CommOptions {
  IfecOptions ifec;
  common::TimeNs limit_ns = 10'000'000'000ULL;  // an operation that has not finished after this fails, saying why
  // Keep stores that land while no operation runs, or that the running one does not claim, for the next one (a
  // peer started it first). Drivers that start every operation on every rank in one event and wait for all of
  // them (the simulated harness) turn it off: nothing can be early there.
  bool keep_early_arrivals = true;
  // The windows its operations use, first..last (last 0: any). Several communicators share an endpoint and each
  // hears every store: one keeps only those into its own windows (a live hostd's point-to-point channels, idle
  // through a large collective, each kept every one of its stores, up to kMaxEarly).
  uint16_t first_window = 0;
  uint16_t last_window = 0;
};

// One collective as a rank takes part in it. Buffers are in place: every rank holds its input at
// (window, offset) and, when the operation finishes, its result there (allreduce: every rank; reduce: the root;
// broadcast: every rank gets the root's bytes; reduce-scatter: rank r gets block r reduced; all-gather: every rank
// gets every block; block r of `count` elements is [count * r / n, count * (r + 1) / n)).
struct CollArgs {
  Collective kind = Collective::kAllReduce;
  int root = 0;  // a rank (reduce destination, broadcast source)
  uint16_t window = 1;
  uint64_t offset = 0;
  uint64_t count = 0;  // elements
  common::EchDtype dtype = common::EchDtype::kFp32;
  common::EchRedOp op = common::EchRedOp::kSum;
  uint16_t scratch_window = 2;  // staging and signal words of the endpoint-based algorithms (and their fallback)
};

// Batch multicast (MoE dispatch), this rank's part: its rows as a source (each to its destinations, at the same
// offset of `window` everywhere), and the byte ranges it receives from other sources.
struct RowsOut {
  uint64_t offset = 0;
  std::vector<int> destinations;  // ranks, not this one
};
struct BatchMulticastArgs {
  uint16_t window = 0;
  uint64_t row_bytes = 0;
  std::vector<RowsOut> rows;                            // sources: this rank
  std::vector<std::pair<uint64_t, uint64_t>> incoming;  // (offset, bytes) this rank receives
};

// Batch reduction (MoE combine), this rank's part: rows it contributes to (each summed in the fabric with the other
// contributors' and delivered to the row's destination), and the rows it is the destination of.
struct RowIn {
  uint32_t index = 0;             // result row: lands at result_offset + index * row bytes of result_window here
  std::vector<int> contributors;  // ranks, not this one
};
struct RowContribution {
  int destination = 0;  // rank
  uint32_t index = 0;
  uint64_t source_offset = 0;  // this rank's row in source_window
};
struct BatchReduceArgs {
  uint16_t source_window = 0;
  uint16_t result_window = 0;
  uint16_t scratch_window = 0;  // fallback: pieces of undelivered chunks are summed here at their destination
  uint64_t result_offset = 0;
  common::EchDtype dtype = common::EchDtype::kFp32;
  uint32_t row_elements = 0;
  std::vector<RowIn> mine;                  // as destination (indices unique)
  std::vector<RowContribution> contribute;  // as contributor
};

// Batch of point-to-point row stores (the endpoint-based MoE dispatch and combine: an all-to-all-v), this rank's
// part: its rows, each from its own offset of source_window to its own offset of dest_window at its destination
// (this rank: copied locally), posted in order; and the byte ranges of dest_window it receives from other ranks.
// With `rows_ahead`, at most that many rows per destination are posted before the earlier ones complete (the
// next one when one does; the stripes spread over QPs as if all were posted at once): bounded memory per rank
// however many rows it sends, and the same frames as long as no QP runs out of work. 0: every row at once.
struct RowPut {
  uint64_t from = 0;    // offset in source_window here
  int destination = 0;  // rank
  uint64_t to = 0;      // offset in dest_window there
  uint64_t bytes = 0;   // this row's length; 0: the batch's row_bytes (an all-to-all-v's rows differ)
};
struct BatchPutArgs {
  uint16_t source_window = 0;
  uint16_t dest_window = 0;
  uint64_t row_bytes = 0;
  std::vector<RowPut> rows;
  std::vector<std::pair<uint64_t, uint64_t>> incoming;  // (offset, bytes) of dest_window, from other ranks
  uint32_t rows_ahead = 0;
};

class CommOp;

// A rank's communicator subscribes once to its endpoint (remote writes, route changes) and hands them to its running
// operation; several may share an endpoint, each hearing everything.
class Communicator : private endpoint::EndpointSubscriber {
 public:
  using Done = std::function<void(CollectiveResult)>;
  using Ready = std::function<void(const std::string& error)>;  // "" when it worked

  Communicator(endpoint::Endpoint& ep, Bootstrap& boot, common::ControlPlane& control, const routing::Topology& topo,
               CommOptions opts = {});
  ~Communicator() override;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // Learns every rank's GPU. Call once, before anything else.
  void init(Ready done);
  // Allocates window `id` of `bytes` here and learns every rank's (rkey, address) for it.
  void allocate_window(uint16_t id, uint64_t bytes, Ready done);

  // One collective (algo: see Algo). The result says which algorithm ran, what the operation met, and its times.
  void run(const CollArgs& a, Algo algo, Done done);
  void multicast_rows(BatchMulticastArgs a, Done done);
  void reduce_rows(BatchReduceArgs a, Done done);
  void put_rows(BatchPutArgs a, Done done);

  int rank() const { return boot_.rank(); }
  int size() const { return boot_.size(); }
  int gpu(int rank) const { return gpus_.at(rank); }
  const std::vector<int>& gpus() const { return gpus_; }
  int rank_of_gpu(int gpu) const;
  endpoint::Endpoint& endpoint() { return ep_; }
  Bootstrap& bootstrap() { return boot_; }
  common::ControlPlane& control() { return control_; }
  const routing::Topology& topology() const { return topo_; }
  const CommOptions& options() const { return opts_; }
  // Replaces the options (between operations).
  void set_options(const CommOptions& o);
  // Where an operation's `done` runs: by default as an event of its own on this rank's clock, at once (the caller
  // may start the next operation from it); a partitioned Cluster hands it to its calling thread between windows,
  // where a driver may touch every rank.
  using Handover = std::function<void(std::function<void()>)>;
  void set_handover(Handover h) { handover_ = std::move(h); }
  void hand_over(std::function<void()> fn);
  common::Clock& clock() { return ep_.clock(); }
  uint16_t next_group() { return next_group_++; }
  // The counter the next in-fabric operation numbers its switch groups from (it picks, among other things, the
  // Y-cable sub-link of each chunk): a trace records it at an operation's start, a replay starts there
  // (IfecOptions::first_group).
  uint16_t group_turn() const { return next_group_; }

  // Stores that landed here while no operation ran, or that the running one did not claim (a peer started the
  // next one first), oldest first; the next operation is offered them (CommOptions::keep_early_arrivals).
  struct Arrival {
    int peer;
    uint16_t window;
    uint64_t offset;
    uint64_t len;
  };
  std::vector<Arrival> take_early_arrivals();
  void keep_early(const Arrival& a);
  // True once after an operation failed here: the next one must wait out the failed one's stores (see ScheduleOp).
  bool take_fence();

  // Scratch bytes the endpoint-based algorithm `algo` needs (ifec: the ring's, its fallback; best: the choice's on
  // `topo` from `first_gpu`, or without a topology whatever any choice needs) for `a` (every rank, in
  // a.scratch_window).
  static uint64_t scratch_bytes(const CollArgs& a, int ranks, Algo algo, const routing::Topology* topo = nullptr,
                                int first_gpu = 0);
  // The endpoint algorithm `best` runs for `a` on this fabric, from its cost model (latency per hop vs bandwidth).
  Algo choose_algorithm(const CollArgs& a) const;
  // The same model for `ranks` ranks whose first is GPU `first_gpu` of `topo` (every rank reaches the same choice).
  static Algo choose_algorithm(const CollArgs& a, int ranks, const routing::Topology& topo, int first_gpu);

  // The switch this rank's GPU meets on `plane` (one tier: the plane's; two tier: its leaf), or -1.
  int switch_node_of(int rank, int plane) const;
  // Why this rank cannot use `plane` toward every other rank (its own link down, or FARE has no path), or "".
  std::string plane_problem(int plane) const;

 private:
  friend class CommOp;
  void start(std::shared_ptr<CommOp> op);
  void finished(CommOp* op);
  // From the endpoint: offered to the running operation; what it does not claim is kept (keep_early).
  void on_remote_write(int peer, uint16_t window, uint64_t offset, uint64_t len) override;
  void on_routes_changed() override;

  endpoint::Endpoint& ep_;
  Bootstrap& boot_;
  common::ControlPlane& control_;
  const routing::Topology& topo_;
  CommOptions opts_;
  std::vector<int> gpus_;  // rank -> GPU (endpoint index)
  // [rank * planes + plane] -> switch_node_of, from one pass over the links at init: plans ask it of every rank on
  // every plane, and a topology's links_of scans every link (thousands of GPUs: seconds per round otherwise).
  std::vector<int> switch_of_;
  void index_switches();
  std::shared_ptr<CommOp> op_;
  uint16_t next_group_ = 1;
  static constexpr size_t kMaxEarly = 1 << 20;
  std::vector<Arrival> early_;
  bool fence_next_ = false;
  Handover handover_;
  endpoint::Subscription subscription_;  // last: released before anything the deliveries touch goes
};

}  // namespace ifec::workloads
