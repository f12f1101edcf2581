// Names of collectives and element sizes.
#include "ifec/workloads/collectives.h"

#include "ifec/common/checks.h"
#include "ifec/common/names.h"

namespace ifec::workloads {

namespace {

constexpr common::Name<Collective> kCollectiveNames[] = {
    {Collective::kAllReduce, "allreduce"},          {Collective::kReduce, "reduce"},
    {Collective::kMulticast, "multicast"},          {Collective::kBarrier, "barrier"},
    {Collective::kReduceScatter, "reduce-scatter"}, {Collective::kAllGather, "all-gather"},
    {Collective::kMulticast, "broadcast"},
};
constexpr common::Vocabulary kCollectives("collective", kCollectiveNames, "unknown");

}  // namespace

const char* collective_name(Collective c) { return kCollectives.name(c); }
Collective parse_collective(const std::string& name) { return kCollectives.parse(name); }

size_t element_size(common::EchDtype t) {
  const size_t s = common::ech_dtype_size(t);
  IFEC_CHECK(s != 0, "unknown dtype " << static_cast<int>(t));
  return s;
}

}  // namespace ifec::workloads
