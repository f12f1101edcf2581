// ./ifec bench live: what one switchd pipeline forwards on veths, and the latency a hop through it adds.
//
//   sender (ns a) f0 == f0 [switch (ns s), its own thread] f1 == f0 receiver (ns b)
//
// Throughput: the sender offers RoCEv2 WRITE frames of one size as fast as its socket takes them; the switch
// (the same switchemu::Switch as everywhere, on AfPacketPorts, IFEC engine off) forwards them by destination IP;
// the receiver counts. Reported per size: frames/s and Gb/s delivered, and per switch CPU second (the switch
// thread's own CPU time: "on one core"), and where the switch thread's time goes (user vs kernel).
// Latency: one frame at a time, a→switch→b and back, against the same ping-pong on a direct veth pair.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ifec::testbed {

struct ForwardingRow {
  size_t frame_bytes = 0;
  double seconds = 0;
  uint64_t sent = 0;
  uint64_t delivered = 0;
  double delivered_pps = 0;
  double delivered_gbps = 0;
  double switch_cpu_s = 0;  // the switch thread's CPU time
  double switch_user_s = 0;
  double switch_sys_s = 0;
  double pps_per_core = 0;  // delivered / switch CPU seconds
};

struct LatencyRow {
  int round_trips = 0;
  double direct_rtt_us = 0;  // median, a <-> b on one veth pair
  double switch_rtt_us = 0;  // median, a <-> switch <-> b
  double added_per_hop_us = 0;
};

std::vector<ForwardingRow> bench_forwarding(const std::vector<size_t>& sizes, double seconds);
LatencyRow bench_hop_latency(int round_trips);

}  // namespace ifec::testbed
