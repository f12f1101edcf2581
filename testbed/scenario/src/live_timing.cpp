// The live daemons' timers (live_timing.h).
#include "ifec/testbed/live_timing.h"

#include <algorithm>

namespace ifec::testbed {

void apply_live_timing(endpoint::EndpointConfig& ec) {
  ec.rto_ns = 25'000'000;
  ec.rto_max_ns = 200'000'000;
  ec.adaptive_rto = true;
  common::TimeNs budget = 0;
  int retries = 0;
  for (common::TimeNs rto = ec.rto_ns; budget < 2 * kLiveBgpHoldNs; rto = std::min(2 * rto, ec.rto_max_ns)) {
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
}

void apply_live_timing(routing::IfecParams& p) {
  p.slot_timeout_ns = std::max<uint64_t>(p.slot_timeout_ns, 500'000'000);
  p.result_retransmit_ns = std::max<uint64_t>(p.result_retransmit_ns, 20'000'000);
}

}  // namespace ifec::testbed
