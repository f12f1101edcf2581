// Event loops (virtual and wall-clock time) and the point-to-point link model.
#include "ifec/common/sim.h"

#include <algorithm>
#include <thread>

#include "ifec/common/checks.h"
#include "ifec/common/frame.h"

namespace ifec::common {

void EventLoop::schedule(TimeNs at, std::function<void()> fn) { push(std::max(at, now_), std::move(fn)); }

void EventLoop::schedule_reading(TimeNs at, std::function<void()> fn, const void* data, size_t bytes) {
  push(std::max(at, now_), std::move(fn), data, bytes);
}

void EventLoop::push(TimeNs at, std::function<void()> fn, const void* reads, size_t read_bytes) {
  uint32_t id;
  if (free_nodes_.empty()) {
    id = static_cast<uint32_t>(nodes_.size());
    nodes_.emplace_back();
  } else {
    id = free_nodes_.back();
    free_nodes_.pop_back();
  }
  Node& n = nodes_[id];
  n.at = at;
  n.seq = seq_++;
  n.fn = std::move(fn);
  n.reads = static_cast<const uint8_t*>(reads);
  n.read_bytes = static_cast<uint32_t>(std::min<size_t>(read_bytes, UINT32_MAX));
  n.next = kNone;
  bool in_heap = false;
  if (at >= base_ && at - base_ < kWheel) {
    if (wheel_.empty()) {
      wheel_.resize(kWheel);
      occupied_.assign(kWheel / 64, 0);
    }
    const uint32_t b = static_cast<uint32_t>(at % kWheel);
    Bucket& bucket = wheel_[b];
    if (bucket.head == kNone) {
      bucket.head = id;
      occupied_[b / 64] |= uint64_t{1} << (b % 64);
      occupied_words_ |= uint64_t{1} << (b / 64);
    } else {
      nodes_[bucket.tail].next = id;
    }
    bucket.tail = id;
    ++in_wheel_;
  } else {
    events_.push_back({at, n.seq, id});
    std::push_heap(events_.begin(), events_.end(), Later{});
    in_heap = true;
  }
  // A later sequence number never runs first at an equal time, so only an earlier time displaces the earliest; the
  // new earliest is the heap's top if it went there, else its bucket's head (no other event has its time).
  if (next_known_ && (next_.node == kNone || at < nodes_[next_.node].at)) {
    next_ = {id, in_heap};
  }
}

EventLoop::Next EventLoop::scan() const {
  Next w;
  if (in_wheel_ > 0) {
    // The first occupied bucket at or after base_'s, going round once: in base_'s word from its bucket on, else
    // the first occupied word after it, else from the wheel's start (base_'s word last: its buckets before base_'s
    // hold the next round's times).
    const uint32_t start = static_cast<uint32_t>(base_ % kWheel);
    uint32_t word = start / 64;
    uint64_t bits = occupied_[word] & (~uint64_t{0} << (start % 64));
    if (bits == 0) {
      const uint64_t after = word == 63 ? 0 : occupied_words_ & (~uint64_t{0} << (word + 1));
      word = static_cast<uint32_t>(__builtin_ctzll(after != 0 ? after : occupied_words_));
      bits = occupied_[word];
    }
    w.node = wheel_[word * 64 + static_cast<uint32_t>(__builtin_ctzll(bits))].head;
  }
  if (events_.empty()) {
    return w;
  }
  const Key& top = events_.front();
  if (w.node == kNone) {
    return {top.node, true};
  }
  const Node& n = nodes_[w.node];
  return Later{}(Key{n.at, n.seq, w.node}, top) ? Next{top.node, true} : w;
}

EventLoop::Next EventLoop::earliest() const {
  if (next_known_) {
    return next_;
  }
  const Next n = scan();  // returned as found: reading it back from next_ would wait on the two stores
  next_ = n;
  next_known_ = true;
  return n;
}

TimeNs EventLoop::next_event_time() const {
  const Next n = earliest();
  return n.node == kNone ? kForever : nodes_[n.node].at;
}

void EventLoop::advance_to(TimeNs t) {
  IFEC_CHECK(next_event_time() >= t, "advance_to(" << t << "): an event waits at " << next_event_time());
  now_ = std::max(now_, t);
}

std::function<void()> EventLoop::pop(Next n) {
  Node& node = nodes_[n.node];
  const TimeNs at = node.at;
  if (n.in_heap) {
    std::pop_heap(events_.begin(), events_.end(), Later{});
    events_.pop_back();
  } else {
    const uint32_t b = static_cast<uint32_t>(at % kWheel);
    Bucket& bucket = wheel_[b];
    bucket.head = node.next;
    if (bucket.head == kNone) {
      bucket.tail = kNone;
      occupied_[b / 64] &= ~(uint64_t{1} << (b % 64));
      if (occupied_[b / 64] == 0) {
        occupied_words_ &= ~(uint64_t{1} << (b / 64));
      }
    }
    --in_wheel_;
  }
  base_ = std::max(base_, at);  // every event still in the wheel is at or after it
  next_known_ = false;
  std::function<void()> fn = std::move(node.fn);
  node.fn = nullptr;
  free_nodes_.push_back(n.node);
  return fn;
}

namespace {

thread_local std::function<bool()> t_interrupt_check;

}  // namespace

void EventLoop::set_interrupt_check(std::function<bool()> check) { t_interrupt_check = std::move(check); }

uint64_t EventLoop::run(TimeNs until) {
  uint64_t n = 0;
  for (Next k = earliest(); k.node != kNone && nodes_[k.node].at <= until; k = earliest()) {
    now_ = nodes_[k.node].at;
    std::function<void()> fn = pop(k);
    // What the next event said it reads, fetched while this one runs.
    const Next after = earliest();
    if (after.node != kNone) {
      const Node& a = nodes_[after.node];
      for (uint32_t off = 0; off < a.read_bytes; off += 64) {
        __builtin_prefetch(a.reads + off, 0, 3);
      }
    }
    fn();
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
    queue_.push(at, std::move(fn));
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
    const EventLoop::Next next = queue_.earliest();
    if (next.node == EventLoop::kNone) {
      if (!wait_for_more) {
        break;
      }
      sleep(deadline);
      continue;
    }
    const TimeNs at = queue_.nodes_[next.node].at;
    if (at > deadline && !wait_for_more) {
      break;
    }
    if (at > t) {
      sleep(std::min(at, deadline));
      continue;
    }
    std::function<void()> fn = queue_.pop(next);
    lock.unlock();  // the event may schedule more, on this loop or another
    fn();
    ++n;
    lock.lock();
  }
  stopped_ = false;
  return n;
}

Link::Link(Clock& clock, const LinkConfig& cfg) : Link(clock, clock, clock, clock, cfg) {}

Link::Link(Clock& clock0, Clock& clock1, Clock& arrivals0, Clock& arrivals1, const LinkConfig& cfg)
    : cfg_(cfg), ends_{LinkPort(*this, clock0, 0), LinkPort(*this, clock1, 1)} {
  IFEC_CHECK(cfg.rate_bps > 0, "link rate must be > 0 bit/s, got " << cfg.rate_bps);
  IFEC_CHECK(cfg.loss_probability >= 0 && cfg.loss_probability < 1,
             "link loss probability must be in [0, 1), got " << cfg.loss_probability);
  loss_state_ = cfg.loss_seed * 0x9E3779B97F4A7C15ULL + 0x2545F4914F6CDD1DULL;
  Clock* arrivals[2] = {&arrivals0, &arrivals1};
  for (int side = 0; side < 2; ++side) {
    if (&clock0 != &clock1 || arrivals[side] != &clock0) {  // split: each end draws its own losses
      ends_[side].arrivals_ = arrivals[side];
      ends_[side].loss_state_ = loss_state_ ^ (0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(side + 1));
    }
  }
}

void Link::set_rate_bps(uint64_t bps) {
  IFEC_CHECK(bps > 0, "link rate must be > 0 bit/s, got " << bps);
  cfg_.rate_bps = bps;
}

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
  for (LinkPort& end : ends_) {
    LinkPort* p = &end;
    p->clock_.schedule(p->clock_.now(), [p] {
      if (p->ready_ && !p->busy()) {
        p->ready_();
      }
    });
  }
}

PortCounters LinkPort::counters() const {
  PortCounters c = counters_;
  c.dropped_link_down += link_.ends_[1 - side_].lost_arriving_;
  return c;
}

bool LinkPort::busy() const { return clock_.now() * 1000 < busy_until_ps_; }

bool LinkPort::send(std::vector<uint8_t>&& frame) {
  if (!link_.up_) {
    ++counters_.dropped_link_down;
    return false;
  }
  if (busy()) {
    ++counters_.refused_busy;
    return false;
  }
  const uint64_t now_ps = clock_.now() * 1000;
  // Back to back: if the previous frame ended inside the current nanosecond, continue from its exact end.
  const uint64_t start_ps = busy_until_ps_ + 999 >= now_ps ? busy_until_ps_ : now_ps;
  const size_t bytes = link_.cfg_.elided_payloads ? wire_frame_bytes(frame) : frame.size();
  if (bytes != last_bytes_) {
    last_bytes_ = bytes;
    last_ps_ = link_.serialization_ps(last_bytes_);
  }
  const uint64_t ser_ps = last_ps_;
  busy_until_ps_ = start_ps + ser_ps;
  counters_.tx_frames++;
  counters_.tx_bytes += bytes;
  counters_.busy_ps += ser_ps;
  const TimeNs done = (busy_until_ps_ + 999) / 1000;
  clock_.schedule(done, [this] {
    if (ready_ && !busy()) {
      ready_();
    }
  });
  LinkPort* peer = &link_.ends_[1 - side_];
  if (link_.cfg_.loss_probability > 0 && lost_in_flight()) {
    ++counters_.dropped_injected;
    return true;  // the sender cannot tell: the frame is lost on the wire
  }
  if (arrivals_ != nullptr) {  // the far end's partition: the frame travels in its arrival event
    if (remote_) {             // ... or, in another process, in the partitions' exchange
      remote_(done + link_.cfg_.delay_ns, std::move(frame), link_.epoch_);
      return true;
    }
    const size_t reads = std::min(frame.size(), peer->read_on_arrival_);
    const uint8_t* data = frame.data();
    // The frame travels in the event itself (one allocation for the callable; a shared InFlight was a second).
    arrivals_->schedule_reading(
        done + link_.cfg_.delay_ns,
        [peer, f = std::move(frame), epoch = link_.epoch_]() mutable {
          peer->deliver(std::move(f), epoch);
          recycle_frame(std::move(f));
        },
        data, reads);
    return true;
  }
  in_flight_.push_back({std::move(frame), link_.epoch_});
  const std::vector<uint8_t>& sent = in_flight_.back().frame;
  auto arrive = [this, peer] {
    InFlight f = std::move(in_flight_.front());
    in_flight_.pop_front();
    peer->deliver(std::move(f.frame), f.epoch);
    recycle_frame(std::move(f.frame));  // unless its receiver kept it (a switch queued it, say)
  };
  clock_.schedule_reading(done + link_.cfg_.delay_ns, std::move(arrive), sent.data(),
                          std::min(sent.size(), peer->read_on_arrival_));
  return true;
}

bool LinkPort::lost_in_flight() {
  uint64_t& x = arrivals_ != nullptr ? loss_state_ : link_.loss_state_;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return static_cast<double>(x >> 11) * (1.0 / 9007199254740992.0) < link_.cfg_.loss_probability;
}

void LinkPort::deliver(std::vector<uint8_t>&& frame, uint64_t epoch) {
  if (epoch != link_.epoch_ || !link_.up_) {
    ++lost_arriving_;  // lost in flight: the sender's loss (counters()), kept here, where this end's thread runs
    return;
  }
  counters_.rx_frames++;
  counters_.rx_bytes += link_.cfg_.elided_payloads ? wire_frame_bytes(frame) : frame.size();
  if (rx_) {
    rx_(std::move(frame));
  }
}

}  // namespace ifec::common
