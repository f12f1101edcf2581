// ifec-cli: the native program behind `./ifec pcap|frames|sim|bench`. Each command is an option table (args.h)
// and one function; errors go to stderr naming the bad value, exit 1 (bad input or a failed run) or 2 (usage).
// Built twice: ifec-cli without LibTorch (starts in milliseconds) hands `bench moe`, once its options are checked,
// to ifec-cli-moe beside it (IFEC_MOE_BY_EXEC), the same program with the MoE layer (IFEC_HAVE_MOE).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "args.h"
#include "ifec/common/checks.h"
#include "ifec/common/frame.h"
#include "ifec/common/heap.h"
#include "ifec/common/icrc.h"
#include "ifec/common/samples.h"
#include "ifec/endpoint/ring_bench.h"
#include "ifec/testbed/live_bench.h"
#ifdef IFEC_CLI_CUDA
#include "endpoint/cuda/api.h"
#endif
#include "ifec/live/netns.h"
#include "ifec/routing/topology.h"
#include "ifec/testbed/collective_bench.h"
#include "ifec/testbed/collective_run.h"
#include "ifec/testbed/endpoint_bench.h"
#include "ifec/testbed/property.h"
#include "ifec/testbed/scale_bench.h"
#ifdef IFEC_HAVE_MPI
#include "ifec/testbed/mpi_processes.h"
#endif
#ifdef IFEC_HAVE_MOE
#include "ifec/testbed/moe_bench.h"
#endif
#include "ifec/testbed/sim_report.h"
#include "ifec/testbed/sim_speed.h"

#if defined(IFEC_HAVE_MOE) || defined(IFEC_MOE_BY_EXEC)
#define IFEC_CLI_MOE 1
#endif

namespace {

using ifec::cli::Args;
using ifec::cli::CommandSpec;
using ifec::cli::Option;
namespace wl = ifec::workloads;
namespace tb = ifec::testbed;
namespace live = ifec::live;

const std::string kDefaultTopology = std::string(IFEC_TOPOLOGY_DIR) + "/superpod-64x4.yaml";
const Option kTopoOption{"--topo", "FILE", "topology file (default: testbed/topologies/superpod-64x4.yaml)"};

struct Command {
  CommandSpec spec;
  std::function<int(const Args&)> run;
};

ifec::routing::Topology topology(const Args& a) {
  return ifec::routing::load_topology(a.get("--topo", kDefaultTopology));
}

#ifdef IFEC_HAVE_MOE
// Creates DIR (and its parents) before a long run writes into it; throws naming DIR when that is impossible.
void make_dirs(const std::string& dir) {
  std::string path;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || (dir[i] == '/' && i > 0)) {
      path = dir.substr(0, i);
      struct stat st {};
      if (stat(path.c_str(), &st) != 0) {
        IFEC_CHECK(mkdir(path.c_str(), 0755) == 0, "--out '" << dir << "': cannot create " << path);
      } else {
        IFEC_CHECK(S_ISDIR(st.st_mode), "--out '" << dir << "': " << path << " is not a directory");
      }
    }
  }
}

void write_file(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  IFEC_CHECK(f != nullptr, "cannot write " << path);
  std::fputs(text.c_str(), f);
  std::fclose(f);
  std::printf("# wrote %s\n", path.c_str());
}
#endif

// ---------------------------------------------------------------------------------------------- pcap, frames --

int run_pcap(const Args& a) {
  const std::string& file = a.positionals()[0];
  IFEC_CHECK(file.empty() || file[0] != '-',
             "'" << file << "' looks like an option, not a file name (write ./" << file << " for a file of that name)");
  const size_t n = ifec::common::write_sample_pcap(file);
  std::printf("wrote %zu frames to %s\n", n, a.positionals()[0].c_str());
  return 0;
}

int run_frames(const Args&) {
  using namespace ifec::common;
  std::printf("%-26s %6s  %-26s %8s %8s %s\n", "sample", "bytes", "opcode", "dest_qp", "psn", "ech");
  for (const auto& s : sample_frames()) {
    ParsedFrame pf;
    WireStatus st = parse_frame(s.bytes.data(), s.bytes.size(), &pf);
    IFEC_CHECK(st.ok(), "sample " << s.name << " does not parse: " << st.message());
    std::string ech = "-";
    if (pf.h.ech) {
      ech = std::string(pf.h.ech->format == EchFormat::kCompact ? "compact " : "standard ") + ech_op_name(pf.h.ech->op);
    }
    std::printf("%-26s %6zu  %-26s %#8x %8u %s\n", s.name.c_str(), s.bytes.size(), opcode_name(pf.h.bth.opcode),
                pf.h.bth.dest_qp, pf.h.bth.psn, ech.c_str());
  }
  return 0;
}

// The live wiring of a topology without Mininet (testbed/live/bare-up.sh reads it): one line per node and per link.
int run_netns_plan(const Args& a) {
  const ifec::routing::Topology t = ifec::routing::load_topology(a.positionals()[0]);
  for (size_t i = 0; i < t.nodes.size(); ++i) {
    const auto& n = t.nodes[i];
    std::printf("node %s %zu %s %s\n", n.name.c_str(), i, ifec::live::mgmt_ip(static_cast<int>(i)).c_str(),
                ifec::routing::node_kind_name(n.kind));
  }
  for (const auto& l : t.links) {
    std::printf("link %s f%d %s f%d %g\n", t.nodes[l.a].name.c_str(), l.a_port, t.nodes[l.b].name.c_str(), l.b_port,
                l.rate_gbps);
  }
  return 0;
}

// ------------------------------------------------------------------------------------------------------- sim --

const std::vector<std::string> kRawOnly = {"--traffic",       "--lb",        "--pfc",      "--restore",
                                           "--incast-target", "--no-verify", "--counters", "--group"};
const std::vector<std::string> kCollectiveOnly = {"--collective",   "--algo",      "--dtype",     "--op",
                                                  "--loss",         "--members",   "--slot-pool", "--slot-budget",
                                                  "--reproducible", "--gpu-groups"};

void refuse(const Args& a, const std::vector<std::string>& names, const char* mode) {
  for (const std::string& n : names) {
    IFEC_CHECK(!a.has(n), n << " does not apply to " << mode);
  }
}

// --payload real (the default) or elided: frames of headers and lengths only, the same times and bytes.
bool payload_elided(const Args& a) {
  return ifec::cli::parse_choice(a.get("--payload", "real"), "--payload", {"real", "elided"}) == "elided";
}

// --gpu-groups N (partitioned runs only: --threads >= 1 or under mpirun; 0, the default: one per thread).
int gpu_groups_arg(const Args& a, int threads) {
  const int n = static_cast<int>(ifec::cli::parse_uint(a.get("--gpu-groups", "0"), "--gpu-groups", 0, 64000));
  IFEC_CHECK(n == 0 || threads > 0 || std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr,  // mpirun: partitioned
             "--gpu-groups " << n << " needs a partitioned run (--threads N >= 1): one event loop has no groups");
  return n;
}

// --leaf-groups K: the switches' partitions per plane and leaf group (partitioned runs only; 0, the default: per
// plane).
int leaf_groups_arg(const Args& a, int threads) {
  const int k = static_cast<int>(ifec::cli::parse_uint(a.get("--leaf-groups", "0"), "--leaf-groups", 0, 4096));
  IFEC_CHECK(k == 0 || threads > 0 || std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr,  // mpirun: partitioned
             "--leaf-groups " << k << " needs a partitioned run (--threads N >= 1): one event loop has no groups");
  return k;
}

// Started by mpirun (and built with MPI): the processes one endpoint-runtime run spreads over, for the life of
// this object; rank 0 prints, the others' standard output goes nowhere. procs null: one process.
struct SpreadRun {
  const tb::Processes* procs = nullptr;
#ifdef IFEC_HAVE_MPI
  std::unique_ptr<tb::MpiProcesses> mpi;
  SpreadRun() {
    if (!tb::launched_by_mpirun()) return;
    mpi = std::make_unique<tb::MpiProcesses>();
    procs = mpi->processes().size > 1 ? &mpi->processes() : nullptr;
    if (procs != nullptr && procs->rank != 0) {
      IFEC_CHECK(std::freopen("/dev/null", "w", stdout) != nullptr,
                 "rank " << procs->rank << ": /dev/null: " << std::strerror(errno));
    }
  }
#endif
  bool reports() const { return procs == nullptr || procs->rank == 0; }
  [[noreturn]] void abort() const {
#ifdef IFEC_HAVE_MPI
    if (mpi) mpi->abort(1);
#endif
    std::abort();
  }
};

// Runs body with the processes mpirun started (or this one alone). Over processes an error on any rank ends every
// rank (MPI_Abort) once printed, rather than leaving the others waiting in an exchange.
int run_spread(const std::function<int(SpreadRun&)>& body) {
  SpreadRun spread;
  try {
    return body(spread);
  } catch (const std::exception& e) {
    if (spread.procs == nullptr) throw;
    std::fprintf(stderr, "ifec: rank %d: %s\n", spread.procs->rank, e.what());
    std::fflush(stderr);
    spread.abort();
  }
}

int run_sim_collective(const Args& a, SpreadRun& spread) {
  refuse(a, kRawOnly, "--collective");
  IFEC_CHECK(a.has("--topo"), "--topo FILE is required");
  IFEC_CHECK(a.has("--algo"), "--algo ring|tree|rd|oneshot|best|ifec is required with --collective");
  tb::CollectivePoint base;
  base.kind = wl::parse_collective(a.get("--collective"));
  base.algo = wl::parse_algo(a.get("--algo"));
  base.dtype = ifec::common::parse_ech_dtype(a.get("--dtype", "fp32"));
  base.op = ifec::common::parse_ech_redop(a.get("--op", "sum"));
  IFEC_CHECK(!a.has("--op") || base.kind == wl::Collective::kAllReduce || base.kind == wl::Collective::kReduce ||
                 base.kind == wl::Collective::kReduceScatter,
             "--op does not apply to --collective " << a.get("--collective") << " (it reduces nothing)");
  base.loss = ifec::cli::parse_probability(a.get("--loss", "0"), "--loss");
  base.fail = a.all("--fail");
  base.seed = ifec::cli::parse_uint(a.get("--seed", "1"), "--seed");
  if (a.has("--members")) {  // absent: every GPU
    base.members = static_cast<int>(ifec::cli::parse_uint(a.get("--members"), "--members", 2, 1 << 20));
  }
  base.slot_pool =
      static_cast<uint32_t>(ifec::cli::parse_uint(a.get("--slot-pool", "8192"), "--slot-pool", 1, 1u << 24));
  base.slot_budget =
      static_cast<uint32_t>(ifec::cli::parse_uint(a.get("--slot-budget", "128"), "--slot-budget", 1, 1u << 20));
  base.reproducible = a.has("--reproducible");
  IFEC_CHECK(!base.reproducible || base.algo == wl::Algo::kIfec || base.algo == wl::Algo::kBest,
             "--reproducible applies to --algo ifec (the switches' reduction order; best's in-fabric row too), not "
                 << a.get("--algo"));
  IFEC_CHECK(!a.has("--dtype") || base.kind != wl::Collective::kBarrier,
             "--dtype does not apply to --collective barrier (it moves no data)");
  base.elided_payloads = payload_elided(a);
  base.threads = static_cast<int>(ifec::cli::parse_uint(a.get("--threads", "0"), "--threads", 0, 1024));
  base.gpu_groups = gpu_groups_arg(a, base.threads);
  base.leaf_groups = leaf_groups_arg(a, base.threads);
  std::vector<uint64_t> sizes;
  if (base.kind == wl::Collective::kBarrier) {
    IFEC_CHECK(!a.has("--bytes"),
               "--bytes '" << a.get("--bytes") << "' does not apply to a barrier (it moves no data)");
    sizes = {0};
  } else {
    IFEC_CHECK(a.has("--bytes"), "--bytes SIZE[,SIZE...] is required");
    sizes = ifec::cli::parse_sizes(a.get("--bytes"), "--bytes");
  }
  const ifec::routing::Topology topo = topology(a);
  // Started by mpirun: each point spread over the processes (rank 0 the GPUs, the others the planes).
  const tb::Processes* procs = spread.procs;
  // Whether rank 0's row went well (every process takes the same next step).
  auto agreed = [procs](bool ok) {
    if (procs == nullptr) return ok;
    std::vector<uint64_t> v = {procs->rank == 0 && ok ? 1u : 0u};
    procs->sum(v);
    return v[0] == 1;
  };
  const bool json = a.has("--json");
  // The header goes out with the first row, so that a point refused at once (--threads out of range) prints only
  // its error.
  bool headed = json;
  auto header = [&] {
    if (headed) return;
    headed = true;
    std::printf("# %s %s on %s, %d GPUs, loss %g%s%s\n", wl::collective_name(base.kind), wl::algo_name(base.algo),
                topo.name.c_str(), base.members ? base.members : topo.num_gpus(), base.loss,
                base.reproducible ? ", reproducible" : "",
                base.elided_payloads ? ", payloads elided (timing only)" : "");
    std::printf("%s", tb::rows_header().c_str());
  };
  // best: the endpoint algorithm the communicator's cost model picks, then the in-fabric one at the same size.
  const bool compare =
      base.algo == wl::Algo::kBest && (base.kind == wl::Collective::kAllReduce || base.kind == wl::Collective::kReduce);
  int failures = 0;
  std::vector<std::string> summary;
  for (uint64_t size : sizes) {
    tb::CollectivePoint p = base;
    p.bytes = size;
    const tb::CollectiveRow r = tb::run_collective_point(topo, p, procs);
    failures += !r.ok;
    header();
    std::printf("%s", json ? (tb::row_json(r, topo.name) + "\n").c_str() : tb::row_text(r).c_str());
    if (!json) {
      std::printf("%s", tb::simulator_text(r).c_str());
    }
    std::fflush(stdout);
    if (compare && agreed(r.ok)) {
      p.algo = wl::Algo::kIfec;
      const tb::CollectiveRow f = tb::run_collective_point(topo, p, procs);
      failures += !f.ok;
      std::printf("%s", json ? (tb::row_json(f, topo.name) + "\n").c_str() : tb::row_text(f).c_str());
      std::fflush(stdout);
      char line[200];
      std::snprintf(line, sizeof(line), "# %13llu B: best = %s (%.2f us), in-fabric %.2f us: %.2fx faster\n",
                    static_cast<unsigned long long>(size), r.ran.c_str(), r.time_us, f.time_us,
                    f.ok && f.time_us > 0 ? r.time_us / f.time_us : 0.0);
      summary.push_back(line);
    }
  }
  if (!summary.empty() && !json) {
    std::printf(
        "# in-fabric speedup against the best endpoint algorithm (chosen per size by the communicator's\n"
        "# latency-bandwidth model of this fabric; ./ifec bench collectives measures every algorithm):\n");
    for (const std::string& l : summary) {
      std::printf("%s", l.c_str());
    }
  }
  if (!spread.reports()) {
    return 0;
  }
  if (failures > 0 && !json) {
    std::fprintf(stderr, "ifec sim: %d of %zu rows failed or were wrong\n", failures, sizes.size());
  }
  return failures ? 1 : 0;
}

int run_sim_raw(const Args& a) {
  refuse(a, kCollectiveOnly, "--traffic");
  IFEC_CHECK(a.has("--topo"), "--topo FILE is required");
  IFEC_CHECK(a.has("--bytes"), "--bytes SIZE is required");
  tb::SimOptions opts;
  opts.topo_path = a.get("--topo");
  opts.pattern = tb::parse_pattern(a.get("--traffic"));
  opts.bytes = ifec::cli::parse_size(a.get("--bytes"), "--bytes");
  IFEC_CHECK(opts.bytes > 0, "--bytes '" << a.get("--bytes") << "' must be > 0");
  const std::string lb = ifec::cli::parse_choice(a.get("--lb", "packet"), "--lb", {"flow", "packet"});
  opts.lb = ifec::switchemu::parse_load_balance(lb);
  opts.pfc = ifec::cli::parse_choice(a.get("--pfc", "on"), "--pfc", {"on", "off"}) == "on";
  opts.seed = ifec::cli::parse_uint(a.get("--seed", "1"), "--seed");
  opts.incast_target =
      static_cast<int>(ifec::cli::parse_uint(a.get("--incast-target", "0"), "--incast-target", 0, 1 << 20));
  IFEC_CHECK(!a.has("--incast-target") || opts.pattern == tb::Pattern::kIncast,
             "--incast-target does not apply to --traffic " << a.get("--traffic"));
  opts.group = static_cast<int>(ifec::cli::parse_uint(a.get("--group", "0"), "--group", 0, 1 << 20));
  opts.threads = static_cast<int>(ifec::cli::parse_uint(a.get("--threads", "1"), "--threads", 0, 1024));
  opts.leaf_groups = static_cast<int>(ifec::cli::parse_uint(a.get("--leaf-groups", "0"), "--leaf-groups", 0, 4096));
  opts.verify_icrc = !a.has("--no-verify");
  opts.progress = !a.has("--quiet");
  opts.elided_payloads = payload_elided(a);
  const ifec::routing::Topology topo = ifec::routing::load_topology(opts.topo_path);
  for (const std::string& f : a.all("--fail")) {
    opts.events.push_back(tb::parse_link_event(topo, f, false));
  }
  for (const std::string& r : a.all("--restore")) {
    opts.events.push_back(tb::parse_link_event(topo, r, true));
  }
#ifdef IFEC_HAVE_MPI
  // Started by mpirun: one run spread over the processes, each its share of the planes; rank 0 reports.
  std::unique_ptr<tb::MpiProcesses> mpi;
  if (tb::launched_by_mpirun()) {
    mpi = std::make_unique<tb::MpiProcesses>();
    if (mpi->processes().size > 1) {
      opts.processes = &mpi->processes();
      opts.threads = std::max(opts.threads, 1);
      opts.progress = opts.progress && mpi->processes().rank == 0;
    }
  }
  const bool reports = mpi == nullptr || mpi->processes().rank == 0;
#else
  const bool reports = true;
#endif
  const tb::SimRun run = tb::run_sim(topo, opts);
  if (!reports) {
    return run.traffic.complete ? 0 : 3;
  }
  if (a.has("--json")) {
    std::printf("%s\n", tb::to_json(run).c_str());
  } else {
    std::printf("%s", tb::to_text(run).c_str());
    if (a.has("--counters")) {
      std::printf("\nper-port, per-queue switch counters (queues that carried traffic):\n%s",
                  tb::counters_table(run).c_str());
    }
  }
  if (!run.traffic.complete) {
    std::fprintf(stderr,
                 "ifec sim: INCOMPLETE: %llu of %llu flows did not deliver all their bytes (raw traffic has no "
                 "retransmission: frames lost to failed links stay lost)%s%s\n",
                 static_cast<unsigned long long>(run.traffic.incomplete_flows),
                 static_cast<unsigned long long>(run.traffic.flows), run.cut_off.empty() ? "" : "; ",
                 run.cut_off.c_str());
    return 3;
  }
  return 0;
}

int run_sim(const Args& a) {
  IFEC_CHECK(a.has("--traffic") != a.has("--collective"),
             "give exactly one of --traffic PATTERN (raw flows) or --collective KIND (see ifec sim --help)");
  if (a.has("--collective")) {
    return run_spread([&a](SpreadRun& spread) { return run_sim_collective(a, spread); });
  }
  return run_sim_raw(a);
}

// ---------------------------------------------------------------------------------------------------- bench --

// One forwarding path's rows for every driver that works here, side by side per size; the AF_XDP rows (where they
// ran) for the targets.
std::vector<std::vector<tb::ForwardingRow>> print_forwarding(const std::vector<live::FabricDriver>& drivers,
                                                             bool pipeline, double seconds) {
  std::vector<std::vector<tb::ForwardingRow>> by_driver;
  for (live::FabricDriver d : drivers) {
    by_driver.push_back(tb::bench_forwarding(d, pipeline, {74, 1024, 4096}, seconds));
  }
  std::printf("# %s: %s\n",
              pipeline ? "switch pipeline (parse, route, queue; IFEC engine off)"
                       : "bare port-to-port forwarder (the driver's ceiling for a switch core)",
              by_driver.front().front().ports.c_str());
  std::printf("#%8s", "frame(B)");
  for (live::FabricDriver d : drivers) {
    std::printf(" | %-9s %10s %7s %13s %6s %8s", live::fabric_driver_name(d), "frames/s", "Gb/s", "frames/core-s",
                "sys%", "overrun");
  }
  std::printf("\n");
  for (size_t i = 0; i < by_driver.front().size(); ++i) {
    std::printf(" %8zu", by_driver.front()[i].frame_bytes);
    for (const auto& rows : by_driver) {
      const tb::ForwardingRow& r = rows[i];
      std::printf(" | %-9s %10.0f %7.2f %13.0f %5.0f%% %8llu", "", r.delivered_pps, r.delivered_gbps, r.pps_per_core,
                  r.switch_cpu_s > 0 ? 100 * r.switch_sys_s / r.switch_cpu_s : 0.0,
                  static_cast<unsigned long long>(r.dropped));
    }
    std::printf("\n");
  }
  return by_driver;
}

int run_bench_live(const Args& a) {
  IFEC_CHECK(live::netns_unavailable().empty(), "bench live: " << live::netns_unavailable());
  const double seconds = a.has("--quick") ? 0.5 : 2.0;
  const std::string no_xdp = live::XdpPort::unavailable();
  std::vector<live::FabricDriver> drivers = {live::FabricDriver::kAfPacket};
  if (no_xdp.empty()) {
    drivers.insert(drivers.begin(), live::FabricDriver::kAfXdp);
  }
  std::printf(
      "# switchd's forwarding core on veths between namespaces [driver: live; measured, wall clock on this machine, "
      "%ld cores; the forwarding thread on core 1, the sender and receiver on core 0]\n",
      sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("# frames/core-s: frames delivered per CPU second of the forwarding thread; %.1f s per size%s%s\n",
              seconds, no_xdp.empty() ? "" : "; AF_XDP not run: ", no_xdp.c_str());
  std::printf(
      "# overrun: frames dropped because the unpaced sender offers more than the forwarding core takes (receive\n"
      "#   rings and sockets at the switch's and the receiver's ports, the forwarder's backlog): the bench drives the\n"
      "#   core past its limit on purpose, so this is not loss a paced fabric would see\n");
  const auto pipeline = print_forwarding(drivers, true, seconds);
  print_forwarding(drivers, false, seconds);
  for (live::FabricDriver d : drivers) {
    const auto l = tb::bench_hop_latency(d, a.has("--quick") ? 200 : 2000);
    std::printf(
        "# hop latency, %s (128-byte frames, one in flight, median of %d round trips): direct veth %.1f us, "
        "through the switch %.1f us: %.1f us added per hop\n",
        l.driver.c_str(), l.round_trips, l.direct_rtt_us, l.switch_rtt_us, l.added_per_hop_us);
  }
  if (no_xdp.empty()) {  // issue 34's targets, on the switch pipeline with AF_XDP
    const tb::ForwardingRow& small = pipeline.front().front();
    const tb::ForwardingRow& large = pipeline.front().back();
    std::printf(
        "# target: 1 M frames/s per switch core at %zu B with AF_XDP: %.2f M (%s); 20 Gb/s at %zu B: %.1f Gb/s "
        "(%s)\n",
        small.frame_bytes, small.pps_per_core / 1e6, small.pps_per_core >= 1e6 ? "met" : "not met", large.frame_bytes,
        large.delivered_gbps, large.delivered_gbps >= 20 ? "met" : "not met");
  }
  return 0;
}

// The GPU backend's row of bench endpoint: a kernel's blocks x threads post into a pinned ring a proxy thread drains
// (descriptors complete at once: the rate of the ring itself), or why there is no such row here.
void print_gpu_descriptor_rate(bool quick) {
#ifdef IFEC_CLI_CUDA
  std::string why;
  if (!ifec::endpoint::cuda_available(&why)) {
    std::printf("%-16s not run: %s\n", "gpu-kernel", why.c_str());
    return;
  }
  for (int blocks : {1, 16}) {
    try {
      const auto r = ifec::endpoint::bench_descriptor_rate_gpu(blocks, 128, quick ? 16 : 64, 4096);
      std::printf("%-16s %8d %12llu %10.6f %14.0f   (%d blocks x %d threads, %s)\n", "gpu-kernel", r.blocks * r.threads,
                  static_cast<unsigned long long>(r.descriptors), r.seconds, r.descriptors_per_s, r.blocks, r.threads,
                  ifec::endpoint::cuda_device_name().c_str());
    } catch (const std::exception& e) {  // a device wait that timed out, say: the other rows still run
      std::printf("%-16s not run: %d blocks: %s\n", "gpu-kernel", blocks, e.what());
    }
  }
#else
  (void)quick;
  std::printf("%-16s not run: this ifec-cli was built without CUDA\n", "gpu-kernel");
#endif
}

int run_bench_endpoint(const Args& a) {
  const bool quick = a.has("--quick");
  const ifec::routing::Topology topo = topology(a);
  // Before the first row: a smaller fabric was refused by the descriptor rate's row, after the CPU rows.
  IFEC_CHECK(topo.num_gpus() >= tb::kDescriptorBenchGpus,
             "--topo " << a.get("--topo", kDefaultTopology) << ": " << topo.num_gpus()
                       << " GPUs, the descriptor rate needs " << tb::kDescriptorBenchGpus << " (GPU 0 puts to GPUs 1.."
                       << tb::kDescriptorBenchGpus - 1 << ")");
  std::printf("== descriptor rate: ring + proxy, CPU and GPU backends (wall clock on this machine)\n");
  std::printf("%-16s %8s %12s %10s %14s\n", "backend", "threads", "descriptors", "seconds", "descriptors/s");
  for (int threads : {1, 2}) {
    const auto r = ifec::endpoint::bench_descriptor_rate(threads, quick ? 200'000 : 2'000'000, 4096);
    std::printf("%-16s %8d %12llu %10.3f %14.0f\n", "cpu-null-sink", r.producer_threads,
                static_cast<unsigned long long>(r.descriptors), r.seconds, r.descriptors_per_s);
  }
  print_gpu_descriptor_rate(quick);
  const auto s = tb::bench_descriptor_rate_sim(topo, quick ? 5'000 : 50'000);
  std::printf("%-16s %8d %12llu %10.3f %14.0f   (8-byte puts, each simulated end to end on %s)\n", s.backend.c_str(),
              s.producer_threads, static_cast<unsigned long long>(s.descriptors), s.seconds, s.per_second,
              topo.name.c_str());
  std::printf("\n== store goodput, GPU 0 -> GPU 1, %s [driver: sim]\n", topo.name.c_str());
  std::printf("%-8s %6s %14s %12s %12s %10s %8s\n", "mode", "planes", "stores", "sim time us", "goodput Gb/s",
              "line Gb/s", "of line");
  const uint64_t stores = quick ? 8 : 32;
  for (auto mode :
       {ifec::endpoint::Ordering::kWeak, ifec::endpoint::Ordering::kPartial, ifec::endpoint::Ordering::kStrong}) {
    double one_plane = 0;
    for (int planes : {1, topo.num_planes}) {
      const auto r = tb::bench_store_goodput(topo, mode, planes, stores, 1 << 20);
      char ratio[32] = "";
      if (planes == 1) {
        one_plane = r.goodput_gbps;
      } else {
        std::snprintf(ratio, sizeof(ratio), "  %.2fx one plane", r.goodput_gbps / one_plane);
      }
      std::printf("%-8s %6d %9llu x 1M %12.1f %12.1f %10.0f %7.1f%%%s\n", r.mode.c_str(), r.planes,
                  static_cast<unsigned long long>(r.stores), r.sim_ns / 1e3, r.goodput_gbps, r.line_rate_gbps,
                  100.0 * r.goodput_gbps / r.line_rate_gbps, ratio);
      if (topo.num_planes == 1) {
        break;
      }
    }
  }
  std::printf("(strong ordering keeps one in-order stream per peer on one sub-port, so it cannot use more planes)\n");
  return 0;
}

// The endpoint algorithms worth running at `size` on `n` GPUs: one-shot and recursive doubling keep n (or log n)
// copies of the buffer per GPU, so they stop where they are long past their crossover (and memory runs out).
std::vector<wl::Algo> candidates(uint64_t size, int n) {
  std::vector<wl::Algo> v = {wl::Algo::kRing, wl::Algo::kTree};
  if (size <= (4ULL << 20)) {
    v.push_back(wl::Algo::kRd);
  }
  if (size * static_cast<uint64_t>(n) <= (16ULL << 20)) {
    v.push_back(wl::Algo::kOneShot);
  }
  return v;
}

unsigned parse_jobs(const Args& a) {
  const uint64_t jobs = ifec::cli::parse_uint(
      a.get("--jobs", std::to_string(std::max(1u, std::thread::hardware_concurrency()))), "--jobs");
  IFEC_CHECK(jobs >= 1 && jobs <= 256, "--jobs " << jobs << " must be 1..256");
  return static_cast<unsigned>(jobs);
}

void print_progress(size_t done, size_t total, const std::string& running) {
  std::fprintf(stderr, "\rbench: %zu/%zu runs done%s%s      ", done, total, running.empty() ? "" : ", running ",
               running.c_str());
  if (done == total) {
    std::fprintf(stderr, "\n");
  }
}

int run_bench_collectives(const Args& a) {
  const bool quick = a.has("--quick");
  const uint64_t max_sim = ifec::cli::parse_size(a.get("--max-sim", quick ? "1MiB" : "64MiB"), "--max-sim");
  // Sizes above it are scaled from it as bandwidth-bound: it must be past the latency-bound sizes.
  IFEC_CHECK(max_sim >= (64 << 10), "--max-sim '" << a.get("--max-sim")
                                                  << "' below 64 KiB: the sizes above it are the largest simulated "
                                                     "time scaled by size, which holds only where bandwidth bounds it");
  const unsigned jobs = parse_jobs(a);  // every option before the table starts
  const ifec::routing::Topology topo = topology(a);
  const int n = topo.num_gpus();
  IFEC_CHECK(n >= 2, "--topo " << a.get("--topo", kDefaultTopology) << ": " << n
                               << " GPU, an AllReduce needs 2 or more");  // not every point failing after the header
  std::vector<uint64_t> sizes;
  for (uint64_t b = 8; b <= (1ULL << 30); b *= 8) {
    sizes.push_back(b);
  }
  for (uint64_t b : {1ULL << 20, 64ULL << 20, 256ULL << 20, 1ULL << 30}) {
    sizes.push_back(b);
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  const double bound = 2.0 * (n - 1) / n;
  // Every simulated (size, algorithm) point is independent (its own cluster and inputs): they run on --jobs workers,
  // largest first, and the table is printed in size order once a size is complete, so the rows are the same as a
  // serial run's.
  std::vector<tb::CollectivePoint> points;
  for (uint64_t size : sizes) {
    if (size > max_sim) {
      break;
    }
    for (wl::Algo algo : candidates(size, n)) {
      tb::CollectivePoint p;
      p.kind = wl::Collective::kAllReduce;
      p.algo = algo;
      p.bytes = size;
      points.push_back(p);
    }
    tb::CollectivePoint p;
    p.kind = wl::Collective::kAllReduce;
    p.algo = wl::Algo::kIfec;
    p.bytes = size;
    points.push_back(p);
  }
  for (const tb::CollectivePoint& p : points) {  // before the table and any point runs, not after the others ran
    tb::check_point_memory(topo, p);
  }
  std::printf("# AllReduce fp32 sum, %s (%d GPUs x %d planes) [driver: sim]\n", topo.name.c_str(), n, topo.num_planes);
  std::printf(
      "# best: the fastest endpoint algorithm measured at the size (ring, tree, rd = recursive doubling, oneshot;\n"
      "# rd and oneshot only where their per-GPU copies fit); speedup = best / ifec. Rows above %llu B are\n"
      "# (modelled): the largest simulated times scaled by size (bandwidth-bound there)\n",
      static_cast<unsigned long long>(max_sim));
  std::printf("#%13s %12s %12s %9s %12s %12s %10s %10s %8s\n", "size(B)", "count", "ring(us)", "best", "best(us)",
              "ifec(us)", "best busbw", "ifec busbw", "speedup");
  const std::vector<tb::CollectiveRow> rows = tb::run_collective_points(topo, points, jobs, print_progress);
  std::map<std::pair<uint64_t, wl::Algo>, double> time_of;
  for (const tb::CollectiveRow& r : rows) {
    IFEC_CHECK(r.ok, "bench " << wl::algo_name(r.point.algo) << " at " << r.point.bytes << " B: " << r.error);
    time_of[{r.point.bytes, r.point.algo}] = r.time_us;
  }
  double last_size = 0;
  double last_ring = 0, last_best = 0, last_ifec = 0;
  std::string last_name = "ring";
  auto measure = [&](wl::Algo algo, uint64_t size) { return time_of.at({size, algo}); };
  for (uint64_t size : sizes) {
    const bool modelled = size > max_sim;
    double ring, best, fabric;
    std::string name;
    if (modelled) {
      const double k = size / last_size;  // bandwidth-bound: time grows with size
      ring = last_ring * k;
      best = last_best * k;
      fabric = last_ifec * k;
      name = last_name;
    } else {
      ring = best = measure(wl::Algo::kRing, size);
      name = "ring";
      for (wl::Algo algo : candidates(size, n)) {
        if (algo != wl::Algo::kRing) {
          const double t = measure(algo, size);
          if (t < best) {
            best = t;
            name = wl::algo_name(algo);
          }
        }
      }
      fabric = measure(wl::Algo::kIfec, size);
      last_size = static_cast<double>(size);
      last_ring = ring;
      last_best = best;
      last_ifec = fabric;
      last_name = name;
    }
    std::printf(" %13llu %12llu %12.2f %9s %12.2f %12.2f %10.2f %10.2f %7.2fx%s\n",
                static_cast<unsigned long long>(size), static_cast<unsigned long long>(size / 4), ring, name.c_str(),
                best, fabric, size / (best * 1e3) * bound, size / (fabric * 1e3) * bound, best / fabric,
                modelled ? "  (modelled)" : "");
    std::fflush(stdout);
    if (quick && size >= max_sim) {
      break;
    }
  }
  return 0;
}

// The CPU's model name from /proc/cpuinfo ("unknown CPU" where there is none).
std::string cpu_model() {
  std::FILE* f = std::fopen("/proc/cpuinfo", "r");
  std::string model = "unknown CPU";
  if (f == nullptr) {
    return model;
  }
  char line[512];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    const std::string l = line;
    if (l.rfind("model name", 0) == 0 && l.find(':') != std::string::npos) {
      model = l.substr(l.find(':') + 2);
      model.erase(model.find_last_not_of(" \n") + 1);
      break;
    }
  }
  std::fclose(f);
  return model;
}

int run_bench_sim(const Args& a) {
  const bool quick = a.has("--quick");
  const int runs = static_cast<int>(ifec::cli::parse_uint(a.get("--runs", quick ? "3" : "5"), "--runs", 1, 100));
  std::printf("# simulator speed: frame-hops (frames sent on any link) per wall-second of the simulation, one core\n");
  std::printf("# CPU: %s; ICRC by %s; goal: 5 M frame-hops/s\n", cpu_model().c_str(),
              ifec::common::crc_impl_name(ifec::common::CrcImpl::kAuto));
  std::fflush(stdout);
  std::vector<tb::SpeedRow> rows;
  for (const tb::SpeedScenario& s : tb::speed_scenarios(IFEC_TOPOLOGY_DIR, quick, runs)) {
    std::fprintf(stderr, "bench sim: %s %s of %llu B on %s, %d run(s)...\n", s.allreduce ? "AllReduce" : "all-to-all",
                 s.allreduce ? wl::algo_name(s.algo) : "", static_cast<unsigned long long>(s.bytes),
                 s.topo_path.c_str(), s.runs);
    rows.push_back(tb::measure_speed(ifec::routing::load_topology(s.topo_path), s));
  }
  std::printf("%s", tb::speed_table(rows).c_str());
  std::printf(
      "# best: the fastest run (the machine's noise only slows runs down); AllReduce: the simulation alone, apart\n"
      "# from inputs, fp64 reference and checks. On wires: bytes the fabric holds at line rate (rate x delay, both\n"
      "# directions); more than a core's cache share means arriving frames are read from memory.\n");
  // The bytes alone, at each all-to-all's bytes on wires: the ceiling no event, link or switch work can beat.
  std::map<double, double> frame_ns;  // bytes on wires -> ns per frame
  for (const tb::SpeedRow& r : rows) {
    if (r.scenario.allreduce || frame_ns.count(r.wire_bytes) != 0) {
      continue;
    }
    const double ns = frame_ns[r.wire_bytes] = tb::frame_bytes_ns(r.wire_bytes, 4096, 100000);
    std::printf(
        "# bytes alone at %.1f MB on wires (%s): building a 4 KiB frame and verifying one that many bytes older\n"
        "#   take %.0f ns per frame on this core, a ceiling of %.2f M frame-hops/s at two hops per frame; this\n"
        "#   all-to-all spends %.0f ns per frame\n",
        r.wire_bytes / 1e6, r.topology.c_str(), ns, 2e3 / ns, r.best_rate() > 0 ? 2e9 / r.best_rate() : 0.0);
  }
  // The AllReduces' bytes alone: the ring's frames built, verified, copied and summed, with nothing else; the
  // in-fabric one's frames built and verified.
  for (const tb::SpeedRow& r : rows) {
    if (r.scenario.allreduce && r.scenario.algo == wl::Algo::kIfec && frame_ns.count(r.wire_bytes) != 0) {
      std::printf("%s", tb::ifec_bytes_note(r, frame_ns[r.wire_bytes]).c_str());
    }
    if (!r.scenario.allreduce || r.scenario.algo != wl::Algo::kRing) {
      continue;
    }
    std::fprintf(stderr, "bench sim: the ring AllReduce's bytes alone, %d ranks x %llu B, 2 passes...\n", r.gpus,
                 static_cast<unsigned long long>(r.scenario.bytes));
    const tb::RingBytes b = tb::ring_bytes(r.gpus, r.scenario.bytes, r.wire_bytes, 2);
    std::printf("%s", tb::ring_bytes_note(r, b).c_str());
  }
  return 0;
}

// What bench scale does not measure yet, beside the targets it states (issue 30's open items).
const char* const kScaleNotBuilt =
    "# not in this bench: MoE at EP 256, 4096 tokens per GPU, every variant, elided (target under 15 minutes each:\n"
    "#   ./ifec bench moe --ep 256 --mode normal --payload elided --topo testbed/topologies/superpod-256x8.yaml);\n"
    "# collectives and MoE run partitioned too (sim --collective and bench moe: --threads N, a GPU group per thread\n"
    "#   or --gpu-groups G, the switches by plane or --leaf-groups K, or under mpirun), the same rows whatever the\n"
    "#   threads, groups or processes\n";

// This program's path (what mpirun starts for bench scale's runs over processes).
std::string self_path() {
  char self[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  return std::string(self, n > 0 ? static_cast<size_t>(n) : 0);
}

int run_bench_scale(const Args& a) {
  const bool quick = a.has("--quick");
  std::printf("# simulator at scale [driver: sim]: each scenario in a process of its own; %u cores; CPU: %s\n",
              std::thread::hardware_concurrency(), cpu_model().c_str());
  std::printf(
      "# M hops/s: frame-hops (frames sent on any link) per second of the event loop(s); threads: loop = one\n"
      "# event loop for the whole fabric, N = one partition per plane (and, for an AllReduce, one per GPU group:\n"
      "# one per thread; \"K leaf groups\": one per plane and leaf group) on N threads, PxN = P MPI processes of N\n"
      "# (speedup: over the same traffic on 1 thread, by plane); setup: the fabric, FARE to convergence and the\n"
      "# flows; peak: the largest process's maximum resident set (a thread runs its partitions one after another\n"
      "# between fabric-wide events: only one plane's frames are in flight at once); route B/G and flow B/G: bytes\n"
      "# per GPU of the routing state (RIB, class table, FIBs) and of the flows (not reported under mpirun);\n"
      "# B/link: bytes per link of the links and switch ports (queue rings at their high water; frames aside); a\n"
      "# speedup target's row is the median of three alternated pairs (the same traffic on one thread, then the\n"
      "# scenario), beside what plain arithmetic got on as many threads first (the cores the host gave this\n"
      "# machine at the time)\n");
  std::fflush(stdout);
  const std::vector<tb::ScaleScenario> scenarios = tb::scale_scenarios(IFEC_TOPOLOGY_DIR, quick);
  std::vector<tb::ScaleRow> rows;
  for (size_t i = 0; i < scenarios.size(); ++i) {
    std::fprintf(stderr, "bench scale: [%zu/%zu] %s...\n", i + 1, scenarios.size(), scenarios[i].describe().c_str());
    rows.push_back(scenarios[i].target_speedup > 0 ? tb::measure_speedup(scenarios[i], true, self_path())
                                                   : tb::measure_scale(scenarios[i], true, self_path()));
  }
  std::printf("%s%s", tb::scale_table(rows, ifec::common::fresh_page_ns()).c_str(), kScaleNotBuilt);
  for (const tb::ScaleRow& r : rows) {
    if (!r.error.empty() || !r.complete) {
      return 1;
    }
  }
  return 0;
}

int run_bench_property(const Args& a) {
  if (a.has("--case")) {
    for (const char* sweep_only : {"--cases", "--seconds", "--seed"}) {  // they were ignored, silently
      IFEC_CHECK(!a.has(sweep_only),
                 sweep_only << " '" << a.get(sweep_only) << "' does not apply with --case (one case, SEED its seed)");
    }
    const tb::PropertyCase c = tb::random_case(ifec::cli::parse_uint(a.get("--case"), "--case"));
    const tb::PropertyResult r = tb::run_property_case(c);
    std::printf("%s\n  %s: %.2f us simulated, %llu fallback chunks, %llu wrong%s%s\n", c.describe().c_str(),
                r.ok ? "ok" : "FAILED", r.sim_us, static_cast<unsigned long long>(r.fallback),
                static_cast<unsigned long long>(r.wrong), r.error.empty() ? "" : ": ", r.error.c_str());
    for (const std::string& f : r.faults) {
      std::printf("  fault: %s\n", f.c_str());
    }
    return r.ok ? 0 : 1;
  }
  const uint64_t cases = ifec::cli::parse_uint(a.get("--cases", "2000"), "--cases", 1);
  const uint64_t seed = ifec::cli::parse_uint(a.get("--seed", "1"), "--seed");
  const double seconds = static_cast<double>(ifec::cli::parse_uint(a.get("--seconds", "0"), "--seconds"));
  const bool verbose = a.has("--verbose");
  std::printf(
      "# property check: in-fabric AllReduce, reduce, multicast, MoE combine and dispatch against host references;\n"
      "# random fabrics, sizes, dtypes, 0.5-5%% loss and slot budgets [driver: sim]; cases from seed %llu\n",
      static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  uint64_t done = 0;
  const auto summary = tb::run_property_sweep(seed, cases, seconds, [&](const std::string& line) {
    ++done;
    if (verbose || line.rfind("FAIL", 0) == 0) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    } else if (done % 100 == 0) {
      std::fprintf(stderr, "property: %llu cases run\n", static_cast<unsigned long long>(done));
    }
  });
  std::printf("# %llu cases in %.1f s: %llu failed, %llu finished part of their chunks off the in-fabric path\n",
              static_cast<unsigned long long>(summary.cases), summary.wall_seconds,
              static_cast<unsigned long long>(summary.failed), static_cast<unsigned long long>(summary.fallback_cases));
  for (const std::string& f : summary.failures) {
    std::printf("FAILED %s\n", f.c_str());
  }
  return summary.failed ? 1 : 0;
}

#ifdef IFEC_MOE_BY_EXEC
char** g_argv = nullptr;  // main's, for the hand-over

// Replaces this process with ifec-cli-moe (in this program's folder) on the same command line.
int run_bench_moe(const Args&) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  IFEC_CHECK(n > 0, "cannot find this program's folder (/proc/self/exe: " << std::strerror(errno) << ")");
  std::string path(self, static_cast<size_t>(n));
  path = path.substr(0, path.rfind('/') + 1) + "ifec-cli-moe";
  std::fflush(stdout);
  execv(path.c_str(), g_argv);
  IFEC_FAIL("cannot run " << path << " (the MoE layer's build of this program): " << std::strerror(errno));
}
#endif

#ifdef IFEC_HAVE_MOE
// What a bench moe table is: the model, the driver, what is simulated, modelled or scaled, the columns.
void print_moe_header(const tb::MoeRunConfig& cfg, const std::vector<uint64_t>& eps, uint64_t cap) {
  std::printf(
      "# MoE dispatch/combine, DeepSeek-V3 routing (hidden %lld, top-%lld of %lld) on %s [driver: sim]; dispatch "
      "%s, combine bf16 rows (the IFEC sum in fp32)\n",
      static_cast<long long>(cfg.model.hidden), static_cast<long long>(cfg.model.topk),
      static_cast<long long>(cfg.model.experts), cfg.topology_name.c_str(),
      cfg.fp8_dispatch ? "FP8 (E4M3 + an fp32 scale per 128 channels)" : "bf16 rows");
  std::printf(
      "# dispatch/combine simulated (timing mode: every row crosses the fabric, values not kept%s); experts(us) "
      "modelled at expert width %lld: %s\n",
      cfg.elided_payloads ? "; payloads elided: frames of headers and lengths, timing only" : "",
      static_cast<long long>(cfg.model.inter), cfg.profile.summary().c_str());
  for (uint64_t ep : eps) {
    const ifec::workloads::MoeConfig gate =
        ifec::workloads::node_limited(cfg.model, static_cast<int>(ep), cfg.gpus_per_node);
    if (gate.groups != cfg.model.groups) {
      std::printf(
          "# EP %llu: node-limited routing over %lld nodes of %d GPUs: the gate's groups are the nodes (%lld groups "
          "of %lld experts, top-%lld groups: a token reaches at most %lld nodes)\n",
          static_cast<unsigned long long>(ep), static_cast<long long>(gate.groups), cfg.gpus_per_node,
          static_cast<long long>(gate.groups), static_cast<long long>(gate.experts_per_group()),
          static_cast<long long>(gate.topk_groups), static_cast<long long>(gate.topk_groups));
    }
  }
  if (cap > 0) {
    std::printf(
        "# points above %llu tokens per rank simulate %llu and scale times and bytes by the token ratio "
        "(bandwidth-bound), marked (scaled from N)\n",
        static_cast<unsigned long long>(cap), static_cast<unsigned long long>(cap));
  }
  std::printf(
      "# GB/s: logical bytes per rank / time (DeepEP's convention); line: that / the GPU's access rate (%.0f GB/s); "
      "bound: the phase's line-rate bound (busiest GPU's wire bytes one way at its rate) / time; overlap: two "
      "micro-batches, DeepEP's schedule (one communication stream, --overlap); overlap2: two micro-batches with one "
      "half's dispatch beside the other's combine on the fabric (a dispatch and a combine stream); MB: all ranks "
      "together\n%s\n",
      cfg.topo.gpu_access_gbps(0) / 8, tb::moe_rows_header().c_str());
  std::fflush(stdout);
}

// After a point's three rows (per_expert, per_rank, ifec): IFEC against the best baseline, and what bounds the
// baselines (the busiest GPU's bytes against the mean: the routing's imbalance; each phase against its line rate).
void print_moe_summary(const tb::MoeRow* v, bool overlap) {
  const double base = std::min(v[0].dispatch_us + v[0].combine_us, v[1].dispatch_us + v[1].combine_us);
  std::printf("#   EP %d %s: IFEC dispatch+combine %.2fx the best baseline, layer %.2fx", v[2].point.ep,
              v[2].point.mode.c_str(), base / (v[2].dispatch_us + v[2].combine_us),
              std::min(v[0].total_us, v[1].total_us) / v[2].total_us);
  if (overlap) {
    std::printf(", overlapped layer %.2fx (dispatch beside combine: %.2fx)",
                std::min(v[0].overlap_us, v[1].overlap_us) / v[2].overlap_us,
                std::min(v[0].overlap2_us, v[1].overlap2_us) / v[2].overlap2_us);
  }
  const tb::MoeRow& pr = v[1];
  const double mean_d = pr.dispatch_wire_bytes / static_cast<double>(pr.point.ep);
  const double mean_c = pr.combine_wire_bytes / static_cast<double>(pr.point.ep);
  std::printf(
      "\n#   per_rank: busiest GPU's wire bytes %.2fx the mean in dispatch, %.2fx in combine (routing); "
      "phases at %.0f%% and %.0f%% of that GPU's line-rate bound\n",
      pr.dispatch_bound_us * pr.line_gbs * 1e3 / mean_d, pr.combine_bound_us * pr.line_gbs * 1e3 / mean_c,
      100 * pr.dispatch_bound_us / pr.dispatch_us, 100 * pr.combine_bound_us / pr.combine_us);
}

int run_bench_moe_spread(const Args& a, SpreadRun& spread) {
  tb::MoeRunConfig cfg;
  cfg.topo = topology(a);
  cfg.topology_name = cfg.topo.name;
  const bool quick = a.has("--quick");
  std::vector<uint64_t> eps = ifec::cli::parse_uints(a.get("--ep", quick ? "8,16" : "8,16,32,64"), "--ep", 2,
                                                     static_cast<uint64_t>(cfg.topo.num_gpus()));
  const uint64_t cap = ifec::cli::parse_uint(a.get("--token-cap", quick ? "32" : "0"), "--token-cap", 0, 1 << 30);
  const std::string mode = ifec::cli::parse_choice(a.get("--mode", "both"), "--mode", {"normal", "ll", "both"});
  const std::vector<std::string> modes =
      mode == "both" ? std::vector<std::string>{"normal", "ll"} : std::vector<std::string>{mode};
  cfg.fp8_dispatch = ifec::cli::parse_choice(a.get("--dispatch", "fp8"), "--dispatch", {"fp8", "bf16"}) == "fp8";
  cfg.overlap = a.has("--overlap");
  cfg.elided_payloads = payload_elided(a);
  cfg.threads = static_cast<int>(ifec::cli::parse_uint(a.get("--threads", "0"), "--threads", 0, 1024));
  cfg.gpu_groups = gpu_groups_arg(a, cfg.threads);
  cfg.leaf_groups = leaf_groups_arg(a, cfg.threads);
  std::vector<tb::MoeVariant> variants;
  for (const std::string& v : ifec::cli::parse_choices(a.get("--variant", "per_expert,per_rank,ifec"), "--variant",
                                                       {"per_expert", "per_rank", "ifec"})) {
    variants.push_back(tb::parse_moe_variant(v));
  }
  std::sort(variants.begin(), variants.end());  // rows in per_expert, per_rank, ifec order, however asked
  const unsigned jobs = parse_jobs(a);
  const std::string out = a.get("--out");
  if (!out.empty()) {
    make_dirs(out);  // before the run, not after it
  }
  cfg.token_cap = static_cast<int64_t>(cap);
  if (a.has("--gpu-profile")) {
    cfg.profile = ifec::workloads::load_gpu_profile(a.get("--gpu-profile"));
  }
  cfg.processes = spread.procs;  // under mpirun: each variant's fabric spread over the processes, rank 0 prints
  std::vector<tb::MoePoint> points;
  for (const std::string& m : modes) {
    for (uint64_t ep : eps) {
      IFEC_CHECK(std::count(eps.begin(), eps.end(), ep) == 1, "--ep " << ep << " given twice");
      points.push_back({m, static_cast<int>(ep), m == "normal" ? 4096 : 128});
      tb::validate_moe_point(cfg, points.back());  // every point, before the table starts
    }
  }
  print_moe_header(cfg, eps, cap);
  const auto rows = tb::run_moe_points(cfg, points, variants, jobs, spread.reports() ? print_progress : nullptr);
  if (!spread.reports()) {
    return 0;
  }
  std::string csv;
  std::string json = "[";
  int wrong = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::printf("%s\n", tb::moe_row_text(rows[i]).c_str());
    const ifec::common::JsonObject rec = tb::moe_row_record(rows[i], cfg.topology_name);
    csv += (csv.empty() ? rec.csv_header() + "\n" : "") + rec.csv_row() + "\n";
    json += (json.size() > 1 ? ",\n" : "") + rec.str();
    wrong += !rows[i].ok();
    if (variants.size() == 3 && i % 3 == 2) {
      print_moe_summary(&rows[i - 2], cfg.overlap);
    }
  }
  std::fflush(stdout);
  if (!out.empty()) {
    write_file(out + "/moe_bench.csv", csv);
    write_file(out + "/moe_bench.json", json + "]\n");
  }
  return wrong ? 1 : 0;
}

int run_bench_moe(const Args& a) {
  return run_spread([&a](SpreadRun& spread) { return run_bench_moe_spread(a, spread); });
}
#endif

// ------------------------------------------------------------------------------------------------ commands --

// The tools and the simulator.
std::vector<Command> tool_commands() {
  const Option fail{"--fail", "LINK@TIME", "take a link down at a simulated time, e.g. gpu5:plane2:sub0@20us", true};
  std::vector<Command> cs;
  cs.push_back({{"pcap",
                 "FILE",
                 "Writes one frame of every kind (RoCEv2 RC operations, ACK/NAK, compact and standard ECH) to FILE as "
                 "pcap.",
                 {},
                 1},
                run_pcap});
  cs.push_back({{"frames", "", "Lists the sample frames with their sizes and decoded headers.", {}, 0}, run_frames});
  cs.push_back({{"netns-plan",
                 "FILE",
                 "The live wiring of a topology, for a bring-up without Mininet (testbed/live/bare-up.sh): one line\n"
                 "per node (node NAME INDEX MGMT_IP gpu|switch) and per link (link A IFACE B IFACE RATE_GBPS).",
                 {},
                 1},
                run_netns_plan});
  cs.push_back(
      {{"sim",
        "--topo FILE (--traffic PATTERN --bytes SIZE | --collective KIND --algo ALGO --bytes SIZE[,SIZE...]) [options]",
        "Runs the simulated fabric (times are simulated, never wall-clock). With --traffic: raw RoCEv2 flows without\n"
        "retransmission (a flow that loses frames ends INCOMPLETE, exit 3). With --collective: one row per size in\n"
        "the nccl-tests layout, wire bytes per plane, fallbacks, the error against an fp64 reference, and the faults\n"
        "met (exit 1 when a row fails or is wrong). LINK: a link id, NODE:NODE[:SUB] or GPU:planeP[:subS].",
        {{"--topo", "FILE", "topology file (testbed/topologies/*.yaml)"},
         {"--traffic", "PATTERN", "raw flows: alltoall, permutation or incast"},
         {"--collective", "KIND", "allreduce, reduce, reduce-scatter, all-gather, multicast (broadcast) or barrier"},
         {"--algo", "ALGO",
          "collective: ring, tree, rd (recursive doubling), oneshot (endpoint-based), best (the endpoint algorithm "
          "the cost model picks per size; also runs ifec and prints the speedup), or ifec (in-switch)"},
         {"--bytes", "SIZE", "bytes per flow, or collective sizes (list); units B, KiB, MiB, GiB"},
         {"--dtype", "TYPE", "collective element type: fp32 (default), bf16, fp16, int32"},
         {"--op", "OP", "collective reduction: sum (default), min, max"},
         {"--loss", "P", "collective: random frame loss on every link, 0 <= P < 1 (default 0)"},
         {"--members", "N", "collective: GPUs 0..N-1 take part (default: every GPU)"},
         {"--slot-pool", "N", "collective: aggregation slots per switch (default 8192)"},
         {"--slot-budget", "N", "collective: slots per group asked of each switch (default 128)"},
         {"--reproducible", "", "collective: switches reduce in contributor order (bitwise reproducible)"},
         fail,
         {"--restore", "LINK@TIME", "raw: bring a link back up at a simulated time", true},
         {"--lb", "MODE", "raw: switch load balancing per flow or per packet (default packet)"},
         {"--pfc", "on|off", "raw: priority flow control (default on)"},
         {"--incast-target", "GPU", "raw incast: the GPU every flow goes to (default 0)"},
         {"--threads", "N",
          "raw: one partition per plane (or per leaf group: --leaf-groups), run by N threads (1..partitions; default "
          "1), "
          "the same result for every N; 0: "
          "one event loop for the whole fabric (every plane's frames in flight together). collective: 0 (default) "
          "one event loop; N >= 1 one partition per plane and one per group of GPUs (--gpu-groups), on N threads, "
          "the same result for every N and grouping"},
         {"--leaf-groups", "N",
          "partitioned: each plane's leaf switches in N groups of consecutive leaves (its spines spread over "
          "them), a partition each, for more threads or processes than planes; every switch-to-switch link through "
          "mailboxes, the same result for every N >= 1, thread count, process count and GPU grouping (0, default: "
          "per plane)"},
         {"--gpu-groups", "N",
          "collective, partitioned (--threads N >= 1): the GPUs in N groups of consecutive GPUs, a partition each "
          "(default: one per thread; 1..GPUs), the same result for every N"},
         {"--group", "N",
          "raw alltoall or permutation within consecutive groups of N GPUs (expert-parallel groups; N divides "
          "the GPUs; default: one group of all)"},
         {"--no-verify", "", "raw: receivers skip the ICRC check"},
         {"--seed", "S", "seed of the simulation (default 1)"},
         {"--payload", "real|elided",
          "real (default): frames carry their bytes, results are checked; elided: headers and lengths only, the same "
          "simulated times and bytes per link, nothing computed or checked (timing only; the largest fabrics)"},
         {"--counters", "", "raw: per-port, per-queue switch counters after the report"},
         {"--quiet", "", "no progress lines on stderr"},
         {"--json", "", "one JSON object per run or row instead of the tables"}},
        0},
       run_sim});
  return cs;
}

std::vector<Command> bench_commands() {
  std::vector<Command> cs;
  cs.push_back(
      {{"bench endpoint",
        "[--quick] [--topo FILE]",
        "Descriptors/s through the ring and proxy (CPU backend, wall clock) and store goodput of the endpoint\n"
        "runtime on the simulated fabric, one plane vs all of them.",
        {{"--quick", "", "fewer descriptors and stores"}, kTopoOption},
        0},
       run_bench_endpoint});
  cs.push_back({{"bench live",
                 "[--quick]",
                 "switchd's pipeline forwarding on veths between namespaces (needs root), its ports on AF_XDP and on\n"
                 "AF_PACKET side by side: frames/s and Gb/s for 74 B, 1 KiB and 4 KiB frames, per switch CPU second,\n"
                 "and the latency one hop adds.",
                 {{"--quick", "", "0.5 s per size, 200 round trips"}},
                 0},
                run_bench_live});
  cs.push_back({{"bench collectives",
                 "[--quick] [--max-sim SIZE] [--jobs N] [--topo FILE]",
                 "In-switch AllReduce vs the best endpoint algorithm measured at each size (ring, tree, recursive\n"
                 "doubling, one-shot), 8 B to 1 GiB, on every GPU of the topology; sizes above --max-sim are the\n"
                 "largest simulated time scaled by size, marked (modelled).",
                 {{"--quick", "", "stop at --max-sim (default 1 MiB with --quick)"},
                  {"--max-sim", "SIZE", "largest simulated size (default 64 MiB)"},
                  {"--jobs", "N", "points simulated at once (default: every core; the rows equal a serial run's)"},
                  kTopoOption},
                 0},
                run_bench_collectives});
  cs.push_back({{"bench sim",
                 "[--quick] [--runs N]",
                 "The simulator's own speed: frame-hops per wall-second on one core for the 64 x 4 all-to-all, the\n"
                 "same code on 8 x 2, and the 64 MiB AllReduce (ring and in-fabric), with the bytes each fabric\n"
                 "holds on its wires and the ICRC implementation this CPU allows; then what the bytes alone cost\n"
                 "per frame at each all-to-all's bytes on wires (building a 4 KiB frame and verifying one that\n"
                 "many bytes older), for the ring AllReduce (its frames built, verified, copied and summed over\n"
                 "buffers as large as its own, the result checked) and for the in-fabric one (its contributions and\n"
                 "results at that cost per frame), and the ceiling each puts on frame-hops/s.",
                 {{"--quick", "", "smaller sizes (256 KiB per pair, 16 MiB AllReduce), 3 runs"},
                  {"--runs", "N",
                   "runs of each all-to-all (default 5); each AllReduce runs twice (once with --runs 1), as the first "
                   "run also pays for the process's first touch of its frame memory"}},
                 0},
                run_bench_sim});
  cs.push_back(
      {{"bench scale",
        "[--quick]",
        "The simulator at thousands of GPUs, each scenario in a process of its own: the 64 x 4 all-to-all,\n"
        "the 1,024-GPU SUN and the 2,048-GPU fat tree's permutation of 2 MiB per GPU with real and elided\n"
        "payloads, the 2,048-GPU all-to-all of 4 KiB per pair and within expert-parallel groups of 256\n"
        "(64 KiB per pair, elided), AllReduce of 4 MiB over the 1,024-GPU SUN (ring, best, in-fabric;\n"
        "elided), DeepSeek-V3's 16,384-GPU fabric's permutation of 2 MiB per GPU (elided), and the 64 x 4 all-to-all "
        "and the 2,048-GPU permutation on one thread, two, and two MPI\n"
        "processes (one partition per plane): GPUs, links, events, frame-hops per\n"
        "second, threads and speedup (the median of three alternated pairs: the same traffic on one thread,\n"
        "then the scenario; beside what plain arithmetic got on as many threads first), setup and simulation\n"
        "time, peak memory, routing and flow bytes per GPU, and each target of issue 30 met or not.",
        {{"--quick", "", "no 2,048-GPU all-to-all, no SUN AllReduce, no DeepSeek-V3 fabric (about two minutes)"}},
        0},
       run_bench_scale});
  cs.push_back({{"bench property",
                 "[--cases N] [--seconds S] [--seed S] [--case SEED] [--verbose]",
                 "Randomized property check: in-fabric AllReduce, reduce, multicast, MoE combine and dispatch on\n"
                 "random fabrics, sizes, dtypes, 0.5-5% loss and slot budgets, each compared with a host reference.",
                 {{"--cases", "N", "cases to run (default 2000)"},
                  {"--seconds", "S", "stop after S seconds of wall time (default: no limit)"},
                  {"--seed", "S", "first case's seed (default 1)"},
                  {"--case", "SEED", "run the one case SEED and print what it met"},
                  {"--verbose", "", "one line per case"}},
                 0},
                run_bench_property});
#ifdef IFEC_CLI_MOE
  cs.push_back(
      {{"bench moe",
        "[--quick] [--ep LIST] [--mode normal|ll|both] [--variant LIST] [--threads N] [--gpu-groups N] "
        "[--leaf-groups N] [--dispatch fp8|bf16] "
        "[--payload real|elided] [--overlap] [--token-cap N] [--jobs N] [--gpu-profile FILE] [--out DIR] [--topo FILE]",
        "MoE dispatch/combine at DeepEP's points (4096 tokens normal, 128 low latency, hidden 7168, top-8 of 256,\n"
        "FP8 dispatch, bf16 combine), simulated directly, per variant (per_expert, per_rank, ifec): times, GB/s per\n"
        "GPU, fractions of line rate and of the line-rate bound, modelled expert compute, wire bytes per plane.",
        {{"--quick", "", "EP 8 and 16, 32 tokens simulated"},
         {"--ep", "LIST", "EP sizes (default 8,16,32,64)"},
         {"--mode", "MODE", "normal, ll or both (default both)"},
         {"--variant", "LIST", "variants to run (default per_expert,per_rank,ifec)"},
         {"--threads", "N",
          "0 (default): each run on one event loop; N >= 1: each run partitioned (a partition per plane and per "
          "group of GPUs) on N threads, the same rows for every N (with --jobs, jobs x N threads in all)"},
         {"--gpu-groups", "N",
          "partitioned (--threads N >= 1): the GPUs in N groups, a partition each (default: one per thread), the "
          "same rows for every N"},
         {"--leaf-groups", "N",
          "partitioned: each plane's switches in N leaf groups, a partition each (see sim --leaf-groups; default 0: "
          "one per plane), the same rows for every N >= 1"},
         {"--dispatch", "TYPE", "dispatch rows: fp8 (E4M3 + a scale per 128 channels, DeepEP's; default) or bf16"},
         {"--payload", "real|elided",
          "real (default): frames carry the rows' bytes; elided: headers and lengths only, the same simulated times "
          "and bytes per link in far less memory (timing only; EP 256: --topo testbed/topologies/superpod-256x8.yaml)"},
         {"--overlap", "",
          "also the layer as two overlapped micro-batches: DeepEP's schedule (overlap: one communication stream) and "
          "one half's dispatch beside the other's combine on the fabric (overlap2); three times the runs"},
         {"--token-cap", "N", "simulate at most N tokens per rank and scale (default 0: none, every token simulated)"},
         {"--jobs", "N", "runs at once (default: every core; the rows equal a serial run's)"},
         {"--gpu-profile", "FILE",
          "the experts' GPU model (YAML/JSON; default the fitted H100, "
          "testbed/gpu-profiles/h100-sxm.yaml; python3 -m ifec.gpu_profile writes one)"},
         {"--out", "DIR", "also write DIR/moe_bench.csv and .json (DIR is created first)"},
         kTopoOption},
        0},
       run_bench_moe});
#endif
  return cs;
}

std::vector<Command> commands() {
  std::vector<Command> cs = tool_commands();
  for (Command& c : bench_commands()) {
    cs.push_back(std::move(c));
  }
  return cs;
}

int usage(std::FILE* to, const std::vector<Command>& cs) {
  std::fprintf(to, "usage: ifec-cli <command> [options]   (ifec-cli <command> --help for its options)\n\n");
  for (const Command& c : cs) {
    std::fprintf(to, "  %-18s %s\n", c.spec.name.c_str(), c.spec.synopsis.c_str());
  }
  return to == stdout ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  ifec::common::keep_freed_heap();  // frames churn through the heap: keep it, do not trim and refault it
#ifdef IFEC_MOE_BY_EXEC
  g_argv = argv;
#endif
  const std::vector<Command> cs = commands();
  if (argc < 2) {
    return usage(stderr, cs);
  }
  std::string name = argv[1];
  if (name == "help" || name == "--help" || name == "-h") {
    return usage(stdout, cs);
  }
  int skip = 2;
  if (name == "bench") {
    if (argc < 3 || std::string(argv[2]).rfind("-", 0) == 0) {
      std::fprintf(stderr, "ifec bench: name a benchmark: endpoint, collectives, live, property, sim, scale%s\n",
#ifdef IFEC_CLI_MOE
                   ", moe"
#else
                   ""
#endif
      );
      return 2;
    }
    name += std::string(" ") + argv[2];
    skip = 3;
  }
  for (const Command& c : cs) {
    if (c.spec.name != name) {
      continue;
    }
    try {
      const Args a(c.spec, argc - skip, argv + skip);
      if (a.help()) {
        std::printf("%s", ifec::cli::help_text(c.spec).c_str());
        return 0;
      }
      return c.run(a);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ifec %s: %s\n", name.c_str(), e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "ifec-cli: unknown command '%s'\n", name.c_str());
  return usage(stderr, cs);
}
