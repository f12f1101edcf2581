// The live daemons' timers (live_timing.h).
#include "ifec/testbed/live_timing.h"

#include <algorithm>

namespace ifec::testbed {

void apply_live_timing(endpoint::EndpointConfig& ec, const routing::Topology& topo) {
  double slowest_gbps = 0;
  for (const routing::Link& l : topo.links) {
    slowest_gbps = slowest_gbps == 0 ? l.rate_gbps : std::min(slowest_gbps, l.rate_gbps);
  }
  const double frame_bits = (topo.params.mtu + 100.0 + topo.params.wire_overhead_bytes) * 8;  // + RoCEv2 headers
  const auto sixteen_frames =
      slowest_gbps > 0 ? static_cast<common::TimeNs>(16 * frame_bits / slowest_gbps) : common::TimeNs{0};
  ec.rto_ns = std::max<common::TimeNs>(25'000'000, sixteen_frames);
  ec.rto_max_ns = std::max<common::TimeNs>(200'000'000, 8 * ec.rto_ns);
  ec.adaptive_rto = true;
  common::TimeNs budget = 0;
  int retries = 0;
  for (common::TimeNs rto = ec.rto_ns; budget < 4 * kLiveBgpHoldNs; rto = std::min(2 * rto, ec.rto_max_ns)) {
    budget += rto;
    ++retries;
  }
  ec.max_retries = retries;
}

void apply_live_timing(workloads::IfecOptions& io) {
  io.timing.initial_rto_ns = 100'000'000;
  io.timing.min_rto_ns = 20'000'000;
  io.timing.max_rto_ns = 800'000'000;
  io.timing.busy_retry_ns = 1'000'000;
  io.reduce_initial_rto_ns = io.timing.initial_rto_ns;
}

void apply_live_timing(routing::IfecParams& p) {
  p.slot_timeout_ns = std::max<uint64_t>(p.slot_timeout_ns, 500'000'000);
  p.result_retransmit_ns = std::max<uint64_t>(p.result_retransmit_ns, 20'000'000);
}

}  // namespace ifec::testbed
