// Proxy: the host thread that drains a DescriptorRing into a TransactionSink and reports completions back.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "ifec/endpoint/ring.h"
#include "ifec/endpoint/sink.h"

namespace ifec::endpoint {

struct ProxyOptions {
  size_t max_batch = 256;  // descriptors drained per poll before the sink gets a progress() call
  // Submitted but not yet completed; at the limit the proxy stops popping (the ring fills and producers wait), so a
  // stalled sink applies backpressure instead of growing the proxy's bookkeeping without bound.
  size_t max_outstanding = size_t{1} << 16;
  std::chrono::microseconds max_idle_sleep{50};  // longest sleep when the ring is empty and the sink is idle
};

struct ProxyStats {
  uint64_t submitted = 0;              // descriptors popped and handed to the sink
  uint64_t completed = 0;              // completions reported to the ring (in ticket order)
  uint64_t errors = 0;                 // of those, with a status other than kOk
  uint64_t fences = 0;                 // kFence descriptors among the submitted
  uint64_t polls = 0;                  // poll iterations
  uint64_t idle_polls = 0;             // iterations that found nothing to do
  uint64_t sink_exceptions = 0;        // submit() threw; the descriptor completed as kInvalidArgument
  uint64_t duplicate_completions = 0;  // a sink ran `done` twice (or for an unknown ticket); ignored
};

// Drains `ring` (single consumer) into `sink` on behalf of endpoint `source_endpoint`, reading payloads and writing
// fetched values through `mem`. Either start() a thread, or drive it with poll_once() from one thread; not both.
//
// Completions are reported to the ring in ticket order even when the sink finishes out of order: `completed` is
// then a prefix count, so a quiet() that waits for completed >= head-at-call really waits for every earlier
// descriptor, not merely for as many completions (which later descriptors could supply).
//
// The sink's `done` callbacks refer to this Proxy: the sink must not run them after the Proxy is destroyed.
class Proxy {
 public:
  Proxy(DescriptorRing& ring, TransactionSink& sink, LocalMemory& mem, int source_endpoint, ProxyOptions options = {});
  ~Proxy();  // stop()
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  // Launches the proxy thread (ifec::common::Error if already running).
  void start();
  // Asks the thread to finish its current iteration and joins it. Does not wait for the ring to drain or for the
  // sink's outstanding operations: descriptors still in the ring stay there; a later start() or poll_once() resumes.
  void stop();
  bool running() const { return thread_.joinable(); }

  // One iteration on the calling thread: pop up to max_batch descriptors, submit them, then sink.progress().
  // Returns the number of descriptors popped. Error if the proxy thread is running.
  size_t poll_once();

  // Submitted but not yet completed (as the proxy thread last saw it).
  uint64_t outstanding() const { return outstanding_.load(std::memory_order_relaxed); }
  ProxyStats stats() const;
  // Message of the last exception a sink's submit() threw, empty if none.
  std::string last_sink_error() const;

 private:
  struct Poll {
    size_t popped = 0;
    size_t completions = 0;
    bool sink_busy = false;
  };
  Poll poll();
  void run();
  void complete(uint64_t ticket, OpStatus status);
  static void bump(std::atomic<uint64_t>& c, uint64_t n = 1) {
    c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);  // single writer: no RMW needed
  }

  DescriptorRing& ring_;
  TransactionSink& sink_;
  LocalMemory& mem_;
  const int source_;
  const ProxyOptions options_;

  std::thread thread_;
  std::atomic<bool> stop_{false};

  // Proxy-thread state: completion status of tickets [base_, base_ + pending_.size()).
  enum : uint8_t { kSlotPending = 0, kSlotOk = 1, kSlotError = 2 };
  std::deque<uint8_t> pending_;
  uint64_t base_ = 0;
  size_t completions_this_poll_ = 0;

  // Stats: written by the proxy thread only, read from anywhere.
  std::atomic<uint64_t> outstanding_{0};
  std::atomic<uint64_t> submitted_{0}, completed_{0}, errors_{0}, fences_{0}, polls_{0}, idle_polls_{0};
  std::atomic<uint64_t> sink_exceptions_{0}, duplicate_completions_{0};
  mutable std::mutex error_mu_;
  std::string last_sink_error_;
};

}  // namespace ifec::endpoint
