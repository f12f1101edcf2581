// Tests for DescriptorRing: ordering, capacity checks, wrap-around, concurrent producers, quiet() and the bench.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "ifec/common/checks.h"
#include "ifec/endpoint/ring.h"
#include "ifec/endpoint/ring_bench.h"

namespace ifec::endpoint {
namespace {

using std::chrono::milliseconds;

// Mixes every field but `value` and `seq`, so a consumer can tell a torn (half-written) slot from a whole one.
uint64_t checksum(const Descriptor& d) {
  uint64_t h = 0x9E3779B97F4A7C15ULL;
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x100000001B3ULL + (h >> 29); };
  mix(d.op);
  mix(d.signal_op);
  mix(d.target);
  mix(d.window);
  mix(d.signal_window);
  mix(d.length);
  mix(d.reserved);
  mix(d.remote_offset);
  mix(d.local_addr);
  mix(d.compare);
  mix(d.signal_offset);
  mix(d.result_addr);
  return h;
}

Descriptor make_desc(uint16_t producer, uint64_t i) {
  Descriptor d;
  d.op = static_cast<uint8_t>(1 + i % 7);
  d.signal_op = static_cast<uint8_t>(i & 1);
  d.target = producer;
  d.window = static_cast<uint16_t>(i * 3);
  d.signal_window = static_cast<uint16_t>(i * 5 + 1);
  d.length = static_cast<uint32_t>(i * 7 + producer);
  d.reserved = static_cast<uint32_t>(~i);
  d.remote_offset = i;
  d.local_addr = i * 0x1000 + producer;
  d.compare = i ^ 0xABCDEF;
  d.signal_offset = i << 3;
  d.result_addr = ~i;
  d.value = checksum(d);
  return d;
}

void expect_same_fields(const Descriptor& a, const Descriptor& b) {
  EXPECT_EQ(0, std::memcmp(reinterpret_cast<const char*>(&a) + 8, reinterpret_cast<const char*>(&b) + 8,
                           sizeof(Descriptor) - 8));
}

TEST(DescriptorRing, PostThenPopKeepsOrderAndFields) {
  DescriptorRing ring(8);
  EXPECT_EQ(ring.capacity(), 8u);
  for (uint64_t i = 0; i < 5; ++i) EXPECT_EQ(ring.post(make_desc(2, i)), i);
  EXPECT_EQ(ring.issued(), 5u);
  EXPECT_EQ(ring.doorbell(), 5u);
  for (uint64_t i = 0; i < 5; ++i) {
    Descriptor d;
    ASSERT_TRUE(ring.try_pop(&d));
    EXPECT_EQ(d.seq, i + 1);
    expect_same_fields(d, make_desc(2, i));
  }
  Descriptor d;
  EXPECT_FALSE(ring.try_pop(&d));
  EXPECT_EQ(ring.consumed(), 5u);
  EXPECT_EQ(ring.completed(), 0u);
}

TEST(DescriptorRing, PostIgnoresCallerSeq) {
  DescriptorRing ring(2);
  Descriptor in = make_desc(0, 1);
  in.seq = 12345;
  ring.post(in);
  Descriptor out;
  ASSERT_TRUE(ring.try_pop(&out));
  EXPECT_EQ(out.seq, 1u);
}

TEST(DescriptorRing, RejectsCapacityThatIsNotAPowerOfTwo) {
  for (size_t bad : {size_t{0}, size_t{3}, size_t{100}, size_t{1000}, DescriptorRing::kMaxCapacity * 2}) {
    try {
      DescriptorRing ring(bad);
      ADD_FAILURE() << "capacity " << bad << " accepted";
    } catch (const common::Error& e) {
      EXPECT_NE(std::string(e.what()).find("capacity " + std::to_string(bad)), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(DescriptorRing ring(1));
}

TEST(DescriptorRing, WrapsAroundManyTimes) {
  DescriptorRing ring(4);
  Descriptor d;
  for (uint64_t i = 0; i < 10000; ++i) {
    ring.post(make_desc(1, i));
    if (i % 3 == 2) {  // keep 1..3 slots in flight so wrap happens at every offset
      while (ring.try_pop(&d)) {
        ASSERT_EQ(d.value, checksum(d));
        ring.mark_completed(false);
      }
    }
  }
  while (ring.try_pop(&d)) ring.mark_completed(false);
  EXPECT_EQ(d.seq, 10000u);
  expect_same_fields(d, make_desc(1, 9999));
  EXPECT_EQ(ring.consumed(), 10000u);
  EXPECT_TRUE(ring.quiet(milliseconds(0)));
}

TEST(DescriptorRing, ViewSharesAnExternalRegion) {
  const size_t bytes = DescriptorRing::region_bytes(16);
  auto storage = std::make_unique<uint64_t[]>(bytes / 8 + 8);
  void* region = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(storage.get()) + 63) & ~uintptr_t{63});
  RingHeader* hdr = DescriptorRing::init_region(region, bytes, 16);
  EXPECT_EQ(hdr->capacity, 16u);
  EXPECT_GE(hdr->slots_offset, sizeof(RingHeader));
  DescriptorRing producer = DescriptorRing::view(region);
  DescriptorRing consumer = DescriptorRing::view(region);
  producer.post(make_desc(3, 7));
  Descriptor d;
  ASSERT_TRUE(consumer.try_pop(&d));
  expect_same_fields(d, make_desc(3, 7));
  consumer.mark_completed(true);
  EXPECT_EQ(producer.completed(), 1u);
  EXPECT_EQ(producer.errors(), 1u);
  EXPECT_EQ(hdr->tail, 1u);

  hdr->capacity = 12;
  EXPECT_THROW(DescriptorRing::view(region), common::Error);
  EXPECT_THROW(DescriptorRing::init_region(region, bytes - 1, 16), common::Error);
}

TEST(DescriptorRing, PostWaitsForAFreeSlot) {
  DescriptorRing ring(2);
  ring.post(make_desc(0, 0));
  ring.post(make_desc(0, 1));
  std::atomic<bool> posted{false};
  std::thread t([&] {
    ring.post(make_desc(0, 2));
    posted = true;
  });
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_FALSE(posted.load()) << "third post into a full ring of 2 did not wait";
  Descriptor d;
  ASSERT_TRUE(ring.try_pop(&d));
  t.join();
  EXPECT_TRUE(posted.load());
  ASSERT_TRUE(ring.try_pop(&d));
  ASSERT_TRUE(ring.try_pop(&d));
  expect_same_fields(d, make_desc(0, 2));
}

TEST(DescriptorRing, ConcurrentProducersDeliverEveryTicketOnceUntorn) {
  constexpr int kProducers = 4;
  constexpr uint64_t kPerProducer = 100000;
  DescriptorRing ring(1024);
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&ring, p] {
      for (uint64_t i = 0; i < kPerProducer; ++i) ring.post(make_desc(static_cast<uint16_t>(p), i));
    });
  }
  std::vector<uint8_t> seen(kProducers * kPerProducer, 0);
  std::vector<uint64_t> next_index(kProducers, 0);
  uint64_t popped = 0, torn = 0, out_of_range = 0, producer_reordered = 0;
  Descriptor d;
  while (popped < kProducers * kPerProducer) {
    if (!ring.try_pop(&d)) {
      std::this_thread::yield();
      continue;
    }
    if (d.seq != popped + 1) {
      ADD_FAILURE() << "ticket " << popped << " arrived with seq " << d.seq;
      break;
    }
    ++popped;
    if (d.value != checksum(d)) ++torn;
    if (d.target >= kProducers || d.remote_offset >= kPerProducer) {
      ++out_of_range;
      continue;
    }
    // One producer's posts take increasing tickets, so they pop in its program order.
    if (d.remote_offset != next_index[d.target]) ++producer_reordered;
    next_index[d.target] = d.remote_offset + 1;
    ++seen[d.target * kPerProducer + d.remote_offset];
    ring.mark_completed(false);
  }
  for (auto& t : producers) t.join();
  EXPECT_EQ(torn, 0u);
  EXPECT_EQ(out_of_range, 0u);
  EXPECT_EQ(producer_reordered, 0u);
  uint64_t not_once = 0;
  for (uint8_t s : seen) not_once += s != 1;
  EXPECT_EQ(not_once, 0u);
  EXPECT_FALSE(ring.try_pop(&d));
  EXPECT_EQ(ring.issued(), kProducers * kPerProducer);
  EXPECT_EQ(ring.doorbell(), kProducers * kPerProducer);
  EXPECT_TRUE(ring.quiet(milliseconds(0)));
}

TEST(DescriptorRing, QuietWaitsForCompletions) {
  DescriptorRing ring(8);
  for (int i = 0; i < 3; ++i) ring.post(make_desc(0, i));
  std::atomic<bool> completed_all{false};
  std::thread consumer([&] {
    std::this_thread::sleep_for(milliseconds(30));
    Descriptor d;
    for (int i = 0; i < 3; ++i) {
      while (!ring.try_pop(&d)) std::this_thread::yield();
      if (i == 2) completed_all = true;
      ring.mark_completed(i == 1);
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(ring.quiet());
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_TRUE(completed_all.load());
  EXPECT_GE(ring.completed(), 3u);
  EXPECT_EQ(ring.errors(), 1u);
  EXPECT_GE(waited, milliseconds(25));
  consumer.join();
}

TEST(DescriptorRing, QuietTimesOutWhenNothingCompletes) {
  DescriptorRing ring(8);
  EXPECT_TRUE(ring.quiet(milliseconds(0))) << "an idle ring is quiet";
  ring.post(make_desc(0, 0));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(ring.quiet(milliseconds(20)));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(20));
  Descriptor d;
  ASSERT_TRUE(ring.try_pop(&d));
  EXPECT_FALSE(ring.quiet(milliseconds(1))) << "popped is not completed";
  ring.mark_completed(false);
  EXPECT_TRUE(ring.quiet(milliseconds(1)));
}

TEST(DescriptorRing, QuietIgnoresPostsAfterTheCall) {
  DescriptorRing ring(8);
  ring.post(make_desc(0, 0));
  std::thread late([&] {
    std::this_thread::sleep_for(milliseconds(50));  // lets the main thread enter quiet() first
    Descriptor d;
    while (!ring.try_pop(&d)) std::this_thread::yield();
    ring.post(make_desc(0, 1));  // after quiet() read head: must not be waited for
    ring.mark_completed(false);
  });
  EXPECT_TRUE(ring.quiet(std::chrono::seconds(5)));
  late.join();
  EXPECT_EQ(ring.completed(), 1u);
}

TEST(RingBench, MeasuresARate) {
  const RingBenchResult r = bench_descriptor_rate(2, 20000, 256);
  EXPECT_EQ(r.producer_threads, 2);
  EXPECT_EQ(r.descriptors, 20000u);
  EXPECT_EQ(r.capacity, 256u);
  EXPECT_GT(r.seconds, 0);
  EXPECT_NEAR(r.descriptors_per_s, 20000 / r.seconds, 1e-6 * r.descriptors_per_s);
  EXPECT_THROW(bench_descriptor_rate(0, 10, 16), common::Error);
  EXPECT_THROW(bench_descriptor_rate(1, 10, 15), common::Error);
}

}  // namespace
}  // namespace ifec::endpoint
