// The pybind11 module ifec._native: one register_<folder>() per library, each a list of .def lines.
#include <pybind11/pybind11.h>

#include "ifec/common/checks.h"
#include "register.h"

PYBIND11_MODULE(_native, m) {
  m.doc() = "IFEC fabric testbed native bindings (thin; conveniences live in the ifec package)";
  // Errors thrown at the C++ API edges arrive in Python as ValueError with the same message.
  pybind11::register_exception<ifec::common::Error>(m, "IfecError", PyExc_ValueError);
  ifec::bindings::register_common(m);
  ifec::bindings::register_routing(m);
  ifec::bindings::register_workloads(m);
  ifec::bindings::register_endpoint(m);
#ifdef IFEC_HAVE_MOE
  ifec::bindings::register_moe(m);
#else
  m.attr("has_moe") = false;
#endif
}
