// The pybind11 module ifec._native: one register_<folder>() per library, each a list of .def lines.
#include <pybind11/pybind11.h>

#include "register.h"

PYBIND11_MODULE(_native, m) {
  m.doc() = "IFEC fabric testbed native bindings (thin; conveniences live in the ifec package)";
  ifec::bindings::register_common(m);
}
