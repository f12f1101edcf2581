// Endpoints over direct links (no switch): every transaction type against a reference under loss, protection
// violations, malformed frames, and ordering litmus tests for the three modes.
//
//   endpoint 0 [port k] ==== link k (rate, delay, loss) ==== [port k] endpoint 1      (k = 0 .. ports-1)
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "ifec/common/frame.h"
#include "ifec/common/sim.h"
#include "ifec/endpoint/endpoint.h"

using namespace ifec;
using common::TimeNs;
using endpoint::OpHandle;
using endpoint::OpStatus;
using endpoint::Ordering;

namespace {

constexpr uint16_t kData = 1;
constexpr uint16_t kFlag = 2;
constexpr uint64_t kWindow = 1 << 20;

struct Pair {
  common::EventLoop loop;
  std::vector<std::unique_ptr<common::Link>> links;
  std::unique_ptr<endpoint::Endpoint> ep[2];

  Pair(Ordering ordering, int ports, double loss, uint64_t seed = 1, uint32_t job_b = 1, TimeNs delay_ns = 500,
       bool adaptive_rto = false) {
    std::vector<endpoint::EndpointPort> p[2];
    for (int k = 0; k < ports; ++k) {
      common::LinkConfig cfg{100'000'000'000ULL, delay_ns, 24, loss, seed * 31 + k};
      links.push_back(std::make_unique<common::Link>(loop, cfg));
      for (int side = 0; side < 2; ++side) {
        p[side].push_back({&links.back()->end(side),
                           k,
                           {2, 0, 0, 0, uint8_t(side), uint8_t(k)},
                           {2, 0, 0, 0, uint8_t(1 - side), uint8_t(k)}});
      }
    }
    for (int i = 0; i < 2; ++i) {
      endpoint::EndpointConfig c;
      c.index = i;
      c.ip = 0x0A000001u + i;
      c.ordering = ordering;
      c.rto_ns = 20'000;
      c.rto_max_ns = 200'000;
      c.max_retries = 12;
      c.adaptive_rto = adaptive_rto;
      ep[i] = std::make_unique<endpoint::Endpoint>(loop, c, p[i], std::vector<uint32_t>{0x0A000001u, 0x0A000002u});
    }
    for (int i = 0; i < 2; ++i) {
      ep[i]->memory().allocate_window(kData, kWindow, i == 1 ? job_b : 1);
      ep[i]->memory().allocate_window(kFlag, 4096, i == 1 ? job_b : 1);
      ep[i]->set_connection_manager(
          [this, i](int peer, int q, uint32_t psn, const endpoint::Endpoint::ResetDone& done) {
            ep[peer]->reset_responder(i, q, psn);
            done("");
          });
    }
    for (int i = 0; i < 2; ++i) {
      for (uint16_t w : {kData, kFlag}) {
        ep[i]->set_remote_window(1 - i, *ep[1 - i]->memory().window(w));
      }
    }
  }

  // Runs until every handle is done or `limit` of simulated time passes; false on timeout (a hang).
  bool wait(const std::vector<OpHandle>& hs, TimeNs limit = 500'000'000) {
    const TimeNs deadline = loop.now() + limit;
    auto all_done = [&] {
      for (const auto& h : hs) {
        if (!h->done()) {
          return false;
        }
      }
      return true;
    };
    while (!all_done()) {
      if (loop.idle() || loop.next_event_time() > deadline) {
        return false;
      }
      loop.run(loop.next_event_time());
    }
    return true;
  }
  uint8_t* mem(int i, uint16_t w) { return ep[i]->memory().window(w)->data; }
};

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) {
    b = static_cast<uint8_t>(rng());
  }
  return v;
}

uint64_t u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Every transaction type, checked against a reference computed here.
void exercise_all(Pair& p, uint32_t seed) {
  const auto big = pattern(300'000, seed);     // 74 packets, several QPs in weak/partial
  const auto small = pattern(1000, seed + 1);  // one packet
  std::vector<OpHandle> hs;
  hs.push_back(p.ep[0]->store(1, kData, 4096, big.data(), big.size()));
  hs.push_back(p.ep[0]->store(1, kData, 500'000, small.data(), small.size()));
  ASSERT_TRUE(p.wait(hs)) << "stores hung";
  for (auto& h : hs) {
    ASSERT_TRUE(h->ok()) << h->error;
  }
  EXPECT_EQ(std::memcmp(p.mem(1, kData) + 4096, big.data(), big.size()), 0);
  EXPECT_EQ(std::memcmp(p.mem(1, kData) + 500'000, small.data(), small.size()), 0);
  std::vector<uint8_t> back(big.size());
  OpHandle ld = p.ep[0]->load(back.data(), 1, kData, 4096, back.size());
  ASSERT_TRUE(p.wait({ld}));
  ASSERT_TRUE(ld->ok()) << ld->error;
  EXPECT_EQ(back, big);
  // Atomics: 50 fetch-adds in flight at once must each apply exactly once, whatever is lost.
  std::vector<OpHandle> adds;
  for (int i = 0; i < 50; ++i) {
    adds.push_back(p.ep[0]->fetch_add(1, kFlag, 64, 3));
  }
  ASSERT_TRUE(p.wait(adds));
  std::vector<uint64_t> olds;
  for (auto& h : adds) {
    ASSERT_TRUE(h->ok()) << h->error;
    olds.push_back(h->result);
  }
  std::sort(olds.begin(), olds.end());
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(olds[i], 3u * i) << "fetch_add results are the 50 distinct prefixes";
  }
  EXPECT_EQ(u64(p.mem(1, kFlag) + 64), 150u) << "each add applied exactly once";
  OpHandle cas_ok = p.ep[0]->compare_swap(1, kFlag, 64, 150, 7);
  ASSERT_TRUE(p.wait({cas_ok}));
  OpHandle cas_miss = p.ep[0]->compare_swap(1, kFlag, 64, 150, 9);
  ASSERT_TRUE(p.wait({cas_miss}));
  EXPECT_EQ(cas_ok->result, 150u);
  EXPECT_EQ(cas_miss->result, 7u);
  EXPECT_EQ(u64(p.mem(1, kFlag) + 64), 7u);
  const auto sig_data = pattern(20'000, seed + 2);
  OpHandle ps =
      p.ep[0]->put_signal(1, kData, 700'000, sig_data.data(), sig_data.size(), kFlag, 128, 5, endpoint::SignalOp::kAdd);
  ASSERT_TRUE(p.wait({ps}));
  ASSERT_TRUE(ps->ok()) << ps->error;
  EXPECT_EQ(u64(p.mem(1, kFlag) + 128), 5u);
  EXPECT_EQ(std::memcmp(p.mem(1, kData) + 700'000, sig_data.data(), sig_data.size()), 0);
  OpHandle q = p.ep[0]->quiet();
  ASSERT_TRUE(p.wait({q}));
}

}  // namespace

class EveryTransaction : public testing::TestWithParam<std::tuple<Ordering, double>> {};

TEST_P(EveryTransaction, MatchesReferenceUnderLoss) {
  const auto [ordering, loss] = GetParam();
  Pair p(ordering, 2, loss, 11);
  exercise_all(p, 5);
  const auto c0 = p.ep[0]->counters();
  if (loss > 0) {
    EXPECT_GT(c0.qp.retransmits + c0.qp.timeouts, 0u) << "loss was injected but nothing was repaired";
  }
  EXPECT_EQ(c0.ops_failed, 0u);
}

INSTANTIATE_TEST_SUITE_P(Modes, EveryTransaction,
                         testing::Combine(testing::Values(Ordering::kWeak, Ordering::kPartial, Ordering::kStrong),
                                          testing::Values(0.0, 0.01, 0.05)),
                         [](const auto& info) {
                           return std::string(endpoint::ordering_name(std::get<0>(info.param))) + "_loss" +
                                  std::to_string(static_cast<int>(std::get<1>(info.param) * 100));
                         });

// What a phase's row reports as sent again (Endpoint::resent) is exactly what loss added: endpoint 0 (the
// requester of every operation) sends the same bytes the first time over lossy links as over clean ones.
TEST(Endpoint, ResentBytesAreWhatLossAddedToTheFirstTransmissions) {
  auto sent = [](Pair& p) {
    uint64_t bytes = 0;
    for (auto& l : p.links) {
      bytes += l->end(0).counters().tx_bytes;
    }
    return bytes;
  };
  for (Ordering ordering : {Ordering::kWeak, Ordering::kStrong}) {
    Pair clean(ordering, 2, 0.0, 11);
    exercise_all(clean, 5);
    Pair lossy(ordering, 2, 0.05, 11);
    exercise_all(lossy, 5);
    const endpoint::Endpoint::Resent none = clean.ep[0]->resent();
    const endpoint::Endpoint::Resent again = lossy.ep[0]->resent();
    EXPECT_EQ(none.frames + none.bytes, 0u);
    EXPECT_GT(again.frames, 0u);
    EXPECT_GT(again.bytes, again.frames * 60) << "at least a RoCEv2 header each";
    EXPECT_EQ(sent(lossy) - again.bytes, sent(clean)) << endpoint::ordering_name(ordering);
  }
}

// Out of order (weak), a timeout that was spurious (everything is on its way: a 200 us round trip, the 20 us first
// timeout) costs a packet or two per expiry, not the whole window again: the QP resends its oldest unacknowledged
// packet and goes on where it was (here 9 packets for 5 timeouts). Go-back-N of every outstanding packet, as
// before, resent 2,645 packets here (18 timeouts), and on a software fabric its copies queued behind the originals made
// the next timeouts (a congestion collapse). In order the responder drops what follows a gap, and go-back-N stays.
TEST(Endpoint, ASpuriousTimeoutResendsAPacketNotTheWindow) {
  Pair p(Ordering::kWeak, 1, 0.0, 1, 1, 100'000);
  const auto data = pattern(1000 * 1024, 3);
  std::vector<OpHandle> hs;
  for (size_t off = 0; off < data.size(); off += 1024) {
    hs.push_back(p.ep[0]->store(1, kData, off, data.data() + off, 1024));
  }
  ASSERT_TRUE(p.wait(hs));
  for (const auto& h : hs) {
    ASSERT_TRUE(h->ok()) << h->error;
  }
  EXPECT_EQ(std::memcmp(p.mem(1, kData), data.data(), data.size()), 0);
  const auto c = p.ep[0]->counters().qp;
  EXPECT_GT(c.timeouts, 0u) << "the first ACK comes after 200 us: the 20 us timer runs out";
  EXPECT_LE(c.retransmits, 2 * c.timeouts);
  printf("spurious timeouts: %lu, packets resent: %lu\n", static_cast<unsigned long>(c.timeouts),
         static_cast<unsigned long>(c.retransmits));
}

// Out of order (weak), a link that fails under a window loses every frame on it, one run of its QP's PSNs; the QP
// moves to the other port (path migration) and what it sends there arrives. The timeout's one resent packet is then
// acknowledged alone (the next is missing too, and no ACK passes it): the QP resends the next ones, twice as many
// each round trip, not one packet per timeout (the live fabric took 20-35 s to repair a plane's failure, 200 ms a
// packet).
TEST(Endpoint, AWindowLostWithItsLinkIsResentInRoundTripsNotOnePacketPerTimeout) {
  Pair p(Ordering::kWeak, 2, 0.0, 1, 1, 20'000, true);
  bool down = false;
  for (auto& ep : p.ep) {
    ep->set_weight_source([&](int, std::vector<double>* w) { (*w)[0] = down ? 0.0 : 1.0; });
  }
  const auto warm = pattern(64 * 1024, 7);  // round trips to time (the QPs' smallest round trip)
  ASSERT_TRUE(p.wait({p.ep[0]->store(1, kData, 0, warm.data(), warm.size())}));
  const auto data = pattern(1 << 20, 9);  // 128 packets per QP
  auto h = p.ep[0]->store(1, kData, 0, data.data(), data.size());
  p.loop.run(p.loop.now() + 15'000);  // about 45 frames on the wire of each link
  p.links[0]->set_up(false);          // everything on link 0's wire is lost
  down = true;
  p.ep[0]->routes_changed();
  p.ep[1]->routes_changed();
  const TimeNs start = p.loop.now();
  ASSERT_TRUE(p.wait({h}));
  ASSERT_TRUE(h->ok()) << h->error;
  EXPECT_EQ(std::memcmp(p.mem(1, kData), data.data(), data.size()), 0);
  const auto c = p.ep[0]->counters().qp;
  const auto lost = p.links[0]->end(0).counters().dropped_link_down;
  printf("%lu frames lost: %.2f ms, %lu timeouts, %lu resent\n", static_cast<unsigned long>(lost),
         (p.loop.now() - start) / 1e6, static_cast<unsigned long>(c.timeouts),
         static_cast<unsigned long>(c.retransmits));
  // One packet per timeout took 5.4 ms here (25 timeouts, the timer backed off to its 200 us): now the first timeout
  // and a few round trips of 40 us, each with its wait of an eighth of the timeout.
  EXPECT_GE(lost, 30u);
  EXPECT_LE(c.timeouts, 4u);
  EXPECT_LT(p.loop.now() - start, 1'000'000);
  EXPECT_LE(c.retransmits, 2 * lost);
}

TEST(Endpoint, InvalidArgumentsFailBeforeAnythingIsSent) {
  Pair p(Ordering::kPartial, 1, 0);
  uint8_t buf[16] = {};
  EXPECT_EQ(p.ep[0]->store(1, kData, kWindow - 8, buf, 16)->status, OpStatus::kInvalidArgument);
  EXPECT_EQ(p.ep[0]->store(5, kData, 0, buf, 16)->status, OpStatus::kInvalidArgument);
  EXPECT_EQ(p.ep[0]->store(1, 77, 0, buf, 16)->status, OpStatus::kInvalidArgument);
  OpHandle mis = p.ep[0]->fetch_add(1, kFlag, 4, 1);
  EXPECT_EQ(mis->status, OpStatus::kInvalidArgument);
  EXPECT_NE(mis->error.find("aligned"), std::string::npos) << mis->error;
  EXPECT_EQ(p.ep[0]->counters().tx_frames, 0u);
}

TEST(Endpoint, ProtectionViolationsAreNakedMemoryUnchangedAndTheQpRecovers) {
  Pair p(Ordering::kPartial, 1, 0);
  const endpoint::WindowInfo& w = *p.ep[1]->memory().window(kData);
  std::vector<uint8_t> before(p.mem(1, kData), p.mem(1, kData) + 8192);
  const auto junk = pattern(6000, 3);
  OpHandle bad_rkey = p.ep[0]->store_raw(1, 0, w.va, w.rkey ^ 0x10, junk.data(), junk.size());
  OpHandle oob = p.ep[0]->store_raw(1, 0, w.va + w.size - 100, w.rkey, junk.data(), junk.size());
  std::vector<uint8_t> sink(64);
  OpHandle bad_read = p.ep[0]->load_raw(sink.data(), 1, 0, w.va - 64, w.rkey, 64);
  OpHandle bad_atomic = p.ep[0]->fetch_add_raw(1, 0, w.va + 4, w.rkey, 1);
  const auto good = pattern(5000, 4);
  OpHandle after = p.ep[0]->store(1, kData, 100'000, good.data(), good.size());
  ASSERT_TRUE(p.wait({bad_rkey, oob, bad_read, bad_atomic, after}));
  EXPECT_EQ(bad_rkey->status, OpStatus::kRemoteAccessError);
  EXPECT_EQ(oob->status, OpStatus::kRemoteAccessError);
  EXPECT_EQ(bad_read->status, OpStatus::kRemoteAccessError);
  EXPECT_EQ(bad_atomic->status, OpStatus::kRemoteAccessError);
  EXPECT_TRUE(after->ok()) << "the QP reconnected and carried on: " << after->error;
  EXPECT_EQ(std::vector<uint8_t>(p.mem(1, kData), p.mem(1, kData) + 8192), before) << "memory changed";
  EXPECT_EQ(std::memcmp(p.mem(1, kData) + 100'000, good.data(), good.size()), 0);
  EXPECT_GE(p.ep[1]->counters().qp.access_naks_sent, 4u);
  EXPECT_GE(p.ep[0]->counters().reconnects, 4u);
}

namespace {

// A store under a wrong rkey (NAKed: the responder goes into error), then a good one of `good` at offset 4096
// posted right behind it on the same QP.
std::pair<OpHandle, OpHandle> wrong_rkey_then_store(Pair& p, const std::vector<uint8_t>& good) {
  const endpoint::WindowInfo& w = *p.ep[1]->memory().window(kData);
  const auto junk = pattern(3000, 5);
  OpHandle bad = p.ep[0]->store_raw(1, 0, w.va, w.rkey ^ 0x10, junk.data(), junk.size());
  return {bad, p.ep[0]->store(1, kData, 4096, good.data(), good.size())};
}

}  // namespace

// A connection manager that answers later (a live peer reached over the control network): nothing of the new
// numbering may reach the peer's responder before it is reset, or it would meet the error state and fail too.
TEST(Endpoint, AfterAFatalNakNothingIsSentUntilThePeerConfirmsItsReset) {
  Pair p(Ordering::kPartial, 1, 0);
  int resets = 0;
  TimeNs reset_at = 0;
  uint64_t requests_before_reset = 0;
  p.ep[0]->set_connection_manager([&](int peer, int q, uint32_t psn, const endpoint::Endpoint::ResetDone& done) {
    p.loop.schedule(p.loop.now() + 50'000, [&p, &resets, &reset_at, &requests_before_reset, peer, q, psn, done] {
      requests_before_reset = p.ep[peer]->counters().qp.rx_requests;
      p.ep[peer]->reset_responder(0, q, psn);
      ++resets;
      reset_at = p.loop.now();
      done("");
    });
  });
  const auto good = pattern(5000, 6);
  const auto [bad, after] = wrong_rkey_then_store(p, good);
  TimeNs after_done_at = 0;
  ASSERT_FALSE(after->done());
  after->on_done = [&](const endpoint::OpState&) { after_done_at = p.loop.now(); };
  ASSERT_TRUE(p.wait({bad, after}));
  EXPECT_EQ(bad->status, OpStatus::kRemoteAccessError);
  EXPECT_TRUE(after->ok()) << after->error;
  EXPECT_EQ(resets, 1);
  // The bad store and `after`'s two packets (5000 B at a 4096 B MTU), sent under the old numbering before the NAK
  // came back; nothing under the new one.
  EXPECT_EQ(p.ep[0]->config().mtu, 4096u);
  EXPECT_EQ(requests_before_reset, 3u) << "requests of the new numbering reached the responder before its reset";
  EXPECT_GE(after_done_at, reset_at + 1'000) << "the store completed before the peer was reset";
  EXPECT_EQ(std::memcmp(p.mem(1, kData) + 4096, good.data(), good.size()), 0);
  EXPECT_EQ(p.ep[1]->counters().qp.access_naks_sent, 1u) << "a request met the responder still in error";
}

// A manager that cannot reach the peer fails the waiting work at once; one that never answers lets the retransmit
// timer end it. Either way nothing hangs, and later work fails fast instead of queueing forever.
TEST(Endpoint, AReconnectThePeerNeverConfirmsEndsInRetryExceeded) {
  for (const bool refuse : {true, false}) {
    Pair p(Ordering::kPartial, 1, 0);
    p.ep[0]->set_connection_manager([refuse](int, int, uint32_t, const endpoint::Endpoint::ResetDone& done) {
      if (refuse) {
        done("peer 1's daemon is unreachable");
      }
    });
    const auto good = pattern(5000, 6);
    const auto [bad, after] = wrong_rkey_then_store(p, good);
    ASSERT_TRUE(p.wait({bad, after})) << (refuse ? "refused" : "never answered") << ": the QP hung";
    EXPECT_EQ(bad->status, OpStatus::kRemoteAccessError);
    EXPECT_EQ(after->status, OpStatus::kRetryExceeded) << (refuse ? "refused" : "never answered");
    EXPECT_EQ(p.ep[0]->counters().reconnects_refused, refuse ? 1u : 0u);
    EXPECT_EQ(p.ep[1]->counters().qp.access_naks_sent, 1u);
    OpHandle later = p.ep[0]->store(1, kData, 0, good.data(), 64);
    ASSERT_TRUE(p.wait({later}));
    EXPECT_EQ(later->status, OpStatus::kRetryExceeded);
  }
}

TEST(Endpoint, WrongJobIsNaked) {
  Pair p(Ordering::kStrong, 1, 0, 1, /*job_b=*/2);  // endpoint 1's windows belong to job 2, endpoint 0 is job 1
  uint64_t v = 42;
  OpHandle h = p.ep[0]->store(1, kFlag, 0, &v, 8);
  ASSERT_TRUE(p.wait({h}));
  EXPECT_EQ(h->status, OpStatus::kRemoteAccessError);
  EXPECT_EQ(u64(p.mem(1, kFlag)), 0u);
}

TEST(Endpoint, MalformedAndUnexpectedFramesAreCountedAndDropped) {
  Pair p(Ordering::kPartial, 1, 0);
  // A well-formed frame to start from: one the endpoint itself would send.
  common::FrameHeaders h;
  h.ip.src = 0x0A000001;
  h.ip.dst = 0x0A000002;
  h.bth.opcode = static_cast<uint8_t>(common::Opcode::kWriteOnly);
  h.bth.pkey = common::pkey_of_job(1);
  h.bth.dest_qp = p.ep[1]->qpn(0, 0);
  h.bth.psn = 0;
  const endpoint::WindowInfo& w = *p.ep[1]->memory().window(kFlag);
  h.reth = common::Reth{w.va, w.rkey, 8};
  const uint64_t payload = 0xDEADBEEF;
  auto inject = [&](const common::FrameHeaders& hh, bool corrupt = false) {
    std::vector<uint8_t> f = common::encode_frame(hh, reinterpret_cast<const uint8_t*>(&payload), 8);
    if (corrupt) {
      f[f.size() - 10] ^= 1;
    }
    p.links[0]->end(0).send(std::move(f));
    p.loop.run(p.loop.now() + 10'000);
  };
  common::FrameHeaders wrong_qp = h;
  wrong_qp.bth.dest_qp = 0x999999;
  inject(wrong_qp);
  common::FrameHeaders far = h;
  far.bth.psn = 0x300000;  // far beyond the responder window
  inject(far);
  common::FrameHeaders send = h;
  send.bth.opcode = static_cast<uint8_t>(common::Opcode::kSendOnly);
  send.reth.reset();
  inject(send);
  common::FrameHeaders spoof = h;
  spoof.ip.src = 0x0A0000FF;
  inject(spoof);
  inject(h, /*corrupt=*/true);
  const auto c = p.ep[1]->counters();
  EXPECT_EQ(c.rx_unknown_qp, 1u);
  EXPECT_EQ(c.qp.far_psn_drops, 1u);
  EXPECT_EQ(c.rx_unsupported, 1u);
  EXPECT_EQ(c.qp.invalid_naks_sent, 0u) << "between the project's endpoints a SEND is a stray frame: counted only";
  EXPECT_EQ(c.rx_wrong_source, 1u);
  EXPECT_EQ(c.rx_malformed, 1u);
  EXPECT_EQ(u64(p.mem(1, kFlag)), 0u) << "nothing was written";
  // And the endpoint still works.
  uint64_t v = 9;
  OpHandle ok = p.ep[0]->store(1, kFlag, 0, &v, 8);
  ASSERT_TRUE(p.wait({ok}));
  EXPECT_TRUE(ok->ok());
  EXPECT_EQ(u64(p.mem(1, kFlag)), 9u);
}

TEST(Endpoint, UnreachablePeerFailsWithRetryExceededInsteadOfHanging) {
  Pair p(Ordering::kPartial, 1, 0);
  p.links[0]->set_up(false);
  uint64_t v = 1;
  OpHandle h = p.ep[0]->store(1, kFlag, 0, &v, 8);
  ASSERT_TRUE(p.wait({h}, 100'000'000'000ULL)) << "hung instead of failing";
  EXPECT_EQ(h->status, OpStatus::kRetryExceeded);
  OpHandle later = p.ep[0]->store(1, kFlag, 8, &v, 8);
  ASSERT_TRUE(p.wait({later}));
  EXPECT_EQ(later->status, OpStatus::kRetryExceeded) << "the QP is in error: fail fast";
}

// Message passing: a 64 KiB data store, then an 8-byte flag store. The receiver watches its memory every 50 ns;
// a violation is seeing the flag before all of the data.
int message_passing_violations(Ordering ordering, double loss, bool fence, int trials) {
  int violations = 0;
  for (int t = 0; t < trials; ++t) {
    Pair p(ordering, 4, loss, 100 + t);
    const auto data = pattern(64 * 1024, t);
    const uint64_t flag = 1;
    bool seen = false;
    bool bad = false;
    std::function<void()> watch = [&] {
      if (!seen && u64(p.mem(1, kFlag)) == flag) {
        seen = true;
        bad = std::memcmp(p.mem(1, kData), data.data(), data.size()) != 0;
      }
      if (!seen) {
        p.loop.schedule(p.loop.now() + 50, watch);
      }
    };
    p.loop.schedule(0, watch);
    OpHandle d = p.ep[0]->store(1, kData, 0, data.data(), data.size());
    if (fence) {
      p.ep[0]->fence(1);
    }
    OpHandle f = p.ep[0]->store(1, kFlag, 0, &flag, 8);
    EXPECT_TRUE(p.wait({d, f}));
    p.loop.run(p.loop.now() + 1000);
    violations += bad;
  }
  return violations;
}

TEST(Litmus, StrongModeDeliversInIssueOrderEvenUnderLoss) {
  EXPECT_EQ(message_passing_violations(Ordering::kStrong, 0.05, /*fence=*/false, 20), 0);
}

TEST(Litmus, PartialModeOrdersAcrossAFence) {
  EXPECT_EQ(message_passing_violations(Ordering::kPartial, 0.05, /*fence=*/true, 20), 0);
}

TEST(Litmus, WeakModeOrdersAcrossAFence) {
  EXPECT_EQ(message_passing_violations(Ordering::kWeak, 0.05, /*fence=*/true, 20), 0);
}

TEST(Litmus, WeakModeWithoutFenceDoesReorderSoTheLitmusHasTeeth) {
  EXPECT_GT(message_passing_violations(Ordering::kWeak, 0.05, /*fence=*/false, 20), 0)
      << "spraying over four QPs with loss never reordered: the litmus could not detect a violation";
}

TEST(Litmus, PartialModeKeepsSameAddressStoresInOrder) {
  // Two stores to one address without a fence: the second must win, loss or not.
  for (int t = 0; t < 20; ++t) {
    Pair p(Ordering::kPartial, 4, 0.05, 300 + t);
    uint64_t first = 1;
    uint64_t second = 2;
    OpHandle a = p.ep[0]->store(1, kFlag, 256, &first, 8);
    OpHandle b = p.ep[0]->store(1, kFlag, 256, &second, 8);
    ASSERT_TRUE(p.wait({a, b}));
    EXPECT_EQ(u64(p.mem(1, kFlag) + 256), 2u) << "trial " << t;
  }
}

TEST(Litmus, PutSignalSignalsOnlyAfterTheDataInEveryMode) {
  for (Ordering o : {Ordering::kWeak, Ordering::kPartial, Ordering::kStrong}) {
    Pair p(o, 4, 0.05, 77);
    const auto data = pattern(64 * 1024, 9);
    bool bad = false;
    bool seen = false;
    std::function<void()> watch = [&] {
      if (!seen && u64(p.mem(1, kFlag)) == 1) {
        seen = true;
        bad = std::memcmp(p.mem(1, kData), data.data(), data.size()) != 0;
      }
      if (!seen) {
        p.loop.schedule(p.loop.now() + 50, watch);
      }
    };
    p.loop.schedule(0, watch);
    OpHandle h = p.ep[0]->put_signal(1, kData, 0, data.data(), data.size(), kFlag, 0, 1, endpoint::SignalOp::kSet);
    ASSERT_TRUE(p.wait({h}));
    EXPECT_TRUE(seen && !bad) << endpoint::ordering_name(o);
  }
}
