// In-fabric collectives: the endpoints' side of the IFEC protocol (switchemu/ifec_engine.h). Reserves a group on
// each usable plane's switch, cuts the buffer into one-slot chunks spread over planes by the group's plane
// bandwidth (the smallest member's), keeps at most the slot budget of chunks in flight per plane, retransmits
// contributions until the result (or, for reduce, an ECH ACK) comes back, acknowledges results so the switch can
// free slots, writes results only after the rkey/bounds/job check, and finishes every chunk the fabric could not
// serve (no reservation, pool exhausted, anomaly, unreachable switch) on the endpoint-based path.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "ifec/workloads/cluster.h"
#include "ifec/workloads/collectives.h"

namespace ifec::workloads {

struct IfecOptions {
  uint32_t job = 1;
  uint32_t slots_per_plane = 128;          // slot budget asked of each plane's switch
  common::TimeNs retransmit_ns = 100'000;  // contribution / multicast retransmission timeout (doubles, capped)
  common::TimeNs retransmit_max_ns = 2'000'000;
  int max_retries = 20;             // then the chunk is finished on the fallback path
  uint32_t multicast_window = 256;  // multicast packets in flight per plane
  bool upstream_fp32 = true;        // two-tier planes: leaf -> spine partials in fp32 (else in the element type)
};

struct IfecStats {
  uint64_t operations = 0;
  uint64_t fallback_operations = 0;  // operations that used the endpoint-based path for some or all chunks
  uint64_t fallback_chunks = 0;
  uint64_t anomalies = 0;  // anomaly-flagged results (timeouts and NaN/Inf)
  uint64_t contributions_sent = 0;
  uint64_t retransmissions = 0;
  uint64_t results_received = 0;
  uint64_t duplicate_results = 0;
  uint64_t protection_drops = 0;  // ECH writes that failed the rkey/bounds/job check
  uint64_t multicast_packets = 0;
};

class IfecCollectives {
 public:
  explicit IfecCollectives(Cluster& cluster, IfecOptions opts = {});
  ~IfecCollectives();
  IfecCollectives(const IfecCollectives&) = delete;
  IfecCollectives& operator=(const IfecCollectives&) = delete;

  // Runs one collective in the fabric (falling back where it must); see collectives.h for buffer semantics.
  CollectiveResult run(const CollectiveSpec& spec, common::TimeNs limit = 10'000'000'000ULL);

  // Fault injection for tests: contributions from `gpu` never leave it (a contributor that never arrives).
  void suppress_contributions(int gpu, bool on = true);
  const IfecStats& stats() const { return stats_; }
  IfecOptions& options() { return opts_; }

 private:
  struct Op;
  void on_ech(int gpu, int port, const common::ParsedFrame& pf, const uint8_t* frame);
  void pump(int member);
  void send_contribution(int member, int plane, uint32_t j, bool retransmit);
  void arm(int member, int plane, uint32_t j);
  void multicast_pump();
  void send_multicast(uint32_t packet, bool retransmit);
  void send_ech_ack(int gpu, int port, const common::ParsedFrame& pf, uint64_t bitmap);
  int port_for(int gpu, int plane, uint32_t salt) const;
  CollectiveResult run_multicast(const CollectiveSpec& spec, common::TimeNs limit);

  Cluster& cluster_;
  IfecOptions opts_;
  IfecStats stats_;
  std::unique_ptr<Op> op_;
  std::set<int> suppressed_;
  std::set<std::tuple<int, int, uint32_t>> seen_multicast_;  // (dest gpu, source, psn): written once
  uint16_t next_group_ = 1;
  uint32_t next_multicast_psn_ = 0;
  std::shared_ptr<bool> alive_;
};

}  // namespace ifec::workloads
