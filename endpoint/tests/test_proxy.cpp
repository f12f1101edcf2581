// Tests for Proxy: thread and poll_once modes, synchronous and asynchronous sinks, ordering, errors, stop().
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ifec/common/checks.h"
#include "ifec/endpoint/proxy.h"
#include "ifec/endpoint/ring.h"
#include "ifec/endpoint/sink.h"

namespace ifec::endpoint {
namespace {

using std::chrono::milliseconds;

constexpr uint16_t kFailingTarget = 13;  // RecordingSink NAKs everything sent here

Descriptor make_put(uint16_t target, uint64_t id) {
  Descriptor d;
  d.op = static_cast<uint8_t>(DescOp::kPut);
  d.target = target;
  d.window = 1;
  d.length = 8;
  d.remote_offset = id;
  d.value = id;
  return d;
}

// Records what it is given; completes at once (kImmediate), or from progress() in batches and in reverse order
// (kDeferredReversed), or never (kNever). Everything runs on the proxy thread; the mutex only guards reads from
// the test thread.
class RecordingSink : public TransactionSink {
 public:
  enum class Mode { kImmediate, kDeferredReversed, kNever };
  explicit RecordingSink(Mode mode) : mode_(mode) {}

  void submit(int source, const Descriptor& d, LocalMemory& mem, Done done) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      seen_.push_back(d);
      sources_.push_back(source);
    }
    OpStatus status = d.target == kFailingTarget ? OpStatus::kRemoteAccessError : OpStatus::kOk;
    if (status == OpStatus::kOk && d.op == static_cast<uint8_t>(DescOp::kPut) && d.local_addr != 0) {
      uint64_t payload = 0;
      mem.read(d.local_addr, &payload, sizeof(payload));
      std::lock_guard<std::mutex> lock(mu_);
      payloads_.push_back(payload);
    }
    if (status == OpStatus::kOk && d.op == static_cast<uint8_t>(DescOp::kFetchAdd) && d.result_addr != 0) {
      const uint64_t old = 1000 + d.value;
      mem.write(d.result_addr, &old, sizeof(old));
    }
    if (mode_ == Mode::kImmediate) {
      done(status);
    } else {
      deferred_.push_back({std::move(done), status});
    }
  }

  bool progress() override {
    ++progress_calls_;
    if (mode_ == Mode::kDeferredReversed && progress_calls_ % 3 == 0) {
      // Finish the oldest batch newest-first: the proxy has to restore ticket order.
      std::vector<Pending> batch;
      batch.swap(deferred_);
      for (auto it = batch.rbegin(); it != batch.rend(); ++it) it->done(it->status);
    }
    return !deferred_.empty();
  }

  std::vector<Descriptor> seen() const {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }
  std::vector<uint64_t> payloads() const {
    std::lock_guard<std::mutex> lock(mu_);
    return payloads_;
  }
  std::vector<int> sources() const {
    std::lock_guard<std::mutex> lock(mu_);
    return sources_;
  }
  size_t deferred() const { return deferred_.size(); }  // proxy thread only (or after stop)
  void complete_one_deferred(size_t index, OpStatus s) { deferred_[index].done(s); }

 private:
  struct Pending {
    Done done;
    OpStatus status;
  };
  Mode mode_;
  mutable std::mutex mu_;
  std::vector<Descriptor> seen_;
  std::vector<int> sources_;
  std::vector<uint64_t> payloads_;
  std::vector<Pending> deferred_;
  uint64_t progress_calls_ = 0;
};

void check_each_id_once(const std::vector<Descriptor>& seen, uint64_t n) {
  std::vector<int> count(n, 0);
  for (const auto& d : seen) {
    ASSERT_LT(d.value, n);
    EXPECT_EQ(d.remote_offset, d.value);
    ++count[d.value];
  }
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(count[i], 1) << "id " << i;
}

TEST(Proxy, ThreadSubmitsEveryDescriptorAndCountsErrors) {
  DescriptorRing ring(64);
  RecordingSink sink(RecordingSink::Mode::kImmediate);
  HostMemory mem;
  Proxy proxy(ring, sink, mem, 5);
  proxy.start();
  EXPECT_TRUE(proxy.running());
  constexpr int kThreads = 3;
  constexpr uint64_t kPer = 2000;
  std::vector<std::thread> producers;
  for (int t = 0; t < kThreads; ++t) {
    producers.emplace_back([&, t] {
      for (uint64_t i = 0; i < kPer; ++i) {
        const uint64_t id = t * kPer + i;
        ring.post(make_put(id % 50 == 0 ? kFailingTarget : 1, id));
      }
    });
  }
  for (auto& p : producers) p.join();
  ASSERT_TRUE(ring.quiet(std::chrono::seconds(10)));
  proxy.stop();
  EXPECT_FALSE(proxy.running());
  const uint64_t n = kThreads * kPer;
  EXPECT_EQ(ring.completed(), n);
  EXPECT_EQ(ring.errors(), n / 50);
  check_each_id_once(sink.seen(), n);
  for (int s : sink.sources()) ASSERT_EQ(s, 5);
  const ProxyStats st = proxy.stats();
  EXPECT_EQ(st.submitted, n);
  EXPECT_EQ(st.completed, n);
  EXPECT_EQ(st.errors, n / 50);
  EXPECT_EQ(st.sink_exceptions, 0u);
  EXPECT_EQ(st.duplicate_completions, 0u);
  EXPECT_EQ(proxy.outstanding(), 0u);
  EXPECT_GT(st.polls, 0u);
}

TEST(Proxy, AsyncSinkCompletesFromProgress) {
  DescriptorRing ring(32);
  RecordingSink sink(RecordingSink::Mode::kDeferredReversed);
  HostMemory mem;
  Proxy proxy(ring, sink, mem, 0);
  proxy.start();
  for (uint64_t i = 0; i < 500; ++i) ring.post(make_put(i % 7 == 3 ? kFailingTarget : 2, i));
  ASSERT_TRUE(ring.quiet(std::chrono::seconds(10)));
  proxy.stop();
  EXPECT_EQ(ring.completed(), 500u);
  EXPECT_EQ(ring.errors(), 71u);  // i % 7 == 3 for i < 500
  check_each_id_once(sink.seen(), 500);
  EXPECT_EQ(sink.deferred(), 0u);
}

TEST(Proxy, CompletionsRetireInTicketOrder) {
  DescriptorRing ring(8);
  RecordingSink sink(RecordingSink::Mode::kNever);
  HostMemory mem;
  Proxy proxy(ring, sink, mem, 0);
  for (uint64_t i = 0; i < 3; ++i) ring.post(make_put(1, i));
  EXPECT_EQ(proxy.poll_once(), 3u);
  ASSERT_EQ(sink.deferred(), 3u);
  sink.complete_one_deferred(2, OpStatus::kOk);
  sink.complete_one_deferred(1, OpStatus::kRetryExceeded);
  // Tickets 1 and 2 are done but 0 is not: quiet() must not see them yet.
  EXPECT_EQ(ring.completed(), 0u);
  EXPECT_EQ(proxy.outstanding(), 3u);
  sink.complete_one_deferred(0, OpStatus::kOk);
  EXPECT_EQ(ring.completed(), 3u);
  EXPECT_EQ(ring.errors(), 1u);
  EXPECT_EQ(proxy.outstanding(), 0u);
  sink.complete_one_deferred(0, OpStatus::kOk);  // a buggy sink calling done twice
  EXPECT_EQ(ring.completed(), 3u);
  EXPECT_EQ(proxy.stats().duplicate_completions, 1u);
}

TEST(Proxy, PollOnceDrivesTheRingWithoutAThread) {
  DescriptorRing ring(16);
  RecordingSink sink(RecordingSink::Mode::kImmediate);
  HostMemory mem;
  ProxyOptions opts;
  opts.max_batch = 4;
  Proxy proxy(ring, sink, mem, 1, opts);
  EXPECT_EQ(proxy.poll_once(), 0u);
  for (uint64_t i = 0; i < 10; ++i) ring.post(make_put(1, i));
  EXPECT_EQ(proxy.poll_once(), 4u);
  EXPECT_EQ(ring.completed(), 4u);
  EXPECT_EQ(proxy.poll_once(), 4u);
  EXPECT_EQ(proxy.poll_once(), 2u);
  EXPECT_EQ(proxy.poll_once(), 0u);
  EXPECT_TRUE(ring.quiet(milliseconds(0)));
  check_each_id_once(sink.seen(), 10);
  EXPECT_EQ(proxy.stats().idle_polls, 2u);
  proxy.start();
  EXPECT_THROW(proxy.poll_once(), common::Error);
  EXPECT_THROW(proxy.start(), common::Error);
}

TEST(Proxy, MaxOutstandingStopsPopping) {
  DescriptorRing ring(16);
  RecordingSink sink(RecordingSink::Mode::kNever);
  HostMemory mem;
  ProxyOptions opts;
  opts.max_outstanding = 5;
  Proxy proxy(ring, sink, mem, 0, opts);
  for (uint64_t i = 0; i < 12; ++i) ring.post(make_put(1, i));
  EXPECT_EQ(proxy.poll_once(), 5u);
  EXPECT_EQ(proxy.poll_once(), 0u);
  EXPECT_EQ(ring.consumed(), 5u);
  sink.complete_one_deferred(0, OpStatus::kOk);
  EXPECT_EQ(proxy.poll_once(), 1u);
  EXPECT_EQ(ring.consumed(), 6u);
}

TEST(Proxy, StopWithPendingWorkDoesNotHang) {
  DescriptorRing ring(256);
  RecordingSink sink(RecordingSink::Mode::kNever);
  HostMemory mem;
  ProxyOptions opts;
  opts.max_outstanding = 40;
  Proxy proxy(ring, sink, mem, 0, opts);
  proxy.start();
  for (uint64_t i = 0; i < 100; ++i) ring.post(make_put(1, i));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (proxy.stats().submitted < 40 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  const auto t0 = std::chrono::steady_clock::now();
  proxy.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  EXPECT_EQ(proxy.stats().submitted, 40u);
  EXPECT_EQ(ring.consumed(), 40u) << "the other 60 stay in the ring";
  EXPECT_EQ(ring.completed(), 0u);
  EXPECT_FALSE(ring.quiet(milliseconds(1)));
  proxy.stop();  // idempotent
}

TEST(Proxy, DestructorStopsARunningProxy) {
  DescriptorRing ring(8);
  RecordingSink sink(RecordingSink::Mode::kImmediate);
  HostMemory mem;
  {
    Proxy proxy(ring, sink, mem, 0);
    proxy.start();
    ring.post(make_put(1, 0));
    ASSERT_TRUE(ring.quiet(std::chrono::seconds(5)));
  }
  EXPECT_EQ(ring.completed(), 1u);
}

TEST(Proxy, FencesReachTheSinkInOrder) {
  DescriptorRing ring(16);
  RecordingSink sink(RecordingSink::Mode::kImmediate);
  HostMemory mem;
  Proxy proxy(ring, sink, mem, 0);
  ring.post(make_put(4, 0));
  Descriptor fence;
  fence.op = static_cast<uint8_t>(DescOp::kFence);
  fence.target = kFenceAllTargets;
  ring.post(fence);
  ring.post(make_put(4, 1));
  proxy.poll_once();
  const auto seen = sink.seen();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].op, static_cast<uint8_t>(DescOp::kPut));
  EXPECT_EQ(seen[1].op, static_cast<uint8_t>(DescOp::kFence));
  EXPECT_EQ(seen[1].target, kFenceAllTargets);
  EXPECT_EQ(seen[2].value, 1u);
  EXPECT_EQ(proxy.stats().fences, 1u);
  EXPECT_EQ(ring.completed(), 3u);
}

TEST(Proxy, PayloadsAndResultsGoThroughLocalMemory) {
  DescriptorRing ring(8);
  RecordingSink sink(RecordingSink::Mode::kImmediate);
  HostMemory mem;
  Proxy proxy(ring, sink, mem, 0);
  uint64_t payload = 0x1122334455667788ULL;
  uint64_t result = 0;
  Descriptor put = make_put(1, 0);
  put.local_addr = reinterpret_cast<uintptr_t>(&payload);
  ring.post(put);
  Descriptor fadd;
  fadd.op = static_cast<uint8_t>(DescOp::kFetchAdd);
  fadd.target = 1;
  fadd.value = 7;
  fadd.result_addr = reinterpret_cast<uintptr_t>(&result);
  ring.post(fadd);
  proxy.poll_once();
  ASSERT_TRUE(ring.quiet(milliseconds(0)));
  ASSERT_EQ(sink.payloads().size(), 1u);
  EXPECT_EQ(sink.payloads()[0], payload);
  EXPECT_EQ(result, 1007u);
}

// Throws from submit() for one target: the proxy must survive and complete the descriptor as an error.
class ThrowingSink : public TransactionSink {
 public:
  void submit(int, const Descriptor& d, LocalMemory&, Done done) override {
    if (d.target == 9) throw std::runtime_error("target 9 unreachable");
    done(OpStatus::kOk);
  }
  bool progress() override { return false; }
};

TEST(Proxy, SinkExceptionCompletesTheDescriptorAsAnError) {
  DescriptorRing ring(8);
  ThrowingSink sink;
  HostMemory mem;
  Proxy proxy(ring, sink, mem, 0);
  ring.post(make_put(1, 0));
  ring.post(make_put(9, 1));
  ring.post(make_put(1, 2));
  EXPECT_EQ(proxy.poll_once(), 3u);
  EXPECT_EQ(ring.completed(), 3u);
  EXPECT_EQ(ring.errors(), 1u);
  EXPECT_EQ(proxy.stats().sink_exceptions, 1u);
  EXPECT_EQ(proxy.last_sink_error(), "target 9 unreachable");
}

TEST(OpStatus, HasNames) {
  EXPECT_STREQ(op_status_name(OpStatus::kOk), "ok");
  EXPECT_STREQ(op_status_name(OpStatus::kRemoteAccessError), "remote_access_error");
  EXPECT_STREQ(op_status_name(OpStatus::kRetryExceeded), "retry_exceeded");
  EXPECT_STREQ(op_status_name(OpStatus::kInvalidArgument), "invalid_argument");
  EXPECT_STREQ(op_status_name(OpStatus::kPending), "pending");
}

TEST(HostMemory, ReadsAndWritesHostPointers) {
  HostMemory mem;
  char buf[8] = "abcdefg";
  char out[8] = {};
  mem.read(reinterpret_cast<uintptr_t>(buf), out, sizeof(out));
  EXPECT_STREQ(out, "abcdefg");
  mem.write(reinterpret_cast<uintptr_t>(buf) + 2, "XY", 2);
  EXPECT_STREQ(buf, "abXYefg");
}

}  // namespace
}  // namespace ifec::endpoint
