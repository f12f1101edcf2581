// The two seams every driver implements (see DESIGN.md "One data plane, several drivers"):
// a Clock that tells time and runs callbacks later, and a Port that sends frames and hands over received ones.
// Switch and endpoint code sees only these, so it cannot know whether time is simulated or wall-clock.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace ifec::common {

using TimeNs = uint64_t;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimeNs now() const = 0;
  // Runs `fn` at time `at` (or as soon as possible if `at` has passed).
  virtual void schedule(TimeNs at, std::function<void()> fn) = 0;
};

class Port {
 public:
  using Receiver = std::function<void(std::vector<uint8_t>&& frame)>;
  virtual ~Port() = default;
  // Queues a frame for transmission; false when the driver refused it (link down, buffer full).
  virtual bool send(std::vector<uint8_t>&& frame) = 0;
  // Installs the callback that is handed every received frame.
  virtual void set_receiver(Receiver rx) = 0;
};

}  // namespace ifec::common
