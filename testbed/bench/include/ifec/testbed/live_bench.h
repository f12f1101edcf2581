// ./ifec bench live: what one switch core forwards on veths with each fabric port driver (AF_XDP, AF_PACKET), and
// the latency a hop through the switch adds.
//
//   sender (ns a) f0 == f0 [forwarding core (ns s), its own thread, pinned] f1 == f0 receiver (ns b)
//
// Throughput: the sender offers RoCEv2 WRITE frames of one size as fast as its port takes them; the forwarding core
// moves them from f0 to f1, either through the switch pipeline (the same switchemu::Switch as everywhere: parse,
// route by destination IP, queue, IFEC engine off) or as a bare port-to-port forwarder (the driver's own ceiling for
// a switch core: no parsing, a small backlog); the receiver counts. Every port of a run uses the same driver.
// Reported per size: frames/s and Gb/s delivered, per CPU second of the forwarding thread ("per core"), and where
// that thread's time goes (user vs kernel). Latency: one frame at a time, a->switch->b and back, against the same
// ping-pong on a direct veth pair.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ifec/live/xdp_port.h"

namespace ifec::testbed {

struct ForwardingRow {
  std::string driver;    // "af_xdp" or "af_packet"
  std::string ports;     // the driver in words, as the port describes itself
  bool pipeline = true;  // the switch pipeline; false: the bare port-to-port forwarder
  size_t frame_bytes = 0;
  double seconds = 0;
  uint64_t sent = 0;
  uint64_t delivered = 0;
  uint64_t dropped = 0;  // the kernel's receive drops on the way, and the forwarder's backlog overflow
  double delivered_pps = 0;
  double delivered_gbps = 0;
  double switch_cpu_s = 0;  // the forwarding thread's CPU time
  double switch_user_s = 0;
  double switch_sys_s = 0;
  double pps_per_core = 0;  // delivered / the forwarding thread's CPU seconds
};

struct LatencyRow {
  std::string driver;
  int round_trips = 0;
  double direct_rtt_us = 0;  // median, a <-> b on one veth pair
  double switch_rtt_us = 0;  // median, a <-> switch <-> b
  double added_per_hop_us = 0;
};

// One row per size; throws common::Error where namespaces or the driver are unavailable (say why first with
// live::netns_unavailable() and live::XdpPort::unavailable()).
std::vector<ForwardingRow> bench_forwarding(live::FabricDriver driver, bool pipeline, const std::vector<size_t>& sizes,
                                            double seconds);
LatencyRow bench_hop_latency(live::FabricDriver driver, int round_trips);

}  // namespace ifec::testbed
