// ifec-cli: the native program behind `./ifec pcap|frames|sim`; one function per subcommand, errors to stderr.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "ifec/common/checks.h"
#include "ifec/common/frame.h"
#include "ifec/common/samples.h"
#include "ifec/endpoint/ring_bench.h"
#include "ifec/routing/topology.h"
#include "ifec/workloads/collective_bench.h"
#include "ifec/workloads/endpoint_bench.h"
#ifdef IFEC_HAVE_MOE
#include "ifec/workloads/moe_bench.h"
#endif
#include "ifec/workloads/sim_report.h"

namespace {

int usage(std::FILE* to) {
  std::fprintf(to,
               "usage: ifec-cli <command> [args]\n"
               "  pcap FILE      write one frame of every kind (RoCEv2 RC operations, ACK/NAK, compact and\n"
               "                 standard ECH) to FILE as pcap\n"
               "  frames         list the sample frames with their sizes and decoded headers\n"
               "  sim --topo FILE --traffic alltoall|permutation|incast --bytes N [--lb flow|packet]\n"
               "      [--pfc on|off] [--fail LINK@TIME]... [--restore LINK@TIME]... [--seed S]\n"
               "      [--incast-target GPU] [--no-verify] [--quiet] [--counters] [--json]\n"
               "                 raw flows over the simulated fabric; LINK is a link id, NODE:NODE[:SUB] or\n"
               "                 GPU:planeP[:subS]; TIME like 20us; N like 1048576, 64KiB or 1MiB\n"
               "  sim --topo FILE --collective allreduce|reduce|multicast|barrier --algo ring|ifec\n"
               "      --bytes SIZE[,SIZE...] [--dtype fp32|bf16|fp16|int32] [--op sum|min|max] [--loss P]\n"
               "      [--fail LINK@TIME] [--members N] [--slot-pool N] [--reproducible] [--seed S] [--json]\n"
               "                 one row per size in the nccl-tests layout, plus wire bytes per plane and fallbacks\n"
               "  bench endpoint [--quick]\n"
               "                 descriptors/s through the ring and proxy (CPU backend) and store goodput of the\n"
               "                 endpoint runtime on the simulated 64 x 4 SuperPoD, one plane vs four\n"
               "  bench collectives [--quick] [--max-sim BYTES]\n"
               "  bench moe [--quick] [--ep 8,16,32,64] [--mode normal|ll|both] [--token-cap N] [--out DIR]\n"
               "                 in-switch vs ring AllReduce on the 64 x 4 SuperPoD, 8 B to 1 GiB\n");
  return 2;
}

int cmd_pcap(int argc, char** argv) {
  if (argc != 1) {
    std::fprintf(stderr, "ifec-cli pcap: expected exactly one FILE argument, got %d\n", argc);
    return 2;
  }
  const size_t n = ifec::common::write_sample_pcap(argv[0]);
  std::printf("wrote %zu frames to %s\n", n, argv[0]);
  return 0;
}

int cmd_frames() {
  using namespace ifec::common;
  std::printf("%-26s %6s  %-26s %8s %8s %s\n", "sample", "bytes", "opcode", "dest_qp", "psn", "ech");
  for (const auto& s : sample_frames()) {
    ParsedFrame pf;
    WireStatus st = parse_frame(s.bytes.data(), s.bytes.size(), &pf);
    if (!st.ok()) {
      std::fprintf(stderr, "sample %s does not parse: %s\n", s.name.c_str(), st.message().c_str());
      return 1;
    }
    std::string ech = "-";
    if (pf.h.ech) {
      ech = std::string(pf.h.ech->format == EchFormat::kCompact ? "compact " : "standard ") + ech_op_name(pf.h.ech->op);
    }
    std::printf("%-26s %6zu  %-26s %#8x %8u %s\n", s.name.c_str(), s.bytes.size(), opcode_name(pf.h.bth.opcode),
                pf.h.bth.dest_qp, pf.h.bth.psn, ech.c_str());
  }
  return 0;
}

uint64_t parse_bytes(const std::string& text) {
  size_t idx = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &idx);
  } catch (const std::exception&) {
    IFEC_FAIL("--bytes '" << text << "' is not a number");
  }
  const std::string unit = text.substr(idx);
  uint64_t scale = 1;
  if (unit == "" || unit == "B") {
    scale = 1;
  } else if (unit == "K" || unit == "KiB" || unit == "k") {
    scale = 1ULL << 10;
  } else if (unit == "M" || unit == "MiB") {
    scale = 1ULL << 20;
  } else if (unit == "G" || unit == "GiB") {
    scale = 1ULL << 30;
  } else {
    IFEC_FAIL("--bytes '" << text << "': unknown unit '" << unit << "' (use B, KiB, MiB or GiB)");
  }
  IFEC_CHECK(v > 0, "--bytes must be > 0, got '" << text << "'");
  return v * scale;
}

std::vector<uint64_t> parse_sizes(const std::string& list) {
  std::vector<uint64_t> out;
  std::string cur;
  for (char ch : list + ",") {
    if (ch == ',') {
      IFEC_CHECK(!cur.empty(), "--bytes '" << list << "': empty size in the list");
      out.push_back(parse_bytes(cur));
      cur.clear();
    } else {
      cur += ch;
    }
  }
  return out;
}

int cmd_sim_collective(int argc, char** argv) {
  using namespace ifec;
  std::string topo_path;
  workloads::CollectivePoint base;
  std::vector<uint64_t> sizes;
  bool json = false;
  bool have_algo = false;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> std::string {
      IFEC_CHECK(i + 1 < argc, flag << " needs a value");
      return argv[++i];
    };
    if (a == "--topo") {
      topo_path = value("--topo");
    } else if (a == "--collective") {
      base.kind = workloads::parse_collective(value("--collective"));
    } else if (a == "--algo") {
      base.algo = workloads::parse_algo(value("--algo"));
      have_algo = true;
    } else if (a == "--bytes") {
      sizes = parse_sizes(value("--bytes"));
    } else if (a == "--dtype") {
      base.dtype = workloads::parse_dtype(value("--dtype"));
    } else if (a == "--op") {
      base.op = workloads::parse_redop(value("--op"));
    } else if (a == "--loss") {
      const std::string v = value("--loss");
      char* end = nullptr;
      base.loss = std::strtod(v.c_str(), &end);
      IFEC_CHECK(end && *end == 0 && base.loss >= 0 && base.loss < 1, "--loss '" << v << "': expected 0 <= P < 1");
    } else if (a == "--fail") {
      base.fail.push_back(value("--fail"));
    } else if (a == "--seed") {
      base.seed = std::stoull(value("--seed"));
    } else if (a == "--members") {
      base.members = std::stoi(value("--members"));
    } else if (a == "--slot-pool") {
      base.slot_pool = static_cast<uint32_t>(std::stoul(value("--slot-pool")));
    } else if (a == "--reproducible") {
      base.reproducible = true;
    } else if (a == "--json") {
      json = true;
    } else if (a == "--quiet") {
    } else {
      IFEC_FAIL("unknown option '" << a << "'");
    }
  }
  IFEC_CHECK(!topo_path.empty(), "--topo FILE is required");
  IFEC_CHECK(have_algo, "--algo ring|ifec is required with --collective");
  if (base.kind == workloads::Collective::kBarrier && sizes.empty()) {
    sizes = {0};
  }
  IFEC_CHECK(!sizes.empty(), "--bytes SIZE[,SIZE...] is required");
  const routing::Topology topo = routing::load_topology(topo_path);
  if (!json) {
    std::printf("# %s %s on %s, %d GPUs, loss %g%s\n", workloads::collective_name(base.kind),
                workloads::algo_name(base.algo), topo.name.c_str(), base.members ? base.members : topo.num_gpus(),
                base.loss, base.reproducible ? ", reproducible" : "");
    std::printf("%s", workloads::rows_header().c_str());
  }
  int failures = 0;
  for (uint64_t size : sizes) {
    workloads::CollectivePoint p = base;
    p.bytes = size;
    const workloads::CollectiveRow r = workloads::run_collective_point(topo, p);
    failures += !r.ok || r.wrong > 0;
    std::printf("%s", json ? (workloads::row_json(r, topo.name) + "\n").c_str() : workloads::row_text(r).c_str());
    std::fflush(stdout);
  }
  return failures ? 1 : 0;
}

int cmd_sim(int argc, char** argv) {
  using namespace ifec;
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--collective") {
      return cmd_sim_collective(argc, argv);
    }
  }
  workloads::SimOptions opts;
  std::string traffic;
  std::vector<std::pair<std::string, bool>> events;
  bool json = false;
  bool counters = false;
  bool have_bytes = false;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> std::string {
      IFEC_CHECK(i + 1 < argc, flag << " needs a value");
      return argv[++i];
    };
    if (a == "--topo") {
      opts.topo_path = value("--topo");
    } else if (a == "--traffic") {
      traffic = value("--traffic");
    } else if (a == "--bytes") {
      opts.bytes = parse_bytes(value("--bytes"));
      have_bytes = true;
    } else if (a == "--lb") {
      const std::string v = value("--lb");
      IFEC_CHECK(v == "flow" || v == "packet", "--lb '" << v << "': expected flow or packet");
      opts.lb = v == "flow" ? switchemu::LoadBalance::kPerFlow : switchemu::LoadBalance::kPerPacket;
    } else if (a == "--pfc") {
      const std::string v = value("--pfc");
      IFEC_CHECK(v == "on" || v == "off", "--pfc '" << v << "': expected on or off");
      opts.pfc = v == "on";
    } else if (a == "--fail") {
      events.push_back({value("--fail"), false});
    } else if (a == "--restore") {
      events.push_back({value("--restore"), true});
    } else if (a == "--seed") {
      const std::string v = value("--seed");
      IFEC_CHECK(!v.empty() && v.find_first_not_of("0123456789") == std::string::npos,
                 "--seed '" << v << "' is not a non-negative integer");
      opts.seed = std::stoull(v);
    } else if (a == "--incast-target") {
      const std::string v = value("--incast-target");
      IFEC_CHECK(!v.empty() && v.size() < 9 && v.find_first_not_of("0123456789") == std::string::npos,
                 "--incast-target '" << v << "' is not a GPU index");
      opts.incast_target = std::stoi(v);
    } else if (a == "--no-verify") {
      opts.verify_icrc = false;
    } else if (a == "--quiet") {
      opts.progress = false;
    } else if (a == "--json") {
      json = true;
    } else if (a == "--counters") {
      counters = true;
    } else {
      IFEC_FAIL("unknown option '" << a << "'");
    }
  }
  IFEC_CHECK(!opts.topo_path.empty(), "--topo FILE is required");
  IFEC_CHECK(!traffic.empty(), "--traffic alltoall|permutation|incast is required");
  IFEC_CHECK(have_bytes, "--bytes N is required");
  opts.pattern = workloads::parse_pattern(traffic);
  const routing::Topology topo = routing::load_topology(opts.topo_path);
  for (const auto& [text, up] : events) {
    opts.events.push_back(workloads::parse_link_event(topo, text, up));
  }
  const workloads::SimRun run = workloads::run_sim(topo, opts);
  if (json) {
    std::printf("%s\n", workloads::to_json(run).c_str());
  } else {
    std::printf("%s", workloads::to_text(run).c_str());
    if (counters) {
      std::printf("\nper-port, per-queue switch counters (queues that carried traffic):\n%s",
                  workloads::counters_table(run).c_str());
    }
  }
  return 0;
}

int bench_collectives(int argc, char** argv) {
  using namespace ifec;
  bool quick = false;
  uint64_t max_sim = 64ULL << 20;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
      max_sim = 1ULL << 20;
    } else if (a == "--max-sim" && i + 1 < argc) {
      max_sim = parse_bytes(argv[++i]);
    } else {
      IFEC_FAIL("bench collectives: unknown option '" << a << "'");
    }
  }
  const routing::Topology topo = routing::make_superpod(64, 4);
  std::printf("# AllReduce fp32 sum, 64 GPUs x 4 planes (800G ports as 2 x 400G) [driver: sim]\n");
  std::printf(
      "# rows above %llu B are (modelled): the largest simulated time scaled by size (both algorithms are\n"
      "# bandwidth-bound there; a latency + bandwidth fit would mix in the ring's latency-bound smaller sizes)\n",
      static_cast<unsigned long long>(max_sim));
  std::printf("#%13s %12s %14s %14s %10s %10s %8s %12s\n", "size(B)", "count", "ring time(us)", "ifec time(us)",
              "ring busbw", "ifec busbw", "speedup", "2(N-1)/N");
  std::vector<uint64_t> sizes;
  for (uint64_t b = 8; b <= (1ULL << 30); b *= 8) {
    sizes.push_back(b);
  }
  sizes.push_back(64ULL << 20);
  sizes.push_back(256ULL << 20);
  sizes.push_back(1ULL << 30);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  struct Fit {
    double s2 = 0, t2 = 0;  // the largest simulated point
    double at(double s) const { return t2 * s / s2; }
  };
  Fit fit[2];
  const double bound = 2.0 * 63 / 64;
  for (uint64_t size : sizes) {
    double t[2];
    bool modelled = size > max_sim;
    for (int a = 0; a < 2; ++a) {
      if (modelled) {
        t[a] = fit[a].at(static_cast<double>(size));
        continue;
      }
      workloads::CollectivePoint p;
      p.kind = workloads::Collective::kAllReduce;
      p.algo = a == 0 ? workloads::Algo::kRing : workloads::Algo::kIfec;
      p.bytes = size;
      const auto r = workloads::run_collective_point(topo, p);
      IFEC_CHECK(r.ok && r.wrong == 0, "bench " << workloads::algo_name(p.algo) << " at " << size
                                                << " B: " << (r.ok ? "wrong results" : r.error));
      t[a] = r.time_us;
      fit[a].s2 = static_cast<double>(size);
      fit[a].t2 = r.time_us;
    }
    const double busbw[2] = {size / (t[0] * 1e3) * bound, size / (t[1] * 1e3) * bound};
    std::printf(" %13llu %12llu %14.2f %14.2f %10.2f %10.2f %7.2fx %12.3f%s\n", static_cast<unsigned long long>(size),
                static_cast<unsigned long long>(size / 4), t[0], t[1], busbw[0], busbw[1], t[0] / t[1], bound,
                modelled ? "  (modelled)" : "");
    std::fflush(stdout);
    if (quick && size >= max_sim) {
      break;
    }
  }
  return 0;
}

#ifdef IFEC_HAVE_MOE
// Comma-separated integers ("8,16,32,64").
std::vector<int64_t> parse_ints(const std::string& s, const char* what) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long long x = std::strtoll(item.c_str(), &end, 10);
    IFEC_CHECK(!item.empty() && *end == 0 && x > 0, what << ": '" << item << "' is not a positive integer");
    v.push_back(x);
  }
  IFEC_CHECK(!v.empty(), what << ": empty list");
  return v;
}

int bench_moe(int argc, char** argv) {
  using namespace ifec;
  workloads::MoeBenchConfig cfg;
  cfg.topo = routing::make_superpod(64, 4);
  cfg.topology_name = "superpod-64x4";
  std::vector<int64_t> eps = {8, 16, 32, 64};
  std::vector<std::string> modes = {"normal", "ll"};
  int64_t cap = 256;
  std::string out;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      IFEC_CHECK(i + 1 < argc, "bench moe: " << a << " needs a value");
      return argv[++i];
    };
    if (a == "--quick") {
      eps = {8, 16};
      cap = 32;
    } else if (a == "--ep") {
      eps = parse_ints(value(), "--ep");
    } else if (a == "--token-cap") {
      const std::string v = value();
      cap = v == "0" ? 0 : parse_ints(v, "--token-cap").front();
    } else if (a == "--mode") {
      const std::string m = value();
      IFEC_CHECK(m == "normal" || m == "ll" || m == "both", "--mode: '" << m << "' (normal, ll or both)");
      modes = m == "both" ? std::vector<std::string>{"normal", "ll"} : std::vector<std::string>{m};
    } else if (a == "--out") {
      out = value();
    } else {
      IFEC_FAIL("bench moe: unknown option '" << a << "'");
    }
  }
  cfg.token_cap = cap;
  cfg.progress = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  std::printf(
      "# MoE dispatch/combine, DeepSeek-V3 routing (hidden %lld, top-%lld of %lld, bf16 rows) on %s "
      "(64 GPUs x 4 planes, 800G ports as 2 x 400G) [driver: sim]\n",
      static_cast<long long>(cfg.model.hidden), static_cast<long long>(cfg.model.topk),
      static_cast<long long>(cfg.model.experts), cfg.topology_name.c_str());
  std::printf(
      "# dispatch/combine simulated; experts(us) modelled: H100 %.0f TFLOP/s, %.0f GB/s HBM, efficiency %.2f, "
      "expert width %lld\n",
      cfg.profile.tflops, cfg.profile.hbm_gbs, cfg.profile.efficiency, static_cast<long long>(cfg.model.inter));
  if (cap > 0) {
    std::printf(
        "# points above %lld tokens per rank simulate %lld and scale times and bytes by the token ratio "
        "(bandwidth-bound), marked (scaled from N)\n",
        static_cast<long long>(cap), static_cast<long long>(cap));
  }
  std::printf("# GB/s: logical bytes per rank / time (DeepEP's convention); MB: all ranks together\n");
  std::printf("%s\n", workloads::moe_rows_header().c_str());
  std::fflush(stdout);
  std::string csv = workloads::moe_csv_header() + "\n";
  std::string json = "[";
  for (const std::string& mode : modes) {
    for (int64_t ep : eps) {
      workloads::MoePoint p;
      p.mode = mode;
      p.ep = static_cast<int>(ep);
      p.tokens = mode == "normal" ? 4096 : 128;
      const auto rows = workloads::run_moe_point(
          cfg, p, {workloads::MoeVariant::kPerExpert, workloads::MoeVariant::kPerRank, workloads::MoeVariant::kIfec});
      for (const auto& r : rows) {
        std::printf("%s\n", workloads::moe_row_text(r).c_str());
        csv += workloads::moe_row_csv(r) + "\n";
        json += (json.size() > 1 ? ",\n" : "") + workloads::moe_row_json(r, cfg.topology_name);
      }
      const double base = std::min(rows[0].dispatch_us + rows[0].combine_us, rows[1].dispatch_us + rows[1].combine_us);
      std::printf("#   EP %lld %s: IFEC dispatch+combine %.2fx the best baseline, layer %.2fx\n",
                  static_cast<long long>(ep), mode.c_str(), base / (rows[2].dispatch_us + rows[2].combine_us),
                  std::min(rows[0].total_us, rows[1].total_us) / rows[2].total_us);
      std::fflush(stdout);
    }
  }
  json += "]\n";
  if (!out.empty()) {
    for (const auto& [name, text] :
         {std::pair<std::string, std::string>{"/moe_bench.csv", csv}, {"/moe_bench.json", json}}) {
      FILE* f = std::fopen((out + name).c_str(), "w");
      IFEC_CHECK(f != nullptr, "cannot write " << out + name);
      std::fputs(text.c_str(), f);
      std::fclose(f);
      std::printf("# wrote %s\n", (out + name).c_str());
    }
  }
  return 0;
}
#endif

int cmd_bench(int argc, char** argv) {
  using namespace ifec;
  IFEC_CHECK(argc >= 1, "bench needs a target: endpoint");
  const std::string what = argv[0];
  if (what == "collectives") {
    return bench_collectives(argc - 1, argv + 1);
  }
#ifdef IFEC_HAVE_MOE
  if (what == "moe") {
    return bench_moe(argc - 1, argv + 1);
  }
#endif
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    IFEC_CHECK(std::string(argv[i]) == "--quick", "bench " << what << ": unknown option '" << argv[i] << "'");
    quick = true;
  }
  IFEC_CHECK(what == "endpoint", "unknown benchmark '" << what << "': expected endpoint, collectives or moe");
  std::printf("== descriptor rate: ring + proxy, CPU backend (wall clock on this machine)\n");
  std::printf("%-16s %8s %12s %10s %14s\n", "backend", "threads", "descriptors", "seconds", "descriptors/s");
  for (int threads : {1, 2}) {
    const auto r = endpoint::bench_descriptor_rate(threads, quick ? 200'000 : 2'000'000, 4096);
    std::printf("%-16s %8d %12llu %10.3f %14.0f\n", "cpu-null-sink", r.producer_threads,
                static_cast<unsigned long long>(r.descriptors), r.seconds, r.descriptors_per_s);
  }
  const auto s = workloads::bench_descriptor_rate_sim(quick ? 5'000 : 50'000);
  std::printf("%-16s %8d %12llu %10.3f %14.0f   (8-byte puts, each simulated end to end)\n", s.backend.c_str(),
              s.producer_threads, static_cast<unsigned long long>(s.descriptors), s.seconds, s.per_second);
  std::printf("\n== store goodput, GPU 0 -> GPU 1, 64 x 4 SuperPoD (800G per plane as 2 x 400G) [driver: sim]\n");
  std::printf("%-8s %6s %14s %12s %12s %10s %8s\n", "mode", "planes", "stores", "sim time us", "goodput Gb/s",
              "line Gb/s", "of line");
  const uint64_t stores = quick ? 8 : 32;
  double one_plane[3] = {0, 0, 0};
  int mi = 0;
  for (auto mode : {endpoint::Ordering::kWeak, endpoint::Ordering::kPartial, endpoint::Ordering::kStrong}) {
    for (int planes : {1, 4}) {
      const auto r = workloads::bench_store_goodput(mode, planes, stores, 1 << 20);
      char ratio[32] = "";
      if (planes == 1) {
        one_plane[mi] = r.goodput_gbps;
      } else {
        std::snprintf(ratio, sizeof(ratio), "  %.2fx one plane", r.goodput_gbps / one_plane[mi]);
      }
      std::printf("%-8s %6d %9llu x 1M %12.1f %12.1f %10.0f %7.1f%%%s\n", r.mode.c_str(), r.planes,
                  static_cast<unsigned long long>(r.stores), r.sim_ns / 1e3, r.goodput_gbps, r.line_rate_gbps,
                  100.0 * r.goodput_gbps / r.line_rate_gbps, ratio);
    }
    ++mi;
  }
  std::printf("(strong ordering keeps one in-order stream per peer on one sub-port, so it cannot use more planes)\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    return usage(stderr);
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "pcap") {
      return cmd_pcap(argc - 2, argv + 2);
    }
    if (cmd == "frames") {
      return cmd_frames();
    }
    if (cmd == "sim") {
      return cmd_sim(argc - 2, argv + 2);
    }
    if (cmd == "bench") {
      return cmd_bench(argc - 2, argv + 2);
    }
    if (cmd == "help" || cmd == "--help" || cmd == "-h") {
      usage(stdout);
      return 0;
    }
  } catch (const ifec::common::Error& e) {
    std::fprintf(stderr, "ifec %s: %s\n", cmd.c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ifec %s: %s\n", cmd.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "ifec-cli: unknown command '%s'\n", cmd.c_str());
  return usage(stderr);
}
