// The simulator's speed on named scenarios: raw all-to-all through run_sim, AllReduce through run_collective_point.
#include "ifec/testbed/sim_speed.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>

#include "ifec/common/checks.h"
#include "ifec/common/frame.h"
#include "ifec/common/protocol.h"
#include "ifec/testbed/collective_bench.h"
#include "ifec/testbed/sim_report.h"

namespace ifec::testbed {

double SpeedRow::best() const { return seconds.empty() ? 0 : *std::min_element(seconds.begin(), seconds.end()); }

double SpeedRow::median() const {
  if (seconds.empty()) {
    return 0;
  }
  std::vector<double> s = seconds;
  std::sort(s.begin(), s.end());
  return s.size() % 2 ? s[s.size() / 2] : (s[s.size() / 2 - 1] + s[s.size() / 2]) / 2;
}

double wire_bytes_in_flight(const routing::Topology& topo) {
  double bytes = 0;
  for (const routing::Link& l : topo.links) {
    bytes += 2 * l.rate_gbps * 1e9 / 8 * static_cast<double>(l.delay_ns) * 1e-9;  // both directions
  }
  return bytes;
}

std::vector<SpeedScenario> speed_scenarios(const std::string& topo_dir, bool quick, int runs) {
  const std::string big = topo_dir + "/superpod-64x4.yaml";
  const std::string small = topo_dir + "/superpod-8x2.yaml";
  const uint64_t mib = 1 << 20;
  return {{big, false, workloads::Algo::kRing, quick ? mib / 4 : mib, runs},
          {small, false, workloads::Algo::kRing, (quick ? 16 : 64) * mib, runs},
          {big, true, workloads::Algo::kRing, (quick ? 16 : 64) * mib, std::min(runs, 2)},
          {big, true, workloads::Algo::kIfec, (quick ? 16 : 64) * mib, std::min(runs, 2)}};
}

SpeedRow measure_speed(const routing::Topology& topo, const SpeedScenario& s) {
  IFEC_CHECK(s.runs >= 1, "runs " << s.runs << " must be >= 1");
  SpeedRow row;
  row.scenario = s;
  row.topology = topo.name;
  row.wire_bytes = wire_bytes_in_flight(topo);
  for (int i = 0; i < s.runs; ++i) {
    uint64_t hops = 0;
    if (s.allreduce) {
      CollectivePoint p;
      p.algo = s.algo;
      p.bytes = s.bytes;
      const CollectiveRow r = run_collective_point(topo, p);
      IFEC_CHECK(r.ok, "AllReduce " << workloads::algo_name(s.algo) << " of " << s.bytes << " B: " << r.error);
      hops = r.frame_hops;
      row.events = r.sim_events;
      row.seconds.push_back(r.sim_seconds);
      row.point_seconds = r.wall_seconds;
    } else {
      SimOptions o;
      o.bytes = s.bytes;
      o.progress = false;
      const SimRun r = run_sim(topo, o);
      IFEC_CHECK(r.traffic.complete, "all-to-all of " << s.bytes << " B per pair did not deliver every byte");
      hops = r.frame_hops;
      row.events = r.events;
      row.seconds.push_back(r.wall_seconds);
    }
    IFEC_CHECK(i == 0 || hops == row.frame_hops,
               "run " << i + 1 << " sent " << hops << " frame-hops, run 1 sent " << row.frame_hops);
    row.frame_hops = hops;
  }
  return row;
}

double frame_bytes_ns(double bytes_in_flight, size_t payload, int frames) {
  IFEC_CHECK(payload > 0 && payload <= common::kDefaultPathMtu,
             "frame payload " << payload << " B outside 1.." << common::kDefaultPathMtu);
  IFEC_CHECK(frames > 0, "frames " << frames << " must be > 0");
  IFEC_CHECK(bytes_in_flight >= 0 && bytes_in_flight <= 64e9, "bytes in flight " << bytes_in_flight << " out of range");
  common::FrameHeaders h;
  h.ip.src = 0x0A000001;
  h.ip.dst = 0x0A000002;
  h.ip.dscp = common::kRoceDscp;
  h.bth.opcode = static_cast<uint8_t>(common::Opcode::kWriteOnly);
  h.bth.dest_qp = 0x100;
  h.reth = common::Reth{0x10000, 0x1001, static_cast<uint32_t>(payload)};
  const std::vector<uint8_t> data(payload, 0x5A);
  const size_t frame = common::header_bytes(h) + payload + common::kIcrcSize;
  const size_t n = std::max<size_t>(1, static_cast<size_t>(bytes_in_flight / static_cast<double>(frame)));
  std::vector<std::vector<uint8_t>> ring(n);
  for (std::vector<uint8_t>& f : ring) {
    f = common::encode_frame(h, data.data(), payload);
  }
  size_t stride = 7919;  // a prime; any step coprime to n visits every slot once per n frames
  while (std::gcd(stride, n) != 1) {
    stride += 2;
  }
  double best = 0;
  size_t slot = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < frames; ++i) {
      slot = (slot + stride) % n;
      common::ParsedFrame pf;
      const common::WireStatus st = common::parse_frame(ring[slot].data(), ring[slot].size(), &pf);
      IFEC_CHECK(st.ok(), "frame " << i << " failed its check: " << st.message());
      common::recycle_frame(std::move(ring[slot]));
      h.bth.psn = static_cast<uint32_t>(i) & common::Bth::kPsnMask;
      ring[slot] = common::encode_frame(h, data.data(), payload);
    }
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / frames;
    best = pass == 0 ? ns : std::min(best, ns);
  }
  return best;
}

namespace {

std::string size_text(uint64_t bytes) {
  return bytes % (1 << 20) == 0 ? std::to_string(bytes >> 20) + " MiB" : std::to_string(bytes >> 10) + " KiB";
}

}  // namespace

std::string speed_table(const std::vector<SpeedRow>& rows) {
  std::string out =
      "# scenario                                      frame-hops       events  runs   best s median s  M hops/s"
      "  on wires\n";
  for (const SpeedRow& r : rows) {
    char what[80];
    if (r.scenario.allreduce) {
      std::snprintf(what, sizeof(what), "AllReduce %s %s, %s", workloads::algo_name(r.scenario.algo),
                    size_text(r.scenario.bytes).c_str(), r.topology.c_str());
    } else {
      std::snprintf(what, sizeof(what), "all-to-all %s per pair, %s", size_text(r.scenario.bytes).c_str(),
                    r.topology.c_str());
    }
    char line[240];
    std::snprintf(line, sizeof(line), "  %-44s %11llu %12llu %5zu %8.2f %8.2f %9.2f %7.1f MB\n", what,
                  static_cast<unsigned long long>(r.frame_hops), static_cast<unsigned long long>(r.events),
                  r.seconds.size(), r.best(), r.median(), r.best_rate() / 1e6, r.wire_bytes / 1e6);
    out += line;
  }
  return out;
}

}  // namespace ifec::testbed
