// Proxy: drains the descriptor ring into a TransactionSink, reorders completions into ticket order.
#include "ifec/endpoint/proxy.h"

#include <algorithm>
#include <exception>

#include "ifec/common/checks.h"

namespace ifec::endpoint {

Proxy::Proxy(DescriptorRing& ring, TransactionSink& sink, LocalMemory& mem, int source_endpoint, ProxyOptions options)
    : ring_(ring), sink_(sink), mem_(mem), source_(source_endpoint), options_(options) {
  IFEC_CHECK(options_.max_batch > 0, "proxy max_batch " << options_.max_batch << " must be positive");
  IFEC_CHECK(options_.max_outstanding > 0, "proxy max_outstanding " << options_.max_outstanding << " must be positive");
  // Tickets below the ring's tail were consumed by someone else (an earlier proxy); ours start here.
  base_ = ring_.consumed();
}

Proxy::~Proxy() { stop(); }

void Proxy::start() {
  IFEC_CHECK(!thread_.joinable(), "proxy for endpoint " << source_ << " is already running");
  stop_.store(false, std::memory_order_relaxed);
  thread_ = std::thread([this] { run(); });
}

void Proxy::stop() {
  if (!thread_.joinable()) return;
  stop_.store(true, std::memory_order_release);
  thread_.join();
}

size_t Proxy::poll_once() {
  IFEC_CHECK(!thread_.joinable(), "proxy for endpoint " << source_ << ": poll_once() while its thread is running");
  return poll().popped;
}

void Proxy::run() {
  SpinBackoff backoff;
  auto sleep = std::chrono::microseconds(1);
  int idle_rounds = 0;
  while (!stop_.load(std::memory_order_acquire)) {
    const Poll p = poll();
    if (p.popped > 0 || p.completions > 0) {
      backoff.reset();
      idle_rounds = 0;
      sleep = std::chrono::microseconds(1);
    } else if (p.sink_busy || ++idle_rounds < 256) {
      // The sink needs progress() calls (or work just stopped): stay responsive, only yield.
      backoff.pause();
    } else {
      // Idle for a while: sleep, doubling up to max_idle_sleep, so an idle proxy does not burn a core.
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, options_.max_idle_sleep);
    }
  }
}

Proxy::Poll Proxy::poll() {
  Poll p;
  completions_this_poll_ = 0;
  Descriptor d;
  while (p.popped < options_.max_batch && pending_.size() < options_.max_outstanding && ring_.try_pop(&d)) {
    ++p.popped;
    const uint64_t ticket = d.seq - 1;
    pending_.push_back(kSlotPending);
    bump(outstanding_);
    bump(submitted_);
    if (d.op == static_cast<uint8_t>(DescOp::kFence)) bump(fences_);
    try {
      sink_.submit(source_, d, mem_, [this, ticket](OpStatus s) { complete(ticket, s); });
    } catch (const std::exception& e) {
      bump(sink_exceptions_);
      {
        std::lock_guard<std::mutex> lock(error_mu_);
        last_sink_error_ = e.what();
      }
      // If the sink threw after running `done`, this second completion is counted as a duplicate and ignored.
      complete(ticket, OpStatus::kInvalidArgument);
    }
  }
  p.sink_busy = sink_.progress();
  p.completions = completions_this_poll_;
  bump(polls_);
  if (p.popped == 0 && p.completions == 0) bump(idle_polls_);
  return p;
}

void Proxy::complete(uint64_t ticket, OpStatus status) {
  const uint64_t idx = ticket - base_;  // wraps to huge for tickets already retired
  if (idx >= pending_.size() || pending_[idx] != kSlotPending) {
    bump(duplicate_completions_);
    return;
  }
  pending_[idx] = status == OpStatus::kOk ? kSlotOk : kSlotError;
  ++completions_this_poll_;
  // Retire the completed prefix so `completed` in the ring only ever covers every ticket below it.
  while (!pending_.empty() && pending_.front() != kSlotPending) {
    const bool error = pending_.front() == kSlotError;
    ring_.mark_completed(error);
    pending_.pop_front();
    ++base_;
    bump(outstanding_, static_cast<uint64_t>(-1));
    bump(completed_);
    if (error) bump(errors_);
  }
}

ProxyStats Proxy::stats() const {
  ProxyStats s;
  s.submitted = submitted_.load(std::memory_order_relaxed);
  s.completed = completed_.load(std::memory_order_relaxed);
  s.errors = errors_.load(std::memory_order_relaxed);
  s.fences = fences_.load(std::memory_order_relaxed);
  s.polls = polls_.load(std::memory_order_relaxed);
  s.idle_polls = idle_polls_.load(std::memory_order_relaxed);
  s.sink_exceptions = sink_exceptions_.load(std::memory_order_relaxed);
  s.duplicate_completions = duplicate_completions_.load(std::memory_order_relaxed);
  return s;
}

std::string Proxy::last_sink_error() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  return last_sink_error_;
}

}  // namespace ifec::endpoint
