// Bindings for routing: topology loading/generation and FARE path bandwidth.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "ifec/common/checks.h"
#include "ifec/routing/fare.h"
#include "ifec/routing/topology.h"
#include "register.h"

namespace py = pybind11;
using namespace ifec::routing;

namespace ifec::bindings {

namespace {

// The most path bandwidths plane_gbps returns (about 2 GB as Python floats in lists): 2048 GPUs on 4 planes.
constexpr long long kMaxPathBandwidths = 1 << 24;

// FARE's per-plane path bandwidth from every GPU to every other after failing `down_links`.
std::vector<std::vector<std::vector<double>>> plane_gbps(const Topology& t, const std::vector<int>& down_links) {
  // Every ordered pair times every plane: a large fabric's table is refused before the RIB is built, not after
  // minutes of work and tens of GB.
  const long long gpus = t.num_gpus();  // at most kMaxGpus: gpus x gpus x planes fits
  const long long values = gpus * (gpus - 1) * t.num_planes;
  IFEC_CHECK(values <= kMaxPathBandwidths, "fare_plane_gbps: " << gpus << " GPUs on " << t.num_planes << " planes make "
                                                               << values << " path bandwidths; at most "
                                                               << kMaxPathBandwidths << " (2048 GPUs on 4 planes)");
  FareRib rib(t);
  for (int l : down_links) {
    IFEC_CHECK(l >= 0 && l < static_cast<int>(t.links.size()), "link id " << l << " outside 0.." << t.links.size() - 1);
    rib.set_link_up(l, false);
  }
  rib.converge();
  const int n = t.num_gpus();
  std::vector<std::vector<std::vector<double>>> out(n, std::vector<std::vector<double>>(n));
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) {
      if (s != d) {
        out[s][d] = rib.plane_gbps(s, d);
      }
    }
  }
  return out;
}

}  // namespace

void register_routing(py::module_& m) {
  py::class_<Topology>(m, "Topology")
      .def_readonly("name", &Topology::name)
      .def_readonly("source", &Topology::source)
      .def_readonly("num_planes", &Topology::num_planes)
      .def_property_readonly("num_gpus", &Topology::num_gpus)
      .def_property_readonly("num_links", [](const Topology& t) { return t.links.size(); })
      .def_property_readonly("num_nodes", [](const Topology& t) { return t.nodes.size(); })
      .def("gpu_access_gbps", &Topology::gpu_access_gbps, py::arg("gpu"))
      .def_property_readonly("mtu", [](const Topology& t) { return t.params.mtu; })
      .def_property_readonly(
          "buffer_bytes", [](const Topology& t) { return t.params.buffer_bytes; },
          "egress buffer per port and priority")
      .def_property_readonly(
          "nodes",
          [](const Topology& t) {
            py::list out;
            for (size_t i = 0; i < t.nodes.size(); ++i) {
              const Node& n = t.nodes[i];
              out.append(py::dict(py::arg("index") = i, py::arg("name") = n.name,
                                  py::arg("kind") = node_kind_name(n.kind), py::arg("plane") = n.plane,
                                  py::arg("gpu") = n.gpu_index, py::arg("loopback") = n.loopback));
            }
            return out;
          })
      .def_property_readonly(
          "links",
          [](const Topology& t) {
            py::list out;
            for (const Link& l : t.links) {
              out.append(py::dict(py::arg("id") = l.id, py::arg("a") = t.nodes[l.a].name, py::arg("a_port") = l.a_port,
                                  py::arg("b") = t.nodes[l.b].name, py::arg("b_port") = l.b_port,
                                  py::arg("plane") = l.plane, py::arg("rate_gbps") = l.rate_gbps,
                                  py::arg("delay_ns") = l.delay_ns, py::arg("cable") = l.cable,
                                  py::arg("subport") = l.subport));
            }
            return out;
          },
          "every link (Y-cable sub-links expanded) with its ends' nodes and ports")
      .def("to_yaml", [](const Topology& t) { return to_yaml(t); });
  m.def("load_topology", &load_topology, py::arg("path"));
  m.def("parse_topology", &parse_topology, py::arg("yaml_text"), py::arg("source_name") = "<string>");
  m.def("make_superpod", &make_superpod, py::arg("gpus"), py::arg("planes"), py::arg("port_gbps") = 800,
        py::arg("subports") = 2, py::arg("delay_ns") = 500);
  m.def("make_fat_tree", &make_fat_tree, py::arg("gpus"), py::arg("planes"), py::arg("leaves"), py::arg("spines"),
        py::arg("nic_gbps") = 400, py::arg("fabric_gbps") = 400, py::arg("delay_ns") = 500,
        py::arg("nic_subports") = 1);
  m.def("make_deepseek_fabric", &make_deepseek_fabric, py::arg("nodes"), py::arg("gpus_per_node"), py::arg("leaves"),
        py::arg("spines"), py::arg("nic_gbps") = 400, py::arg("nvlink_gbps") = 1280, py::arg("delay_ns") = 500,
        py::arg("nvlink_delay_ns") = 200,
        "DeepSeek-V3's fabric: GPU i of each server on plane i, NVLink-class links inside the server");
  m.def("fare_plane_gbps", &plane_gbps, py::arg("topology"), py::arg("down_links") = std::vector<int>{},
        "[src][dst] -> per-plane path bandwidth (Gb/s) after FARE converges");
}

}  // namespace ifec::bindings
