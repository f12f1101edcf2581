// The timers of the live testbed's daemons. Software switches and hosts sharing a machine's cores queue for
// milliseconds, so their retransmission timers are milliseconds and adaptive (Jacobson/Karn), not the microseconds
// of the simulated links. ifec-hostd and ifec-switchd apply them; the simulator applies them too when it runs a
// scenario to compare with a live fabric (`./ifec live compare`), so both sides run the same protocol.
#pragma once

#include "ifec/endpoint/endpoint.h"
#include "ifec/routing/topology.h"
#include "ifec/workloads/communicator.h"

namespace ifec::testbed {

// FARE's BGP sessions: the hold time (3 s, keepalives every second: RFC 4271's smallest). A killed daemon's sessions
// end at once (the kernel closes its sockets) and so does a link that loses its carrier; only a hung daemon holds
// its plane's weight this long, while QPs on it retransmit into the void.
constexpr common::TimeNs kLiveBgpHoldNs = 3'000'000'000;

// RC queue pairs: timeouts of at least 25 ms, or sixteen MTU frames on the topology's slowest link where that is
// longer (adaptive above that, at most 8 times it and 200 ms; a loaded two-core machine can leave a daemon
// unscheduled for over 10 ms, and on paced-4x2's 10 Mb/s sub-links a frame takes 3.4 ms, so a few frames queued ahead
// of one reach 25 ms), and retries enough to outlast four times BGP's hold time, 12 s: a QP must not give up on its
// peer before FARE has moved it off a dead plane (12 retries, 2.2 s, lost that race), nor while the surviving plane's
// software switch is swamped by everything the dead one carried (the containerized fabric on two cores: 6 s without
// progress on the live plane seen in a switch-kill MoE drill).
void apply_live_timing(endpoint::EndpointConfig& ec, const routing::Topology& topo);
// Contributions and multicast packets: 100 ms first timeout (20..800 ms adaptive; in-fabric reductions' too, not
// the simulator's few drains of a window), 1 ms back-off on a busy slot.
void apply_live_timing(workloads::IfecOptions& io);
// The switch's IFEC engine: slots wait at least 500 ms for contributors, results are resent after 20 ms or more.
void apply_live_timing(routing::IfecParams& p);

}  // namespace ifec::testbed
