// Drivers: event ordering, exact link timing against the analytic formula, link failure, wall-clock loop, PFC frames.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "ifec/common/pfc.h"
#include "ifec/common/sim.h"

using namespace ifec::common;

TEST(EventLoop, RunsInTimeThenSchedulingOrder) {
  EventLoop loop;
  std::vector<int> order;
  loop.schedule(20, [&] { order.push_back(3); });
  loop.schedule(10, [&] { order.push_back(1); });
  loop.schedule(10, [&] { order.push_back(2); });
  loop.schedule(5, [&] {
    order.push_back(0);
    loop.schedule(10, [&] { order.push_back(21); });  // same time as two earlier events: runs after them
  });
  EXPECT_EQ(loop.run(), 5u);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 21, 3}));
  EXPECT_EQ(loop.now(), 20u);
}

TEST(EventLoop, RunUntilStopsAtTheLimit) {
  EventLoop loop;
  int ran = 0;
  loop.schedule(100, [&] { ++ran; });
  loop.schedule(200, [&] { ++ran; });
  loop.run(150);
  EXPECT_EQ(ran, 1);
  EXPECT_EQ(loop.next_event_time(), 200u);
}

// The loop remembers its earliest event between calls: an event scheduled earlier than the remembered one, in
// the wheel or in the heap, takes its place; a later one or one at the same time does not.
TEST(EventLoop, AnEarlierEventScheduledAfterALookReplacesTheEarliest) {
  EventLoop loop;
  std::vector<int> order;
  loop.schedule(3000, [&] { order.push_back(3); });
  EXPECT_EQ(loop.next_event_time(), 3000u);
  loop.schedule(3000, [&] { order.push_back(4); });  // same time: after the first
  loop.schedule(9000, [&] { order.push_back(5); });  // beyond the wheel: the heap
  EXPECT_EQ(loop.next_event_time(), 3000u);
  loop.schedule(200, [&] { order.push_back(1); });  // earlier, in the wheel
  EXPECT_EQ(loop.next_event_time(), 200u);
  loop.run(250);  // the time moves past the wheel's last event run: the next one lands in the heap
  loop.schedule(6000, [&] { order.push_back(6); });
  loop.schedule(255, [&] { order.push_back(2); });
  EXPECT_EQ(loop.next_event_time(), 255u);
  EXPECT_EQ(loop.run(), 5u);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3, 4, 6, 5}));

  // Only timers, in the heap: an earlier timer becomes the top, and pop takes it from there.
  EventLoop timers;
  std::vector<int> fired;
  timers.schedule(90000, [&] { fired.push_back(2); });
  EXPECT_EQ(timers.next_event_time(), 90000u);
  timers.schedule(80000, [&] { fired.push_back(1); });
  EXPECT_EQ(timers.next_event_time(), 80000u);
  timers.schedule(95000, [&] { fired.push_back(3); });
  EXPECT_EQ(timers.run(), 3u);
  EXPECT_EQ(fired, (std::vector<int>{1, 2, 3}));
}

// Near events (the wheel), far ones (the heap) and ones that cross from one to the other as time moves, scheduled
// before and during the run, in slices: every event runs at its time, equal times in scheduling order, against a
// reference that sorts (time, scheduling number).
TEST(EventLoop, ManyEventsNearAndFarRunInTimeThenSchedulingOrder) {
  EventLoop loop;
  uint64_t x = 88172645463325252ull;
  auto rnd = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  struct Planned {
    TimeNs at;
    uint64_t seq;
  };
  std::vector<Planned> planned;
  std::vector<std::pair<TimeNs, uint64_t>> ran;
  uint64_t seq = 0;
  std::function<void(TimeNs, int)> add = [&](TimeNs at, int depth) {
    const uint64_t s = seq++;
    planned.push_back({at, s});
    loop.schedule(at, [&, at, s, depth] {
      EXPECT_EQ(loop.now(), at);
      ran.push_back({at, s});
      if (depth < 3) {
        for (int k = static_cast<int>(rnd() % 3); k > 0; --k) {
          const uint64_t r = rnd() % 10;  // same ns, near (within the wheel), or far (tens of microseconds on)
          add(loop.now() + (r < 3 ? 0 : r < 8 ? rnd() % 3000 : 4096 + rnd() % 60000), depth + 1);
        }
      }
    });
  };
  for (int i = 0; i < 3000; ++i) {
    add(rnd() % 200000, 0);
  }
  while (!loop.idle()) {
    loop.run(loop.now() + 1 + rnd() % 5000);
  }
  std::sort(planned.begin(), planned.end(),
            [](const Planned& a, const Planned& b) { return a.at != b.at ? a.at < b.at : a.seq < b.seq; });
  ASSERT_EQ(ran.size(), planned.size());
  for (size_t i = 0; i < ran.size(); ++i) {
    ASSERT_EQ(ran[i].first, planned[i].at) << i;
    ASSERT_EQ(ran[i].second, planned[i].seq) << i;
  }
  EXPECT_GT(ran.size(), 6000u);
}

// A prefetch hint changes nothing but the cache: events scheduled with one run in the same time and scheduling
// order as plain ones, and a hint at memory that is gone by then (a freed frame, a null pointer) is harmless.
TEST(EventLoop, EventsThatSayWhatTheyReadRunInTheSameOrder) {
  EventLoop loop;
  std::vector<int> order;
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(page, MAP_FAILED);
  munmap(page, 4096);
  const auto* stale = static_cast<const uint8_t*>(page);  // unmapped by now
  loop.schedule_reading(
      10, [&] { order.push_back(1); }, stale, 4096);
  loop.schedule(10, [&] { order.push_back(2); });
  loop.schedule_reading(
      5, [&] { order.push_back(0); }, nullptr, 0);
  loop.schedule_reading(
      9000, [&] { order.push_back(4); }, stale, 64);  // beyond the wheel: in the heap
  loop.schedule_reading(
      10, [&] { order.push_back(3); }, stale, 100000);
  EXPECT_EQ(loop.run(), 5u);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(Link, OneFrameArrivesAfterSerializationPlusPropagation) {
  EventLoop loop;
  LinkConfig cfg{400'000'000'000ULL, 500, 24};
  Link link(loop, cfg);
  TimeNs arrived = 0;
  link.end(1).set_receiver([&](std::vector<uint8_t>&& f) {
    arrived = loop.now();
    EXPECT_EQ(f.size(), 1000u);
  });
  ASSERT_TRUE(link.end(0).send(std::vector<uint8_t>(1000, 0)));
  EXPECT_TRUE(link.end(0).busy());
  loop.run();
  // (1000 + 24) bytes * 8 / 400 Gb/s = 20.48 ns -> the frame is complete within ns 21; + 500 ns.
  EXPECT_EQ(arrived, 21u + 500u);
  EXPECT_EQ(link.end(0).counters().tx_frames, 1u);
  EXPECT_EQ(link.end(1).counters().rx_bytes, 1000u);
}

TEST(Link, BackToBackFramesDoNotAccumulateRounding) {
  EventLoop loop;
  LinkConfig cfg{400'000'000'000ULL, 700, 24};
  Link link(loop, cfg);
  const int kFrames = 1000;
  const size_t kBytes = 4174;  // 83.96 ns each: rounding up per frame would add ~40 ns over 1000 frames
  int sent = 0;
  TimeNs last = 0;
  link.end(1).set_receiver([&](std::vector<uint8_t>&&) { last = loop.now(); });
  auto pump = [&] {
    if (sent < kFrames && !link.end(0).busy()) {
      ++sent;
      link.end(0).send(std::vector<uint8_t>(kBytes, 0));
    }
  };
  link.end(0).set_tx_ready(pump);
  pump();
  loop.run();
  const double exact_ns = kFrames * (kBytes + 24) * 8 / 400.0;  // 83960 ns
  EXPECT_EQ(last, static_cast<TimeNs>(std::ceil(exact_ns)) + 700);
  EXPECT_EQ(link.end(0).counters().busy_ps, static_cast<uint64_t>(exact_ns * 1000));
}

TEST(Link, DownLinkRefusesAndLosesInFlightFrames) {
  EventLoop loop;
  Link link(loop, LinkConfig{100'000'000'000ULL, 1000, 24});
  int received = 0;
  link.end(1).set_receiver([&](std::vector<uint8_t>&&) { ++received; });
  ASSERT_TRUE(link.end(0).send(std::vector<uint8_t>(100, 0)));
  loop.schedule(500, [&] { link.set_up(false); });  // the frame is propagating
  loop.run();
  EXPECT_EQ(received, 0);
  EXPECT_EQ(link.end(0).counters().dropped_link_down, 1u);
  EXPECT_FALSE(link.end(0).send(std::vector<uint8_t>(100, 0)));
  EXPECT_EQ(link.end(0).counters().dropped_link_down, 2u);
  link.set_up(true);
  ASSERT_TRUE(link.end(0).send(std::vector<uint8_t>(100, 0)));
  loop.run();
  EXPECT_EQ(received, 1);
}

TEST(Link, RejectsZeroRate) {
  EventLoop loop;
  EXPECT_ANY_THROW(Link(loop, LinkConfig{0, 1, 0}));
}

TEST(RealtimeLoop, RunsEventsNoEarlierThanScheduledInOrder) {
  RealtimeLoop loop;
  std::vector<std::pair<int, TimeNs>> seen;
  const TimeNs t0 = loop.now();
  loop.schedule(t0 + 2'000'000, [&] { seen.push_back({2, loop.now()}); });
  loop.schedule(t0 + 1'000'000, [&] { seen.push_back({1, loop.now()}); });
  loop.run(t0 + 1'000'000'000);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].first, 1);
  EXPECT_GE(seen[0].second, t0 + 1'000'000);
  EXPECT_GE(seen[1].second, t0 + 2'000'000);
}

TEST(PfcFrame, EncodesIeee8021QbbLayout) {
  PfcFrame f;
  f.src = {0x02, 0, 0, 0, 0, 9};
  f.class_enable = 1 << 3;
  f.quanta[3] = 0xFFFF;
  std::vector<uint8_t> b = f.encode();
  ASSERT_EQ(b.size(), 60u);
  EXPECT_EQ(std::vector<uint8_t>(b.begin(), b.begin() + 6), (std::vector<uint8_t>{0x01, 0x80, 0xC2, 0, 0, 1}));
  EXPECT_EQ(b[12], 0x88);
  EXPECT_EQ(b[13], 0x08);
  EXPECT_EQ(b[14], 0x01);
  EXPECT_EQ(b[15], 0x01);
  EXPECT_EQ(b[17], 0x08) << "class-enable vector bit 3";
  EXPECT_EQ(b[18 + 6], 0xFF);
  EXPECT_EQ(b[19 + 6], 0xFF);
  PfcFrame d;
  ASSERT_TRUE(PfcFrame::decode(b.data(), b.size(), &d).ok());
  EXPECT_EQ(d.class_enable, 1 << 3);
  EXPECT_EQ(d.quanta[3], 0xFFFF);
  b[15] = 0x02;
  EXPECT_EQ(PfcFrame::decode(b.data(), b.size(), &d).error, WireError::kBadMacControl);
  EXPECT_EQ(PfcFrame::decode(b.data(), 20, &d).error, WireError::kTruncated);
}

TEST(PfcFrame, QuantaAre512BitTimes) {
  EXPECT_EQ(pfc_quanta_ns(1, 512'000'000'000ULL), 1u);
  EXPECT_EQ(pfc_quanta_ns(0xFFFF, 400'000'000'000ULL), 83885u);  // 65535 * 512 / 400 = 83884.8
}

TEST(Link, InjectedLossIsCountedAndNearItsProbability) {
  EventLoop loop;
  LinkConfig cfg{100'000'000'000ULL, 10, 24};
  cfg.loss_probability = 0.05;
  cfg.loss_seed = 9;
  Link link(loop, cfg);
  int received = 0;
  int sent = 0;
  link.end(1).set_receiver([&](std::vector<uint8_t>&&) { ++received; });
  auto pump = [&] {
    if (sent < 20000 && !link.end(0).busy()) {
      ++sent;
      link.end(0).send(std::vector<uint8_t>(64, 0));
    }
  };
  link.end(0).set_tx_ready(pump);
  pump();
  loop.run();
  const uint64_t lost = link.end(0).counters().dropped_injected;
  EXPECT_EQ(received + lost, 20000u);
  EXPECT_NEAR(lost / 20000.0, 0.05, 0.005);
}
