// An in-memory Port (gVisor's link/channel idea): frames the owner sends are captured in an outbox instead of
// crossing a wire, and a test or a fuzzer hands frames in with inject(). The test seam for everything above the
// Port interface (switch pipeline, endpoint, RC queue pairs) without a link model or a clock of its own.
#pragma once

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "ifec/common/interfaces.h"

namespace ifec::common {

class ChannelPort : public Port {
 public:
  explicit ChannelPort(uint64_t rate_bps = 400'000'000'000ULL) : rate_bps_(rate_bps) {}

  // Port: never busy (no serialization); a down port refuses frames like a link that is down.
  bool send(std::vector<uint8_t>&& frame) override {
    if (!up_) {
      ++refused_;
      return false;
    }
    outbox_.push_back(std::move(frame));
    return true;
  }
  bool busy() const override { return false; }
  bool link_up() const override { return up_; }
  uint64_t rate_bps() const override { return rate_bps_; }
  void set_receiver(Receiver rx) override { rx_ = std::move(rx); }
  void set_tx_ready(TxReady ready) override { ready_ = std::move(ready); }

  // Hands `frame` to the owner as if it arrived on the wire (dropped while the port is down).
  void inject(std::vector<uint8_t> frame) {
    if (up_ && rx_) {
      rx_(std::move(frame));
    }
  }
  // What the owner sent, oldest first; take() empties it.
  const std::deque<std::vector<uint8_t>>& outbox() const { return outbox_; }
  std::deque<std::vector<uint8_t>> take() { return std::exchange(outbox_, {}); }
  void set_up(bool up) {
    up_ = up;
    if (up && ready_) {
      ready_();
    }
  }
  uint64_t refused() const { return refused_; }

 private:
  uint64_t rate_bps_;
  bool up_ = true;
  uint64_t refused_ = 0;
  Receiver rx_;
  TxReady ready_;
  std::deque<std::vector<uint8_t>> outbox_;
};

}  // namespace ifec::common
