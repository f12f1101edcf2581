// Runs one collective on a fresh simulated fabric and reports it like nccl-tests, plus what only a simulator sees.
#include "ifec/testbed/collective_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>

#include "ifec/common/checks.h"
#include "ifec/common/json.h"
#include "ifec/common/numeric.h"
#include "ifec/testbed/cluster.h"
#include "ifec/testbed/harness.h"
#include "ifec/testbed/live_timing.h"
#include "ifec/testbed/parallel.h"

namespace ifec::testbed {

using workloads::collective_name;
using workloads::element_size;

using common::EchDtype;
using common::EchRedOp;

EchDtype parse_dtype(const std::string& name) {
  if (name == "fp32" || name == "float") {
    return EchDtype::kFp32;
  }
  if (name == "bf16") {
    return EchDtype::kBf16;
  }
  if (name == "fp16" || name == "half") {
    return EchDtype::kFp16;
  }
  if (name == "int32") {
    return EchDtype::kInt32;
  }
  IFEC_FAIL("unknown dtype '" << name << "': expected fp32, bf16, fp16 or int32");
}

EchRedOp parse_redop(const std::string& name) {
  if (name == "sum") {
    return EchRedOp::kSum;
  }
  if (name == "min") {
    return EchRedOp::kMin;
  }
  if (name == "max") {
    return EchRedOp::kMax;
  }
  IFEC_FAIL("unknown reduction op '" << name << "': expected sum, min or max");
}

namespace {

constexpr uint16_t kBuf = 1;
constexpr uint16_t kScratch = 2;
constexpr uint64_t kMemoryBudget = 12ULL << 30;  // host bytes the simulated GPUs' windows may take together

double busbw_factor(Collective k, size_t n) { return k == Collective::kAllReduce ? 2.0 * (n - 1) / n : 1.0; }

// The check walks the elements in blocks: a block's reference stays in L1/L2 while every member's input is added
// into it and every output is compared with it, so the check streams each output once and keeps no full-size copy.
constexpr uint64_t kCheckBlock = 2048;

// Error bound of one element: every fp32 accumulation step may round (n steps), and the output type rounds once in
// the switch or once per ring step: |err| <= (n * 2^-24 + steps * unit) * sum |x_i| (min/max: one rounding of the
// result).
struct Rounding {
  Rounding(const CollectivePoint& p, int n, bool rounds_per_step)
      : multicast(p.kind == Collective::kMulticast), sum(p.op == EchRedOp::kSum), int32(p.dtype == EchDtype::kInt32) {
    const double unit = p.dtype == EchDtype::kBf16   ? 1.0 / 256
                        : p.dtype == EchDtype::kFp16 ? 1.0 / 2048
                        : p.dtype == EchDtype::kFp32 ? 1.0 / 16777216
                                                     : 0;
    const double steps = rounds_per_step ? n : 1;
    const double fp32_steps = int32 ? 0 : n / 16777216.0;
    factor = multicast ? 0 : fp32_steps + steps * unit;
  }
  bool multicast;  // the source's bytes alone
  bool sum;
  bool int32;
  double factor;
};

// Block scratch: the fp64 reference of elements [first, first + m) and its bound, with room for one member's input.
struct ReferenceBlock {
  explicit ReferenceBlock(size_t element_bytes)
      : value(kCheckBlock), bound(kCheckBlock), v(kCheckBlock), input(kCheckBlock * element_bytes) {}
  std::vector<double> value;  // fp64 (exact wrap-around for int32 sums)
  std::vector<double> bound;  // largest |error| the path's rounding explains
  std::vector<double> v;
  std::vector<uint8_t> input;
};

// Member by member, in member order: the same additions, in the same order, as element by element.
// Inlined into each of check_outputs' clones, so it is vectorized for the CPU too.
[[gnu::always_inline]] inline void reference_block(const CollectivePoint& p, int n, const Rounding& r, int source,
                                                   uint64_t first, uint64_t m, ReferenceBlock& b) {
  double* value = b.value.data();
  double* bound = b.bound.data();
  const double* v = b.v.data();
  std::fill_n(bound, m, 0.0);  // sum |x_i| first, then the bound
  for (int k = 0; k < (r.multicast ? 1 : n); ++k) {
    collective_input(p, r.multicast ? source : k, m, b.input.data(), first);
    common::load_elements(p.dtype, b.input.data(), m, b.v.data());
    // One loop per case, each one the compiler vectorizes.
    for (uint64_t i = 0; i < m; ++i) {
      bound[i] += std::fabs(v[i]);
    }
    if (k == 0) {
      std::copy_n(v, m, value);
    } else if (r.sum) {
      for (uint64_t i = 0; i < m; ++i) {
        value[i] += v[i];
      }
    } else if (p.op == EchRedOp::kMin) {
      for (uint64_t i = 0; i < m; ++i) {
        value[i] = std::min(value[i], v[i]);
      }
    } else {
      for (uint64_t i = 0; i < m; ++i) {
        value[i] = std::max(value[i], v[i]);
      }
    }
  }
  for (uint64_t i = 0; i < m; ++i) {
    const double magnitude = !r.sum || r.multicast ? std::fabs(value[i]) : bound[i];
    if (r.int32 && r.sum) {
      value[i] = static_cast<double>(static_cast<int32_t>(static_cast<uint32_t>(static_cast<int64_t>(value[i]))));
    }
    bound[i] = r.factor * magnitude + 1e-30;
  }
}

// A counter-based generator: 64 well-mixed bits from (seed, member, element), so any member's input is a pure
// function of those three (splitmix64's finaliser).
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

// Cloned for AVX-512 where the CPU has it (its 64-bit multiplies vectorize the generator): same bytes either way.
__attribute__((target_clones("arch=x86-64-v4", "default"))) void collective_input(const CollectivePoint& p, int member,
                                                                                  uint64_t count, uint8_t* out,
                                                                                  uint64_t first) {
  // Bell-shaped floats of mean 0 and variance 1 (the sum of four uniforms, Irwin-Hall, scaled), or small integers
  // for int32 so that sums stay meaningful; element i of the member from (seed, member, i) alone. One loop per
  // element type: 64 members x 16 M elements are written per 64 MiB point, and regenerated for the reference.
  const uint64_t stream = mix(p.seed * 7919 + static_cast<uint64_t>(member));
  auto bits = [stream, first](uint64_t i) { return mix(stream ^ ((first + i) * 0xD1B54A32D192ED03ull)); };
  auto bell = [](uint64_t r) {
    const double u = static_cast<double>((r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48));
    return static_cast<float>((u / 65536.0 - 2.0) * 1.7320508075688772);  // sqrt(3): variance 1
  };
  switch (p.dtype) {
    case EchDtype::kInt32:
      for (uint64_t i = 0; i < count; ++i) {
        const int32_t v = static_cast<int32_t>(bits(i) % 2001) - 1000;
        std::memcpy(out + 4 * i, &v, 4);
      }
      return;
    case EchDtype::kFp32:
      for (uint64_t i = 0; i < count; ++i) {
        const float v = bell(bits(i));
        std::memcpy(out + 4 * i, &v, 4);
      }
      return;
    case EchDtype::kFp16:
    case EchDtype::kBf16:
      for (uint64_t i = 0; i < count; ++i) {
        common::Acc a;
        a.f = bell(bits(i));
        common::store_element(p.dtype, a, out, i);
      }
      return;
  }
}

__attribute__((target_clones("arch=x86-64-v4", "default"))) OutputCheck check_outputs(
    const CollectivePoint& p, int n, uint64_t count, bool rounds_per_step, const std::vector<const uint8_t*>& outputs,
    int source) {
  OutputCheck c;
  if (p.kind == Collective::kBarrier || n <= 0 || count == 0) {
    return c;
  }
  const Rounding rounding(p, n, rounds_per_step);
  const size_t es = element_size(p.dtype);
  ReferenceBlock ref(es);
  std::vector<double> got(kCheckBlock);
  std::vector<double> scale(kCheckBlock);  // what an error is relative to
  for (uint64_t first = 0; first < count; first += kCheckBlock) {
    const uint64_t m = std::min(kCheckBlock, count - first);
    reference_block(p, n, rounding, source, first, m, ref);
    for (uint64_t i = 0; i < m; ++i) {
      scale[i] = std::max(1.0, std::fabs(ref.value[i]));
    }
    for (const uint8_t* out : outputs) {
      common::load_elements(p.dtype, out + first * es, m, got.data());
      // In two loops the compiler vectorizes (errors and the count), then a plain maximum.
      uint64_t wrong = 0;
      for (uint64_t i = 0; i < m; ++i) {
        const double err = std::fabs(got[i] - ref.value[i]);
        wrong += !(err <= ref.bound[i]);  // NaN or Inf where the reference is finite counts as wrong
        got[i] = err / scale[i];
      }
      c.wrong += wrong;
      for (uint64_t i = 0; i < m; ++i) {
        c.max_rel_error = std::max(c.max_rel_error, got[i]);
      }
    }
  }
  return c;
}

CollectiveRow run_collective_point(const routing::Topology& fabric_topo, const CollectivePoint& p) {
  routing::Topology topo = fabric_topo;
  topo.params.ifec.reproducible = topo.params.ifec.reproducible || p.reproducible;
  topo.params.ifec.slot_pool = p.slot_pool;
  const auto wall0 = std::chrono::steady_clock::now();
  CollectiveRow row;
  row.point = p;
  const size_t es = element_size(p.dtype);
  row.count = p.kind == Collective::kBarrier ? 0 : p.bytes / es;
  IFEC_CHECK(p.kind != Collective::kBarrier || p.bytes == 0,
             "a barrier moves no data: size " << p.bytes << " B given (leave --bytes out)");
  IFEC_CHECK(p.kind == Collective::kBarrier || row.count > 0,
             "size " << p.bytes << " B holds no " << common::ech_dtype_name(p.dtype) << " element");
  IFEC_CHECK(p.kind == Collective::kBarrier || p.bytes % es == 0, "size " << p.bytes << " B is not a whole number of "
                                                                          << common::ech_dtype_name(p.dtype)
                                                                          << " elements (" << es << " B each)");
  IFEC_CHECK(p.members >= 0, "members " << p.members << " must be >= 2 (or 0 for every GPU)");
  IFEC_CHECK(p.loss >= 0 && p.loss < 1, "loss " << p.loss << " outside [0, 1)");
  IFEC_CHECK(p.slot_pool > 0, "slot pool " << p.slot_pool << " must be > 0");
  IFEC_CHECK(p.slot_budget > 0, "slot budget " << p.slot_budget << " must be > 0");
  ClusterOptions o;
  o.fabric.loss = p.loss;
  o.fabric.seed = p.seed;
  o.fabric.lb = switchemu::LoadBalance::kPerPacket;
  o.endpoint.ordering = endpoint::Ordering::kWeak;
  if (p.live_timing) {
    apply_live_timing(o.endpoint);
    apply_live_timing(topo.params.ifec);
  }
  Cluster c(topo, o);
  CollectiveSpec s;
  s.kind = p.kind;
  const int n = p.members > 0 ? p.members : c.size();
  IFEC_CHECK(n >= 2 && n <= c.size(), "members " << n << " outside 2.." << c.size());
  for (int g = 0; g < n; ++g) {
    s.members.push_back(g);
  }
  s.root = 0;
  s.window = kBuf;
  s.offset = 0;
  s.count = row.count;
  s.dtype = p.dtype;
  s.op = p.op;
  s.scratch_window = kScratch;
  const uint64_t buf = std::max<uint64_t>(64, row.count * es);
  const uint64_t scratch = std::max<uint64_t>(4096, ring_scratch_bytes(s, p.algo, &c.fabric().topology()));
  IFEC_CHECK((buf + scratch) * c.size() <= kMemoryBudget,
             "size " << p.bytes << " B on " << c.size() << " GPUs needs " << ((buf + scratch) * c.size() >> 20)
                     << " MiB of host memory for the simulated windows; the limit is " << (kMemoryBudget >> 20)
                     << " MiB");
  c.allocate_window(kBuf, buf);
  c.allocate_window(kScratch, scratch);
  for (int g = 0; g < n; ++g) {
    collective_input(p, g, row.count, c.window_data(g, kBuf));  // straight into the window: no copy kept
    // Every scratch page written once now, as a GPU's memory is mapped before a collective runs: the kernel
    // zero-fills a page on its first write, which would otherwise land in the simulated time.
    uint8_t* sc = c.window_data(g, kScratch);
    for (uint64_t off = 0; off < scratch; off += 4096) {
      sc[off] = 0;
    }
  }
  for (const std::string& f : p.fail) {
    LinkEvent e = parse_link_event(topo, f, false);
    for (int l : e.links) {
      c.fabric().schedule_link_state(l, false, c.loop().now() + e.at);
    }
  }
  // One counter summed over both ends of every link.
  auto over_links = [&](uint64_t common::PortCounters::*counter) {
    uint64_t total = 0;
    for (size_t l = 0; l < topo.links.size(); ++l) {
      for (int side = 0; side < 2; ++side) {
        total += c.fabric().link(static_cast<int>(l)).end(side).counters().*counter;
      }
    }
    return total;
  };
  auto link_bytes = [&](bool tx) {
    std::vector<uint64_t> v(topo.num_planes, 0);
    for (int g = 0; g < n; ++g) {
      for (const auto& port : c.fabric().gpu_ports(g)) {
        const auto& k = port.io->counters();
        v[port.plane] += tx ? k.tx_bytes : k.rx_bytes;
      }
    }
    return v;
  };
  const auto tx0 = link_bytes(true);
  const auto rx0 = link_bytes(false);
  auto per_link = [&] {
    std::vector<std::array<uint64_t, 3>> v;
    for (int g = 0; g < n; ++g) {
      for (const auto& port : c.fabric().gpu_ports(g)) {
        v.push_back({static_cast<uint64_t>(port.link), port.io->counters().tx_bytes, port.io->counters().rx_bytes});
      }
    }
    return v;
  };
  const auto links0 = per_link();
  const uint64_t hops0 = over_links(&common::PortCounters::tx_frames);
  const uint64_t events0 = c.loop().events_run();
  const auto sim0 = std::chrono::steady_clock::now();
  CollectiveResult res;
  if (p.algo != Algo::kIfec) {
    res = run_endpoint_collective(c, s, 10'000'000'000ULL, p.algo);
  } else {
    IfecOptions io;
    io.slots_per_plane = p.slot_budget;
    if (p.live_timing) {
      apply_live_timing(io);
    }
    IfecCollectives ifec(c, io);
    res = ifec.run(s);
  }
  row.sim_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - sim0).count();
  row.sim_events = c.loop().events_run() - events0;
  row.frame_hops = over_links(&common::PortCounters::tx_frames) - hops0;
  row.ok = res.ok;
  row.ran = res.algo;
  row.error = res.error.empty() && res.fell_back ? res.fallback_reason : res.error;
  row.frames_lost = over_links(&common::PortCounters::dropped_injected);
  row.frames_lost_link_down = over_links(&common::PortCounters::dropped_link_down);
  for (const std::string& f : p.fail) {
    row.faults.push_back("link down: " + f);
  }
  if (row.frames_lost + row.frames_lost_link_down > 0) {
    row.faults.push_back("frames lost: " + std::to_string(row.frames_lost) + " to injected loss, " +
                         std::to_string(row.frames_lost_link_down) + " on links that were down");
  }
  row.faults.insert(row.faults.end(), res.faults.begin(), res.faults.end());
  row.fell_back = res.fell_back;
  row.fallback_chunks = res.fallback_chunks;
  row.anomalies = res.anomalies;
  row.time_us = (res.end_ns - res.start_ns) / 1e3;
  row.algbw_gbs = row.time_us > 0 ? p.bytes / (row.time_us * 1e3) : 0;
  row.busbw_gbs = row.algbw_gbs * busbw_factor(p.kind, n);
  const auto tx1 = link_bytes(true);
  const auto rx1 = link_bytes(false);
  for (int q = 0; q < topo.num_planes; ++q) {
    row.plane_tx_bytes.push_back(tx1[q] - tx0[q]);
    row.plane_rx_bytes.push_back(rx1[q] - rx0[q]);
  }
  row.gpu_links = per_link();
  for (size_t i = 0; i < row.gpu_links.size(); ++i) {
    row.gpu_links[i][1] -= links0[i][1];
    row.gpu_links[i][2] -= links0[i][2];
  }
  if (p.corrupt_output && row.count > 0) {
    uint8_t* out = c.window_data(p.kind == Collective::kReduce ? s.root : s.members.back(), kBuf);
    out[(row.count / 2) * es + es - 1] ^= 0x40;  // a high bit of the middle element
  }
  if (row.ok && p.kind != Collective::kBarrier) {
    std::vector<const uint8_t*> outs;
    for (int g : p.kind == Collective::kReduce ? std::vector<int>{s.root} : s.members) {
      outs.push_back(c.window_data(g, kBuf));
    }
    const OutputCheck chk = check_outputs(p, n, row.count, p.algo != Algo::kIfec || row.fell_back, outs, s.root);
    row.wrong = chk.wrong;
    row.max_rel_error = chk.max_rel_error;
    if (row.wrong > 0) {
      row.ok = false;  // a wrong result is never reported as ok
      row.error = std::to_string(row.wrong) + " elements differ from the fp64 reference beyond the rounding bound";
    }
  }
  row.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return row;
}

std::string rows_header() {
  char line[320];
  std::snprintf(line, sizeof(line), "#%13s %12s %6s %6s %5s %11s %8s %8s %7s %10s %9s  %s\n", "size(B)", "count",
                "type", "redop", "algo", "time(us)", "algbw", "busbw", "#wrong", "max_err", "fallback",
                "wire MB sent per plane (all members)");
  return std::string(line) +
         "#                                                   (GB/s)   (GB/s)                    (chunks)  [driver: "
         "sim]\n";
}

std::string row_text(const CollectiveRow& r) {
  std::ostringstream planes;
  for (size_t q = 0; q < r.plane_tx_bytes.size(); ++q) {
    planes << (q ? " " : "") << std::fixed;
    planes.precision(1);
    planes << r.plane_tx_bytes[q] / 1e6;
  }
  char line[400];
  if (!r.ok && r.wrong == 0) {
    std::snprintf(line, sizeof(line), " %13llu  FAILED: %s\n", static_cast<unsigned long long>(r.point.bytes),
                  r.error.c_str());
    return line;
  }
  std::snprintf(line, sizeof(line), " %13llu %12llu %6s %6s %7s %11.2f %8.2f %8.2f %7llu %10.2e %9llu  %s%s\n",
                static_cast<unsigned long long>(r.point.bytes), static_cast<unsigned long long>(r.count),
                common::ech_dtype_name(r.point.dtype), common::ech_redop_name(r.point.op),
                r.ran.empty() ? workloads::algo_name(r.point.algo) : r.ran.c_str(), r.time_us, r.algbw_gbs, r.busbw_gbs,
                static_cast<unsigned long long>(r.wrong), r.max_rel_error,
                static_cast<unsigned long long>(r.fallback_chunks), r.modelled ? "(modelled) " : "",
                r.modelled ? "" : planes.str().c_str());
  std::string out = line;
  if (r.wrong > 0) {
    out += "#   WRONG: " + r.error + "\n";
  }
  for (const std::string& f : r.faults) {
    out += "#   fault: " + f + "\n";
  }
  return out;
}

std::string simulator_text(const CollectiveRow& r) {
  char line[300];
  std::snprintf(line, sizeof(line),
                "#   simulator: %llu frame-hops, %llu events in %.2f s wall (%.2f M frame-hops/s on one core); the "
                "point took %.2f s with inputs, fp64 reference and checks\n",
                static_cast<unsigned long long>(r.frame_hops), static_cast<unsigned long long>(r.sim_events),
                r.sim_seconds, r.sim_seconds > 0 ? r.frame_hops / r.sim_seconds / 1e6 : 0.0, r.wall_seconds);
  return line;
}

std::string row_json(const CollectiveRow& r, const std::string& topology, const std::string& driver) {
  common::JsonObject o;
  o.add("driver", driver).add("topology", topology).add("collective", collective_name(r.point.kind));
  o.add("algo", workloads::algo_name(r.point.algo)).add("ran", r.ran).add("size", r.point.bytes).add("count", r.count);
  o.add("type", common::ech_dtype_name(r.point.dtype)).add("redop", common::ech_redop_name(r.point.op));
  o.add("ok", r.ok).add("time_us", r.time_us).add("algbw_gbs", r.algbw_gbs).add("busbw_gbs", r.busbw_gbs);
  o.add("wrong", r.wrong).add("max_rel_error", r.max_rel_error).add("fallback_chunks", r.fallback_chunks);
  o.add("fell_back", r.fell_back).add("anomalies", r.anomalies).add("modelled", r.modelled).add("loss", r.point.loss);
  o.add("plane_tx_bytes", r.plane_tx_bytes).add("plane_rx_bytes", r.plane_rx_bytes);
  std::vector<uint64_t> ids, up, down;  // per member link: topology id, bytes the GPU sent, bytes it received
  for (const auto& l : r.gpu_links) {
    ids.push_back(l[0]);
    up.push_back(l[1]);
    down.push_back(l[2]);
  }
  o.add("gpu_link_ids", ids).add("gpu_link_up_bytes", up).add("gpu_link_down_bytes", down);
  o.add("frames_lost", r.frames_lost).add("frames_lost_link_down", r.frames_lost_link_down);
  o.add("faults", r.faults).add("wall_seconds", r.wall_seconds).add("sim_seconds", r.sim_seconds);
  o.add("sim_events", r.sim_events).add("frame_hops", r.frame_hops);
  if (!r.ok) {
    o.add("error", r.error);
  }
  return o.str();
}

}  // namespace ifec::testbed

namespace ifec::testbed {

std::vector<CollectiveRow> run_collective_points(
    const routing::Topology& topo, const std::vector<CollectivePoint>& points, unsigned jobs,
    const std::function<void(size_t done, size_t total, const std::string& running)>& progress) {
  std::vector<CollectiveRow> rows(points.size());
  ParallelJobs pj;
  for (size_t i = 0; i < points.size(); ++i) {
    pj.order.push_back(i);
  }
  std::stable_sort(pj.order.begin(), pj.order.end(),
                   [&](size_t a, size_t b) { return points[a].bytes > points[b].bytes; });
  const uint64_t gpus = static_cast<uint64_t>(topo.num_gpus());
  // Two windows per GPU (buffer, scratch); the check works in small blocks.
  pj.need = [&](size_t i) { return 2 * gpus * std::max<uint64_t>(points[i].bytes, 4096) + (1 << 20); };
  pj.budget = std::min(kMemoryBudget, host_memory_budget());  // a smaller machine runs fewer points at once
  pj.label = [&](size_t i) {
    std::ostringstream os;
    os << points[i].bytes << " B " << workloads::algo_name(points[i].algo);
    return os.str();
  };
  pj.run = [&](size_t i) {
    try {
      rows[i] = run_collective_point(topo, points[i]);
    } catch (const std::exception& e) {
      rows[i].point = points[i];
      rows[i].ok = false;
      rows[i].error = e.what();
    }
  };
  pj.progress = progress;
  run_parallel(pj, jobs);
  return rows;
}

}  // namespace ifec::testbed
