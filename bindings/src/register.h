// Registration functions, one per library folder.
#pragma once

#include <pybind11/pybind11.h>

namespace ifec::bindings {

void register_common(pybind11::module_& m);
void register_routing(pybind11::module_& m);
void register_workloads(pybind11::module_& m);
void register_endpoint(pybind11::module_& m);
void register_moe(pybind11::module_& m);  // only with LibTorch (IFEC_HAVE_MOE)

}  // namespace ifec::bindings
