// Event loops (virtual and wall-clock time) and the point-to-point link model.
#include "ifec/common/sim.h"

#include <algorithm>
#include <thread>

#include "ifec/common/checks.h"

namespace ifec::common {

void EventLoop::schedule(TimeNs at, std::function<void()> fn) {
  events_.push_back(Event{std::max(at, now_), seq_++, std::move(fn)});
  std::push_heap(events_.begin(), events_.end(), Later{});
}

EventLoop::Event EventLoop::pop() {
  std::pop_heap(events_.begin(), events_.end(), Later{});
  Event e = std::move(events_.back());
  events_.pop_back();
  return e;
}

namespace {

thread_local std::function<bool()> t_interrupt_check;

}  // namespace

void EventLoop::set_interrupt_check(std::function<bool()> check) { t_interrupt_check = std::move(check); }

uint64_t EventLoop::run(TimeNs until) {
  uint64_t n = 0;
  while (!events_.empty() && events_.front().at <= until) {
    Event e = pop();
    now_ = e.at;
    e.fn();
    ++n;
    if ((++interrupt_tick_ & 0xFFFF) == 0 && t_interrupt_check && t_interrupt_check()) {
      events_run_ += n;
      throw Interrupted();
    }
  }
  events_run_ += n;
  if (until != kForever && now_ < until) {
    now_ = until;  // time passes to `until` whether or not later events are waiting
  }
  return n;
}

RealtimeLoop::RealtimeLoop() : RealtimeLoop(std::chrono::steady_clock::now()) {}

RealtimeLoop::RealtimeLoop(std::chrono::steady_clock::time_point start) : start_(start) {}

TimeNs RealtimeLoop::now() const {
  return static_cast<TimeNs>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count());
}

void RealtimeLoop::schedule(TimeNs at, std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.events_.push_back(EventLoop::Event{at, queue_.seq_++, std::move(fn)});
    std::push_heap(queue_.events_.begin(), queue_.events_.end(), EventLoop::Later{});
  }
  wake_.notify_one();
}

void RealtimeLoop::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }
  wake_.notify_one();
}

uint64_t RealtimeLoop::run(TimeNs deadline) { return loop(deadline, false); }

uint64_t RealtimeLoop::serve(TimeNs deadline) { return loop(deadline, true); }

uint64_t RealtimeLoop::loop(TimeNs deadline, bool wait_for_more) {
  uint64_t n = 0;
  std::unique_lock<std::mutex> lock(mu_);
  // Sleeps until `until` (ns since start), or until schedule() or stop() wakes it.
  auto sleep = [&](TimeNs until) {
    if (until >= kForever / 2) {
      wake_.wait(lock);
    } else {
      wake_.wait_until(lock, start_ + std::chrono::nanoseconds(until));
    }
  };
  while (!stopped_) {
    const TimeNs t = now();
    if (t > deadline) {
      break;
    }
    if (queue_.events_.empty()) {
      if (!wait_for_more) {
        break;
      }
      sleep(deadline);
      continue;
    }
    const TimeNs at = queue_.events_.front().at;
    if (at > deadline && !wait_for_more) {
      break;
    }
    if (at > t) {
      sleep(std::min(at, deadline));
      continue;
    }
    EventLoop::Event e = queue_.pop();
    lock.unlock();  // the event may schedule more, on this loop or another
    e.fn();
    ++n;
    lock.lock();
  }
  stopped_ = false;
  return n;
}

Link::Link(Clock& clock, const LinkConfig& cfg) : clock_(clock), cfg_(cfg) {
  IFEC_CHECK(cfg.rate_bps > 0, "link rate must be > 0 bit/s, got " << cfg.rate_bps);
  IFEC_CHECK(cfg.loss_probability >= 0 && cfg.loss_probability < 1,
             "link loss probability must be in [0, 1), got " << cfg.loss_probability);
  loss_state_ = cfg.loss_seed * 0x9E3779B97F4A7C15ULL + 0x2545F4914F6CDD1DULL;
  ends_[0].reset(new LinkPort(*this, 0));
  ends_[1].reset(new LinkPort(*this, 1));
}

Link::~Link() = default;

uint64_t Link::serialization_ps(size_t bytes) const {
  // bits * 1e12 / rate, rounded up to the picosecond; 128-bit to stay exact for any frame size and rate.
  const unsigned __int128 bits = (static_cast<unsigned __int128>(bytes) + cfg_.overhead_bytes) * 8;
  const unsigned __int128 num = bits * 1'000'000'000'000ULL;
  return static_cast<uint64_t>((num + cfg_.rate_bps - 1) / cfg_.rate_bps);
}

void Link::set_up(bool up) {
  if (up == up_) {
    return;
  }
  up_ = up;
  if (!up) {
    ++epoch_;
    return;
  }
  // Owners may have stopped offering frames while the link was down: tell both ends the wire is free.
  for (auto& end : ends_) {
    LinkPort* p = end.get();
    clock_.schedule(clock_.now(), [p] {
      if (p->ready_ && !p->busy()) {
        p->ready_();
      }
    });
  }
}

bool LinkPort::busy() const { return link_.clock_.now() * 1000 < busy_until_ps_; }

bool LinkPort::send(std::vector<uint8_t>&& frame) {
  if (!link_.up_) {
    ++counters_.dropped_link_down;
    return false;
  }
  if (busy()) {
    ++counters_.refused_busy;
    return false;
  }
  const uint64_t now_ps = link_.clock_.now() * 1000;
  // Back to back: if the previous frame ended inside the current nanosecond, continue from its exact end.
  const uint64_t start_ps = busy_until_ps_ + 999 >= now_ps ? busy_until_ps_ : now_ps;
  const uint64_t ser_ps = link_.serialization_ps(frame.size());
  busy_until_ps_ = start_ps + ser_ps;
  counters_.tx_frames++;
  counters_.tx_bytes += frame.size();
  counters_.busy_ps += ser_ps;
  const TimeNs done = (busy_until_ps_ + 999) / 1000;
  Clock& clock = link_.clock_;
  clock.schedule(done, [this] {
    if (ready_ && !busy()) {
      ready_();
    }
  });
  LinkPort* peer = link_.ends_[1 - side_].get();
  if (link_.cfg_.loss_probability > 0) {
    uint64_t& x = link_.loss_state_;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    if (static_cast<double>(x >> 11) * (1.0 / 9007199254740992.0) < link_.cfg_.loss_probability) {
      ++counters_.dropped_injected;
      return true;  // the sender cannot tell: the frame is lost on the wire
    }
  }
  clock.schedule(done + link_.cfg_.delay_ns,
                 [peer, f = std::move(frame), epoch = link_.epoch_]() mutable { peer->deliver(std::move(f), epoch); });
  return true;
}

void LinkPort::deliver(std::vector<uint8_t>&& frame, uint64_t epoch) {
  if (epoch != link_.epoch_ || !link_.up_) {
    ++peer().counters_.dropped_link_down;  // lost in flight: counted at the sender
    return;
  }
  counters_.rx_frames++;
  counters_.rx_bytes += frame.size();
  if (rx_) {
    rx_(std::move(frame));
  }
}

}  // namespace ifec::common
