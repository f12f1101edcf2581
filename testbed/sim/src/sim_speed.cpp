// The simulator's speed on named scenarios: raw all-to-all through run_sim, AllReduce through run_collective_point.
#include "ifec/testbed/sim_speed.h"

#include <algorithm>
#include <cstdio>

#include "ifec/common/checks.h"
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
          {big, true, workloads::Algo::kRing, (quick ? 16 : 64) * mib, 1},
          {big, true, workloads::Algo::kIfec, (quick ? 16 : 64) * mib, 1}};
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
