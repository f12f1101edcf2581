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
  uint32_t slots_per_plane = 128;  // slot budget asked of each plane's switch
  // Contribution / multicast retransmission timeout. Until the first round trips are measured: the larger of
  // retransmit_ns and four times what a window takes to cross the slowest link; then srtt + 4 rttvar (Jacobson,
  // samples from untransmitted-again packets only), at least min_rto_ns. Doubles per try up to 8x.
  common::TimeNs retransmit_ns = 100'000;
  common::TimeNs min_rto_ns = 20'000;
  common::TimeNs retransmit_max_ns = 800'000;
  int max_retries = 20;                  // then the chunk is finished on the fallback path
  uint32_t multicast_window = 256;       // multicast packets in flight per plane (per source and plane for batches)
  uint32_t row_window = 64;              // batch reduction: contributions in flight per GPU and plane
  common::TimeNs busy_retry_ns = 1'000;  // first retry after an RNR NAK (slot busy); doubles up to 8x
  bool upstream_fp32 = true;             // two-tier planes: leaf -> spine partials in fp32 (else in the element type)
};

// Batch multicast (MoE dispatch): many rows, each from its own source to its own destination set, in one operation.
// A row lives at the same byte offset of `window` at its source and at every destination (a symmetric layout), so
// one compact-ECH packet per MTU of the row reaches every destination through the source's plane switch.
struct RowMulticast {
  int source = 0;
  uint64_t offset = 0;            // byte offset of the row in the window, at the source and every destination
  std::vector<int> destinations;  // GPUs below 64, source excluded
};
struct BatchMulticastSpec {
  uint16_t window = 0;
  uint64_t row_bytes = 0;
  std::vector<RowMulticast> rows;
};

// Batch reduction (MoE combine): many rows, each summed in the fabric from its own contributors and delivered to
// its own destination. A row's destination does not contribute (it adds its own part locally). One group per
// destination and plane; every contribution says how many contributors its row has (ECH "expected contributors").
struct RowReduce {
  int destination = 0;
  uint32_t index = 0;  // result row: lands at result_offset + index * row bytes of result_window at the destination
  std::vector<std::pair<int, uint64_t>> contributions;  // (GPU, byte offset of its row in source_window)
};
struct BatchReduceSpec {
  uint16_t source_window = 0;
  uint16_t result_window = 0;
  uint64_t result_offset = 0;
  common::EchDtype dtype = common::EchDtype::kFp32;
  uint32_t row_elements = 0;
  std::vector<RowReduce> rows;  // row indices unique per destination
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
  uint64_t busy_naks = 0;  // contributions a switch refused because their slot held an older chunk (retried)
};

class IfecCollectives {
 public:
  explicit IfecCollectives(Cluster& cluster, IfecOptions opts = {});
  ~IfecCollectives();
  IfecCollectives(const IfecCollectives&) = delete;
  IfecCollectives& operator=(const IfecCollectives&) = delete;

  // Runs one collective in the fabric (falling back where it must); see collectives.h for buffer semantics.
  CollectiveResult run(const CollectiveSpec& spec, common::TimeNs limit = 10'000'000'000ULL);

  // Batch multicast / reduction over rows (see above); rows the fabric could not serve finish point to point
  // (stores, and for the reduction a sum at the destination), counted in fallback_chunks with the reason.
  CollectiveResult multicast_rows(const BatchMulticastSpec& spec, common::TimeNs limit = 10'000'000'000ULL);
  CollectiveResult reduce_rows(const BatchReduceSpec& spec, common::TimeNs limit = 10'000'000'000ULL);

  // Fault injection for tests: contributions from `gpu` never leave it (a contributor that never arrives).
  void suppress_contributions(int gpu, bool on = true);
  const IfecStats& stats() const { return stats_; }
  IfecOptions& options() { return opts_; }

 private:
  struct Op;
  void on_ech(int gpu, int port, const common::ParsedFrame& pf, const uint8_t* frame);
  void on_reduce_ech(int gpu, int port, const common::ParsedFrame& pf, const uint8_t* frame);
  void on_multicast_ech(int gpu, int port, const common::ParsedFrame& pf, const uint8_t* frame);
  void on_routes_changed(int gpu);
  void sample_rtt(int member, int plane, uint32_t j);
  void abandon();  // releases the running operation's reservations and forgets it
  bool any_two_tier(const CollectiveSpec& spec) const;
  std::string plane_problem(int gpu, int plane, const std::vector<int>& peers) const;
  bool start_round(const std::vector<uint32_t>& todo, std::string* reasons);
  std::string resolve_round(std::vector<uint32_t>* todo, common::TimeNs deadline, CollectiveResult* res);
  void finish_on_endpoint_path(const std::vector<uint32_t>& todo, common::TimeNs deadline, const std::string& why,
                               CollectiveResult* res);
  void give_up_plane(int member, int plane, const std::string& why);
  common::TimeNs rto(int tries) const;
  common::TimeNs backoff(common::TimeNs base, int tries) const;
  void pump(int member);
  void send_contribution(int member, int plane, uint32_t j, bool retransmit);
  void arm(int member, int plane, uint32_t j, common::TimeNs delay, bool counts_as_try);
  void multicast_pump();
  void multicast_routes_changed(int gpu);
  void give_up_packet(uint32_t packet, bool pump);
  void send_multicast(uint32_t packet, bool retransmit);
  void send_ech_ack(int gpu, int port, const common::ParsedFrame& pf, uint64_t bitmap);
  int port_for(int gpu, int plane, uint32_t salt) const;
  CollectiveResult run_multicast(const CollectiveSpec& spec, common::TimeNs limit);
  struct Rows;
  void on_row_ech(int gpu, int port, const common::ParsedFrame& pf, const uint8_t* frame);
  void row_pump(int gpu, int plane);
  void send_row_contribution(uint32_t item, bool retransmit);
  void arm_row(uint32_t item, common::TimeNs delay, bool counts_as_try);
  void finish_row_item(uint32_t item, bool stuck, bool pump);
  void rows_routes_changed(int gpu);

  Cluster& cluster_;
  IfecOptions opts_;
  IfecStats stats_;
  std::unique_ptr<Op> op_;
  std::shared_ptr<Rows> rows_;  // shared_ptr: Rows is defined in ifec_rows.cpp
  std::set<int> suppressed_;
  uint16_t next_group_ = 1;
  uint32_t next_multicast_psn_ = 0;
  std::shared_ptr<bool> alive_;
};

}  // namespace ifec::workloads
