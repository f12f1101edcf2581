// One RC queue pair alone, no endpoint and no link model: each side's frames go out through an in-memory port
// (common::ChannelPort), where the test reads them as bytes, checks them against hand-computed expectations
// (opcodes, PSNs, RETH, AETH syndromes, ICRC), and decides what reaches the other side: delivered, dropped,
// duplicated or delayed.
//
//   QP A --next_frame()--> ChannelPort A (outbox) --test--> inject --> ChannelPort B --receiver--> QP B
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "ifec/common/channel_port.h"
#include "ifec/common/frame.h"
#include "ifec/common/protocol.h"
#include "ifec/common/sim.h"
#include "ifec/endpoint/qp.h"

using namespace ifec;
using common::Opcode;
using endpoint::OpStatus;

namespace {

constexpr uint16_t kWin = 1;
constexpr uint32_t kMtu = 1024;

struct Side {
  endpoint::SymmetricMemory mem;
  common::ChannelPort port;
  std::unique_ptr<endpoint::QueuePair> qp;
  explicit Side(int index) : mem(index) { mem.allocate_window(kWin, 64 * 1024, 1); }
  // Moves every frame the QP has ready onto the port's outbox.
  void pump() {
    while (qp->has_frame()) {
      std::vector<uint8_t> f = qp->next_frame();
      if (f.empty()) {
        break;  // nothing sendable now (window full)
      }
      port.send(std::move(f));
    }
  }
};

struct Wire {
  common::EventLoop loop;
  Side a{0};
  Side b{1};

  Wire() {
    setup(a, 0x101, 0x102, 0x0A000001, 0x0A000002);
    setup(b, 0x102, 0x101, 0x0A000002, 0x0A000001);
  }
  void setup(Side& s, uint32_t local, uint32_t remote, uint32_t ip, uint32_t peer_ip) {
    endpoint::QpConfig c;
    c.local_qpn = local;
    c.remote_qpn = remote;
    c.pkey = common::pkey_of_job(1);
    c.mtu = kMtu;
    c.rto_ns = 50'000;
    c.max_retries = 3;
    c.ack_every = 1;
    c.headers.ip.src = ip;
    c.headers.ip.dst = peer_ip;
    c.headers.udp.src_port = 0xC001;
    Side* sp = &s;
    s.qp = std::make_unique<endpoint::QueuePair>(loop, c, s.mem, [sp] { sp->pump(); });
    s.port.set_receiver([sp](std::vector<uint8_t>&& f) {
      common::ParsedFrame pf;
      const common::WireStatus st = common::parse_frame(f.data(), f.size(), &pf);
      ASSERT_TRUE(st.ok()) << st.message();
      sp->qp->receive(pf, f.data());
    });
  }
  // Parses every frame `from` sent since the last call (each must be a valid RoCEv2 frame, ICRC included).
  std::vector<std::pair<common::ParsedFrame, std::vector<uint8_t>>> sent(Side& from) {
    from.pump();
    std::vector<std::pair<common::ParsedFrame, std::vector<uint8_t>>> out;
    for (auto& f : from.port.take()) {
      common::ParsedFrame pf;
      const common::WireStatus st = common::parse_frame(f.data(), f.size(), &pf);
      EXPECT_TRUE(st.ok()) << st.message();
      out.emplace_back(pf, std::move(f));
    }
    return out;
  }
  // Delivers every frame each side sends to the other until neither sends more (or `rounds` pass).
  void exchange(int rounds = 100) {
    for (int i = 0; i < rounds; ++i) {
      auto ab = sent(a);
      auto ba = sent(b);
      if (ab.empty() && ba.empty()) {
        return;
      }
      for (auto& [pf, f] : ab) {
        b.port.inject(std::move(f));
      }
      for (auto& [pf, f] : ba) {
        a.port.inject(std::move(f));
      }
    }
  }
};

std::shared_ptr<const std::vector<uint8_t>> pattern(size_t n) {
  auto v = std::make_shared<std::vector<uint8_t>>(n);
  for (size_t i = 0; i < n; ++i) {
    (*v)[i] = static_cast<uint8_t>(i * 7 + 3);
  }
  return v;
}

}  // namespace

TEST(QueuePairAlone, WriteIsSegmentedByTheMtuAndAcknowledged) {
  Wire w;
  const auto data = pattern(2500);  // 1024 + 1024 + 452
  const endpoint::WindowInfo* dst = w.b.mem.window(kWin);
  OpStatus st = OpStatus::kRetryExceeded;
  bool done = false;
  w.a.qp->post_write(dst->va + 100, dst->rkey, data, 0, 2500, [&](OpStatus s, uint64_t) { st = s, done = true; });
  auto req = w.sent(w.a);
  ASSERT_EQ(req.size(), 3u);
  const uint8_t ops[3] = {uint8_t(Opcode::kWriteFirst), uint8_t(Opcode::kWriteMiddle), uint8_t(Opcode::kWriteLast)};
  const size_t sizes[3] = {1024, 1024, 452};
  for (int i = 0; i < 3; ++i) {
    const common::ParsedFrame& pf = req[i].first;
    EXPECT_EQ(pf.h.bth.opcode, ops[i]) << "packet " << i;
    EXPECT_EQ(pf.h.bth.psn, static_cast<uint32_t>(i));
    EXPECT_EQ(pf.h.bth.dest_qp, 0x102u);
    EXPECT_EQ(pf.h.bth.pkey, 0x8001);
    EXPECT_EQ(pf.payload_size, sizes[i]);
    EXPECT_EQ(pf.h.reth.has_value(), i == 0) << "only the FIRST packet carries the RETH";
    EXPECT_EQ(pf.h.udp.dst_port, 4791);
  }
  EXPECT_EQ(req[0].first.h.reth->virtual_address, dst->va + 100);
  EXPECT_EQ(req[0].first.h.reth->dma_length, 2500u);
  EXPECT_FALSE(done) << "nothing completes before the responder acknowledged";
  for (auto& [pf, f] : req) {
    w.b.port.inject(std::move(f));
  }
  auto acks = w.sent(w.b);
  ASSERT_FALSE(acks.empty());
  EXPECT_EQ(acks.back().first.h.bth.opcode, uint8_t(Opcode::kAcknowledge));
  EXPECT_EQ(acks.back().first.h.bth.psn, 2u);
  EXPECT_EQ(acks.back().first.h.aeth->kind(), common::AethKind::kAck);
  EXPECT_EQ(std::memcmp(dst->data + 100, data->data(), 2500), 0);
  for (auto& [pf, f] : acks) {
    w.a.port.inject(std::move(f));
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(st, OpStatus::kOk);
}

TEST(QueuePairAlone, ALostMiddlePacketIsNakedAndResentFromItsPsn) {
  Wire w;
  const auto data = pattern(3000);
  const endpoint::WindowInfo* dst = w.b.mem.window(kWin);
  bool ok = false;
  w.a.qp->post_write(dst->va, dst->rkey, data, 0, 3000, [&](OpStatus s, uint64_t) { ok = s == OpStatus::kOk; });
  auto req = w.sent(w.a);
  ASSERT_EQ(req.size(), 3u);
  w.b.port.inject(std::move(req[0].second));
  w.b.port.inject(std::move(req[2].second));  // PSN 1 lost: PSN 2 is ahead of the expected one
  auto replies = w.sent(w.b);
  bool nak1 = false;
  for (const auto& [pf, f] : replies) {
    nak1 = nak1 || (pf.h.aeth && pf.h.aeth->kind() == common::AethKind::kNak &&
                    pf.h.aeth->value() == uint8_t(common::NakCode::kPsnSequenceError) && pf.h.bth.psn == 1);
  }
  EXPECT_TRUE(nak1) << "a PSN sequence error NAK for PSN 1";
  for (auto& [pf, f] : replies) {
    w.a.port.inject(std::move(f));
  }
  auto resent = w.sent(w.a);
  ASSERT_GE(resent.size(), 2u);
  EXPECT_EQ(resent[0].first.h.bth.psn, 1u) << "go-back-N from the NAKed PSN";
  EXPECT_EQ(resent[0].first.h.bth.opcode, uint8_t(Opcode::kWriteMiddle));
  for (auto& [pf, f] : resent) {
    w.b.port.inject(std::move(f));
  }
  w.exchange();
  EXPECT_TRUE(ok);
  EXPECT_EQ(std::memcmp(dst->data, data->data(), 3000), 0);
}

TEST(QueuePairAlone, ADuplicatedFetchAddExecutesOnceAndIsAnsweredFromTheCache) {
  Wire w;
  const endpoint::WindowInfo* dst = w.b.mem.window(kWin);
  const uint64_t start = 1000;
  std::memcpy(dst->data + 8, &start, 8);
  uint64_t fetched = 0;
  w.a.qp->post_atomic(false, dst->va + 8, dst->rkey, 5, 0, [&](OpStatus, uint64_t r) { fetched = r; });
  auto req = w.sent(w.a);
  ASSERT_EQ(req.size(), 1u);
  EXPECT_EQ(req[0].first.h.bth.opcode, uint8_t(Opcode::kFetchAdd));
  EXPECT_EQ(req[0].first.h.atomic->swap_or_add, 5u);
  const std::vector<uint8_t> copy = req[0].second;
  w.b.port.inject(std::vector<uint8_t>(copy));
  w.b.port.inject(std::vector<uint8_t>(copy));  // the same request again (a retransmission the network duplicated)
  auto replies = w.sent(w.b);
  ASSERT_EQ(replies.size(), 2u);
  for (const auto& [pf, f] : replies) {
    EXPECT_EQ(pf.h.bth.opcode, uint8_t(Opcode::kAtomicAcknowledge));
    EXPECT_EQ(pf.h.atomic_ack->original_data, start) << "both answers carry the value before the one add";
  }
  uint64_t now = 0;
  std::memcpy(&now, dst->data + 8, 8);
  EXPECT_EQ(now, start + 5);
  EXPECT_EQ(w.b.qp->counters().atomic_replays, 1u);
  for (auto& [pf, f] : replies) {
    w.a.port.inject(std::move(f));
  }
  EXPECT_EQ(fetched, start);
}

TEST(QueuePairAlone, ReadResponsesArePlacedAndABadRkeyIsNakedWithoutTouchingMemory) {
  Wire w;
  const endpoint::WindowInfo* src = w.b.mem.window(kWin);
  for (int i = 0; i < 2000; ++i) {
    src->data[i] = static_cast<uint8_t>(i ^ 0x5A);
  }
  std::vector<uint8_t> got(2000, 0);
  bool ok = false;
  w.a.qp->post_read(src->va, src->rkey, got.data(), 2000, [&](OpStatus s, uint64_t) { ok = s == OpStatus::kOk; });
  w.exchange();
  EXPECT_TRUE(ok);
  EXPECT_EQ(std::memcmp(got.data(), src->data, 2000), 0);

  OpStatus st = OpStatus::kOk;
  const auto data = pattern(64);
  const std::vector<uint8_t> before(src->data, src->data + 4096);
  w.a.qp->post_write(src->va, src->rkey ^ 0x55, data, 0, 64, [&](OpStatus s, uint64_t) { st = s; });
  auto req = w.sent(w.a);
  for (auto& [pf, f] : req) {
    w.b.port.inject(std::move(f));
  }
  auto replies = w.sent(w.b);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].first.h.aeth->kind(), common::AethKind::kNak);
  EXPECT_EQ(replies[0].first.h.aeth->value(), uint8_t(common::NakCode::kRemoteAccessError));
  EXPECT_EQ(std::memcmp(before.data(), src->data, 4096), 0);
  w.a.port.inject(std::move(replies[0].second));
  EXPECT_EQ(st, OpStatus::kRemoteAccessError);
}

TEST(QueuePairAlone, AdaptiveTimeoutLearnsASlowPathAndStopsRetransmitting) {
  // ACKs come back 120 us after each write, more than the configured 50 us timeout. A fixed timeout retransmits
  // every write; an adaptive one (Jacobson/Karels, Karn's rule, backed-off until a valid sample) learns the path
  // after a few writes and then waits it out.
  for (bool adaptive : {false, true}) {
    common::EventLoop loop;
    endpoint::SymmetricMemory ma(0), mb(1);
    mb.allocate_window(kWin, 64 * 1024, 1);
    auto cfg = [&](uint32_t l, uint32_t r) {
      endpoint::QpConfig c;
      c.local_qpn = l;
      c.remote_qpn = r;
      c.pkey = common::pkey_of_job(1);
      c.rto_ns = 50'000;
      c.rto_max_ns = 10'000'000;
      c.max_retries = 30;
      c.ack_every = 1;
      c.adaptive_rto = adaptive;
      return c;
    };
    endpoint::QueuePair a(loop, cfg(0x101, 0x102), ma, [] {}), b(loop, cfg(0x102, 0x101), mb, [] {});
    auto deliver = [](endpoint::QueuePair& from, endpoint::QueuePair& to) {
      while (from.has_frame()) {
        std::vector<uint8_t> f = from.next_frame();
        if (f.empty()) break;
        common::ParsedFrame pf;
        ASSERT_TRUE(common::parse_frame(f.data(), f.size(), &pf).ok());
        to.receive(pf, f.data());
      }
    };
    const auto data = pattern(256);
    int done = 0;
    for (int i = 0; i < 20; ++i) {
      a.post_write(mb.window(kWin)->va, mb.window(kWin)->rkey, data, 0, 256, [&](OpStatus, uint64_t) { ++done; });
      deliver(a, b);                   // the write reaches B at once
      loop.run(loop.now() + 120'000);  // B's ACK takes 120 us to come back (timers may fire meanwhile)
      deliver(a, b);                   // retransmissions the timer made (B acknowledges them again)
      deliver(b, a);
      loop.run(loop.now() + 1'000);
    }
    EXPECT_EQ(done, 20);
    if (adaptive) {
      EXPECT_LE(a.counters().timeouts, 4u) << "learned after a few writes";
    } else {
      EXPECT_GE(a.counters().timeouts, 19u) << "a fixed 50 us timeout fires on every write";
    }
  }
}

// A real RDMA peer (a Soft-RoCE guest, testbed/rxe) writes as a NIC does: WRITE FIRST/LAST, its own QP number and
// PSNs (here across the 24-bit wrap), the default partition 0xFFFF. After attach_external the responder places the
// message, acknowledges it under the peer's QP number and P_Key, and refuses a SEND (it has no receive queue) with
// NAK Invalid Request instead of dropping it silently.
TEST(QueuePairAlone, AnExternalPeersWriteIsAckedUnderItsQpnAndSendIsRefused) {
  Wire w;
  const uint16_t kPeerWin = 2;
  const endpoint::WindowInfo& win = w.b.mem.allocate_window(kPeerWin, 4096, common::job_of_pkey(0xFFFF));
  w.b.qp->attach_external(0x11, 0xFFFFFE, 0xFFFF);
  EXPECT_TRUE(w.b.qp->external());
  const auto data = pattern(2048);
  auto request = [&](Opcode op, uint32_t psn, const uint8_t* payload, size_t len, bool ack_req) {
    common::FrameHeaders h;
    h.ip.src = 0x0A000001;  // the peer's address (what its GID says)
    h.ip.dst = 0x0A000002;
    h.udp.src_port = 0xD00D;
    h.bth.opcode = uint8_t(op);
    h.bth.pkey = 0xFFFF;
    h.bth.dest_qp = 0x102;
    h.bth.psn = psn;
    h.bth.ack_req = ack_req;
    if (op == Opcode::kWriteFirst) {
      h.reth = common::Reth{win.va + 8, win.rkey, 2048};
    }
    w.b.port.inject(common::encode_frame(h, payload, len));
  };
  request(Opcode::kWriteFirst, 0xFFFFFE, data->data(), 1024, false);
  request(Opcode::kWriteLast, 0xFFFFFF, data->data() + 1024, 1024, true);
  EXPECT_EQ(std::memcmp(win.data + 8, data->data(), 2048), 0) << "the message landed where its RETH said";
  auto acks = w.sent(w.b);
  ASSERT_FALSE(acks.empty());
  const common::ParsedFrame& ack = acks.back().first;
  EXPECT_EQ(ack.h.bth.opcode, uint8_t(Opcode::kAcknowledge));
  EXPECT_EQ(ack.h.bth.dest_qp, 0x11u) << "responses go to the peer's QP";
  EXPECT_EQ(ack.h.bth.pkey, 0xFFFF);
  EXPECT_EQ(ack.h.bth.psn, 0xFFFFFFu);
  EXPECT_EQ(ack.h.aeth->kind(), common::AethKind::kAck);
  // A SEND at the next PSN (0 after the wrap): what the endpoint does with any SEND from an external peer.
  w.b.qp->reject_unsupported(0);
  auto nak = w.sent(w.b);
  ASSERT_EQ(nak.size(), 1u);
  EXPECT_EQ(nak[0].first.h.bth.psn, 0u);
  EXPECT_EQ(nak[0].first.h.aeth->syndrome, common::Aeth::nak(common::NakCode::kInvalidRequest, 0).syndrome);
  EXPECT_EQ(w.b.qp->counters().invalid_naks_sent, 1u);
}

// A peer that cannot be reset (an external RDMA stack whose QP went into error, say) leaves the requester in error:
// new work fails at once. Attaching the peer again (its new QP) starts the requester clean at next_psn(): the next
// write goes out at that PSN and completes.
TEST(QueuePairAlone, AttachingAgainAfterAnErrorStartsTheRequesterClean) {
  Wire w;
  w.a.qp->on_reconnect([&](uint32_t psn) { w.a.qp->peer_reset(psn, false); });  // the peer refuses: it is gone
  const endpoint::WindowInfo* dst = w.b.mem.window(kWin);
  const auto data = pattern(1500);
  OpStatus bad = OpStatus::kPending;
  w.a.qp->post_write(dst->va, dst->rkey ^ 0x55, data, 0, 64, [&](OpStatus s, uint64_t) { bad = s; });
  w.exchange();
  EXPECT_EQ(bad, OpStatus::kRemoteAccessError);
  ASSERT_TRUE(w.a.qp->failed());
  OpStatus refused = OpStatus::kPending;
  w.a.qp->post_write(dst->va, dst->rkey, data, 0, 64, [&](OpStatus s, uint64_t) { refused = s; });
  EXPECT_EQ(refused, OpStatus::kRetryExceeded) << "in error, new work fails at once";

  w.a.qp->attach_external(0x102, w.b.qp->next_psn(), common::pkey_of_job(1));
  EXPECT_FALSE(w.a.qp->failed());
  w.b.qp->reset_responder(w.a.qp->next_psn());  // the peer's new QP expects the PSN the attach handed it
  OpStatus good = OpStatus::kPending;
  w.a.qp->post_write(dst->va + 100, dst->rkey, data, 0, 1500, [&](OpStatus s, uint64_t) { good = s; });
  const auto first = w.sent(w.a);
  ASSERT_EQ(first.size(), 2u);  // 1500 B at a 1024 B MTU
  EXPECT_EQ(first[0].first.h.bth.psn, w.b.qp->expected_psn());
  for (auto [pf, f] : first) {
    w.b.port.inject(std::move(f));
  }
  w.exchange();
  EXPECT_EQ(good, OpStatus::kOk);
  EXPECT_EQ(std::memcmp(dst->data + 100, data->data(), 1500), 0);
}
