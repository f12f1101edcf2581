// Bindings for the endpoint runtime on a simulated fabric: a Cluster and its transactions, as thin .defs.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

#include "ifec/common/checks.h"
#include "ifec/common/protocol.h"
#include "ifec/testbed/cluster.h"
#include "ifec/testbed/collective_run.h"
#include "ifec/testbed/harness.h"
#include "ifec/workloads/collectives.h"
#include "register.h"

namespace py = pybind11;
using namespace ifec;
using endpoint::OpHandle;

namespace ifec::bindings {

namespace {

// A load's handle plus the buffer the bytes land in.
struct PendingLoad {
  OpHandle handle;
  std::shared_ptr<std::vector<uint8_t>> buffer;
};

std::unique_ptr<testbed::Cluster> make_cluster(const routing::Topology& topo, const std::string& ordering, double loss,
                                               const std::string& lb, int planes, uint64_t seed) {
  IFEC_CHECK(planes >= 0 && planes <= topo.num_planes,
             "planes " << planes << " outside 0.." << topo.num_planes << " (0: every plane of " << topo.name << ")");
  testbed::ClusterOptions o;
  o.endpoint.ordering = endpoint::parse_ordering(ordering);
  IFEC_CHECK(loss >= 0 && loss < 1, "loss " << loss << " outside [0, 1)");
  o.fabric.lb = switchemu::parse_load_balance(lb);
  o.fabric.loss = loss;
  o.fabric.seed = seed;
  o.planes = planes;
  return std::make_unique<testbed::Cluster>(topo, o);
}

endpoint::Endpoint& ep(testbed::Cluster& c, int gpu) {
  IFEC_CHECK(gpu >= 0 && gpu < c.size(), "GPU " << gpu << " outside 0.." << c.size() - 1);
  return c.ep(gpu);
}

py::dict counters(testbed::Cluster& c, int gpu) {
  py::dict d;
  for (const auto& [k, v] : ep(c, gpu).named_counters()) {
    d[py::str(k)] = v;
  }
  return d;
}

testbed::CollectiveSpec make_spec(const std::string& kind, const std::vector<int>& members, int root, uint16_t window,
                                  uint64_t offset, uint64_t count, const std::string& dtype, const std::string& op,
                                  uint16_t scratch_window) {
  testbed::CollectiveSpec s;
  s.kind = workloads::parse_collective(kind);
  s.members = members;
  s.root = root;
  s.window = window;
  s.offset = offset;
  s.count = count;
  s.dtype = common::parse_ech_dtype(dtype);
  s.op = common::parse_ech_redop(op);
  s.scratch_window = scratch_window;
  return s;
}

// Handles from Python: None (or an empty handle) is named, not dereferenced.
void check_handles(const std::vector<OpHandle>& hs) {
  for (size_t i = 0; i < hs.size(); ++i) {
    IFEC_CHECK(hs[i] != nullptr, "handles[" << i << "] is None, expected an OpHandle from store/load/...");
  }
}

void check_members(testbed::Cluster& c, const std::vector<int>& members) {
  for (int g : members) {
    IFEC_CHECK(g >= 0 && g < c.size(), "member GPU " << g << " outside 0.." << c.size() - 1);
  }
}

py::dict result_dict(const workloads::CollectiveResult& r) {
  py::dict d;
  d["ok"] = r.ok;
  d["error"] = r.error;
  d["time_ns"] = r.end_ns - r.start_ns;
  d["fell_back"] = r.fell_back;
  d["fallback_chunks"] = r.fallback_chunks;
  d["anomalies"] = r.anomalies;
  d["faults"] = r.faults;
  d["algo"] = r.algo;
  d["driver"] = "sim";
  return d;
}

// Transactions' handles: status, result, error; a load's bytes once done.
void register_handles(py::module_& m) {
  py::enum_<endpoint::OpStatus>(m, "OpStatus")
      .value("PENDING", endpoint::OpStatus::kPending)
      .value("OK", endpoint::OpStatus::kOk)
      .value("REMOTE_ACCESS_ERROR", endpoint::OpStatus::kRemoteAccessError)
      .value("RETRY_EXCEEDED", endpoint::OpStatus::kRetryExceeded)
      .value("INVALID_ARGUMENT", endpoint::OpStatus::kInvalidArgument);
  py::class_<endpoint::OpState, std::shared_ptr<endpoint::OpState>>(m, "OpHandle")
      .def_property_readonly("done", &endpoint::OpState::done)
      .def_property_readonly("ok", &endpoint::OpState::ok)
      .def_readonly("status", &endpoint::OpState::status)
      .def_readonly("result", &endpoint::OpState::result)
      .def_readonly("error", &endpoint::OpState::error);
  py::class_<PendingLoad>(m, "PendingLoad")
      .def_readonly("handle", &PendingLoad::handle)
      .def("data", [](const PendingLoad& p) {
        return py::bytes(reinterpret_cast<const char*>(p.buffer->data()), p.buffer->size());
      });
}

// A cluster's windows from the host's side: allocated, read, written, and where a peer reaches them.
void register_cluster_windows(py::class_<testbed::Cluster>& cluster) {
  cluster
      .def(
          "allocate_window",
          [](testbed::Cluster& c, uint16_t id, uint64_t bytes, uint32_t job, bool shared) {
            // The runtime's own windows (the harness's barrier words, ...): re-allocating one broke them silently.
            IFEC_CHECK(id < common::kFirstReservedWindow, "allocate_window: window id "
                                                              << id << " is reserved for the runtime (ids 0.."
                                                              << common::kFirstReservedWindow - 1 << " are free)");
            c.allocate_window(id, bytes, job, shared);
          },
          py::arg("id"), py::arg("bytes"), py::arg("job") = 1, py::arg("shared") = false)
      .def("window_bytes",
           [](testbed::Cluster& c, int gpu, uint16_t id, uint64_t offset, uint64_t length) {
             const endpoint::WindowInfo* w = ep(c, gpu).memory().window(id);
             IFEC_CHECK(w != nullptr, "GPU " << gpu << " has no window " << id);
             IFEC_CHECK(offset <= w->size && length <= w->size - offset, "window " << id << ": [" << offset << ", +"
                                                                                   << length << ") outside its "
                                                                                   << w->size << " bytes");
             return py::bytes(reinterpret_cast<const char*>(w->data + offset), length);
           })
      .def("window_va_rkey",
           [](testbed::Cluster& c, int gpu, uint16_t id) {
             const endpoint::WindowInfo* w = ep(c, gpu).memory().window(id);
             IFEC_CHECK(w != nullptr, "GPU " << gpu << " has no window " << id);
             return py::make_tuple(w->va, w->rkey, w->size);
           })
      .def("write_window", [](testbed::Cluster& c, int gpu, uint16_t id, uint64_t offset, py::bytes data) {
        // Host-side initialisation of a GPU's memory (what cudaMemcpy does before a kernel runs).
        std::string_view v = data;
        const endpoint::WindowInfo* w = ep(c, gpu).memory().window(id);
        IFEC_CHECK(w != nullptr, "GPU " << gpu << " has no window " << id);
        IFEC_CHECK(offset <= w->size && v.size() <= w->size - offset,
                   "window " << id << ": [" << offset << ", +" << v.size() << ") outside its " << w->size << " bytes");
        std::memcpy(w->data + offset, v.data(), v.size());
      });
}

// A simulated cluster: its GPUs' windows and transactions, waits, link failures, counters, endpoint collectives.
void register_cluster(py::module_& m) {
  py::class_<testbed::Cluster> cluster(m, "Cluster");
  register_cluster_windows(cluster);
  cluster
      .def(py::init(&make_cluster), py::arg("topology"), py::arg("ordering") = "partial", py::arg("loss") = 0.0,
           py::arg("lb") = "packet", py::arg("planes") = 0, py::arg("seed") = 1)
      .def_property_readonly("size", &testbed::Cluster::size)
      .def_property_readonly("now_ns", [](testbed::Cluster& c) { return c.now(); })
      .def("store",
           [](testbed::Cluster& c, int gpu, int peer, uint16_t window, uint64_t offset, py::bytes data) {
             std::string_view v = data;
             return ep(c, gpu).store(peer, window, offset, v.data(), v.size());
           })
      .def("load",
           [](testbed::Cluster& c, int gpu, int peer, uint16_t window, uint64_t offset, uint64_t length) {
             PendingLoad p;
             endpoint::Endpoint& e = ep(c, gpu);
             // A buffer only for a load the peer's window holds: any other fails in load() (naming its values)
             // before it touches one, and a huge length must not be allocated first.
             const endpoint::WindowInfo* w =
                 peer >= 0 && peer < e.num_endpoints() ? e.peer_window(peer, window) : nullptr;
             p.buffer = std::make_shared<std::vector<uint8_t>>(w != nullptr && length <= w->size ? length : 0);
             p.handle = e.load(p.buffer->data(), peer, window, offset, length);
             return p;
           })
      .def("fetch_add", [](testbed::Cluster& c, int gpu, int peer, uint16_t window, uint64_t offset,
                           uint64_t add) { return ep(c, gpu).fetch_add(peer, window, offset, add); })
      .def("compare_swap",
           [](testbed::Cluster& c, int gpu, int peer, uint16_t window, uint64_t offset, uint64_t compare,
              uint64_t swap) { return ep(c, gpu).compare_swap(peer, window, offset, compare, swap); })
      .def("put_signal",
           [](testbed::Cluster& c, int gpu, int peer, uint16_t window, uint64_t offset, py::bytes data,
              uint16_t sig_window, uint64_t sig_offset, uint64_t signal, bool add) {
             std::string_view v = data;
             return ep(c, gpu).put_signal(peer, window, offset, v.data(), v.size(), sig_window, sig_offset, signal,
                                          add ? endpoint::SignalOp::kAdd : endpoint::SignalOp::kSet);
           })
      .def("store_raw",
           [](testbed::Cluster& c, int gpu, int peer, int qp, uint64_t va, uint32_t rkey, py::bytes data) {
             std::string_view v = data;
             return ep(c, gpu).store_raw(peer, qp, va, rkey, v.data(), v.size());
           })
      .def(
          "fence", [](testbed::Cluster& c, int gpu, int peer) { ep(c, gpu).fence(peer); }, py::arg("gpu"),
          py::arg("peer") = -1)
      .def("quiet", [](testbed::Cluster& c, int gpu) { return ep(c, gpu).quiet(); })
      .def(
          "wait",
          [](testbed::Cluster& c, const std::vector<OpHandle>& hs, uint64_t limit_ns) {
            check_handles(hs);
            return interruptible([&] { return c.wait(hs, limit_ns); });
          },
          py::arg("handles"), py::arg("limit_ns") = 1'000'000'000ULL)
      .def(
          "barrier",
          [](testbed::Cluster& c, uint64_t limit_ns) { return interruptible([&] { return c.barrier(limit_ns); }); },
          py::arg("limit_ns") = 1'000'000'000ULL)
      .def(
          "fail_link",
          [](testbed::Cluster& c, int link, uint64_t at_ns) { c.fabric().schedule_link_state(link, false, at_ns); },
          py::arg("link"), py::arg("at_ns"))
      .def("counters", &counters, py::arg("gpu"))
      .def(
          "scratch_bytes",
          [](testbed::Cluster& c, const std::string& kind, const std::vector<int>& members, uint64_t count,
             const std::string& dtype, const std::string& algo) {
            IFEC_CHECK(!members.empty(), "scratch_bytes: members is empty");
            check_members(c, members);
            IFEC_CHECK(count <= (uint64_t{1} << 40), "scratch_bytes: count " << count << " outside 0..2^40 elements");
            return testbed::ring_scratch_bytes(make_spec(kind, members, members.at(0), 1, 0, count, dtype, "sum", 2),
                                               workloads::parse_algo(algo), &c.fabric().topology());
          },
          py::arg("kind"), py::arg("members"), py::arg("count"), py::arg("dtype"), py::arg("algo") = "ring")
      .def(
          "run_endpoint_collective",
          [](testbed::Cluster& c, const std::string& kind, const std::vector<int>& members, int root, uint16_t window,
             uint64_t offset, uint64_t count, const std::string& dtype, const std::string& op, uint16_t scratch_window,
             uint64_t limit_ns, const std::string& algo) {
            check_members(c, members);
            const auto spec = make_spec(kind, members, root, window, offset, count, dtype, op, scratch_window);
            const workloads::Algo a = workloads::parse_algo(algo);
            IFEC_CHECK(a != workloads::Algo::kIfec,
                       "run_endpoint_collective: algo 'ifec' runs through IfecCollectives");
            return result_dict(interruptible([&] { return testbed::run_endpoint_collective(c, spec, limit_ns, a); }));
          },
          py::arg("kind"), py::arg("members"), py::arg("root"), py::arg("window"), py::arg("offset"), py::arg("count"),
          py::arg("dtype"), py::arg("op"), py::arg("scratch_window"), py::arg("limit_ns") = 10'000'000'000ULL,
          py::arg("algo") = "ring");
}

// The in-fabric collectives of a cluster, and one collective point on a fresh fabric as a JSON row.
void register_collectives(py::module_& m) {
  py::class_<testbed::IfecCollectives>(m, "IfecCollectives")
      .def(py::init<testbed::Cluster&>(), py::arg("cluster"), py::keep_alive<1, 2>())
      .def(
          "run",
          [](testbed::IfecCollectives& x, const std::string& kind, const std::vector<int>& members, int root,
             uint16_t window, uint64_t offset, uint64_t count, const std::string& dtype, const std::string& op,
             uint16_t scratch_window, uint64_t limit_ns) {
            const auto spec = make_spec(kind, members, root, window, offset, count, dtype, op, scratch_window);
            return result_dict(interruptible([&] { return x.run(spec, limit_ns); }));
          },
          py::arg("kind"), py::arg("members"), py::arg("root"), py::arg("window"), py::arg("offset"), py::arg("count"),
          py::arg("dtype"), py::arg("op"), py::arg("scratch_window"), py::arg("limit_ns") = 10'000'000'000ULL)
      .def("suppress_contributions", &testbed::IfecCollectives::suppress_contributions, py::arg("gpu"),
           py::arg("on") = true)
      .def_property_readonly("fallback_operations",
                             [](const testbed::IfecCollectives& x) { return x.stats().fallback_operations; });
  m.def(
      "run_collective_json",
      [](const routing::Topology& topo, const std::string& kind, const std::string& algo, uint64_t bytes,
         const std::string& dtype, const std::string& op, double loss, uint64_t seed, bool reproducible, int members,
         const std::vector<std::string>& fail, uint32_t slot_pool, uint32_t slot_budget, bool live_timing,
         bool elided_payloads, int threads, int root, const py::dict& turns, int gpu_groups, int leaf_groups) {
        testbed::CollectivePoint p;
        const bool alltoall = kind == "alltoall";  // point-to-point stores (testbed/scenario's alltoall_point.h)
        p.kind = alltoall ? workloads::Collective::kAllGather : workloads::parse_collective(kind);
        p.algo = alltoall ? workloads::Algo::kRing : workloads::parse_algo(algo);
        p.bytes = bytes;
        p.dtype = common::parse_ech_dtype(dtype);
        p.op = common::parse_ech_redop(op);
        p.loss = loss;
        p.seed = seed;
        p.reproducible = reproducible;
        p.members = members;
        p.fail = fail;
        p.slot_pool = slot_pool;
        p.slot_budget = slot_budget;
        p.live_timing = live_timing;
        p.elided_payloads = elided_payloads;
        p.threads = threads;
        p.gpu_groups = gpu_groups;
        p.leaf_groups = leaf_groups;
        p.root = root;
        p.start = turns_from(turns);
        return interruptible([&] {
          return testbed::row_json(
              alltoall ? testbed::run_alltoall_point(topo, p) : testbed::run_collective_point(topo, p), topo.name);
        });
      },
      py::arg("topology"), py::arg("kind"), py::arg("algo"), py::arg("bytes"), py::arg("dtype") = "fp32",
      py::arg("op") = "sum", py::arg("loss") = 0.0, py::arg("seed") = 1, py::arg("reproducible") = false,
      py::arg("members") = 0, py::arg("fail") = std::vector<std::string>{}, py::arg("slot_pool") = 8192,
      py::arg("slot_budget") = 128, py::arg("live_timing") = false, py::arg("elided_payloads") = false,
      py::arg("threads") = 0, py::arg("root") = 0, py::arg("turns") = py::dict(), py::arg("gpu_groups") = 0,
      py::arg("leaf_groups") = 0);
}

}  // namespace

void register_endpoint(py::module_& m) {
  m.def(
      "window_va_rkey",
      [](int endpoint, uint16_t id) {
        IFEC_CHECK(endpoint >= 0 && endpoint < routing::kMaxGpus,
                   "window_va_rkey: endpoint " << endpoint << " outside 0.." << routing::kMaxGpus - 1);
        return py::make_tuple(endpoint::window_va(id), endpoint::window_rkey(endpoint, id));
      },
      py::arg("endpoint"), py::arg("window"), "(virtual address, rkey) of window `window` at GPU `endpoint`");
  register_handles(m);
  register_cluster(m);
  register_collectives(m);
}

}  // namespace ifec::bindings
