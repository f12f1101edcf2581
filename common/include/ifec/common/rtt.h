// Retransmission timeouts from measured round trips (Jacobson/Karels): srtt + 4 rttvar, never below a floor;
// before the first sample, the caller's initial value. Feed it only round trips of packets sent once (Karn).
#pragma once

#include <algorithm>
#include <cmath>

#include "ifec/common/interfaces.h"

namespace ifec::common {

class RttEstimator {
 public:
  explicit RttEstimator(TimeNs floor = 0) : floor_(floor) {}
  void sample(TimeNs rtt) {
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
  TimeNs rto(TimeNs initial) const {
    return valid_ ? std::max(floor_, static_cast<TimeNs>(srtt_ + 4 * rttvar_)) : initial;
  }
  bool valid() const { return valid_; }

 private:
  TimeNs floor_;
  double srtt_ = 0;
  double rttvar_ = 0;
  bool valid_ = false;
};

}  // namespace ifec::common
