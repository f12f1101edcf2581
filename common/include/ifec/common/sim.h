// Drivers: a discrete-event clock (virtual ns, deterministic), a wall-clock loop, and the link model that gives
// Ports their rate, propagation delay and up/down state on top of either clock.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "ifec/common/counters.h"
#include "ifec/common/fifo.h"
#include "ifec/common/interfaces.h"

namespace ifec::common {

// Discrete-event driver: virtual time in nanoseconds; events at equal times run in scheduling order, so a run
// is a pure function of its inputs and seeds.
class EventLoop : public Clock {
 public:
  TimeNs now() const override { return now_; }
  void schedule(TimeNs at, std::function<void()> fn) override;
  // Before each event runs, the memory the next one will read (when it said) is prefetched: a frame arriving on
  // a simulated link usually sits outside the cache (the fabric's bandwidth-delay product is tens of MB).
  void schedule_reading(TimeNs at, std::function<void()> fn, const void* data, size_t bytes) override;
  // Runs events up to and including time `until` (all of them by default), then sets the time to `until` (when
  // finite), so a loop of run(now() + slice) always moves forward; returns how many events ran.
  uint64_t run(TimeNs until = kForever);
  bool idle() const { return events_.empty() && in_wheel_ == 0; }
  uint64_t events_run() const { return events_run_; }
  // A check every run() on this thread makes every 2^16 events: when it returns true, run() throws Interrupted
  // (between two events, so the simulation state stays consistent). Python installs one that looks for Ctrl-C.
  static void set_interrupt_check(std::function<bool()> check);
  TimeNs next_event_time() const;
  // Sets the time to `t` without running anything: no event may wait before `t` (Error otherwise). A partitioned
  // run moves every partition to the time of a fabric-wide event before that event runs.
  void advance_to(TimeNs t);

 private:
  // Every event is a node in one pool, reused through a free list (last in, first out: the node just run is still
  // in the cache). Events due within kWheel ns of the last one run are chained, in scheduling order, in a wheel of
  // one-nanosecond buckets (equal times run in scheduling order); later ones (timers) wait in a heap of small keys.
  // The earliest event is remembered between a run and the next (a push earlier than it replaces it), so the wheel
  // is scanned once per event.
  static constexpr uint32_t kWheel = 4096;
  static constexpr uint32_t kNone = 0xFFFFFFFF;
  static_assert(kWheel == 64 * 64, "occupied_words_ has a bit for each of occupied_'s words");
  struct Node {
    TimeNs at = 0;
    uint64_t seq = 0;
    std::function<void()> fn;
    const uint8_t* reads = nullptr;  // what the event reads first (a prefetch hint), read_bytes long
    uint32_t read_bytes = 0;
    uint32_t next = kNone;  // the next node in its bucket
  };
  struct Key {
    TimeNs at;
    uint64_t seq;
    uint32_t node;
  };
  struct Later {
    bool operator()(const Key& a, const Key& b) const { return a.at != b.at ? a.at > b.at : a.seq > b.seq; }
  };
  struct Bucket {
    uint32_t head = kNone;
    uint32_t tail = kNone;
  };
  // The earliest event: a node, and whether it is the heap's top (else its bucket's head).
  struct Next {
    uint32_t node = kNone;
    bool in_heap = false;
  };
  friend class RealtimeLoop;
  void push(TimeNs at, std::function<void()> fn, const void* reads = nullptr, size_t read_bytes = 0);
  std::function<void()> pop(Next n);  // takes out earliest()'s event, returns its callback; now_ unchanged
  Next earliest() const;              // node kNone when no event waits
  Next scan() const;                  // the same, found afresh
  std::vector<Node> nodes_;
  std::vector<uint32_t> free_nodes_;
  std::vector<Key> events_;         // binary heap ordered by Later: the earliest first
  std::vector<Bucket> wheel_;       // [at % kWheel], for base_ <= at < base_ + kWheel
  std::vector<uint64_t> occupied_;  // one bit per bucket
  uint64_t occupied_words_ = 0;     // one bit per word of occupied_ that has one set
  TimeNs base_ = 0;                 // no event in the wheel is earlier
  size_t in_wheel_ = 0;
  mutable Next next_;  // earliest(), when next_known_
  mutable bool next_known_ = false;
  TimeNs now_ = 0;
  uint64_t seq_ = 0;
  uint64_t events_run_ = 0;
  uint64_t interrupt_tick_ = 0;
};

// Wall-clock driver: the same single-threaded event semantics, but now() is real time since a start point and
// run() sleeps until each event is due. Events run on the thread that calls run()/serve(); schedule() may be called
// from any thread (it wakes a sleeping loop), so loops on separate threads can post work to each other. Used to
// prove that nothing above the seams depends on virtual time, and to run ranks and switches on their own threads.
class RealtimeLoop : public Clock {
 public:
  RealtimeLoop();
  // Loops that share `start` share their clock: now() agrees across threads.
  explicit RealtimeLoop(std::chrono::steady_clock::time_point start);
  TimeNs now() const override;
  void schedule(TimeNs at, std::function<void()> fn) override;
  // Runs until no events remain or the wall-clock deadline (ns since start) passes; returns events run.
  uint64_t run(TimeNs deadline);
  // Runs events as they fall due, waiting for more when none is left, until stop() or the deadline.
  uint64_t serve(TimeNs deadline);
  void stop();  // any thread: serve() returns after the event it is running

 private:
  uint64_t loop(TimeNs deadline, bool wait_for_more);

  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopped_ = false;
  EventLoop queue_;  // holds and orders the events; its virtual time is not used
  std::chrono::steady_clock::time_point start_;
};

struct LinkConfig {
  uint64_t rate_bps = 400'000'000'000ULL;
  TimeNs delay_ns = 500;
  uint32_t overhead_bytes = 24;  // per frame on the wire beyond the frame bytes: preamble+SFD, FCS, IFG
  double loss_probability = 0;   // each frame independently lost in flight (fault injection), both directions
  uint64_t loss_seed = 1;
  // Frames may have their payload elided (encode_frame with a null payload): each is timed and counted at the
  // length its headers say (wire_frame_bytes), not its buffer's.
  bool elided_payloads = false;
};

// clang-format off
#define IFEC_PORT_COUNTERS(X)                                                                 \
  X(tx_frames, "")                                                                            \
  X(tx_bytes, "frame bytes (without the wire overhead)")                                      \
  X(rx_frames, "")                                                                            \
  X(rx_bytes, "")                                                                             \
  X(dropped_link_down, "refused by send() or lost in flight when the link went down")         \
  X(refused_busy, "send() while a frame was still serializing (an owner bug; frame dropped)") \
  X(dropped_injected, "lost to the link's injected random loss")                              \
  X(busy_ps, "time spent serializing, picoseconds (utilization = busy / elapsed)")
// clang-format on

struct PortCounters {
  IFEC_COUNTER_SET(PortCounters, IFEC_PORT_COUNTERS)
};

class Link;

// One end of a Link: a Port whose frames serialize at the link's rate and arrive at the other end a delay later.
class LinkPort : public Port {
 public:
  bool send(std::vector<uint8_t>&& frame) override;
  bool busy() const override;
  bool link_up() const override;
  uint64_t rate_bps() const override;
  uint32_t overhead_bytes() const;
  void set_receiver(Receiver rx) override { rx_ = std::move(rx); }
  void set_tx_ready(TxReady ready) override { ready_ = std::move(ready); }
  // This end's counters; dropped_link_down includes what its frames lost in flight, which the far end counts when
  // they arrive (lost_arriving_: each end writes only its own, the two ends may run on two threads).
  PortCounters counters() const;
  // Every counter, writable, in a fixed order: a run spread over processes adds theirs together.
  template <typename F>
  void visit_counters(F&& fn) {
    counters_.for_each([&](const char*, uint64_t& v) { fn(v); });
    fn(lost_arriving_);
  }
  LinkPort& peer();
  // How much of each arriving frame its receiver reads at once: the headers (default) for a switch that forwards,
  // all of it for a NIC that checks the ICRC. Tells the clock what to prefetch; nothing else depends on it.
  void set_read_on_arrival(size_t bytes) { read_on_arrival_ = bytes; }
  // A far end in another process (one simulation over MPI; a link made with per-end clocks): this end's frames
  // leave through `remote`, with their arrival time and the link's epoch, instead of an arrival event here.
  using Remote = std::function<void(TimeNs at, std::vector<uint8_t>&& frame, uint64_t epoch)>;
  void set_remote(Remote remote) { remote_ = std::move(remote); }
  // A frame sent to this end from another process, at its arrival time: counted and handed on as any arrival (or
  // lost, when the link went down since it was sent).
  void arrive(std::vector<uint8_t>&& frame, uint64_t epoch) { deliver(std::move(frame), epoch); }

 private:
  friend class Link;
  LinkPort(Link& link, Clock& clock, int side) : link_(link), clock_(clock), side_(side) {}
  void deliver(std::vector<uint8_t>&& frame, uint64_t epoch);
  bool lost_in_flight();  // the injected loss's draw for the next frame sent from this end

  struct InFlight {
    std::vector<uint8_t> frame;
    uint64_t epoch = 0;
  };
  Link& link_;
  Clock& clock_;
  int side_;
  // Where this end's frames arrive when the far end runs on another clock (a partition's mailbox, see Link's
  // second constructor; null: this end's clock, which is then the far end's too).
  Clock* arrivals_ = nullptr;
  uint64_t loss_state_ = 0;  // injected loss's draws on such a link, per end (each end on its own thread)
  uint64_t busy_until_ps_ = 0;
  // The last frame size this end serialized and its time: frames mostly come in one size, and the exact time
  // takes a 128-bit division (kept per end: the two ends may be driven from two threads).
  size_t last_bytes_ = SIZE_MAX;
  uint64_t last_ps_ = 0;
  size_t read_on_arrival_ = 128;
  Receiver rx_;
  TxReady ready_;
  Remote remote_;
  PortCounters counters_;
  uint64_t lost_arriving_ = 0;  // frames for this end lost in flight when the link went down (the sender's loss)
  // Frames on the wire from this end, oldest first: they arrive in the order sent (one serializer, one delay), so
  // the arrival event needs only the port, not its own copy of the frame. A Fifo allocates nothing until the first
  // frame (std::deque's 576 bytes per end were 38 MB of a 2,048-GPU fabric's 32,768 links before any traffic).
  Fifo<InFlight> in_flight_;
};

// A full-duplex point-to-point link between two LinkPorts, on any Clock. Serialization is exact: the port keeps
// its transmit time in picoseconds and back-to-back frames start where the previous one ended, so rounding to
// the clock's nanoseconds never accumulates. The two ends live inside the link, so what a frame's send and arrival
// touch (the link's state and both ends) sits together in memory.
class Link {
 public:
  Link(Clock& clock, const LinkConfig& cfg);
  // A link whose ends run on different clocks (partitions of one simulation on different threads): end i sends,
  // times and receives on clock_i; its frames arrive through arrivals_i, a clock that takes events for the far
  // end's partition (a mailbox delivered between the partitions' windows: the link's delay is their lookahead).
  Link(Clock& clock0, Clock& clock1, Clock& arrivals0, Clock& arrivals1, const LinkConfig& cfg);
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  LinkPort& end(int i) { return ends_[i]; }
  const LinkPort& end(int i) const { return ends_[i]; }
  // Takes the link down (frames in flight are lost and counted at the sender) or brings it back up.
  void set_up(bool up);
  bool up() const { return up_; }
  // Runs the link at another rate from the next frame on (a gray failure: a link renegotiated slower, which the
  // topology and routing still take at its configured rate). Throws on 0.
  void set_rate_bps(uint64_t bps);
  const LinkConfig& config() const { return cfg_; }
  // Serialization time of a frame of `bytes` on this link, in picoseconds (wire overhead included).
  uint64_t serialization_ps(size_t bytes) const;

 private:
  friend class LinkPort;
  LinkConfig cfg_;
  bool up_ = true;
  uint64_t epoch_ = 0;       // bumped on every down transition: frames sent in an older epoch are lost
  uint64_t loss_state_ = 0;  // xorshift state for injected loss: deterministic per link
  LinkPort ends_[2];
};

inline bool LinkPort::link_up() const { return link_.up_; }
inline uint64_t LinkPort::rate_bps() const { return link_.cfg_.rate_bps; }
inline uint32_t LinkPort::overhead_bytes() const { return link_.cfg_.overhead_bytes; }
inline LinkPort& LinkPort::peer() { return link_.ends_[1 - side_]; }

}  // namespace ifec::common
