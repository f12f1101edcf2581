// ifec-cli: the native program behind `./ifec pcap|frames|sim`; one function per subcommand, errors to stderr.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "ifec/common/checks.h"
#include "ifec/common/frame.h"
#include "ifec/common/samples.h"
#include "ifec/endpoint/ring_bench.h"
#include "ifec/routing/topology.h"
#include "ifec/workloads/endpoint_bench.h"
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
               "  bench endpoint [--quick]\n"
               "                 descriptors/s through the ring and proxy (CPU backend) and store goodput of the\n"
               "                 endpoint runtime on the simulated 64 x 4 SuperPoD, one plane vs four\n");
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

int cmd_sim(int argc, char** argv) {
  using namespace ifec;
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

int cmd_bench(int argc, char** argv) {
  using namespace ifec;
  IFEC_CHECK(argc >= 1, "bench needs a target: endpoint");
  const std::string what = argv[0];
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    IFEC_CHECK(std::string(argv[i]) == "--quick", "bench " << what << ": unknown option '" << argv[i] << "'");
    quick = true;
  }
  IFEC_CHECK(what == "endpoint", "unknown benchmark '" << what << "': expected endpoint");
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
