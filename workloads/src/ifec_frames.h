// Private to the IFEC collectives' sources: headers of the ECH frames an endpoint sends to a switch.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <utility>

#include "ifec/common/ech.h"
#include "ifec/common/frame.h"
#include "ifec/endpoint/endpoint.h"
#include "ifec/workloads/collectives.h"

namespace ifec::workloads::detail {

uint16_t pkey_for(uint32_t job);
common::EchOp ech_op(Collective c);
// Ethernet/IPv4/UDP/BTH of an ECH frame the endpoint sends on `port` to `dst_ip`; the caller adds ECH, RETH or AETH.
common::FrameHeaders ech_headers(endpoint::Endpoint& e, int port, uint32_t dst_ip, uint16_t udp_entropy, uint8_t opcode,
                                 uint16_t pkey, uint32_t psn);

// Retransmission timeout from measured round trips (Jacobson/Karels): srtt + 4 rttvar, never below `floor`;
// before the first sample, the caller's initial value.
class RttEstimator {
 public:
  explicit RttEstimator(common::TimeNs floor = 0) : floor_(floor) {}
  void sample(common::TimeNs rtt) {
    const double r = static_cast<double>(rtt);
    if (!valid_) {
      srtt_ = r;
      rttvar_ = r / 2;
      valid_ = true;
      return;
    }
    rttvar_ = 0.75 * rttvar_ + 0.25 * std::abs(srtt_ - r);
    srtt_ = 0.875 * srtt_ + 0.125 * r;
  }
  common::TimeNs rto(common::TimeNs initial) const {
    return valid_ ? std::max(floor_, static_cast<common::TimeNs>(srtt_ + 4 * rttvar_)) : initial;
  }

 private:
  common::TimeNs floor_;
  double srtt_ = 0;
  double rttvar_ = 0;
  bool valid_ = false;
};

// Runs `fn` when the scope ends, however it ends (an exception such as common::Interrupted included).
template <typename Fn>
class ScopeExit {
 public:
  explicit ScopeExit(Fn fn) : fn_(std::move(fn)) {}
  ~ScopeExit() { fn_(); }
  ScopeExit(const ScopeExit&) = delete;
  ScopeExit& operator=(const ScopeExit&) = delete;

 private:
  Fn fn_;
};

// Sends queued items while fewer than `window` are in flight (the caller decrements `inflight` as they finish).
// `send` returns false for an item that no longer needs sending (given up while queued): it takes no place.
template <typename Send>
void drain_window(std::deque<uint32_t>& queue, uint32_t& inflight, uint32_t window, Send send) {
  while (!queue.empty() && inflight < window) {
    const uint32_t i = queue.front();
    queue.pop_front();
    inflight++;
    if (!send(i)) {
      inflight--;
    }
  }
}

}  // namespace ifec::workloads::detail
