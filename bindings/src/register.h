// Registration functions, one per library folder.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <type_traits>

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
// A key or value it cannot take is named (pybind11's own cast error names neither).
inline testbed::Turns turns_from(const pybind11::dict& turns) {
  for (const auto& kv : turns) {
    const std::string key = pybind11::str(kv.first);
    IFEC_CHECK(key == "group" || key == "stripe" || key == "multicast",
               "turns: unknown key '" << key << "' (expected group, stripe or multicast)");
  }
  auto take = [&](const char* key, const char* expected, auto* out) {
    if (!turns.contains(key)) {
      return;
    }
    try {
      *out = turns[key].template cast<std::remove_pointer_t<decltype(out)>>();
    } catch (const pybind11::cast_error&) {
      IFEC_FAIL("turns: " << key << " " << pybind11::repr(turns[key]).cast<std::string>() << ": expected " << expected);
    }
  };
  testbed::Turns t;
  take("group", "a group counter in 0..65535", &t.group);
  IFEC_CHECK(t.group >= -1 && t.group <= 0xFFFF,
             "turns: group " << t.group << ": expected a group counter in 0..65535");
  take("stripe", "a list of stripe rotors (whole numbers >= 0), one per member", &t.stripe);
  take("multicast", "a list of multicast PSNs (whole numbers in 0..4294967295), one per member", &t.multicast);
  return t;
}

void register_common(pybind11::module_& m);
void register_routing(pybind11::module_& m);
void register_workloads(pybind11::module_& m);
void register_endpoint(pybind11::module_& m);
void register_moe(pybind11::module_& m);  // only with LibTorch (IFEC_HAVE_MOE)

}  // namespace ifec::bindings
