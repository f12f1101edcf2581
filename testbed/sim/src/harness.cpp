// The simulated rank harness: whole-cluster descriptions split into per-rank arguments, run by the ranks'
// communicators, and their results merged.
#include "ifec/testbed/harness.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "ifec/common/checks.h"
#include "ifec/common/protocol.h"

namespace ifec::testbed {

using common::TimeNs;

workloads::CollArgs coll_args(const CollectiveSpec& spec) {
  workloads::CollArgs a;
  a.kind = spec.kind;
  auto it = std::find(spec.members.begin(), spec.members.end(), spec.root);
  a.root = it == spec.members.end() ? -1 : static_cast<int>(it - spec.members.begin());
  a.window = spec.window;
  a.offset = spec.offset;
  a.count = spec.count;
  a.dtype = spec.dtype;
  a.op = spec.op;
  a.scratch_window = spec.scratch_window;
  return a;
}

uint64_t ring_scratch_bytes(const CollectiveSpec& spec, Algo algo, const routing::Topology* topo) {
  return workloads::Communicator::scratch_bytes(coll_args(spec), static_cast<int>(spec.members.size()), algo, topo,
                                                spec.members.empty() ? 0 : spec.members[0]);
}

void validate_spec(Cluster& cluster, const CollectiveSpec& spec, Algo algo) {
  const char* kind = workloads::collective_name(spec.kind);
  const int n = static_cast<int>(spec.members.size());
  IFEC_CHECK(n >= 2, kind << ": " << n << " member(s), need 2 or more");
  std::vector<char> seen(cluster.size(), 0);
  for (int g : spec.members) {
    IFEC_CHECK(g >= 0 && g < cluster.size(), kind << ": member GPU " << g << " outside 0.." << cluster.size() - 1);
    IFEC_CHECK(!seen[g], kind << ": member GPU " << g << " listed twice");
    seen[g] = 1;
  }
  IFEC_CHECK(spec.root >= 0 && spec.root < cluster.size() && seen[spec.root],
             kind << ": root GPU " << spec.root << " is not a member");
  const size_t esize = workloads::element_size(spec.dtype);
  IFEC_CHECK(
      spec.op == common::EchRedOp::kSum || spec.op == common::EchRedOp::kMin || spec.op == common::EchRedOp::kMax,
      kind << ": unknown reduction op " << static_cast<int>(spec.op));
  if (spec.kind != Collective::kBarrier) {
    IFEC_CHECK(spec.window != spec.scratch_window,
               kind << ": scratch window " << spec.scratch_window << " is the buffer's window");
    for (int g : spec.members) {
      const endpoint::WindowInfo* w = cluster.ep(g).memory().window(spec.window);
      IFEC_CHECK(w != nullptr, kind << ": GPU " << g << " has no window " << spec.window);
      IFEC_CHECK(spec.offset <= w->size && spec.count <= (w->size - spec.offset) / esize,
                 kind << ": buffer of " << spec.count << " x " << esize << " bytes at offset " << spec.offset
                      << " exceeds window " << spec.window << " (" << w->size << " bytes) on GPU " << g);
    }
  }
  // The algorithm's scratch (the in-fabric path falls back to the ring; best may choose any).
  const uint64_t need = ring_scratch_bytes(spec, algo, &cluster.fabric().topology());
  for (int g : spec.members) {
    const endpoint::WindowInfo* w = cluster.ep(g).memory().window(spec.scratch_window);
    IFEC_CHECK(w != nullptr, kind << ": GPU " << g << " has no scratch window " << spec.scratch_window);
    IFEC_CHECK(w->size >= need, kind << ": scratch window " << spec.scratch_window << " on GPU " << g << " has "
                                     << w->size << " bytes, needs " << need);
  }
}

CollectiveResult merge_results(const std::vector<CollectiveResult>& ranks, const std::vector<int>& gpus,
                               bool sum_counts) {
  CollectiveResult m;
  if (ranks.empty()) {
    m.ok = true;
    return m;
  }
  m.ok = true;
  m.start_ns = ranks[0].start_ns;
  m.algo = ranks[0].algo;
  std::set<std::string> seen;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const CollectiveResult& x = ranks[r];
    if (!x.ok && m.ok) {
      m.ok = false;
      m.error = "rank " + std::to_string(r) + " (GPU " + std::to_string(gpus.at(r)) + "): " + x.error;
    }
    m.start_ns = std::min(m.start_ns, x.start_ns);
    m.end_ns = std::max(m.end_ns, x.end_ns);
    m.data_start_ns = std::max(m.data_start_ns, x.data_start_ns ? x.data_start_ns : x.start_ns);
    m.data_end_ns = std::max(m.data_end_ns, x.data_end_ns ? x.data_end_ns : x.end_ns);
    m.fell_back = m.fell_back || x.fell_back;
    if (m.fallback_reason.empty()) {
      m.fallback_reason = x.fallback_reason;
    }
    m.fallback_chunks =
        sum_counts ? m.fallback_chunks + x.fallback_chunks : std::max(m.fallback_chunks, x.fallback_chunks);
    m.anomalies = sum_counts ? m.anomalies + x.anomalies : std::max(m.anomalies, x.anomalies);
    for (const std::string& f : x.faults) {
      if (seen.insert(f).second) {
        m.faults.push_back(f);
      }
    }
  }
  return m;
}

CollectiveResult run_endpoint_collective(Cluster& cluster, const CollectiveSpec& spec, TimeNs limit, Algo algo) {
  IFEC_CHECK(algo != Algo::kIfec, "run_endpoint_collective: the in-fabric algorithm runs through IfecCollectives");
  validate_spec(cluster, spec, algo);
  workloads::CommOptions o;
  o.limit_ns = limit;
  auto comms = cluster.communicators(spec.members, o);
  const workloads::CollArgs a = coll_args(spec);
  auto res = cluster.run_ranks(
      static_cast<int>(comms.size()), [&](int r, workloads::Communicator::Done done) { comms[r]->run(a, algo, done); },
      limit + 1'000);
  return merge_results(res, spec.members, false);
}

// ------------------------------------------------------------------------------------------ batch splitting --

void validate_rows(Cluster& cluster, const BatchMulticastSpec& spec) {
  const int n = cluster.size();
  IFEC_CHECK(spec.row_bytes > 0, "batch multicast: row_bytes is 0");
  for (const RowMulticast& row : spec.rows) {
    IFEC_CHECK(row.source >= 0 && row.source < n,
               "batch multicast: source GPU " << row.source << " outside 0.." << n - 1);
    std::vector<int> gs = row.destinations;
    gs.push_back(row.source);
    for (int g : gs) {
      IFEC_CHECK(g >= 0 && g < n, "batch multicast: destination GPU " << g << " outside 0.." << n - 1);
      IFEC_CHECK(g == row.source || g != gs.back(), "batch multicast: GPU " << g << " is the row's own source");
      const endpoint::WindowInfo* w = cluster.ep(g).memory().window(spec.window);
      IFEC_CHECK(w != nullptr, "batch multicast: GPU " << g << " has no window " << spec.window);
      IFEC_CHECK(row.offset + spec.row_bytes <= w->size, "batch multicast: row at offset "
                                                             << row.offset << " overruns window " << spec.window << " ("
                                                             << w->size << " B) of GPU " << g);
    }
  }
}

void validate_rows(Cluster& cluster, const BatchReduceSpec& spec) {
  const int n = cluster.size();
  IFEC_CHECK(spec.row_elements > 0, "batch reduction: row_elements is 0");
  const uint64_t row_bytes = uint64_t{spec.row_elements} * workloads::element_size(spec.dtype);
  std::set<std::pair<int, uint32_t>> used;
  for (const RowReduce& row : spec.rows) {
    IFEC_CHECK(row.destination >= 0 && row.destination < n,
               "batch reduction: destination GPU " << row.destination << " outside 0.." << n - 1);
    const endpoint::WindowInfo* w = cluster.ep(row.destination).memory().window(spec.result_window);
    IFEC_CHECK(w != nullptr, "batch reduction: GPU " << row.destination << " has no window " << spec.result_window);
    IFEC_CHECK(spec.result_offset + (uint64_t{row.index} + 1) * row_bytes <= w->size,
               "batch reduction: row index " << row.index << " overruns window " << spec.result_window << " ("
                                             << w->size << " B) of GPU " << row.destination);
    IFEC_CHECK(used.insert({row.destination, row.index}).second,
               "batch reduction: row index " << row.index << " used twice for GPU " << row.destination);
    IFEC_CHECK(row.contributions.size() <= 255,
               "batch reduction: " << row.contributions.size() << " contributors to one row (at most 255)");
    for (const auto& [g, off] : row.contributions) {
      IFEC_CHECK(g >= 0 && g < n, "batch reduction: contributor GPU " << g << " outside 0.." << n - 1);
      IFEC_CHECK(g != row.destination, "batch reduction: GPU " << g << " contributes to its own row " << row.index
                                                               << " (add the local part locally)");
      const endpoint::WindowInfo* sw = cluster.ep(g).memory().window(spec.source_window);
      IFEC_CHECK(sw != nullptr, "batch reduction: GPU " << g << " has no window " << spec.source_window);
      IFEC_CHECK(off + row_bytes <= sw->size, "batch reduction: contribution at offset "
                                                  << off << " overruns window " << spec.source_window << " ("
                                                  << sw->size << " B) of GPU " << g);
    }
  }
}

std::vector<workloads::BatchMulticastArgs> split_rows(const BatchMulticastSpec& spec, int gpus) {
  std::vector<workloads::BatchMulticastArgs> out(gpus);
  for (auto& a : out) {
    a.window = spec.window;
    a.row_bytes = spec.row_bytes;
  }
  for (const RowMulticast& row : spec.rows) {
    IFEC_CHECK(row.source >= 0 && row.source < gpus,
               "multicast rows: source GPU " << row.source << " outside 0.." << gpus - 1);
    out[row.source].rows.push_back({row.offset, row.destinations});
    for (int d : row.destinations) {
      IFEC_CHECK(d >= 0 && d < gpus && d != row.source, "multicast rows: destination GPU "
                                                            << d << " of the row at offset " << row.offset
                                                            << " is outside 0.." << gpus - 1 << " or its source");
      out[d].incoming.emplace_back(row.offset, spec.row_bytes);
    }
  }
  return out;
}

std::vector<workloads::BatchReduceArgs> split_rows(const BatchReduceSpec& spec, int gpus) {
  std::vector<workloads::BatchReduceArgs> out(gpus);
  for (auto& a : out) {
    a.source_window = spec.source_window;
    a.result_window = spec.result_window;
    a.scratch_window = common::kRowScratchWindow;
    a.result_offset = spec.result_offset;
    a.dtype = spec.dtype;
    a.row_elements = spec.row_elements;
  }
  for (const RowReduce& row : spec.rows) {
    IFEC_CHECK(row.destination >= 0 && row.destination < gpus,
               "reduce rows: destination GPU " << row.destination << " outside 0.." << gpus - 1);
    workloads::RowIn in;
    in.index = row.index;
    for (const auto& [g, off] : row.contributions) {
      IFEC_CHECK(g >= 0 && g < gpus && g != row.destination,
                 "reduce rows: contributor GPU " << g << " of row " << row.index << " at GPU " << row.destination
                                                 << " is outside 0.." << gpus - 1 << " or the destination");
      in.contributors.push_back(g);
      out[g].contribute.push_back({row.destination, row.index, off});
    }
    out[row.destination].mine.push_back(std::move(in));
  }
  return out;
}

void validate_rows(Cluster& cluster, const BatchPutSpec& spec) {
  const int n = cluster.size();
  IFEC_CHECK(spec.row_bytes > 0, "row stores: row_bytes is 0");
  for (const RowPutSpec& row : spec.rows) {
    for (const auto& [g, window, off] : {std::tuple{row.source, spec.source_window, row.from},
                                         std::tuple{row.destination, spec.dest_window, row.to}}) {
      IFEC_CHECK(g >= 0 && g < n, "row stores: GPU " << g << " outside 0.." << n - 1);
      const endpoint::WindowInfo* w = cluster.ep(g).memory().window(window);
      IFEC_CHECK(w != nullptr, "row stores: GPU " << g << " has no window " << window);
      IFEC_CHECK(off + spec.row_bytes <= w->size, "row stores: row at offset " << off << " overruns window " << window
                                                                               << " (" << w->size << " B) of GPU "
                                                                               << g);
    }
  }
}

std::vector<workloads::BatchPutArgs> split_rows(const BatchPutSpec& spec, int gpus) {
  std::vector<workloads::BatchPutArgs> out(gpus);
  for (auto& a : out) {
    a.source_window = spec.source_window;
    a.dest_window = spec.dest_window;
    a.row_bytes = spec.row_bytes;
  }
  for (const RowPutSpec& row : spec.rows) {
    IFEC_CHECK(
        row.source >= 0 && row.source < gpus && row.destination >= 0 && row.destination < gpus,
        "row stores: row from GPU " << row.source << " to GPU " << row.destination << " outside 0.." << gpus - 1);
    out[row.source].rows.push_back({row.from, row.destination, row.to});
    if (row.destination != row.source) {
      out[row.destination].incoming.emplace_back(row.to, spec.row_bytes);
    }
  }
  return out;
}

namespace {

std::vector<int> all_gpus(Cluster& c) {
  std::vector<int> g(c.size());
  for (int i = 0; i < c.size(); ++i) {
    g[i] = i;
  }
  return g;
}

// Every GPU's rank runs its part of one batch operation: `start(comm, args, done)`; the results summed.
template <typename Args, typename Start>
CollectiveResult run_batch(Cluster& cluster, std::vector<Args> args, const workloads::CommOptions& o, Start start) {
  const std::vector<int> gpus = all_gpus(cluster);
  IFEC_CHECK(args.size() == gpus.size(),
             "batch operation: " << args.size() << " ranks' parts for " << gpus.size() << " GPUs");
  auto comms = cluster.communicators(gpus, o);
  auto res = cluster.run_ranks(
      static_cast<int>(comms.size()),
      [&](int r, workloads::Communicator::Done done) { start(*comms[r], std::move(args[r]), done); },
      o.limit_ns + 1'000);
  return merge_results(res, gpus, true);
}

}  // namespace

CollectiveResult run_put_rows(Cluster& cluster, const BatchPutSpec& spec, TimeNs limit) {
  validate_rows(cluster, spec);
  return run_put_rows(cluster, split_rows(spec, cluster.size()), limit);
}

CollectiveResult run_put_rows(Cluster& cluster, std::vector<workloads::BatchPutArgs> per_gpu, TimeNs limit) {
  workloads::CommOptions o;
  o.limit_ns = limit;
  return run_batch(cluster, std::move(per_gpu), o,
                   [](workloads::Communicator& c, workloads::BatchPutArgs a, workloads::Communicator::Done d) {
                     c.put_rows(std::move(a), d);
                   });
}

// ---------------------------------------------------------------------------------------- IfecCollectives --

IfecCollectives::IfecCollectives(Cluster& cluster, IfecOptions opts) : cluster_(cluster), opts_(opts) {
  for (int g = 0; g < cluster_.size(); ++g) {
    base_.push_back(cluster_.ep(g).ech().counters());
  }
}

workloads::CommOptions IfecCollectives::comm_options(TimeNs limit) const {
  workloads::CommOptions o;
  o.ifec = opts_;
  o.limit_ns = limit;
  return o;
}

CollectiveResult IfecCollectives::account(CollectiveResult r) {
  ops_.operations++;
  ops_.fallback_operations += r.fell_back;
  ops_.fallback_chunks += r.fallback_chunks;
  ops_.anomalies += r.anomalies;
  return r;
}

CollectiveResult IfecCollectives::run(const CollectiveSpec& spec, TimeNs limit) {
  validate_spec(cluster_, spec);
  auto comms = cluster_.communicators(spec.members, comm_options(limit));
  const workloads::CollArgs a = coll_args(spec);
  auto res = cluster_.run_ranks(
      static_cast<int>(comms.size()),
      [&](int r, workloads::Communicator::Done done) { comms[r]->run(a, Algo::kIfec, done); }, limit + 1'000);
  return account(merge_results(res, spec.members, false));
}

CollectiveResult IfecCollectives::multicast_rows(const BatchMulticastSpec& spec, TimeNs limit) {
  validate_rows(cluster_, spec);
  return multicast_rows(split_rows(spec, cluster_.size()), limit);
}

CollectiveResult IfecCollectives::multicast_rows(std::vector<workloads::BatchMulticastArgs> per_gpu, TimeNs limit) {
  return account(run_batch(cluster_, std::move(per_gpu), comm_options(limit),
                           [](workloads::Communicator& c, workloads::BatchMulticastArgs a,
                              workloads::Communicator::Done d) { c.multicast_rows(std::move(a), d); }));
}

CollectiveResult IfecCollectives::reduce_rows(const BatchReduceSpec& spec, TimeNs limit) {
  validate_rows(cluster_, spec);
  return reduce_rows(split_rows(spec, cluster_.size()), limit);
}

CollectiveResult IfecCollectives::reduce_rows(std::vector<workloads::BatchReduceArgs> per_gpu, TimeNs limit) {
  return account(run_batch(cluster_, std::move(per_gpu), comm_options(limit),
                           [](workloads::Communicator& c, workloads::BatchReduceArgs a,
                              workloads::Communicator::Done d) { c.reduce_rows(std::move(a), d); }));
}

void IfecCollectives::suppress_contributions(int gpu, bool on) {
  IFEC_CHECK(gpu >= 0 && gpu < cluster_.size(),
             "suppress_contributions: GPU " << gpu << " outside 0.." << cluster_.size() - 1);
  cluster_.ep(gpu).ech().suppress_contributions(on);
}

IfecStats IfecCollectives::stats() const {
  IfecStats s = ops_;
  for (int g = 0; g < cluster_.size(); ++g) {
    const endpoint::EchCounters& c = cluster_.ep(g).ech().counters();
    const endpoint::EchCounters& b = base_.at(g);
    s.contributions_sent += c.contributions_sent - b.contributions_sent;
    s.retransmissions += c.retransmissions - b.retransmissions;
    s.results_received += c.results_written - b.results_written;
    s.duplicate_results += c.duplicate_results - b.duplicate_results;
    s.protection_drops += c.protection_drops - b.protection_drops;
    s.multicast_packets += c.multicast_sent - b.multicast_sent;
    s.busy_naks += c.busy_naks - b.busy_naks;
  }
  return s;
}

}  // namespace ifec::testbed
