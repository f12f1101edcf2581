// The control plane as byte messages: every op's arguments and answers across client -> serve -> on_reply, ids
// and pending calls, malformed messages refused with a message naming what is wrong, and a real InProcessControl.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "ifec/common/checks.h"
#include "ifec/common/sim.h"
#include "ifec/testbed/fabric.h"
#include "ifec/testbed/in_process.h"
#include "ifec/testbed/message_control.h"

using namespace ifec;
using common::ControlError;
using common::ControlReply;
using common::ControlStatus;
using common::GroupReservation;
using common::IfecCounters;
using common::PortWeight;
using common::WindowRegistration;
using Bytes = std::vector<uint8_t>;

namespace {

// Records what each call got and answers with what the test chose: at once, or when answer_held() runs.
class FakeControl : public common::ControlPlane {
 public:
  std::vector<std::string> calls;
  std::string sw;
  GroupReservation reservation;
  WindowRegistration window;
  uint32_t job = 0;
  uint16_t group = 0;
  int link = -1;
  bool up = false;
  int dest_gpu = -1;

  ControlStatus status;
  ControlReply<uint32_t> slots;
  ControlReply<IfecCounters> counter_set;
  ControlReply<std::vector<PortWeight>> weights;
  bool hold = false;

  void answer_held() {
    auto held = std::move(held_);
    held_.clear();
    for (auto& fn : held) {
      fn();
    }
  }

  void reserve(const std::string& s, const GroupReservation& r, Done done) override {
    record("reserve", s);
    reservation = r;
    answer([done, st = status] { done(st); });
  }
  void release(const std::string& s, uint32_t j, uint16_t g, Done done) override {
    record("release", s);
    job = j;
    group = g;
    answer([done, st = status] { done(st); });
  }
  void register_window(const std::string& s, const WindowRegistration& w, Done done) override {
    record("register_window", s);
    window = w;
    answer([done, st = status] { done(st); });
  }
  void free_slots(const std::string& s, std::function<void(const ControlReply<uint32_t>&)> done) override {
    record("free_slots", s);
    answer([done, r = slots] { done(r); });
  }
  void counters(const std::string& s, std::function<void(const ControlReply<IfecCounters>&)> done) override {
    record("counters", s);
    answer([done, r = counter_set] { done(r); });
  }
  void set_link_state(int l, bool u, Done done) override {
    record("set_link_state", "");
    link = l;
    up = u;
    answer([done, st = status] { done(st); });
  }
  void fare_weights(const std::string& s, int dest,
                    std::function<void(const ControlReply<std::vector<PortWeight>>&)> done) override {
    record("fare_weights", s);
    dest_gpu = dest;
    answer([done, r = weights] { done(r); });
  }

 private:
  void record(const char* op, const std::string& s) {
    calls.push_back(op);
    sw = s;
  }
  void answer(std::function<void()> fn) {
    if (hold) {
      held_.push_back(std::move(fn));
    } else {
      fn();
    }
  }
  std::vector<std::function<void()>> held_;
};

// The two ends and the messages between them, delivered when the test says.
struct Wire {
  FakeControl fake;
  std::vector<Bytes> requests;
  std::vector<Bytes> replies;
  testbed::MessageControlClient client{[this](Bytes m) { requests.push_back(std::move(m)); }};

  void serve() {
    auto sent = std::move(requests);
    requests.clear();
    for (const Bytes& m : sent) {
      testbed::serve_control_request(m, fake, [this](Bytes r) { replies.push_back(std::move(r)); });
    }
  }
  void deliver() {
    auto back = std::move(replies);
    replies.clear();
    for (const Bytes& m : back) {
      client.on_reply(m);
    }
  }
  void run() {
    serve();
    deliver();
  }
};

// The common::Error `fn` throws, or a test failure when it throws none.
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const common::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no common::Error thrown";
  return "";
}

#define EXPECT_MENTIONS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

uint64_t bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, sizeof b);
  return b;
}

GroupReservation odd_reservation() {
  GroupReservation r;
  r.job = 0xdeadbeef;
  r.group = 0xbeef;
  r.op = common::EchOp::kReduce;
  r.dtype = common::EchDtype::kBf16;
  r.redop = common::EchRedOp::kMax;
  r.window = 0x1234;
  r.slots = 0x89abcdef;
  r.members = {{true, 0x0a000001, 0xfedcba9876543210ull, 0x11223344, false},
               {false, 0x0a000002, 0, 0xffffffff, true},
               {true, 0xffffffff, 1, 0, true}};
  r.upstream_ip = 0xc0a80101;
  r.upstream_group = 0xfffe;
  r.upstream_contributor = 0x8001;
  r.upstream_fp32 = false;
  return r;
}

void expect_same(const GroupReservation& a, const GroupReservation& b) {
  EXPECT_EQ(a.job, b.job);
  EXPECT_EQ(a.group, b.group);
  EXPECT_EQ(a.op, b.op);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.redop, b.redop);
  EXPECT_EQ(a.window, b.window);
  EXPECT_EQ(a.slots, b.slots);
  ASSERT_EQ(a.members.size(), b.members.size());
  for (size_t i = 0; i < a.members.size(); ++i) {
    SCOPED_TRACE("member " + std::to_string(i));
    EXPECT_EQ(a.members[i].local, b.members[i].local);
    EXPECT_EQ(a.members[i].ip, b.members[i].ip);
    EXPECT_EQ(a.members[i].result_va, b.members[i].result_va);
    EXPECT_EQ(a.members[i].rkey, b.members[i].rkey);
    EXPECT_EQ(a.members[i].destination, b.members[i].destination);
  }
  EXPECT_EQ(a.upstream_ip, b.upstream_ip);
  EXPECT_EQ(a.upstream_group, b.upstream_group);
  EXPECT_EQ(a.upstream_contributor, b.upstream_contributor);
  EXPECT_EQ(a.upstream_fp32, b.upstream_fp32);
}

void expect_same(const ControlStatus& a, const ControlStatus& b) {
  ASSERT_EQ(a.has_value(), b.has_value());
  if (a) {
    EXPECT_EQ(a->target, b->target);
    EXPECT_EQ(a->reason, b->reason);
  }
}

// A reserve request's bytes, as the client sends them.
Bytes reserve_request(const GroupReservation& r) {
  Bytes out;
  testbed::MessageControlClient c([&out](Bytes m) { out = std::move(m); });
  c.reserve("leaf-7", r, [](const ControlStatus&) {});
  return out;
}

}  // namespace

TEST(MessageControl, ReserveCarriesEveryFieldAndItsAnswer) {
  Wire w;
  const GroupReservation r = odd_reservation();
  int runs = 0;
  ControlStatus got = ControlError{"stale", "stale"};
  w.client.reserve("leaf-7", r, [&](const ControlStatus& st) {
    ++runs;
    got = st;
  });
  EXPECT_EQ(runs, 0) << "answers come through on_reply, never inside the call";
  w.run();
  ASSERT_EQ(w.fake.calls, std::vector<std::string>{"reserve"});
  EXPECT_EQ(w.fake.sw, "leaf-7");
  expect_same(w.fake.reservation, r);
  EXPECT_EQ(runs, 1);
  expect_same(got, std::nullopt);

  // An error answer, and ECH values the switch does not know: they pass as bytes, for the switch to refuse.
  w.fake.status = ControlError{"leaf-7", "slot pool exhausted: 3 free, 64 asked"};
  GroupReservation odd = r;
  odd.op = static_cast<common::EchOp>(0xee);
  odd.members.clear();
  w.client.reserve("leaf-7", odd, [&](const ControlStatus& st) {
    ++runs;
    got = st;
  });
  w.run();
  expect_same(w.fake.reservation, odd);
  EXPECT_EQ(runs, 2);
  expect_same(got, w.fake.status);
}

TEST(MessageControl, ReleaseAndRegisterWindowCarryTheirArguments) {
  Wire w;
  w.fake.status = ControlError{"spine-0", "not reserved"};
  ControlStatus released;
  w.client.release("spine-0", 0xfffffffe, 0xabcd, [&](const ControlStatus& st) { released = st; });
  w.run();
  EXPECT_EQ(w.fake.sw, "spine-0");
  EXPECT_EQ(w.fake.job, 0xfffffffeu);
  EXPECT_EQ(w.fake.group, 0xabcd);
  expect_same(released, w.fake.status);

  w.fake.status = std::nullopt;
  const WindowRegistration reg{-3, 0x0a0b0c0d, 0xfedc, 0x0123456789abcdefull, 0x80000001, 0x7fffffff};
  ControlStatus registered = ControlError{"stale", "stale"};
  w.client.register_window("", reg, [&](const ControlStatus& st) { registered = st; });
  w.run();
  EXPECT_EQ(w.fake.sw, "") << "an empty name travels as one";
  EXPECT_EQ(w.fake.window.gpu, -3);
  EXPECT_EQ(w.fake.window.ip, 0x0a0b0c0du);
  EXPECT_EQ(w.fake.window.window, 0xfedc);
  EXPECT_EQ(w.fake.window.va, 0x0123456789abcdefull);
  EXPECT_EQ(w.fake.window.rkey, 0x80000001u);
  EXPECT_EQ(w.fake.window.job, 0x7fffffffu);
  expect_same(registered, std::nullopt);
}

TEST(MessageControl, SetLinkStateCarriesLinkAndDirection) {
  Wire w;
  w.fake.status = ControlError{"link 41", "no such link"};
  ControlStatus got;
  w.client.set_link_state(41, true, [&](const ControlStatus& st) { got = st; });
  w.run();
  EXPECT_EQ(w.fake.calls, std::vector<std::string>{"set_link_state"});
  EXPECT_EQ(w.fake.link, 41);
  EXPECT_TRUE(w.fake.up);
  expect_same(got, w.fake.status);
  w.client.set_link_state(-2, false, [](const ControlStatus&) {});
  w.run();
  EXPECT_EQ(w.fake.link, -2);
  EXPECT_FALSE(w.fake.up);
}

TEST(MessageControl, FreeSlotsAndCountersCarryValueAndError) {
  Wire w;
  w.fake.slots.value = 0xfffffff0;
  ControlReply<uint32_t> slots;
  w.client.free_slots("leaf-1", [&](const ControlReply<uint32_t>& r) { slots = r; });
  w.run();
  EXPECT_EQ(w.fake.sw, "leaf-1");
  EXPECT_EQ(slots.value, 0xfffffff0u);
  EXPECT_TRUE(slots.ok());
  // An error travels with whatever value came beside it.
  w.fake.slots = {7, ControlError{"leaf-1", "runs no IFEC engine"}};
  w.client.free_slots("leaf-1", [&](const ControlReply<uint32_t>& r) { slots = r; });
  w.run();
  EXPECT_EQ(slots.value, 7u);
  expect_same(slots.error, w.fake.slots.error);

  uint64_t k = 1;
  w.fake.counter_set.value.for_each([&k](const char*, uint64_t& v) { v = k++ * 0x0101010101010101ull; });
  w.fake.counter_set.value.partial_resends = std::numeric_limits<uint64_t>::max();
  ControlReply<IfecCounters> counters;
  w.client.counters("spine-2", [&](const ControlReply<IfecCounters>& r) { counters = r; });
  w.run();
  EXPECT_EQ(w.fake.sw, "spine-2");
  EXPECT_EQ(common::counters_to_map(counters.value), common::counters_to_map(w.fake.counter_set.value));
  EXPECT_EQ(counters.value.partial_resends, std::numeric_limits<uint64_t>::max());
  EXPECT_TRUE(counters.ok());
  w.fake.counter_set = {};
  w.fake.counter_set.error = ControlError{"spine-2", "no such switch"};
  w.client.counters("spine-2", [&](const ControlReply<IfecCounters>& r) { counters = r; });
  w.run();
  expect_same(counters.error, w.fake.counter_set.error);
  EXPECT_EQ(counters.value.partial_resends, 0u);
}

TEST(MessageControl, FareWeightsAreBitExact) {
  Wire w;
  const double nan = std::nan("0x5a5a");
  w.fake.weights.value = {{0, 0.1}, {-1, -0.0}, {65535, nan}, {7, 5e-324}, {2147483647, HUGE_VAL}, {3, 400}};
  ControlReply<std::vector<PortWeight>> got;
  w.client.fare_weights("leaf-3", 12, [&](const ControlReply<std::vector<PortWeight>>& r) { got = r; });
  w.run();
  EXPECT_EQ(w.fake.sw, "leaf-3");
  EXPECT_EQ(w.fake.dest_gpu, 12);
  ASSERT_EQ(got.value.size(), w.fake.weights.value.size());
  for (size_t i = 0; i < got.value.size(); ++i) {
    EXPECT_EQ(got.value[i].port, w.fake.weights.value[i].port) << i;
    EXPECT_EQ(bits(got.value[i].gbps), bits(w.fake.weights.value[i].gbps)) << i;
  }
  EXPECT_TRUE(got.ok());
  w.fake.weights = {};
  w.fake.weights.error = ControlError{"leaf-3", "destination GPU 99 outside 0..15"};
  w.client.fare_weights("leaf-3", 99, [&](const ControlReply<std::vector<PortWeight>>& r) { got = r; });
  w.run();
  EXPECT_TRUE(got.value.empty());
  expect_same(got.error, w.fake.weights.error);
}

TEST(MessageControl, IdsIncreaseFromOneAndPendingCountsUnansweredCalls) {
  Wire w;
  w.fake.hold = true;
  std::vector<std::string> order;
  w.client.release("a", 1, 1, [&](const ControlStatus&) { order.push_back("release"); });
  w.client.free_slots("b", [&](const ControlReply<uint32_t>&) { order.push_back("free_slots"); });
  w.client.set_link_state(3, false, [&](const ControlStatus&) { order.push_back("set_link_state"); });
  ASSERT_EQ(w.requests.size(), 3u);
  for (uint64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(testbed::peek_control_request(w.requests[i]).id, i + 1);
  }
  EXPECT_EQ(w.client.pending(), 3u);
  w.serve();
  EXPECT_EQ(w.fake.calls.size(), 3u);
  EXPECT_TRUE(w.replies.empty()) << "the fake holds its answers";
  w.fake.answer_held();
  ASSERT_EQ(w.replies.size(), 3u);
  // Replies in another order than the calls: each reaches its own call.
  w.client.on_reply(w.replies[2]);
  EXPECT_EQ(w.client.pending(), 2u);
  w.client.on_reply(w.replies[0]);
  w.client.on_reply(w.replies[1]);
  EXPECT_EQ(w.client.pending(), 0u);
  EXPECT_EQ(order, (std::vector<std::string>{"set_link_state", "release", "free_slots"}));
}

TEST(MessageControl, PeekReadsARequestWithoutRunningIt) {
  Wire w;
  w.client.counters("spine-1", [](const ControlReply<IfecCounters>&) {});
  w.client.set_link_state(17, true, [](const ControlStatus&) {});
  w.client.reserve("leaf-0", odd_reservation(), [](const ControlStatus&) {});
  const testbed::ControlRequestInfo c = testbed::peek_control_request(w.requests[0]);
  EXPECT_EQ(c.id, 1u);
  EXPECT_EQ(c.op, "counters");
  EXPECT_EQ(c.sw, "spine-1");
  EXPECT_EQ(c.link, -1);
  const testbed::ControlRequestInfo l = testbed::peek_control_request(w.requests[1]);
  EXPECT_EQ(l.op, "set_link_state");
  EXPECT_EQ(l.sw, "");
  EXPECT_EQ(l.link, 17);
  const testbed::ControlRequestInfo r = testbed::peek_control_request(w.requests[2]);
  EXPECT_EQ(r.id, 3u);
  EXPECT_EQ(r.op, "reserve");
  EXPECT_EQ(r.sw, "leaf-0");
  EXPECT_TRUE(w.fake.calls.empty());
}

TEST(MessageControl, AReplyRunsItsCallbackOnceAndAnUnknownIdThrows) {
  Wire w;
  int runs = 0;
  w.client.free_slots("x", [&](const ControlReply<uint32_t>&) { ++runs; });
  w.serve();
  ASSERT_EQ(w.replies.size(), 1u);
  const Bytes reply = w.replies[0];
  w.deliver();
  EXPECT_EQ(runs, 1);
  const std::string again = error_of([&] { w.client.on_reply(reply); });
  EXPECT_MENTIONS(again, "call 1 is not pending");
  EXPECT_EQ(runs, 1);
  // A reply from another client's numbering.
  Wire other;
  for (int i = 0; i < 5; ++i) {
    other.client.free_slots("x", [](const ControlReply<uint32_t>&) {});
  }
  other.serve();
  w.client.free_slots("x", [&](const ControlReply<uint32_t>&) { ++runs; });
  const std::string unknown = error_of([&] { w.client.on_reply(other.replies[4]); });
  EXPECT_MENTIONS(unknown, "call 5 is not pending (1 calls pending)");
  EXPECT_EQ(w.client.pending(), 1u);
}

TEST(MessageControl, AReplyToAnotherOpThrows) {
  Wire w;
  w.client.free_slots("x", [](const ControlReply<uint32_t>&) {});
  Wire other;
  other.client.counters("x", [](const ControlReply<IfecCounters>&) {});
  other.serve();
  const std::string e = error_of([&] { w.client.on_reply(other.replies[0]); });
  EXPECT_MENTIONS(e, "call 1 is a free_slots but the reply is a counters");
  EXPECT_EQ(w.client.pending(), 1u);
}

TEST(MessageControl, EveryTruncatedRequestThrowsAndRunsNothing) {
  const Bytes full = reserve_request(odd_reservation());
  FakeControl fake;
  for (size_t n = 0; n < full.size(); ++n) {
    const Bytes cut(full.begin(), full.begin() + n);
    const std::string e = error_of([&] { testbed::serve_control_request(cut, fake, [](Bytes) {}); });
    // Cut inside the members, the count is found short before any member is read.
    const bool named =
        e.find("control request: truncated at byte ") == 0 || e.find("members count 3") != std::string::npos;
    EXPECT_TRUE(named) << n << ": " << e;
  }
  EXPECT_TRUE(fake.calls.empty());
  // Where it stopped, and what it was reading: after the kind, id and op (10 bytes), the name's length (4) and
  // "leaf-7" (6), and the job (4), one byte of the group's two.
  const std::string e = error_of([&] { testbed::peek_control_request(Bytes(full.begin(), full.begin() + 25)); });
  EXPECT_MENTIONS(e, "control request: truncated at byte 24 reading group (2 bytes, 1 left)");
}

TEST(MessageControl, MalformedRequestsThrowNamingTheProblem) {
  const Bytes good = reserve_request(odd_reservation());
  FakeControl fake;
  auto serve = [&](const Bytes& m) { return error_of([&] { testbed::serve_control_request(m, fake, [](Bytes) {}); }); };

  Bytes trailing = good;
  trailing.push_back(0);
  trailing.push_back(0);
  EXPECT_MENTIONS(serve(trailing), "2 trailing bytes after byte " + std::to_string(good.size()));
  EXPECT_MENTIONS(serve(trailing), "a reserve request");

  Bytes op = good;
  op[9] = 99;
  EXPECT_MENTIONS(serve(op), "control request: unknown op code 99 at byte 9");

  Bytes kind = good;
  kind[0] = 2;
  EXPECT_MENTIONS(serve(kind), "message kind 2, expected 1 (request)");

  // The first member's `local`: after the header (10), the name (4 + 6), job..slots (4 2 1 1 1 2 4), the count (4).
  Bytes flag = good;
  flag[39] = 7;
  EXPECT_MENTIONS(serve(flag), "member.local at byte 39 is 7, not a bool");

  // A member count far past the message's end allocates nothing.
  Bytes count = good;
  count[35] = count[36] = count[37] = count[38] = 0xff;
  EXPECT_MENTIONS(serve(count), "members count 4294967295 at byte 35 needs");

  Bytes name = good;
  name[13] = 0x40;  // the name's length: 1 GiB
  EXPECT_MENTIONS(serve(name), "truncated at byte 14 reading switch");

  EXPECT_MENTIONS(serve({}), "truncated at byte 0 reading message kind");
  EXPECT_TRUE(fake.calls.empty());
}

TEST(MessageControl, AMalformedReplyThrowsAndLeavesItsCallPending) {
  Wire w;
  int runs = 0;
  ControlReply<std::vector<PortWeight>> got;
  w.fake.weights.value = {{1, 100}, {2, 300}};
  w.client.fare_weights("leaf-2", 4, [&](const ControlReply<std::vector<PortWeight>>& r) {
    ++runs;
    got = r;
  });
  w.serve();
  const Bytes reply = w.replies.at(0);
  for (size_t n = 0; n < reply.size(); ++n) {
    const std::string e = error_of([&] { w.client.on_reply(Bytes(reply.begin(), reply.begin() + n)); });
    const bool named =
        e.find("control reply: truncated at byte ") == 0 || e.find("port weights count 2") != std::string::npos;
    EXPECT_TRUE(named) << n << ": " << e;
  }
  Bytes trailing = reply;
  trailing.push_back(1);
  EXPECT_MENTIONS(error_of([&] { w.client.on_reply(trailing); }), "1 trailing bytes after byte");
  Bytes request_kind = reply;
  request_kind[0] = 1;
  EXPECT_MENTIONS(error_of([&] { w.client.on_reply(request_kind); }), "message kind 1, expected 2 (reply)");
  EXPECT_EQ(runs, 0);
  EXPECT_EQ(w.client.pending(), 1u);
  w.client.on_reply(reply);
  EXPECT_EQ(runs, 1);
  ASSERT_EQ(got.value.size(), 2u);
  EXPECT_EQ(got.value[1].port, 2);
  EXPECT_EQ(got.value[1].gbps, 300);
}

TEST(MessageControl, GarbageNeverCrashes) {
  // Random bytes, and valid messages with one byte changed: each is refused with an Error or read as some message.
  std::mt19937 rng(11);
  Wire w;
  w.fake.weights.value = {{1, 2}};
  w.fake.counter_set.value.contributions = 5;
  std::vector<Bytes> valid = {reserve_request(odd_reservation())};
  w.client.counters("s", [](const ControlReply<IfecCounters>&) {});
  w.client.fare_weights("s", 1, [](const ControlReply<std::vector<PortWeight>>&) {});
  w.client.register_window("s", {}, [](const ControlStatus&) {});
  valid.insert(valid.end(), w.requests.begin(), w.requests.end());
  w.serve();
  valid.insert(valid.end(), w.replies.begin(), w.replies.end());
  int refused = 0;
  for (int i = 0; i < 4000; ++i) {
    Bytes m;
    if (i % 2 == 0) {
      m.resize(rng() % 80);
      for (auto& b : m) {
        b = static_cast<uint8_t>(rng() % 4 == 0 ? rng() % 3 : rng());  // small values make plausible headers
      }
    } else {
      m = valid[rng() % valid.size()];
      m[rng() % m.size()] = static_cast<uint8_t>(rng());
    }
    try {
      testbed::serve_control_request(m, w.fake, [](Bytes) {});
    } catch (const common::Error&) {
      ++refused;
    }
    try {
      w.client.on_reply(m);
    } catch (const common::Error&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 4000);
}

TEST(MessageControl, RoundTripsThroughInProcessControl) {
  common::EventLoop loop;
  const routing::Topology topo = routing::make_superpod(8, 2);
  testbed::Fabric fabric(loop, topo, {});
  std::map<std::string, switchemu::Switch*> switches;
  for (int i = 0; i < fabric.num_switches(); ++i) {
    switches[topo.nodes.at(fabric.switch_node(i)).name] = &fabric.switch_at(i);
  }
  ASSERT_FALSE(switches.empty());
  const testbed::Poster now = [](std::function<void()> f) { f(); };
  testbed::InProcessControl target(
      topo, switches, [](int, bool) {}, now, now);

  std::vector<Bytes> replies;
  testbed::MessageControlClient client(
      [&](Bytes m) { testbed::serve_control_request(m, target, [&](Bytes r) { replies.push_back(std::move(r)); }); });
  const auto& [name, sw] = *switches.begin();
  ControlReply<uint32_t> slots;
  client.free_slots(name, [&](const ControlReply<uint32_t>& r) { slots = r; });
  ControlReply<uint32_t> missing;
  client.free_slots("no-such-leaf", [&](const ControlReply<uint32_t>& r) { missing = r; });
  ControlReply<std::vector<PortWeight>> weights;
  client.fare_weights(name, 3, [&](const ControlReply<std::vector<PortWeight>>& r) { weights = r; });
  ASSERT_EQ(replies.size(), 3u);
  for (const Bytes& r : replies) {
    client.on_reply(r);
  }
  EXPECT_TRUE(slots.ok());
  EXPECT_EQ(slots.value, sw->ifec()->free_slots());
  EXPECT_GT(slots.value, 0u);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error->target, "no-such-leaf");
  EXPECT_EQ(missing.error->reason, "no such switch");
  ASSERT_TRUE(weights.ok());
  ASSERT_EQ(weights.value.size(), 2u) << "two sub-links toward GPU 3";
  EXPECT_EQ(weights.value[0].gbps, 400);
}
