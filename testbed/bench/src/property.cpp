// The randomized property check: draws cases from seeds, runs each on a fresh simulated fabric and compares the
// outputs element by element with host references (see property.h).
#include "ifec/testbed/property.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <sstream>

#include "ifec/common/checks.h"
#include "ifec/common/names.h"
#include "ifec/common/numeric.h"
#include "ifec/testbed/collective_run.h"
#include "ifec/testbed/harness.h"

namespace ifec::testbed {

using workloads::element_size;

using common::EchDtype;

namespace {

constexpr uint16_t kSource = 3;
constexpr uint16_t kResult = 4;

// Rounding unit of the output type: one rounding moves a value by at most this fraction of its magnitude.
double unit_of(EchDtype t) {
  switch (t) {
    case EchDtype::kBf16:
      return 1.0 / 256;
    case EchDtype::kFp16:
      return 1.0 / 2048;
    case EchDtype::kFp32:
      return 1.0 / 16777216;
    case EchDtype::kInt32:
      return 0;
  }
  return 0;
}

routing::Topology topology_of(const PropertyCase& c) {
  routing::Topology t =
      c.two_tier ? routing::make_fat_tree(c.gpus, c.planes, 2, 2) : routing::make_superpod(c.gpus, c.planes);
  t.params.ifec.slot_pool = c.slot_pool;
  return t;
}

PropertyResult run_collective_case(const PropertyCase& c) {
  CollectivePoint p;
  p.kind = c.kind == PropertyKind::kAllReduce ? Collective::kAllReduce
           : c.kind == PropertyKind::kReduce  ? Collective::kReduce
                                              : Collective::kMulticast;
  p.algo = Algo::kIfec;
  p.bytes = c.count * element_size(c.dtype);
  p.dtype = c.dtype;
  p.op = c.op;
  p.loss = c.loss;
  p.seed = c.seed;
  p.slot_pool = c.slot_pool;
  p.slot_budget = c.slot_budget;
  p.members = c.members;
  p.corrupt_output = c.corrupt_output;
  const CollectiveRow row = run_collective_point(topology_of(c), p);
  PropertyResult r;
  r.ok = row.ok && row.wrong == 0;
  r.wrong = row.wrong;
  r.error = row.error;
  r.sim_us = row.time_us;
  r.fallback = row.fallback_chunks;
  r.faults = row.faults;
  return r;
}

// What a batch operation reported; ok is decided by the comparison with the reference.
PropertyResult result_of(const CollectiveResult& res) {
  PropertyResult r;
  r.error = res.error;
  r.sim_us = (res.end_ns - res.start_ns) / 1e3;
  r.fallback = res.fallback_chunks;
  r.faults = res.faults;
  return r;
}

ClusterOptions cluster_options(const PropertyCase& c) {
  ClusterOptions o;
  o.fabric.loss = c.loss;
  o.fabric.seed = c.seed;
  o.endpoint.ordering = endpoint::Ordering::kWeak;
  return o;
}

IfecOptions ifec_options(const PropertyCase& c) {
  IfecOptions io;
  io.slots_per_plane = c.slot_budget;
  return io;
}

// The cluster a batch case runs on, with its in-fabric collectives at the case's slot budget.
struct CaseCluster {
  explicit CaseCluster(const PropertyCase& c) : cl(topology_of(c), cluster_options(c)), ifec(cl, ifec_options(c)) {}
  Cluster cl;
  IfecCollectives ifec;
};

// Batch reduction (MoE combine): random rows, each summed from 1..max_contributors other GPUs into its destination.
PropertyResult run_combine_case(const PropertyCase& c) {
  std::mt19937_64 rng(c.seed * 31 + 7);
  CaseCluster cc(c);
  Cluster& cl = cc.cl;
  IfecCollectives& ifec = cc.ifec;
  const size_t es = element_size(c.dtype);
  const uint64_t row_bytes = uint64_t{c.row_elements} * es;
  BatchReduceSpec spec;
  spec.source_window = kSource;
  spec.result_window = kResult;
  spec.result_offset = 64;
  spec.dtype = c.dtype;
  spec.row_elements = c.row_elements;
  std::vector<uint32_t> next_index(c.gpus, 0);
  std::vector<uint64_t> used(c.gpus, 0);  // bytes of source rows per GPU
  for (uint32_t i = 0; i < c.rows; ++i) {
    RowReduce row;
    row.destination = static_cast<int>(rng() % c.gpus);
    row.index = next_index[row.destination]++;
    std::set<int> from;
    const int k = 1 + static_cast<int>(rng() % c.max_contributors);
    while (static_cast<int>(from.size()) < k) {
      const int g = static_cast<int>(rng() % c.gpus);
      if (g != row.destination) {
        from.insert(g);
      }
    }
    for (int g : from) {
      row.contributions.push_back({g, used[g]});
      used[g] += row_bytes;
    }
    spec.rows.push_back(row);
  }
  uint64_t src_bytes = 64;
  uint32_t max_index = 1;
  for (int g = 0; g < c.gpus; ++g) {
    src_bytes = std::max(src_bytes, used[g]);
    max_index = std::max(max_index, next_index[g]);
  }
  cl.allocate_window(kSource, src_bytes);
  cl.allocate_window(kResult, spec.result_offset + max_index * row_bytes);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int g = 0; g < c.gpus; ++g) {
    uint8_t* w = cl.window_data(g, kSource);
    for (uint64_t e = 0; e < used[g] / es; ++e) {
      common::Acc a;
      a.f = normal(rng);
      common::store_element(c.dtype, a, w, e);
    }
  }
  const CollectiveResult res = ifec.reduce_rows(spec, 10'000'000'000ULL);
  PropertyResult r = result_of(res);
  if (!res.ok) {
    return r;
  }
  if (c.corrupt_output) {
    const RowReduce& row = spec.rows.front();
    cl.window_data(row.destination, kResult)[spec.result_offset + row.index * row_bytes + es - 1] ^= 0x40;
  }
  // Reference: the contributions summed in double; the fabric accumulates in fp32 and rounds once to the type.
  for (const RowReduce& row : spec.rows) {
    const uint8_t* out = cl.window_data(row.destination, kResult) + spec.result_offset + row.index * row_bytes;
    for (uint32_t e = 0; e < c.row_elements; ++e) {
      double ref = 0;
      double magnitude = 0;
      for (const auto& [g, off] : row.contributions) {
        const double v = common::load_element(c.dtype, cl.window_data(g, kSource) + off, e).f;
        ref += v;
        magnitude += std::fabs(v);
      }
      const double got = common::load_element(c.dtype, out, e).f;
      const double bound = (row.contributions.size() / 16777216.0 + unit_of(c.dtype)) * magnitude + 1e-30;
      r.wrong += !(std::fabs(got - ref) <= bound);  // NaN counts as wrong
    }
  }
  r.ok = r.wrong == 0;
  if (!r.ok) {
    r.error = std::to_string(r.wrong) + " row elements differ from the reference sum";
  }
  return r;
}

// Batch multicast (MoE dispatch): each GPU's rows to random destination sets; every destination must hold the
// source's bytes exactly, and nobody else may.
PropertyResult run_dispatch_case(const PropertyCase& c) {
  std::mt19937_64 rng(c.seed * 37 + 11);
  CaseCluster cc(c);
  Cluster& cl = cc.cl;
  IfecCollectives& ifec = cc.ifec;
  BatchMulticastSpec spec;
  spec.window = kResult;
  spec.row_bytes = c.row_elements;
  const uint32_t per_source = std::max<uint32_t>(1, c.rows / c.gpus);
  for (int src = 0; src < c.gpus; ++src) {
    for (uint32_t t = 0; t < per_source; ++t) {
      RowMulticast row;
      row.source = src;
      row.offset = (uint64_t(src) * per_source + t) * spec.row_bytes;
      for (int d = 0; d < c.gpus; ++d) {
        if (d != src && rng() % 3 == 0) {
          row.destinations.push_back(d);
        }
      }
      spec.rows.push_back(row);
    }
  }
  cl.allocate_window(kResult, uint64_t(c.gpus) * per_source * spec.row_bytes);
  for (const RowMulticast& row : spec.rows) {
    uint8_t* p = cl.window_data(row.source, kResult) + row.offset;
    for (uint64_t i = 0; i < spec.row_bytes; ++i) {
      p[i] = static_cast<uint8_t>(rng() | 1);  // never zero: a missing byte shows
    }
  }
  const CollectiveResult res = ifec.multicast_rows(spec, 10'000'000'000ULL);
  PropertyResult r = result_of(res);
  if (!res.ok) {
    return r;
  }
  if (c.corrupt_output) {
    const RowMulticast& row = spec.rows.front();
    const int victim = row.destinations.empty() ? (row.source + 1) % c.gpus : row.destinations.front();
    cl.window_data(victim, kResult)[row.offset] ^= 0x40;  // a wrong byte, or one leaked to a non-destination
  }
  for (const RowMulticast& row : spec.rows) {
    const uint8_t* want = cl.window_data(row.source, kResult) + row.offset;
    for (int d = 0; d < c.gpus; ++d) {
      if (d == row.source) {
        continue;
      }
      const bool dest = std::count(row.destinations.begin(), row.destinations.end(), d) > 0;
      const uint8_t* got = cl.window_data(d, kResult) + row.offset;
      for (uint64_t i = 0; i < spec.row_bytes; ++i) {
        r.wrong += dest ? got[i] != want[i] : got[i] != 0;
      }
    }
  }
  r.ok = r.wrong == 0;
  if (!r.ok) {
    r.error = std::to_string(r.wrong) + " bytes differ (missing at a destination, or leaked to another GPU)";
  }
  return r;
}

}  // namespace

namespace {

constexpr common::Name<PropertyKind> kKindNames[] = {{PropertyKind::kAllReduce, "allreduce"},
                                                     {PropertyKind::kReduce, "reduce"},
                                                     {PropertyKind::kMulticast, "multicast"},
                                                     {PropertyKind::kCombine, "combine"},
                                                     {PropertyKind::kDispatch, "dispatch"}};
constexpr common::Vocabulary kKinds("property case kind", kKindNames);

}  // namespace

const char* property_kind_name(PropertyKind k) { return kKinds.name(k); }

std::string PropertyCase::describe() const {
  std::ostringstream o;
  o << "case " << seed << ": " << property_kind_name(kind) << " on " << gpus << " GPUs x " << planes << " planes"
    << (two_tier ? " (leaf-spine)" : "") << ", ";
  if (kind == PropertyKind::kCombine || kind == PropertyKind::kDispatch) {
    o << rows << " rows of " << row_elements << (kind == PropertyKind::kDispatch ? " B" : " elements");
    if (kind == PropertyKind::kCombine) {
      o << ", up to " << max_contributors << " contributors";
    }
  } else {
    o << members << " members, " << count << " elements, " << common::ech_redop_name(op);
  }
  o << ", " << (kind == PropertyKind::kDispatch ? "bytes" : common::ech_dtype_name(dtype)) << ", loss " << loss
    << ", slot budget " << slot_budget << ", pool " << slot_pool;
  return o.str();
}

PropertyCase random_case(uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + 1);
  auto pick = [&](std::initializer_list<int> v) { return *(v.begin() + rng() % v.size()); };
  PropertyCase c;
  c.seed = seed;
  c.kind = static_cast<PropertyKind>(rng() % 5);
  c.two_tier = rng() % 5 == 0;
  c.gpus = c.two_tier ? pick({4, 8, 16, 32}) : pick({2, 3, 4, 8, 8, 16, 32});
  c.planes = pick({1, 2, 2, 4});
  c.members = 2 + static_cast<int>(rng() % (c.gpus - 1));
  c.loss = 0.005 + (rng() % 4501) / 100000.0;  // 0.5% .. 5%
  c.slot_budget = static_cast<uint32_t>(pick({1, 2, 4, 16, 128}));
  // Sometimes a pool smaller than what the groups ask: reservations fail on some planes, or all.
  c.slot_pool = rng() % 6 == 0 ? static_cast<uint32_t>(1 + rng() % (2 * c.slot_budget)) : 8192;
  const bool floats_only = c.kind == PropertyKind::kCombine;
  c.dtype = floats_only ? (rng() % 2 ? EchDtype::kFp32 : EchDtype::kBf16)
                        : static_cast<EchDtype>(pick({0, 1, 2, 3}));  // fp32, fp16, bf16, int32
  c.op = c.kind == PropertyKind::kAllReduce || c.kind == PropertyKind::kReduce
             ? static_cast<common::EchRedOp>(rng() % 5 < 3 ? 0 : 1 + rng() % 2)
             : common::EchRedOp::kSum;
  // Element counts spread over 1 .. ~200k, rarely a power of two.
  c.count = 1 + rng() % pick({7, 1500, 20000, 200000, 600000});
  c.rows = 1 + static_cast<uint32_t>(rng() % 400);
  c.row_elements = 1 + static_cast<uint32_t>(rng() % pick({30, 3000, 9000}));
  c.max_contributors = 1 + static_cast<int>(rng() % std::min(8, c.gpus - 1));
  return c;
}

PropertyResult run_property_case(const PropertyCase& c) {
  try {
    switch (c.kind) {
      case PropertyKind::kCombine:
        return run_combine_case(c);
      case PropertyKind::kDispatch:
        return run_dispatch_case(c);
      default:
        return run_collective_case(c);
    }
  } catch (const common::Interrupted&) {
    throw;
  } catch (const std::exception& e) {
    PropertyResult r;
    r.error = std::string("threw: ") + e.what();
    return r;
  }
}

PropertySummary run_property_sweep(uint64_t seed0, uint64_t cases, double seconds,
                                   const std::function<void(const std::string&)>& progress) {
  PropertySummary s;
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < cases; ++i) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (seconds > 0 && elapsed >= seconds) {
      break;
    }
    const PropertyCase c = random_case(seed0 + i);
    const PropertyResult r = run_property_case(c);
    s.cases++;
    s.fallback_cases += r.fallback > 0;
    if (!r.ok) {
      s.failed++;
      s.failures.push_back(c.describe() + ": " + r.error);
    }
    if (progress) {
      std::ostringstream line;
      line << (r.ok ? "ok   " : "FAIL ") << c.describe() << " -> " << r.sim_us << " us simulated, fallback "
           << r.fallback << (r.ok ? "" : ": " + r.error);
      progress(line.str());
    }
  }
  s.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

}  // namespace ifec::testbed
