// The scale bench: each scenario in a forked child (its own peak memory), its figures back over a pipe.
#include "ifec/testbed/scale_bench.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "ifec/common/checks.h"
#include "ifec/routing/topology.h"
#include "ifec/testbed/traffic_run.h"

namespace ifec::testbed {

namespace {

// What a child sends its parent: plain figures, then an error message (empty when it ran).
struct ChildFigures {
  int gpus = 0;
  int links = 0;
  int switches = 0;
  int complete = 0;
  uint64_t events = 0;
  uint64_t frame_hops = 0;
  uint64_t routing_bytes = 0;
  uint64_t traffic_bytes = 0;
  double setup_seconds = 0;
  double sim_seconds = 0;
  char error[1024] = {};
};

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string size_text(uint64_t bytes) {
  std::ostringstream o;
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) {
    o << bytes / (1u << 20) << " MiB";
  } else if (bytes >= 1024 && bytes % 1024 == 0) {
    o << bytes / 1024 << " KiB";
  } else {
    o << bytes << " B";
  }
  return o.str();
}

ChildFigures run_child(const ScaleScenario& s, bool progress) {
  ChildFigures f;
  try {
    const routing::Topology topo = routing::load_topology(s.topo_path);
    f.gpus = topo.num_gpus();
    f.links = static_cast<int>(topo.links.size());
    f.switches = static_cast<int>(topo.nodes.size()) - f.gpus;
    SimOptions o;
    o.topo_path = s.topo_path;
    o.pattern = s.pattern;
    o.bytes = s.bytes;
    o.elided_payloads = s.elided_payloads;
    o.group = s.group;
    o.progress = progress;
    const SimRun r = run_sim(topo, o);
    f.complete = r.traffic.complete ? 1 : 0;
    f.events = r.events;
    f.frame_hops = r.frame_hops;
    f.routing_bytes = r.routing_bytes;
    f.traffic_bytes = r.traffic_bytes;
    f.setup_seconds = r.setup_seconds;
    f.sim_seconds = r.sim_seconds;
  } catch (const std::exception& e) {
    std::snprintf(f.error, sizeof(f.error), "%s", e.what());
  }
  return f;
}

// Reads exactly `n` bytes unless the writer ends first; returns the bytes read.
size_t read_all(int fd, void* buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, static_cast<char*>(buf) + got, n - got);
    if (r < 0 && errno == EINTR) {
      continue;
    }
    if (r <= 0) {
      break;
    }
    got += static_cast<size_t>(r);
  }
  return got;
}

void write_all(int fd, const void* buf, size_t n) {
  size_t put = 0;
  while (put < n) {
    const ssize_t w = ::write(fd, static_cast<const char*>(buf) + put, n - put);
    if (w < 0 && errno == EINTR) {
      continue;
    }
    if (w <= 0) {
      return;
    }
    put += static_cast<size_t>(w);
  }
}

void fill_row(ScaleRow& row, const ChildFigures& f) {
  row.gpus = f.gpus;
  row.links = f.links;
  row.switches = f.switches;
  row.complete = f.complete != 0;
  row.events = f.events;
  row.frame_hops = f.frame_hops;
  row.routing_bytes = f.routing_bytes;
  row.traffic_bytes = f.traffic_bytes;
  row.setup_seconds = f.setup_seconds;
  row.sim_seconds = f.sim_seconds;
  row.error = f.error;
}

std::string child_status(int status) {
  std::ostringstream o;
  if (WIFSIGNALED(status)) {
    o << "the run was killed by signal " << WTERMSIG(status)
      << (WTERMSIG(status) == SIGKILL ? " (out of memory?)" : "");
  } else {
    o << "the run exited with status " << WEXITSTATUS(status) << " before reporting";
  }
  return o.str();
}

}  // namespace

std::string ScaleScenario::describe() const {
  return base_name(topo_path) + " " + pattern_name(pattern) + " " + size_text(bytes) +
         (pattern == Pattern::kAllToAll ? "/pair " : "/GPU ") + (elided_payloads ? "elided" : "real") +
         (group > 0 ? " in groups of " + std::to_string(group) : "");
}

std::vector<ScaleScenario> scale_scenarios(const std::string& topo_dir, bool quick) {
  const uint64_t mib = 1 << 20;
  const std::string sun = topo_dir + "/sun-1024x8.yaml";
  const std::string ft = topo_dir + "/fat-tree-2048x8.yaml";
  std::vector<ScaleScenario> v;
  v.push_back({topo_dir + "/superpod-64x4.yaml", Pattern::kAllToAll, quick ? mib / 4 : mib, false, 0, 0, 0});
  v.push_back({sun, Pattern::kPermutation, 2 * mib, false, 0, 0, 0});
  v.push_back({sun, Pattern::kPermutation, 2 * mib, true, 0, 0, 0});
  v.push_back({ft, Pattern::kPermutation, 2 * mib, false, 0, 3e9, 1.5e6});
  v.push_back({ft, Pattern::kPermutation, 2 * mib, true, 0, 0, 0});
  if (!quick) {
    v.push_back({ft, Pattern::kAllToAll, 4096, false, 0, 0, 0});
    v.push_back({ft, Pattern::kAllToAll, 64 * 1024, true, 256, 0, 0});
  }
  return v;
}

ScaleRow measure_scale(const ScaleScenario& s, bool progress) {
  ScaleRow row;
  row.scenario = s;
  row.topology = base_name(s.topo_path);
  int fds[2];
  IFEC_CHECK(::pipe(fds) == 0, "pipe: " << std::strerror(errno));
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  IFEC_CHECK(pid >= 0, "fork: " << std::strerror(errno));
  if (pid == 0) {
    ::close(fds[0]);
    const ChildFigures f = run_child(s, progress);
    write_all(fds[1], &f, sizeof(f));
    std::fflush(stderr);
    ::_exit(0);
  }
  ::close(fds[1]);
  ChildFigures f;
  const size_t got = read_all(fds[0], &f, sizeof(f));
  ::close(fds[0]);
  int status = 0;
  struct rusage ru {};
  while (::wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {
  }
  row.peak_bytes = static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // Linux reports kilobytes
  if (got != sizeof(f)) {
    row.error = child_status(status);
    return row;
  }
  fill_row(row, f);
  return row;
}

std::string scale_table(const std::vector<ScaleRow>& rows) {
  std::ostringstream o;
  char line[512];
  std::snprintf(line, sizeof(line), "# %-62s %6s %6s %11s %11s %8s %8s %10s %7s %9s %9s %9s\n", "scenario", "GPUs",
                "links", "events", "frame-hops", "setup s", "sim s", "M hops/s", "threads", "peak GB", "route B/G",
                "flow B/G");
  o << line;
  for (const ScaleRow& r : rows) {
    if (!r.error.empty()) {
      o << "  " << r.scenario.describe() << ": FAILED: " << r.error << "\n";
      continue;
    }
    std::snprintf(line, sizeof(line), "  %-62s %6d %6d %11llu %11llu %8.2f %8.2f %10.3f %7d %9.2f %9.0f %9.0f%s\n",
                  r.scenario.describe().c_str(), r.gpus, r.links, static_cast<unsigned long long>(r.events),
                  static_cast<unsigned long long>(r.frame_hops), r.setup_seconds, r.sim_seconds, r.rate() / 1e6,
                  r.threads, r.peak_bytes / 1e9, static_cast<double>(r.routing_bytes) / std::max(1, r.gpus),
                  static_cast<double>(r.traffic_bytes) / std::max(1, r.gpus), r.complete ? "" : "  INCOMPLETE");
    o << line;
  }
  for (const ScaleRow& r : rows) {
    if (!r.error.empty() || (r.scenario.target_peak_bytes <= 0 && r.scenario.target_rate <= 0)) {
      continue;
    }
    const bool mem = r.peak_bytes <= r.scenario.target_peak_bytes;
    const bool rate = r.rate() >= r.scenario.target_rate;
    std::snprintf(line, sizeof(line),
                  "# target, %s on one core: peak %.2f GB (at most %.1f: %s), %.2f M frame-hops/s (at least %.1f: "
                  "%s)\n",
                  r.scenario.describe().c_str(), r.peak_bytes / 1e9, r.scenario.target_peak_bytes / 1e9,
                  mem ? "met" : "NOT MET", r.rate() / 1e6, r.scenario.target_rate / 1e6, rate ? "met" : "NOT MET");
    o << line;
  }
  return o.str();
}

}  // namespace ifec::testbed
