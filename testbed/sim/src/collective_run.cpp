// Runs one collective point on a fresh simulated fabric and fills its row, plus what only a simulator sees (frames
// lost on links, frame-hops and events per wall-second).
#include "ifec/testbed/collective_run.h"

#include <algorithm>
#include <chrono>

#include "ifec/common/checks.h"
#include "ifec/common/heap.h"
#include "ifec/testbed/alltoall_point.h"
#include "ifec/testbed/cluster.h"
#include "ifec/testbed/harness.h"
#include "ifec/testbed/link_events.h"
#include "ifec/testbed/live_timing.h"

namespace ifec::testbed {

using workloads::element_size;

namespace {

constexpr uint16_t kBuf = 1;
constexpr uint16_t kScratch = 2;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void validate_point(const CollectivePoint& p, uint64_t count, size_t es) {
  IFEC_CHECK(p.kind != Collective::kBarrier || p.bytes == 0,
             "a barrier moves no data: size " << p.bytes << " B given (leave --bytes out)");
  IFEC_CHECK(p.kind == Collective::kBarrier || count > 0,
             "size " << p.bytes << " B holds no " << common::ech_dtype_name(p.dtype) << " element");
  IFEC_CHECK(p.kind == Collective::kBarrier || p.bytes % es == 0, "size " << p.bytes << " B is not a whole number of "
                                                                          << common::ech_dtype_name(p.dtype)
                                                                          << " elements (" << es << " B each)");
  IFEC_CHECK(p.members >= 0, "members " << p.members << " must be >= 2 (or 0 for every GPU)");
  IFEC_CHECK(p.loss >= 0 && p.loss < 1, "loss " << p.loss << " outside [0, 1)");
  IFEC_CHECK(p.slot_pool > 0, "slot pool " << p.slot_pool << " must be > 0");
  IFEC_CHECK(p.slot_budget > 0, "slot budget " << p.slot_budget << " must be > 0");
  IFEC_CHECK(p.start.group >= -1 && p.start.group <= 0xFFFF, "group turn " << p.start.group << " outside 0..65535");
}

}  // namespace

Turns start_turns(Cluster& c, const Turns& t, int n) {
  IFEC_CHECK(t.stripe.empty() || static_cast<int>(t.stripe.size()) == n,
             t.stripe.size() << " stripe turns for " << n << " members (one each, or none)");
  IFEC_CHECK(t.multicast.empty() || static_cast<int>(t.multicast.size()) == n,
             t.multicast.size() << " multicast turns for " << n << " members (one each, or none)");
  Turns out;
  out.group = t.group >= 0 ? t.group : IfecOptions{}.first_group;
  for (int g = 0; g < n; ++g) {
    if (!t.stripe.empty()) {
      c.ep(g).set_stripe_turn(t.stripe[g]);
    }
    if (!t.multicast.empty()) {
      c.ep(g).ech().set_next_psn(t.multicast[g]);
    }
    out.stripe.push_back(c.ep(g).stripe_turn());
    out.multicast.push_back(c.ep(g).ech().next_psn());
  }
  return out;
}

namespace {

CollectiveSpec spec_for(const CollectivePoint& p, int n, uint64_t count) {
  CollectiveSpec s;
  s.kind = p.kind;
  for (int g = 0; g < n; ++g) {
    s.members.push_back(g);
  }
  s.root = p.root;
  s.window = kBuf;
  s.offset = 0;
  s.count = count;
  s.dtype = p.dtype;
  s.op = p.op;
  s.scratch_window = kScratch;
  return s;
}

}  // namespace

uint64_t point_memory_budget() { return std::min(kPointMemoryBudget, common::memory_budget_bytes(kPointMemoryBudget)); }

namespace {

// A GPU's buffer and scratch window bytes for `s`; throws naming the point where `gpus` GPUs' windows would take
// more host memory than point_memory_budget() (elided payloads share one memory).
std::pair<uint64_t, uint64_t> window_bytes(const routing::Topology& topo, int gpus, const CollectivePoint& p,
                                           const CollectiveSpec& s) {
  const uint64_t buf = std::max<uint64_t>(64, s.count * element_size(p.dtype));
  const uint64_t scratch = std::max<uint64_t>(4096, ring_scratch_bytes(s, p.algo, &topo));
  const uint64_t budget = point_memory_budget();
  IFEC_CHECK(p.elided_payloads || (buf + scratch) * gpus <= budget,
             "size " << p.bytes << " B on " << gpus << " GPUs needs " << ((buf + scratch) * gpus >> 20)
                     << " MiB of host memory for the simulated windows; the limit is " << (budget >> 20)
                     << " MiB (12 GiB, or 3/4 of this machine's memory)");
  return {buf, scratch};
}

// The buffer and scratch windows on every GPU, each member's input written straight into its buffer (no copy kept).
void prepare_windows(Cluster& c, const CollectivePoint& p, const CollectiveSpec& s) {
  const auto [buf, scratch] = window_bytes(c.fabric().topology(), c.size(), p, s);
  if (p.elided_payloads) {  // nothing is written or read: one memory serves every GPU's windows
    c.allocate_window(kBuf, buf, 1, /*shared=*/true);
    c.allocate_window(kScratch, scratch, 1, /*shared=*/true);
    return;
  }
  c.allocate_window(kBuf, buf);
  c.allocate_window(kScratch, scratch);
  for (int g = 0; g < static_cast<int>(s.members.size()); ++g) {
    collective_input(p, g, s.count, c.window_data(g, kBuf));
    // Every scratch page written once now, as a GPU's memory is mapped before a collective runs: the kernel
    // zero-fills a page on its first write, which would otherwise land in the simulated time.
    uint8_t* sc = c.window_data(g, kScratch);
    for (uint64_t off = 0; off < scratch; off += 4096) {
      sc[off] = 0;
    }
  }
}

// What the fabric counted: per plane (the members' ports), per member link, and over every link end.
struct LinkTally {
  std::vector<uint64_t> plane_tx, plane_rx;
  std::vector<std::array<uint64_t, 3>> gpu_links;  // (topology link id, bytes the GPU sent, bytes it received)
  uint64_t hops = 0;                               // frames sent on any link end
  // The GPUs' packets sent again (frames, bytes) and in-fabric retransmissions, busy NAKs, duplicate results.
  std::array<uint64_t, 5> retries{};

  static LinkTally read(Cluster& c, int members) {
    LinkTally t;
    const routing::Topology& topo = c.fabric().topology();
    t.plane_tx.assign(topo.num_planes, 0);
    t.plane_rx.assign(topo.num_planes, 0);
    for (int g = 0; g < members; ++g) {
      for (const auto& port : c.fabric().gpu_ports(g)) {
        const auto& k = port.io->counters();
        t.plane_tx[port.plane] += k.tx_bytes;
        t.plane_rx[port.plane] += k.rx_bytes;
        t.gpu_links.push_back({static_cast<uint64_t>(port.link), k.tx_bytes, k.rx_bytes});
      }
    }
    t.hops = over_links(c, &common::PortCounters::tx_frames);
    for (int g = 0; c.runs_gpus() && g < members; ++g) {
      const endpoint::Endpoint::Resent r = c.ep(g).resent();
      const auto& e = c.ep(g).ech().counters();
      const std::array<uint64_t, 5> mine = {r.frames, r.bytes, e.retransmissions, e.busy_naks, e.duplicate_results};
      for (size_t k = 0; k < mine.size(); ++k) {
        t.retries[k] += mine[k];
      }
    }
    return t;
  }
  // One counter summed over both ends of every link.
  static uint64_t over_links(Cluster& c, uint64_t common::PortCounters::*counter) {
    uint64_t total = 0;
    for (size_t l = 0; l < c.fabric().topology().links.size(); ++l) {
      for (int side = 0; side < 2; ++side) {
        total += c.fabric().link(static_cast<int>(l)).end(side).counters().*counter;
      }
    }
    return total;
  }
};

CollectiveResult run_operation(Cluster& c, const CollectiveSpec& s, const CollectivePoint& p) {
  if (p.algo != Algo::kIfec) {
    return run_endpoint_collective(c, s, 10'000'000'000ULL, p.algo);
  }
  IfecOptions io;
  io.slots_per_plane = p.slot_budget;
  if (p.start.group >= 0) {
    io.first_group = static_cast<uint16_t>(p.start.group);
  }
  if (p.live_timing) {
    apply_live_timing(io);
  }
  IfecCollectives ifec(c, io);
  return ifec.run(s);
}

// The row's result, times and bandwidths, wire bytes and faults from the operation and the counters around it.
// Spread over processes, the counters over every link end add up every process's (the members' ports are the
// GPUs' process's alone).
void fill_row(CollectiveRow& row, const CollectiveResult& res, Cluster& c, const LinkTally& before, int n,
              const Processes* spread) {
  const LinkTally after = LinkTally::read(c, n);
  row.frame_hops = after.hops - before.hops;
  row.frames_lost = LinkTally::over_links(c, &common::PortCounters::dropped_injected);
  row.frames_lost_link_down = LinkTally::over_links(c, &common::PortCounters::dropped_link_down);
  std::array<uint64_t, 5> retries{};
  for (size_t k = 0; k < retries.size(); ++k) {
    retries[k] = after.retries[k] - before.retries[k];
  }
  if (spread != nullptr) {  // the GPUs' process counts the retries, the others add 0
    std::vector<uint64_t> v = {row.frame_hops, row.frames_lost, row.frames_lost_link_down};
    v.insert(v.end(), retries.begin(), retries.end());
    spread->sum(v);
    row.frame_hops = v[0];
    row.frames_lost = v[1];
    row.frames_lost_link_down = v[2];
    std::copy(v.begin() + 3, v.end(), retries.begin());
  }
  row.resent = retries[0];
  row.resent_bytes = retries[1];
  row.ifec_retransmissions = retries[2];
  row.ifec_busy_naks = retries[3];
  row.ifec_duplicate_results = retries[4];
  for (const std::string& f : row.point.fail) {
    row.faults.push_back("link down: " + f);
  }
  if (row.frames_lost + row.frames_lost_link_down > 0) {
    row.faults.push_back("frames lost: " + std::to_string(row.frames_lost) + " to injected loss, " +
                         std::to_string(row.frames_lost_link_down) + " on links that were down");
  }
  record_result(row, res, n);
  row.error = res.error.empty() && res.fell_back ? res.fallback_reason : res.error;
  for (size_t q = 0; q < after.plane_tx.size(); ++q) {
    row.plane_tx_bytes.push_back(after.plane_tx[q] - before.plane_tx[q]);
    row.plane_rx_bytes.push_back(after.plane_rx[q] - before.plane_rx[q]);
  }
  row.gpu_links = after.gpu_links;
  for (size_t i = 0; i < row.gpu_links.size(); ++i) {
    row.gpu_links[i][1] -= before.gpu_links[i][1];
    row.gpu_links[i][2] -= before.gpu_links[i][2];
  }
}

// Every output against the fp64 reference.
void check_row(CollectiveRow& row, Cluster& c, const CollectiveSpec& s) {
  const CollectivePoint& p = row.point;
  const size_t es = element_size(p.dtype);
  if (p.corrupt_output && row.count > 0) {
    uint8_t* out = c.window_data(p.kind == Collective::kReduce ? s.root : s.members.back(), kBuf);
    out[(row.count / 2) * es + es - 1] ^= 0x40;  // a high bit of the middle element
  }
  if (!row.ok || p.kind == Collective::kBarrier || p.elided_payloads) {
    return;  // elided payloads: timing only, nothing to check
  }
  std::vector<const uint8_t*> outs;
  for (int g : p.kind == Collective::kReduce ? std::vector<int>{s.root} : s.members) {
    outs.push_back(c.window_data(g, kBuf));
  }
  record_check(row, static_cast<int>(s.members.size()), row.ran != "ifec" || row.fell_back, outs, s.root);
}

// The cluster a point runs on (its loss, seed, per-packet spraying, payloads, partitions; the live timers where it
// is to be compared with a live fabric, which also applies them to `topo`'s switches).
ClusterOptions cluster_options(routing::Topology& topo, const CollectivePoint& p, const Processes* procs) {
  ClusterOptions o;
  o.fabric.loss = p.loss;
  o.fabric.seed = p.seed;
  o.fabric.lb = switchemu::LoadBalance::kPerPacket;
  o.fabric.elided_payloads = p.elided_payloads;
  o.threads = p.threads;
  o.gpu_groups = p.gpu_groups;
  o.fabric.leaf_groups = p.leaf_groups;
  o.processes = procs;
  if (procs != nullptr && procs->size > 1) {
    o.threads = std::max(o.threads, 1);
  }
  o.endpoint.ordering = endpoint::Ordering::kWeak;
  if (p.live_timing) {
    apply_live_timing(o.endpoint, topo);
    apply_live_timing(topo.params.ifec);
  }
  return o;
}

}  // namespace

void check_point_memory(const routing::Topology& topo, const CollectivePoint& p) {
  const size_t es = element_size(p.dtype);
  const int n = p.members > 0 ? p.members : topo.num_gpus();
  window_bytes(topo, topo.num_gpus(), p, spec_for(p, n, p.kind == Collective::kBarrier ? 0 : p.bytes / es));
}

CollectiveRow run_collective_point(const routing::Topology& fabric_topo, const CollectivePoint& p,
                                   const Processes* procs) {
  routing::Topology topo = fabric_topo;
  topo.params.ifec.reproducible = topo.params.ifec.reproducible || p.reproducible;
  topo.params.ifec.slot_pool = p.slot_pool;
  const auto wall0 = std::chrono::steady_clock::now();
  CollectiveRow row;
  row.point = p;
  const size_t es = element_size(p.dtype);
  row.count = p.kind == Collective::kBarrier ? 0 : p.bytes / es;
  validate_point(p, row.count, es);
  const ClusterOptions o = cluster_options(topo, p, procs);  // before the cluster: it may set topo's timers
  Cluster c(topo, o);
  IFEC_CHECK(c.size() >= 2, "topology '" << topo.name << "' has " << c.size() << " GPU: a collective needs 2 or more");
  const int n = p.members > 0 ? p.members : c.size();
  IFEC_CHECK(p.root >= 0 && p.root < n, "root " << p.root << " is not one of the " << n << " members");
  IFEC_CHECK(n >= 2 && n <= c.size(), "members " << n << " outside 2.." << c.size());
  const CollectiveSpec s = spec_for(p, n, row.count);
  if (c.runs_gpus()) {
    prepare_windows(c, p, s);
    row.turns = start_turns(c, p.start, n);
  }
  std::vector<LinkEvent> failures;
  for (const std::string& f : p.fail) {
    failures.push_back(parse_link_event(topo, f, false));
    for (int l : failures.back().links) {
      c.fabric().schedule_link_state(l, false, c.now() + failures.back().at);
    }
  }
  const LinkTally before = LinkTally::read(c, n);
  const uint64_t events0 = c.events_run();
  const uint64_t control0 = c.partitions() ? c.partitions()->control_events() : 0;
  const auto sim0 = std::chrono::steady_clock::now();
  CollectiveResult res;
  if (c.runs_gpus()) {
    res = run_operation(c, s, p);
    c.stop_serving();
  } else {
    c.serve();  // this process runs planes: rank 0's row is the run's
  }
  row.sim_seconds = seconds_since(sim0);
  row.sim_events = c.events_run() - events0;
  const Processes* spread = c.partitions() && c.partitions()->spread() ? procs : nullptr;
  if (spread != nullptr) {  // every process's partitions' events, the control loop's (run by all alike) once
    const uint64_t control = c.partitions()->control_events() - control0;
    std::vector<uint64_t> v = {row.sim_events - control};
    spread->sum(v);
    row.sim_events = v[0] + control;
  }
  if (const PlanePartitions* parts = c.partitions()) {
    row.partitions = parts->describe();
    row.windows = parts->windows_run();
  }
  fill_row(row, res, c, before, n, spread);
  check_row(row, c, s);
  if (const std::string cut = cut_off_gpus(topo, failures); !row.error.empty() && !cut.empty()) {
    row.error += " (" + cut + ")";
  }
  row.wall_seconds = seconds_since(wall0);
  return row;
}

CollectiveRow run_alltoall_point(const routing::Topology& fabric_topo, const CollectivePoint& p) {
  IFEC_CHECK(p.bytes > 0, "all-to-all: size " << p.bytes << " B per peer must be > 0");
  IFEC_CHECK(p.members == 0, "all-to-all: every GPU takes part (members " << p.members << ")");
  IFEC_CHECK(p.fail.empty() && p.loss == 0 && !p.elided_payloads,
             "all-to-all: no link failures, loss or elided payloads (run it with none)");
  IFEC_CHECK(p.root == 0, "all-to-all: root " << p.root << ": every GPU stores to every other (there is no root)");
  routing::Topology topo = fabric_topo;
  const auto wall0 = std::chrono::steady_clock::now();
  CollectiveRow row;
  row.point = p;
  row.count = p.bytes;
  const ClusterOptions o = cluster_options(topo, p, nullptr);  // before the cluster: it may set topo's timers
  Cluster c(topo, o);
  const int n = c.size();
  IFEC_CHECK(n >= 2, "all-to-all: topology '" << topo.name << "' has " << n << " GPU: it needs 2 or more");
  // Divided, not multiplied: a product of a huge size wrapped to a small one and passed.
  IFEC_CHECK(p.bytes <= point_memory_budget() / (uint64_t{2} * n * n),
             "all-to-all: " << p.bytes << " B per peer on " << n << " GPUs needs more than "
                            << (point_memory_budget() >> 20) << " MiB of host memory for the simulated windows");
  c.allocate_window(kBuf, p.bytes * n);
  c.allocate_window(kScratch, p.bytes * n);
  std::vector<workloads::BatchPutArgs> per_gpu;
  for (int g = 0; g < n; ++g) {
    per_gpu.push_back(alltoall_rows(p.seed, g, n, p.bytes, kBuf, kScratch, c.window_data(g, kBuf)));
  }
  row.turns = start_turns(c, p.start, n);
  const LinkTally before = LinkTally::read(c, n);
  const uint64_t events0 = c.events_run();
  const auto sim0 = std::chrono::steady_clock::now();
  const CollectiveResult res = run_put_rows(c, std::move(per_gpu));
  row.sim_seconds = seconds_since(sim0);
  row.sim_events = c.events_run() - events0;
  fill_row(row, res, c, before, n, nullptr);
  row.ran = "stores";
  for (int g = 0; g < n && res.ok; ++g) {
    row.wrong += alltoall_wrong(p.seed, g, n, p.bytes, c.window_data(g, kScratch));
  }
  row.ok = res.ok && row.wrong == 0;
  if (row.wrong > 0) {
    row.error = std::to_string(row.wrong) + " bytes differ from what their sender wrote";
  }
  row.algbw_gbs = row.time_us > 0 ? static_cast<double>(p.bytes) * (n - 1) / (row.time_us * 1e3) : 0;
  row.wall_seconds = seconds_since(wall0);
  return row;
}

}  // namespace ifec::testbed
