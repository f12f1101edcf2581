// Names of collectives and element sizes.
#include "ifec/workloads/collectives.h"

#include "ifec/common/checks.h"

namespace ifec::workloads {

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "allreduce";
    case Collective::kReduce:
      return "reduce";
    case Collective::kMulticast:
      return "multicast";
    case Collective::kBarrier:
      return "barrier";
    case Collective::kReduceScatter:
      return "reduce-scatter";
    case Collective::kAllGather:
      return "all-gather";
  }
  return "unknown";
}

Collective parse_collective(const std::string& name) {
  for (Collective c : {Collective::kAllReduce, Collective::kReduce, Collective::kMulticast, Collective::kBarrier,
                       Collective::kReduceScatter, Collective::kAllGather}) {
    if (name == collective_name(c)) {
      return c;
    }
  }
  if (name == "broadcast") {
    return Collective::kMulticast;
  }
  IFEC_FAIL(
      "unknown collective '" << name
                             << "' (expected allreduce, reduce, multicast (broadcast), barrier, reduce-scatter or "
                                "all-gather)");
}

size_t element_size(common::EchDtype t) {
  const size_t s = common::ech_dtype_size(t);
  IFEC_CHECK(s != 0, "unknown dtype " << static_cast<int>(t));
  return s;
}

}  // namespace ifec::workloads
