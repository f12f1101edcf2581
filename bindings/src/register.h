// Registration functions, one per library folder.
#pragma once

#include <pybind11/pybind11.h>

#include "ifec/common/checks.h"
#include "ifec/common/sim.h"
#include "ifec/testbed/collective_point.h"

namespace ifec::bindings {

// Runs `fn` (a long simulation) with the GIL released, honouring Ctrl-C: the event loop asks every 2^16 events
// whether a signal is pending, stops between two events, and KeyboardInterrupt is raised here once `fn` unwound.
template <typename Fn>
auto interruptible(Fn&& fn) -> decltype(fn()) {
  common::EventLoop::set_interrupt_check([] {
    pybind11::gil_scoped_acquire gil;
    return PyErr_CheckSignals() != 0;
  });
  struct Reset {
    ~Reset() { common::EventLoop::set_interrupt_check(nullptr); }
  } reset;
  try {
    pybind11::gil_scoped_release release;
    return fn();
  } catch (const common::Interrupted&) {
    throw pybind11::error_already_set();  // PyErr_CheckSignals left KeyboardInterrupt set
  }
}

// The carried state a simulated operation starts from, as a replay or a live comparison passes it: {"group": int,
// "stripe": [one per member], "multicast": [one per member]}, each optional.
inline testbed::Turns turns_from(const pybind11::dict& turns) {
  testbed::Turns t;
  t.group = turns.contains("group") ? turns["group"].cast<int>() : -1;
  if (turns.contains("stripe")) {
    t.stripe = turns["stripe"].cast<std::vector<uint64_t>>();
  }
  if (turns.contains("multicast")) {
    t.multicast = turns["multicast"].cast<std::vector<uint32_t>>();
  }
  return t;
}

void register_common(pybind11::module_& m);
void register_routing(pybind11::module_& m);
void register_workloads(pybind11::module_& m);
void register_endpoint(pybind11::module_& m);
void register_moe(pybind11::module_& m);  // only with LibTorch (IFEC_HAVE_MOE)

}  // namespace ifec::bindings
