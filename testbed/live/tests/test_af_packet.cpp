// The live driver's seams on real interfaces: the epoll loop's timers and cross-thread posting, and AfPacketPort
// on a veth pair between two namespaces this test makes (and removes): fabric frames cross byte for byte, the
// kernel-side filter passes RoCEv2, ECH, PFC and FARE frames and nothing else, and the carrier follows the peer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ifec/common/checks.h"
#include "ifec/common/frame.h"
#include "ifec/common/pfc.h"
#include "ifec/live/af_packet_port.h"
#include "ifec/live/epoll_loop.h"
#include "ifec/live/netns.h"
#include "port_frames.h"

using namespace ifec;

namespace {

using live::testing::roce_frame;

// Runs the loop until `done` or `limit_ns` of wall time; false on timeout.
bool run_until(live::EpollLoop& loop, const std::function<bool()>& done, common::TimeNs limit_ns = 2'000'000'000ULL) {
  const common::TimeNs deadline = loop.now() + limit_ns;
  while (!done()) {
    if (loop.now() > deadline) {
      return false;
    }
    loop.schedule(loop.now() + 1'000'000, [] {});
    loop.serve(loop.now() + 1'000'000);
  }
  return true;
}

class Veth : public testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = live::netns_unavailable(); !why.empty()) {
      GTEST_SKIP() << why;
    }
    const std::string tag = "ifec-t" + std::to_string(getpid());
    a_ = std::make_unique<live::ScopedNetns>(tag + "-a");
    b_ = std::make_unique<live::ScopedNetns>(tag + "-b");
    live::make_veth(*a_, "f0", *b_, "f0");
    pa_ = std::make_unique<live::AfPacketPort>(loop_, "f0", 10'000'000'000ULL, a_->name());
    pb_ = std::make_unique<live::AfPacketPort>(loop_, "f0", 10'000'000'000ULL, b_->name());
    pb_->set_receiver([this](std::vector<uint8_t>&& f) { got_.push_back(std::move(f)); });
    ASSERT_TRUE(run_until(loop_, [&] {
      pa_->refresh_link();
      pb_->refresh_link();
      return pa_->link_up() && pb_->link_up();
    })) << "veth carrier never came up";
  }
  void TearDown() override {
    pa_.reset();
    pb_.reset();
    a_.reset();
    b_.reset();
  }

  live::EpollLoop loop_;
  std::unique_ptr<live::ScopedNetns> a_, b_;
  std::unique_ptr<live::AfPacketPort> pa_, pb_;
  std::vector<std::vector<uint8_t>> got_;
};

}  // namespace

TEST(EpollLoop, TimersRunInTimeOrderAndOtherThreadsWakeIt) {
  live::EpollLoop loop;
  std::vector<int> order;
  const common::TimeNs t0 = loop.now();
  std::vector<common::TimeNs> ran_at(3);
  loop.schedule(t0 + 3'000'000, [&] { order.push_back(3), ran_at[2] = loop.now(); });
  loop.schedule(t0 + 1'000'000, [&] { order.push_back(1), ran_at[0] = loop.now(); });
  loop.schedule(t0 + 2'000'000, [&] { order.push_back(2), ran_at[1] = loop.now(); });
  loop.serve(t0 + 5'000'000);
  ASSERT_EQ(order, (std::vector<int>{1, 2, 3}));
  EXPECT_GE(ran_at[0], t0 + 1'000'000) << "never early";
  EXPECT_GE(ran_at[2], t0 + 3'000'000);
  bool posted = false;
  std::thread other([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    loop.schedule(0, [&] {
      posted = true;
      loop.stop();
    });
  });
  const common::TimeNs before = loop.now();
  loop.serve();  // waits with nothing due until the other thread posts
  other.join();
  EXPECT_TRUE(posted);
  EXPECT_GE(loop.now() - before, 15'000'000u);
}

// A worker's jobs run off the loop's thread, in order, while the loop keeps serving its timers; each continuation
// runs on the loop with the job's error; a worker destroyed drops the jobs it has not started.
TEST(LoopWorker, JobsRunOffTheLoopWhichKeepsServingAndTheirContinuationsRunOnIt) {
  live::EpollLoop loop;
  std::vector<std::string> done;
  std::vector<std::thread::id> job_threads;
  std::atomic<bool> release{false};
  int ticks = 0;
  std::function<void()> tick = [&] {
    if (++ticks == 20) {
      release = true;  // twenty timers ran on the loop while the first job held the worker
    }
    loop.schedule(loop.now() + 1'000'000, tick);
  };
  {
    live::LoopWorker worker(loop);
    const std::thread::id me = std::this_thread::get_id();
    worker.post(
        [&] {
          job_threads.push_back(std::this_thread::get_id());
          while (!release) {  // a long job: the loop must keep running its timers meanwhile
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        },
        [&](const std::string& e) { done.push_back(std::this_thread::get_id() == me ? "first" + e : "off loop"); });
    worker.post([] { throw std::runtime_error("bad input"); }, [&](const std::string& e) { done.push_back(e); });
    loop.schedule(0, tick);
    ASSERT_TRUE(run_until(loop, [&] { return done.size() == 2; }));
    EXPECT_EQ(done, (std::vector<std::string>{"first", "bad input"}));
    ASSERT_EQ(job_threads.size(), 1u);
    EXPECT_NE(job_threads[0], me);
    EXPECT_GE(ticks, 20);
    release = false;
    worker.post([&] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); },
                [&](const std::string&) { done.push_back("dropped"); });
    worker.post([&] { done.push_back("never"); }, [&](const std::string&) { done.push_back("never"); });
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }  // waits for the running job, drops the other and both continuations
  loop.serve(loop.now() + 20'000'000);
  EXPECT_EQ(done.size(), 2u) << done.back();
}

// Work an arrival's handling defers "at once" (a collective's next store) runs with that arrival's time, and so does
// what it defers in turn; a timer for later, and the loop outside them, see none.
TEST(EpollLoop, WorkDeferredFromAnArrivalKeepsItsArrivalTime) {
  live::EpollLoop loop;
  const common::TimeNs kArrived = 12'345;
  common::TimeNs deferred = 1, chained = 1, later = 1, plain = 1;
  loop.schedule(0, [&] {
    loop.set_arrival_ns(kArrived);  // as NodeRuntime sets it while handing a frame over
    loop.schedule(loop.now(), [&] {
      deferred = loop.arrival_ns();
      loop.schedule(0, [&] { chained = loop.arrival_ns(); });
    });
    loop.schedule(loop.now() + 1'000'000, [&] { later = loop.arrival_ns(); });
    loop.set_arrival_ns(0);
    loop.schedule(0, [&] { plain = loop.arrival_ns(); });
  });
  loop.serve(loop.now() + 3'000'000);
  EXPECT_EQ(deferred, kArrived);
  EXPECT_EQ(chained, kArrived);
  EXPECT_EQ(later, 0u);
  EXPECT_EQ(plain, 0u);
  EXPECT_EQ(loop.arrival_ns(), 0u);
}

// Clock::event_time: the arrival being handled, on the loop's thread (and in what its handling deferred at once); the
// clock's time where nothing arrived, and on any other thread (a gRPC handler's).
TEST(EpollLoop, EventTimeIsTheArrivalBeingHandledElseNow) {
  live::EpollLoop loop;
  common::TimeNs deferred = 0, later = 0, later_now = 0, other_thread = 0, other_now = 0;
  common::TimeNs arrived = 0;
  loop.schedule(0, [&] {
    arrived = loop.now() > 500'000 ? loop.now() - 500'000 : 1;  // a frame that waited half a millisecond
    loop.set_arrival_ns(arrived);
    loop.schedule(loop.now(), [&] {
      deferred = loop.event_time();
      std::thread([&] {
        other_now = loop.now();
        other_thread = loop.event_time();
      }).join();
    });
    loop.schedule(loop.now() + 1'000'000, [&] {
      later = loop.event_time();
      later_now = loop.now();
    });
    loop.set_arrival_ns(0);
  });
  loop.serve(loop.now() + 3'000'000);
  EXPECT_EQ(deferred, arrived);
  EXPECT_GE(other_thread, other_now);
  EXPECT_GE(later, later_now - 100'000);  // the timer's own time, not the arrival's
  EXPECT_GT(later, arrived + 900'000);
}

// The pacer on a clock the test drives: a sender that sends whenever it is let runs at the link's rate, never slower;
// a late wake-up is made up for up to the catch-up it is given and no more; an idle link lets a frame go at once.
TEST(LinkPacer, HoldsASenderToTheLinkRateAndNeverBelowIt) {
  using live::LinkPacer;
  live::LinkPacer pacer(1'000'000'000ULL);  // 1 Gb/s
  const size_t bytes = 1000;
  const common::TimeNs cost = (bytes + LinkPacer::kWireOverheadBytes) * 8;  // ns at 1 Gb/s
  const common::TimeNs t0 = 1'000'000'000ULL;
  common::TimeNs now = t0;
  for (int i = 0; i < 2000; ++i) {
    const common::TimeNs resume = pacer.sent(now, bytes);
    ASSERT_TRUE(resume == 0 || resume > now) << "frame " << i;
    ASSERT_LE(resume, now + cost) << "frame " << i << ": held back longer than its own serialization";
    now = std::max(now, resume);
  }
  // 2000 frames at the rate, less the credit an idle port starts with (kCatchUpNs) and the burst it may run ahead.
  const common::TimeNs want = 2000 * cost - LinkPacer::kCatchUpNs - LinkPacer::kSlackNs;
  EXPECT_LE(now - t0, want + cost) << "slower than the link";
  EXPECT_GE(now - t0 + cost, want) << "faster than the link";

  // A wake-up 1 ms late: 200 us of it are made up (frames go at once), the rest is lost, as on a real link.
  now = pacer.last_bit(now, 0) + 1'000'000;
  int at_once = 0;
  while (pacer.sent(now, bytes) == 0) {
    ++at_once;
  }
  EXPECT_NEAR(at_once, (LinkPacer::kCatchUpNs + LinkPacer::kSlackNs) / cost, 1);

  // Frames the port knows were due earlier (TxGate::catch_up): a wake-up 5 ms late is made up in full, one 30 ms
  // late up to kMaxCatchUpNs.
  for (const common::TimeNs late : {5'000'000ULL, 30'000'000ULL}) {
    now = pacer.last_bit(now, 0) + late;
    at_once = 0;
    while (pacer.sent(now, bytes, LinkPacer::kMaxCatchUpNs) == 0) {
      ++at_once;
    }
    const common::TimeNs made_up = std::min(late, LinkPacer::kMaxCatchUpNs);
    EXPECT_NEAR(at_once, (made_up + LinkPacer::kSlackNs) / cost, 1) << late << " ns late";
  }

  // An idle link (longer than the catch-up) lets the next frame go at once; no limit never holds anything.
  EXPECT_EQ(pacer.sent(now + 10'000'000, bytes), 0u);
  live::LinkPacer unlimited(0);
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(unlimited.sent(now, 9000), 0u);
  }
}

// What a frame sent now may make up (TxGate::catch_up): kCatchUpNs by default; the time since the frame being handled
// arrived (a reply, a forwarded frame), up to kMaxCatchUpNs; kMaxCatchUpNs for what waited for the port (tx-ready).
TEST(TxGate, CatchesUpTheTimeSinceTheFrameItAnswersArrivedOrWhileItWaited) {
  using live::LinkPacer;
  live::EpollLoop loop;
  live::TxGate gate(loop, 1'000'000'000ULL);
  while (loop.now() < 40'000'000) {  // arrivals 30 ms ago need a loop that ran that long
    loop.serve(loop.now() + 40'000'000);
  }
  EXPECT_EQ(gate.catch_up(loop.now()), LinkPacer::kCatchUpNs);
  loop.set_arrival_ns(loop.now() - 5'000'000);
  const common::TimeNs five = gate.catch_up(loop.now());
  EXPECT_GE(five, 5'000'000u);
  EXPECT_LT(five, 6'000'000u);
  loop.set_arrival_ns(loop.now() - 50'000);  // arrived just now: the default still
  EXPECT_EQ(gate.catch_up(loop.now()), LinkPacer::kCatchUpNs);
  loop.set_arrival_ns(loop.now() - 30'000'000);
  EXPECT_EQ(gate.catch_up(loop.now()), LinkPacer::kMaxCatchUpNs);
  loop.set_arrival_ns(0);
  common::TimeNs in_ready = 0;
  gate.set_ready([&] { in_ready = gate.catch_up(loop.now()); });
  gate.ready_soon();
  loop.poll();
  EXPECT_EQ(in_ready, LinkPacer::kMaxCatchUpNs);
  EXPECT_EQ(gate.catch_up(loop.now()), LinkPacer::kCatchUpNs) << "only while the owner answers tx-ready";
}

// WakeLead: a moving average of how late timers ran, each wake-up counted up to kMaxLeadNs; never negative.
TEST(WakeLead, AveragesTheLoopsLatenessAndCapsAStall) {
  using live::WakeLead;
  WakeLead lead;
  lead.woke(1'000'000, 900'000);  // ran early (an earlier wake-up): counts as on time
  EXPECT_EQ(lead.lead(), 0u);
  for (int i = 0; i < 64; ++i) {
    lead.woke(1'000'000, 1'300'000);
  }
  EXPECT_NEAR(static_cast<double>(lead.lead()), 300'000.0, 300'000.0 * 0.01) << "converges to a steady lateness";
  const common::TimeNs before = lead.lead();
  lead.woke(1'000'000, 1'000'000 + 50'000'000);  // a 50 ms stall of the host
  EXPECT_EQ(lead.lead(), before + (WakeLead::kMaxLeadNs - before) / WakeLead::kWindow);
}

// WireDelay: held frames go in order, at their last bit less the loop's usual lateness, never earlier; a loop whose
// release timers run late (here: another timer just before each one spins 400 us) learns to arm them that much early.
TEST(WireDelay, ReleasesInOrderAndArmsEarlyByTheLoopsLateness) {
  live::EpollLoop loop;
  std::vector<std::pair<common::TimeNs, uint8_t>> put;
  live::WireDelay wire(loop, [&](std::vector<uint8_t>&& f) { put.emplace_back(loop.now(), f[0]); });
  std::vector<common::TimeNs> due;
  for (uint8_t i = 0; i < 16; ++i) {
    const common::TimeNs last_bit = loop.now() + 2'000'000;
    const common::TimeNs lead = wire.lead();
    const common::TimeNs armed = last_bit - lead;
    loop.schedule(armed - 1, [&loop, armed] {
      while (loop.now() < armed + 400'000) {
      }
    });
    std::vector<uint8_t> frame{i};
    ASSERT_TRUE(wire.hold(last_bit, frame, loop.now()));
    due.push_back(last_bit - lead);
    while (put.size() <= i) {
      loop.serve(loop.now() + 1'000'000);
    }
  }
  for (size_t i = 0; i < put.size(); ++i) {
    EXPECT_EQ(put[i].second, i);
    EXPECT_GE(put[i].first + live::WireDelay::kHoldNs, due[i]) << "frame " << i << " went before its time";
  }
  EXPECT_GT(wire.lead(), 300'000u) << "after 16 wake-ups 400 us late";
  EXPECT_LE(wire.lead(), live::WakeLead::kMaxLeadNs);
}

TEST_F(Veth, FabricFramesCrossByteForByteAndOtherTrafficIsFiltered) {
  const auto roce = roce_frame(pa_->mac(), pb_->mac(), false, 4096);  // a jumbo frame: the veth MTU is 9216
  const auto ech = roce_frame(pa_->mac(), pb_->mac(), true, 256);
  common::PfcFrame pfc;
  std::copy(pa_->mac(), pa_->mac() + 6, pfc.src.begin());
  pfc.class_enable = 1 << 3;
  pfc.quanta[3] = 0xFFFF;
  const std::vector<uint8_t> pause = pfc.encode();
  // Not fabric traffic (the kernel's): an ARP ethertype, the retired FARE ethertype 0x88B5 (BGP carries FARE
  // now), IPv4 UDP to port 53 (the same frame as RoCE, another port) and IPv4 TCP to port 179 (BGP).
  std::vector<uint8_t> arp(64, 0);
  std::copy(pb_->mac(), pb_->mac() + 6, arp.begin());
  std::copy(pa_->mac(), pa_->mac() + 6, arp.begin() + 6);
  arp[12] = 0x08;
  arp[13] = 0x06;
  std::vector<uint8_t> old_fare = arp;
  old_fare[12] = 0x88;
  old_fare[13] = 0xB5;
  std::vector<uint8_t> dns = roce;
  dns[14 + 20 + 2] = 0;
  dns[14 + 20 + 3] = 53;
  std::vector<uint8_t> bgp = roce;
  bgp[14 + 9] = 6;  // TCP
  bgp[14 + 20 + 2] = 0;
  bgp[14 + 20 + 3] = 179;
  for (const auto& f : {arp, roce, dns, ech, pause, old_fare, bgp}) {
    ASSERT_TRUE(pa_->send(std::vector<uint8_t>(f)));
  }
  ASSERT_TRUE(run_until(loop_, [&] { return got_.size() >= 3; })) << got_.size() << " of 3 frames arrived";
  run_until(
      loop_, [] { return false; }, 200'000'000);  // anything else that would arrive has time to
  ASSERT_EQ(got_.size(), 3u) << "ARP, 0x88B5, UDP 53 and TCP 179 must be filtered in the kernel";
  EXPECT_EQ(got_[0], roce);
  EXPECT_EQ(got_[1], ech);
  EXPECT_EQ(got_[2], pause);
  EXPECT_EQ(pa_->counters().tx_frames, 7u);
  EXPECT_EQ(pb_->counters().rx_frames, 3u);
}

// The carrier is read, not only the operational state (IFF_RUNNING), which the kernel's link watcher may report a
// second late (the second sub-link of a failed Y-cable, live): the first look after the peer went down sees it.
TEST_F(Veth, CarrierFollowsThePeerAndADownPortRefusesFrames) {
  b_->ip({"link", "set", "f0", "down"});
  EXPECT_TRUE(pa_->refresh_link());
  ASSERT_FALSE(pa_->link_up()) << "A still sees a carrier";
  EXPECT_FALSE(pa_->send(roce_frame(pa_->mac(), pb_->mac(), false, 64)));
  EXPECT_EQ(pa_->counters().tx_refused, 1u);
  b_->ip({"link", "set", "f0", "up"});
  ASSERT_TRUE(run_until(loop_, [&] {
    pa_->refresh_link();
    pb_->refresh_link();
    return pa_->link_up() && pb_->link_up();
  }));
  ASSERT_TRUE(pa_->send(roce_frame(pa_->mac(), pb_->mac(), false, 64)));
  EXPECT_TRUE(run_until(loop_, [&] { return got_.size() == 1; }));
}

// More frames than one recvmmsg() call takes (kRxBatch) wait in the socket: all of them arrive, in order, each
// with the kernel's receive timestamp (real time, between the sends and the drain); a frame longer than a port's
// max_frame is counted as truncated, not delivered.
TEST_F(Veth, ABurstArrivesInOrderWithKernelTimestampsAndAnOversizedFrameIsCountedNotDelivered) {
  live::AfPacketPort small(loop_, "f0", 10'000'000'000ULL, b_->name(), 1000);  // a second socket on b's f0
  std::vector<std::vector<uint8_t>> small_got;
  small.set_receiver([&](std::vector<uint8_t>&& f) { small_got.push_back(std::move(f)); });
  std::vector<common::TimeNs> stamps;
  pb_->set_receiver([&](std::vector<uint8_t>&& f) {
    got_.push_back(std::move(f));
    stamps.push_back(pb_->rx_timestamp_ns());
  });
  constexpr uint32_t kFrames = 100;  // 256 B at 10 Gb/s: within the pacer's slack, sent without running the loop
  std::vector<std::vector<uint8_t>> sent;
  const common::TimeNs before = live::EpollLoop::clock_ns(CLOCK_REALTIME);
  for (uint32_t i = 0; i < kFrames; ++i) {
    sent.push_back(roce_frame(pa_->mac(), pb_->mac(), true, 256, i));
    ASSERT_TRUE(pa_->send(std::vector<uint8_t>(sent.back()))) << "frame " << i;
  }
  const auto big = roce_frame(pa_->mac(), pb_->mac(), false, 2048);
  ASSERT_TRUE(run_until(loop_, [&] { return !pa_->busy(); }));
  ASSERT_TRUE(pa_->send(std::vector<uint8_t>(big)));
  ASSERT_TRUE(run_until(loop_, [&] { return got_.size() == kFrames + 1 && small_got.size() == kFrames; }))
      << got_.size() << " and " << small_got.size() << " frames arrived";
  const common::TimeNs after = live::EpollLoop::clock_ns(CLOCK_REALTIME);
  for (uint32_t i = 0; i < kFrames; ++i) {
    ASSERT_EQ(got_[i], sent[i]) << "frame " << i;
    ASSERT_EQ(small_got[i], sent[i]) << "frame " << i;
    EXPECT_GE(stamps[i], before) << "frame " << i;
    EXPECT_LE(stamps[i], after) << "frame " << i;
    EXPECT_GE(stamps[i], i > 0 ? stamps[i - 1] : 0) << "frame " << i;
  }
  EXPECT_EQ(got_.back(), big);
  EXPECT_EQ(small.counters().rx_truncated, 1u);
  EXPECT_EQ(small.counters().rx_frames, kFrames);
  EXPECT_EQ(pb_->counters().rx_dropped, 0u);
}

TEST(AfPacketPort, ErrorsNameTheInterface) {
  if (const std::string why = live::netns_unavailable(); !why.empty()) {
    GTEST_SKIP() << why;
  }
  live::EpollLoop loop;
  try {
    live::AfPacketPort p(loop, "nosuchif0", 1'000'000'000);
    FAIL() << "opened an interface that does not exist";
  } catch (const common::Error& e) {
    EXPECT_NE(std::string(e.what()).find("interface nosuchif0: no such interface"), std::string::npos) << e.what();
  }
  EXPECT_THROW(live::AfPacketPort(loop, "a-name-far-too-long-for-linux", 1), common::Error);
}
