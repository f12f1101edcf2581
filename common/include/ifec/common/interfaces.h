// The two seams every driver implements (docs/architecture.md, "Two seams"):
// a Clock that tells time and runs callbacks later, and a Port that transmits one frame at a time and hands over
// received ones. Switch and endpoint code sees only these, so it cannot know whether time is simulated or real.
//
// Packet path through these seams:
//   sender: Port::send(frame) -> [driver serializes at link rate, propagates] -> peer Port receiver callback
//   sender: Port tx-ready callback when the wire is free again -> the owner dequeues its next frame
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace ifec::common {

using TimeNs = uint64_t;
inline constexpr TimeNs kForever = ~TimeNs{0};

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimeNs now() const = 0;
  // When what the caller is handling happened: the arrival of the frame being handled (or of the one whose handling
  // deferred this work "at once") where the clock's driver knows it, as a live port's kernel receive timestamp; now()
  // otherwise (a simulated loop runs every event at its time). A measurement that ends at a frame's arrival reads
  // this: it measures the wire, not how late a loaded host ran the handler.
  virtual TimeNs event_time() const { return now(); }
  // Runs `fn` at time `at` (or as soon as possible if `at` has passed). Callbacks run one at a time.
  virtual void schedule(TimeNs at, std::function<void()> fn) = 0;
  // The same for an event that will read `bytes` at `data` first (a frame arriving): a loop may fetch them into the
  // cache while the event before it runs. Only a hint: loops may ignore it, and `data` may be gone by then.
  virtual void schedule_reading(TimeNs at, std::function<void()> fn, const void* data, size_t bytes) {
    (void)data;
    (void)bytes;
    schedule(at, std::move(fn));
  }
};

class Port {
 public:
  using Receiver = std::function<void(std::vector<uint8_t>&& frame)>;
  using TxReady = std::function<void()>;
  virtual ~Port() = default;
  // Starts transmitting `frame`; false (frame dropped and counted by the driver) when busy or the link is down.
  // The owner keeps its own queues and calls send() only when !busy().
  virtual bool send(std::vector<uint8_t>&& frame) = 0;
  virtual bool busy() const = 0;
  virtual bool link_up() const = 0;
  // Line rate in bits per second (for PFC pause quanta and reports).
  virtual uint64_t rate_bps() const = 0;
  virtual void set_receiver(Receiver rx) = 0;
  // Called each time a transmission ends and the port can take the next frame.
  virtual void set_tx_ready(TxReady ready) = 0;
};

}  // namespace ifec::common
