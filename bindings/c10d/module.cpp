// ifec._c10d: the ifec process group's factory for Python (ifec.torch_backend registers it with torch.distributed).
// Built against torch's own pybind11 types: the intrusive_ptr<ProcessGroup> it returns is torch's ProcessGroup.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "process_group.h"

namespace py = pybind11;
using ifec::c10d_backend::BackendOptions;

PYBIND11_MODULE(_c10d, m) {
  m.doc() = "The ifec torch.distributed backend's process group (use ifec.torch_backend)";
  m.def(
      "create",
      [](int rank, int size, const std::string& hostd, const std::string& node, const std::string& algo,
         double timeout_s, uint64_t first_run_id, const std::string& trace, uint32_t group,
         const std::vector<int>& members, const std::vector<int>& gpus) {
        BackendOptions o;
        o.hostd = hostd;
        o.node = node;
        o.algo = algo;
        o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
        o.first_run_id = first_run_id;
        o.trace = trace;
        o.group = group;
        o.members = members;
        o.gpus = gpus;
        o.world_size = group == 0 ? size : 0;  // a group's size is not the world's
        return ifec::c10d_backend::create(rank, size, o);
      },
      py::arg("rank"), py::arg("size"), py::arg("hostd"), py::arg("node"), py::arg("algo"), py::arg("timeout_s"),
      py::arg("first_run_id"), py::arg("trace"), py::arg("group"), py::arg("members"), py::arg("gpus"),
      py::call_guard<py::gil_scoped_release>());
}
