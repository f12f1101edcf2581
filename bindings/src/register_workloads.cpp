// Bindings for workloads: the simulated-fabric run behind `./ifec sim` (the report comes back as JSON text).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "ifec/common/checks.h"
#include "ifec/routing/topology.h"
#include "ifec/testbed/sim_report.h"
#include "register.h"

namespace py = pybind11;
using namespace ifec;

namespace ifec::bindings {

namespace {

std::string run_sim_json(const routing::Topology& topo, const std::string& traffic, uint64_t bytes,
                         const std::string& lb, bool pfc, uint64_t seed, const std::vector<std::string>& fail,
                         const std::vector<std::string>& restore, int incast_target, bool elided_payloads, int group,
                         int threads, int leaf_groups) {
  testbed::SimOptions o;
  o.pattern = testbed::parse_pattern(traffic);
  o.bytes = bytes;
  o.lb = switchemu::parse_load_balance(lb);
  o.pfc = pfc;
  o.seed = seed;
  o.incast_target = incast_target;
  o.group = group;
  o.threads = threads;
  o.leaf_groups = leaf_groups;
  o.progress = false;
  o.elided_payloads = elided_payloads;
  for (const auto& f : fail) {
    o.events.push_back(testbed::parse_link_event(topo, f, false));
  }
  for (const auto& r : restore) {
    o.events.push_back(testbed::parse_link_event(topo, r, true));
  }
  return interruptible([&] { return testbed::to_json(testbed::run_sim(topo, o)); });
}

}  // namespace

void register_workloads(py::module_& m) {
  m.def("run_sim_json", &run_sim_json, py::arg("topology"), py::arg("traffic"), py::arg("bytes"),
        py::arg("lb") = "packet", py::arg("pfc") = true, py::arg("seed") = 1,
        py::arg("fail") = std::vector<std::string>{}, py::arg("restore") = std::vector<std::string>{},
        py::arg("incast_target") = 0, py::arg("elided_payloads") = false, py::arg("group") = 0, py::arg("threads") = 1,
        py::arg("leaf_groups") = 0, "Raw traffic over the simulated fabric; returns the report as JSON text");
  m.def("resolve_links", &testbed::resolve_links, py::arg("topology"), py::arg("selector"),
        "link ids a selector names: ID, NODE:NODE[:SUB] or GPU:planeP[:subS] (the sim's --fail syntax); "
        "IfecError naming the selector when it is malformed or matches nothing");
}

}  // namespace ifec::bindings
