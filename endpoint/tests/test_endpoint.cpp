// The endpoint's subscription seam: what subscribers hear (remote writes, route changes), for how long, and that a
// subscription outliving its endpoint is harmless.
//
//   endpoint 0 [port 0] ==== link (100 Gb/s) ==== [port 0] endpoint 1 <- subscribers
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "ifec/common/sim.h"
#include "ifec/endpoint/endpoint.h"

using namespace ifec;

namespace {

constexpr uint16_t kData = 1;

struct Pair {
  common::EventLoop loop;
  std::unique_ptr<common::Link> link;
  std::unique_ptr<endpoint::Endpoint> ep[2];

  Pair() {
    link = std::make_unique<common::Link>(loop, common::LinkConfig{100'000'000'000ULL, 500, 24, 0.0, 1});
    for (int i = 0; i < 2; ++i) {
      endpoint::EndpointConfig c;
      c.index = i;
      c.ip = 0x0A000001u + i;
      std::vector<endpoint::EndpointPort> ports = {
          {&link->end(i), 0, {2, 0, 0, 0, uint8_t(i), 0}, {2, 0, 0, 0, uint8_t(1 - i), 0}}};
      ep[i] = std::make_unique<endpoint::Endpoint>(loop, c, ports, std::vector<uint32_t>{0x0A000001u, 0x0A000002u});
      ep[i]->memory().allocate_window(kData, 1 << 16, 1);
    }
    ep[0]->set_remote_window(1, *ep[1]->memory().window(kData));
  }

  // Endpoint 0 stores `len` bytes at `offset` of endpoint 1's window and the loop runs until it is acknowledged.
  void store(uint64_t offset, size_t len) {
    const std::vector<uint8_t> bytes(len, 0x5A);
    endpoint::OpHandle h = ep[0]->store(1, kData, offset, bytes.data(), bytes.size());
    while (!h->done() && !loop.idle()) {
      loop.run(loop.next_event_time());
    }
    ASSERT_TRUE(h->ok()) << h->error;
  }
};

struct Recorder : endpoint::EndpointSubscriber {
  struct Write {
    int peer;
    uint16_t window;
    uint64_t offset;
    uint64_t len;
  };
  std::vector<Write> writes;
  int route_changes = 0;
  void on_remote_write(int peer, uint16_t window, uint64_t offset, uint64_t len) override {
    writes.push_back({peer, window, offset, len});
  }
  void on_routes_changed() override { ++route_changes; }
};

TEST(EndpointSubscription, DeliversWritesInWindowTermsUntilReleased) {
  Pair p;
  Recorder r;
  endpoint::Subscription sub = p.ep[1]->subscribe(r);
  p.store(100, 64);
  ASSERT_EQ(r.writes.size(), 1u);
  EXPECT_EQ(r.writes[0].peer, 0);
  EXPECT_EQ(r.writes[0].window, kData);
  EXPECT_EQ(r.writes[0].offset, 100u);
  EXPECT_EQ(r.writes[0].len, 64u);
  p.ep[1]->routes_changed();
  EXPECT_EQ(r.route_changes, 1);

  sub.reset();
  p.store(200, 64);
  p.ep[1]->routes_changed();
  EXPECT_EQ(r.writes.size(), 1u) << "a released subscription still hears writes";
  EXPECT_EQ(r.route_changes, 1) << "a released subscription still hears route changes";
}

TEST(EndpointSubscription, EverySubscriberHearsAndADestroyedTokenReleases) {
  Pair p;
  Recorder a, b, c;
  endpoint::Subscription sa = p.ep[1]->subscribe(a);
  {
    endpoint::Subscription sb = p.ep[1]->subscribe(b);
    p.store(0, 4096);
    p.ep[1]->routes_changed();
    EXPECT_EQ(a.writes.size(), 1u);
    EXPECT_EQ(b.writes.size(), 1u);
    EXPECT_EQ(a.route_changes, 1);
    EXPECT_EQ(b.route_changes, 1);
  }
  // b's slot is free again: c takes it, and a is not disturbed.
  endpoint::Subscription sc = p.ep[1]->subscribe(c);
  p.store(0, 4096);
  EXPECT_EQ(a.writes.size(), 2u);
  EXPECT_EQ(b.writes.size(), 1u) << "the token went out of scope, yet b still hears";
  EXPECT_EQ(c.writes.size(), 1u);

  // A moved token carries the subscription; the moved-from one releases nothing.
  endpoint::Subscription moved = std::move(sa);
  sa.reset();
  p.store(0, 64);
  EXPECT_EQ(a.writes.size(), 3u);
  moved = endpoint::Subscription();
  p.store(0, 64);
  EXPECT_EQ(a.writes.size(), 3u) << "assigning over a token must release its subscription";
}

TEST(EndpointSubscription, OutlivingTheEndpointIsSafe) {
  auto p = std::make_unique<Pair>();
  Recorder r;
  endpoint::Subscription sub = p->ep[1]->subscribe(r);
  p->store(0, 64);
  EXPECT_EQ(r.writes.size(), 1u);
  p.reset();    // the endpoints go first
  sub.reset();  // and the token finds nothing to release
  endpoint::Subscription idle;
  idle.reset();
  SUCCEED();
}

// The NIC's two kinds of send queue, the ECH agent's frames and the QPs', take turns on a port while both wait: an
// endpoint with a long ECH backlog (resends on a slow port, say) still answers RC requests. Its ACK waited behind
// every queued ECH frame before, and a backlog longer than the requester's timeout ran its retries out.
TEST(EndpointNic, AnAckDoesNotWaitBehindTheEchBacklog) {
  Pair p;
  constexpr int kBacklog = 200;
  std::vector<uint8_t> junk(4096 + 64, 0);  // not IP: endpoint 0 counts each as malformed
  junk[12] = 0x88;
  junk[13] = 0xB5;  // a local experimental ethertype
  for (int i = 0; i < kBacklog; ++i) {
    ASSERT_TRUE(p.ep[1]->send_frame(0, std::vector<uint8_t>(junk)));
  }
  const common::TimeNs frame_ns = (junk.size() + 24) * 8 / 100;  // at 100 Gb/s
  p.store(0, 64);
  const common::TimeNs done = p.loop.now();
  EXPECT_LT(p.ep[1]->ech_frames_sent(), uint64_t{kBacklog} / 4) << "the store's ACK went out behind the backlog";
  EXPECT_LT(done, 8 * frame_ns) << "the store took " << done << " ns, the whole backlog " << kBacklog * frame_ns;
  p.loop.run();
  EXPECT_EQ(p.ep[1]->ech_frames_sent(), uint64_t{kBacklog});
  EXPECT_EQ(p.ep[0]->counters().rx_malformed, uint64_t{kBacklog});
}

}  // namespace
