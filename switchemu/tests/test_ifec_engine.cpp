// The IFEC engine alone (no ports, no fabric): what it emits for a compact-ECH multicast and its retransmissions,
// which groups it reserves, and how it answers a reduction's resent contributions and silent members.
// Reductions are tested through whole fabrics in testbed/sim/tests (test_ifec_collectives.cpp, test_ifec_rows.cpp).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ifec/common/frame.h"
#include "ifec/common/protocol.h"
#include "ifec/common/sim.h"
#include "ifec/switchemu/ifec_engine.h"

using namespace ifec;

namespace {

constexpr uint32_t kSwitchIp = 0x0AFF0001;
constexpr uint16_t kWindow = 40;
uint32_t gpu_ip(int g) { return 0x0A000001u + static_cast<uint32_t>(g); }

// The headers GPU `from` sends the switch about GPU 0's multicast packet PSN 5 in window kWindow (compact ECH).
common::FrameHeaders multicast_headers(int from, common::Opcode opcode) {
  common::FrameHeaders h;
  h.ip.src = gpu_ip(from);
  h.ip.dst = kSwitchIp;
  h.ip.dscp = common::kRoceDscp;
  h.udp.src_port = static_cast<uint16_t>(0xC001 + from);
  h.bth.opcode = static_cast<uint8_t>(opcode);
  h.bth.pkey = common::pkey_of_job(1);
  h.bth.dest_qp = common::kEchQpn;
  h.bth.psn = 5;
  common::Ech ech;
  ech.format = common::EchFormat::kCompact;
  ech.op = common::EchOp::kMulticast;
  ech.source_id = 0;
  ech.window_id = kWindow;
  h.ech = ech;
  return h;
}

// GPU 0's multicast packet of 256 bytes to GPUs 1 and 2, as its EchAgent sends it (or resends it).
std::vector<uint8_t> multicast_frame(bool retransmission) {
  common::FrameHeaders h = multicast_headers(0, common::Opcode::kWriteOnly);
  h.ech->flags = retransmission ? common::ech_flags::kRetransmission : 0;
  h.ech->dest_bitmap = (1ULL << 1) | (1ULL << 2);
  h.reth = common::Reth{64, 0, 256};
  const std::vector<uint8_t> data(256, 0x5A);
  return common::encode_frame(h, data.data(), data.size());
}

struct Engine {
  common::EventLoop loop;
  std::vector<std::vector<uint8_t>> out;  // what the engine emitted
  std::vector<uint64_t> sprays;           // and which member of equal next hops each names
  switchemu::IfecEngine e{loop, routing::IfecParams{}, 100'000'000'000ULL, kSwitchIp,
                          [this](std::vector<uint8_t>&& f, uint64_t spray) {
                            out.push_back(std::move(f));
                            sprays.push_back(spray);
                          }};
  Engine() {
    for (int g = 1; g <= 2; ++g) {
      e.register_window({g, gpu_ip(g), kWindow, 0x100000ULL * g, 0x77u + g, 1});
    }
  }
  void receive(bool retransmission) { deliver(multicast_frame(retransmission)); }
  // GPU `g`'s ACK of its replica of the packet, as its EchAgent sends it.
  void ack_from(int g) {
    common::FrameHeaders h = multicast_headers(g, common::Opcode::kAcknowledge);
    h.ech->set_destination(static_cast<uint16_t>(g));
    h.aeth = common::Aeth::ack(0);
    deliver(common::encode_frame(h, nullptr, 0));
  }
  void deliver(const std::vector<uint8_t>& f) {
    common::ParsedFrame pf;
    ASSERT_TRUE(common::parse_frame(f.data(), f.size(), &pf).ok());
    e.receive(pf, f.data());
  }
  // The ECH flags of the last frame emitted, which must be the source's completion.
  uint8_t completion_flags() const {
    common::ParsedFrame pf;
    EXPECT_TRUE(common::parse_frame(out.back().data(), out.back().size(), &pf).ok());
    EXPECT_EQ(pf.h.bth.opcode, static_cast<uint8_t>(common::Opcode::kAcknowledge));
    EXPECT_EQ(pf.h.ip.dst, gpu_ip(0));
    return pf.h.ech->flags;
  }
};

}  // namespace

// A source's retransmission while the first replicas are still queued toward their GPUs (the switch's backlog,
// 50 us here) is held: a second copy would only lengthen that queue. Once the replicas can have been acknowledged
// (backlog + kRepairSlackNs), the same retransmission is repaired toward both unacknowledged destinations.
TEST(IfecEngineMulticast, RepairsOnlyOnceTheEarlierReplicaCanHaveBeenAcknowledged) {
  Engine s;
  s.e.set_backlog([](uint32_t) { return common::TimeNs{50'000}; });
  s.receive(false);
  ASSERT_EQ(s.out.size(), 2u) << "one replica per destination";
  s.loop.run(s.loop.now() + 50'000);  // the replicas have left the queue, not yet been acknowledged
  s.receive(true);
  EXPECT_EQ(s.out.size(), 2u);
  EXPECT_EQ(s.e.counters().multicast_repairs_held, 2u);
  EXPECT_EQ(s.e.counters().multicast_repairs, 0u);
  s.loop.run(s.loop.now() + switchemu::IfecEngine::kRepairSlackNs);
  s.receive(true);
  ASSERT_EQ(s.out.size(), 4u);
  EXPECT_EQ(s.e.counters().multicast_repairs, 2u);
  common::ParsedFrame pf;
  ASSERT_TRUE(common::parse_frame(s.out[3].data(), s.out[3].size(), &pf).ok());
  EXPECT_EQ(pf.h.ip.dst, gpu_ip(2));
  EXPECT_EQ(pf.h.reth->virtual_address, 0x200000ULL + 64) << "rewritten to the destination's window";
}

// Without a backlog to consult (a switch that cannot see its queues), every retransmission is repaired at once.
TEST(IfecEngineMulticast, WithoutABacklogEveryRetransmissionIsRepaired) {
  Engine s;
  s.receive(false);
  s.receive(true);
  EXPECT_EQ(s.out.size(), 4u);
  EXPECT_EQ(s.e.counters().multicast_repairs, 2u);
  EXPECT_EQ(s.e.counters().multicast_repairs_held, 0u);
}

// The source's completion says whether a copy it sent again reached the switch first: without the flag, the original
// completed before any copy came (it was late, not lost: EchAgent then resends nothing more behind it); with it, the
// answer follows the copy (a repair, or the entry the copy made where the original was lost). A copy of a packet
// already completed is answered at once, flagged.
TEST(IfecEngineMulticast, TheCompletionSaysWhetherACopyCameFirst) {
  Engine plain;
  plain.receive(false);
  plain.ack_from(1);
  plain.ack_from(2);
  ASSERT_EQ(plain.out.size(), 3u) << "two replicas, one completion";
  EXPECT_EQ(plain.completion_flags(), 0);
  plain.receive(true);  // the copy comes after the completion
  ASSERT_EQ(plain.out.size(), 4u);
  EXPECT_EQ(plain.completion_flags(), common::ech_flags::kRetransmission);

  Engine repaired;
  repaired.receive(false);
  repaired.ack_from(1);
  repaired.receive(true);  // repaired toward GPU 2 only
  ASSERT_EQ(repaired.out.size(), 3u);
  repaired.ack_from(2);
  ASSERT_EQ(repaired.out.size(), 4u);
  EXPECT_EQ(repaired.completion_flags(), common::ech_flags::kRetransmission);

  Engine lost;
  lost.receive(true);  // the original never came
  lost.ack_from(1);
  lost.ack_from(2);
  ASSERT_EQ(lost.out.size(), 3u);
  EXPECT_EQ(lost.completion_flags(), common::ech_flags::kRetransmission);
}

common::GroupReservation group_of(uint16_t id, size_t members, uint32_t upstream_ip) {
  common::GroupReservation r;
  r.group = id;
  r.slots = 4;
  r.upstream_ip = upstream_ip;
  for (size_t m = 0; m < members; ++m) {
    r.members.push_back({true, gpu_ip(static_cast<int>(m)), 0, 0, true});
  }
  return r;
}

// A group's members are the GPUs contributing at this switch, at most the switch's max_group_members (64 by default:
// the width of its slots' bitmaps): more are refused with the count. A two-tier leaf may have a single member (it
// still sends its partial upstream); a group that is its own root needs two.
TEST(IfecEngineReserve, MembersAtMost64AndOneOnlyUnderAnUpstream) {
  Engine s;
  std::string why;
  EXPECT_FALSE(s.e.reserve(group_of(1, 65, 0), &why));
  EXPECT_NE(why.find("has 65 members, expected 2..64"), std::string::npos) << why;
  EXPECT_FALSE(s.e.reserve(group_of(2, 1, 0), &why));
  EXPECT_NE(why.find("has 1 members, expected 2..64"), std::string::npos) << why;
  EXPECT_TRUE(s.e.reserve(group_of(3, 1, 0x0AFF0002), &why)) << why;
  EXPECT_TRUE(s.e.reserve(group_of(4, 64, 0), &why)) << why;
  EXPECT_EQ(s.e.counters().reservations, 2u);
  EXPECT_EQ(s.e.counters().reservation_failures, 2u);
}

// A switch configured for 256-member groups (one plane switch under 256 GPUs: the MoE combine at EP 256) takes
// contributions from members past 64 and completes a slot when all of them, or the expected count, arrived.
TEST(IfecEngineReserve, AWiderSwitchTakesGroupsOf256) {
  common::EventLoop loop;
  std::vector<std::vector<uint8_t>> out;
  std::vector<uint64_t> sprays;
  routing::IfecParams params;
  params.max_group_members = 256;
  switchemu::IfecEngine e{loop, params, 100'000'000'000ULL, kSwitchIp, [&](std::vector<uint8_t>&& f, uint64_t s) {
                            out.push_back(std::move(f));
                            sprays.push_back(s);
                          }};
  std::string why;
  EXPECT_FALSE(e.reserve(group_of(1, 257, 0), &why));
  EXPECT_NE(why.find("has 257 members, expected 2..256"), std::string::npos) << why;
  common::GroupReservation r = group_of(2, 256, 0);
  r.op = common::EchOp::kReduce;
  for (auto& m : r.members) {
    m.destination = false;
  }
  r.members[0].destination = true;
  ASSERT_TRUE(e.reserve(r, &why)) << why;
  // Chunk 0 expects 3 contributors: members 100, 200 and 255; the result goes to member 0 once the third arrives.
  for (int c : {100, 200, 255}) {
    EXPECT_EQ(e.counters().slots_completed, 0u);
    common::FrameHeaders h;
    h.ip.src = gpu_ip(c);
    h.ip.dst = kSwitchIp;
    h.bth.opcode = static_cast<uint8_t>(common::Opcode::kWriteOnly);
    h.bth.pkey = common::pkey_of_job(1);
    h.bth.dest_qp = common::kEchQpn;
    common::Ech ech;
    ech.format = common::EchFormat::kStandard;
    ech.op = common::EchOp::kReduce;
    ech.job_id = 1;
    ech.group_id = 2;
    ech.contributor_id = static_cast<uint16_t>(c);
    ech.chunk_index = 3;
    ech.expected = 3;
    ech.element_count = 4;
    h.ech = ech;
    h.reth = common::Reth{0, 0, 16};
    const std::vector<uint8_t> data(16, 0);
    const std::vector<uint8_t> f = common::encode_frame(h, data.data(), data.size());
    common::ParsedFrame pf;
    ASSERT_TRUE(common::parse_frame(f.data(), f.size(), &pf).ok());
    e.receive(pf, f.data());
  }
  EXPECT_EQ(e.counters().contributions, 3u);
  EXPECT_EQ(e.counters().slots_completed, 1u);
  EXPECT_EQ(e.counters().results_sent, 1u);
  // Every frame about chunk 3 of group 2 (three ACKs, the result) names member 3 + 2 of equal next hops: on a
  // Y-cable, the sub-link the endpoint sent the contributions on.
  ASSERT_EQ(sprays.size(), 4u);
  EXPECT_EQ(sprays, std::vector<uint64_t>(4, 5));
}

// ECH v2 (a bitmap base): GPU 200 multicasts to GPUs 70 and 127; each replica names its one destination in its
// own block of 64, and the single completion to the source names GPU 200 once both acknowledged.
TEST(IfecEngineMulticast, ReachesGpusPast63WithABitmapBase) {
  Engine s;
  for (int g : {70, 127}) {
    s.e.register_window({g, gpu_ip(g), kWindow, 0x100000ULL * g, 0x77u + g, 1});
  }
  std::vector<uint8_t> f = multicast_frame(false);
  common::ParsedFrame pf;
  ASSERT_TRUE(common::parse_frame(f.data(), f.size(), &pf).ok());
  common::FrameHeaders h = pf.h;
  h.ip.src = gpu_ip(200);
  h.ech->source_id = 200;
  h.ech->bitmap_base = 64;
  h.ech->dest_bitmap = (1ULL << 6) | (1ULL << 63);
  f = common::encode_frame(h, f.data() + pf.payload_offset, pf.payload_size);
  ASSERT_TRUE(common::parse_frame(f.data(), f.size(), &pf).ok());
  s.e.receive(pf, f.data());
  ASSERT_EQ(s.out.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    common::ParsedFrame r;
    ASSERT_TRUE(common::parse_frame(s.out[i].data(), s.out[i].size(), &r).ok());
    const int dest = i == 0 ? 70 : 127;
    EXPECT_EQ(r.h.ip.dst, gpu_ip(dest));
    EXPECT_TRUE(r.h.ech->addresses(dest));
    EXPECT_EQ(r.h.ech->dest_bitmap, 1ULL << (dest - 64)) << "one destination, in its own block";
    EXPECT_EQ(r.h.ech->source_id, 200);
    // The destination's acknowledgement (EchAgent::send_ack): the replica's ECH, its own GPU as the destination.
    common::FrameHeaders ack = r.h;
    ack.ip.src = gpu_ip(dest);
    ack.ip.dst = kSwitchIp;
    ack.bth.opcode = static_cast<uint8_t>(common::Opcode::kAcknowledge);
    ack.reth.reset();
    ack.aeth = common::Aeth::ack(0);
    const std::vector<uint8_t> a = common::encode_frame(ack, nullptr, 0);
    common::ParsedFrame apf;
    ASSERT_TRUE(common::parse_frame(a.data(), a.size(), &apf).ok());
    s.e.receive(apf, a.data());
    EXPECT_EQ(s.out.size(), i == 0 ? 2u : 3u) << "the source hears once, after the last destination";
  }
  common::ParsedFrame done;
  ASSERT_TRUE(common::parse_frame(s.out[2].data(), s.out[2].size(), &done).ok());
  EXPECT_EQ(done.h.ip.dst, gpu_ip(200));
  EXPECT_TRUE(done.h.ech->addresses(200));
  EXPECT_EQ(s.e.counters().multicast_completions, 1u);
}

namespace {

// Member `c`'s frame about chunk `chunk` of group 7 (AllReduce, fp32, 4 elements): its contribution, or with `ack`
// its acknowledgement of the chunk's result (as EchAgent sends them).
std::vector<uint8_t> reduce_frame(int c, uint32_t chunk, bool ack = false) {
  common::FrameHeaders h;
  h.ip.src = gpu_ip(c);
  h.ip.dst = kSwitchIp;
  h.bth.opcode = static_cast<uint8_t>(ack ? common::Opcode::kAcknowledge : common::Opcode::kWriteOnly);
  h.bth.pkey = common::pkey_of_job(1);
  h.bth.dest_qp = common::kEchQpn;
  h.bth.psn = chunk;
  common::Ech ech;
  ech.format = common::EchFormat::kStandard;
  ech.op = common::EchOp::kAllReduce;
  ech.job_id = 1;
  ech.group_id = 7;
  ech.contributor_id = static_cast<uint16_t>(c);
  ech.chunk_index = chunk;
  ech.element_count = ack ? 0 : 4;
  h.ech = ech;
  if (ack) {
    h.aeth = common::Aeth::ack(0);
    return common::encode_frame(h, nullptr, 0);
  }
  h.reth = common::Reth{16ULL * chunk, 0, 16};
  const std::vector<uint8_t> data(16, 0);
  return common::encode_frame(h, data.data(), data.size());
}

void deliver(Engine& s, const std::vector<uint8_t>& f) {
  common::ParsedFrame pf;
  ASSERT_TRUE(common::parse_frame(f.data(), f.size(), &pf).ok());
  s.e.receive(pf, f.data());
}

common::ParsedFrame parsed(const std::vector<uint8_t>& f) {
  common::ParsedFrame pf;
  EXPECT_TRUE(common::parse_frame(f.data(), f.size(), &pf).ok());
  return pf;
}

}  // namespace

// A destination resends its contribution while the slot still waits for another member (a late host): the switch
// acknowledges it as held (an ACK where a destination otherwise only ever gets the result), writes nothing, and
// sends the result to every member once the last contribution arrives.
TEST(IfecEngineReduce, AResentContributionToASlotStillWaitingIsAcknowledgedAsHeld) {
  Engine s;
  ASSERT_TRUE(s.e.reserve(group_of(7, 3, 0), nullptr));
  deliver(s, reduce_frame(0, 0));
  deliver(s, reduce_frame(1, 0));
  EXPECT_TRUE(s.out.empty()) << "destinations hear only the result";
  deliver(s, reduce_frame(0, 0));  // member 0's timer ran out: member 2 is late
  ASSERT_EQ(s.out.size(), 1u);
  const common::ParsedFrame held = parsed(s.out[0]);
  EXPECT_EQ(held.h.bth.opcode, static_cast<uint8_t>(common::Opcode::kAcknowledge));
  EXPECT_EQ(held.h.ip.dst, gpu_ip(0));
  EXPECT_EQ(held.h.ech->chunk_index, 0u);
  EXPECT_EQ(s.e.counters().held_answers, 1u);
  EXPECT_EQ(s.e.counters().contributions, 2u) << "the copy was not aggregated again";
  deliver(s, reduce_frame(2, 0));
  ASSERT_EQ(s.out.size(), 4u);
  for (size_t i = 1; i < 4; ++i) {
    EXPECT_EQ(parsed(s.out[i]).h.bth.opcode, static_cast<uint8_t>(common::Opcode::kWriteOnly));
  }
  EXPECT_EQ(s.e.counters().slots_completed, 1u);
}

// A member silent past the result timeout with four results unacknowledged gets one of them again per timeout, not
// all four (the others' timers count the try and wait for its answer); once it answers, the rest follow it.
TEST(IfecEngineReduce, ResendsToASilentMemberOneResultAtATime) {
  Engine s;
  ASSERT_TRUE(s.e.reserve(group_of(7, 2, 0), nullptr));  // 4 slots
  for (uint32_t chunk = 0; chunk < 4; ++chunk) {
    deliver(s, reduce_frame(0, chunk));
    deliver(s, reduce_frame(1, chunk));
    deliver(s, reduce_frame(0, chunk, true));  // member 0 has its result; member 1 stays silent
  }
  ASSERT_EQ(s.e.counters().results_sent, 8u);
  const common::TimeNs rto = routing::IfecParams{}.result_retransmit_ns;
  s.loop.run(s.loop.now() + rto + 1);
  EXPECT_EQ(s.e.counters().result_resends, 1u) << "one probe toward member 1";
  ASSERT_EQ(s.out.size(), 9u);
  EXPECT_EQ(parsed(s.out.back()).h.ip.dst, gpu_ip(1));
  deliver(s, reduce_frame(1, parsed(s.out.back()).h.ech->chunk_index, true));  // it answers: late, not gone
  for (uint32_t chunk = 0; chunk < 4; ++chunk) {
    deliver(s, reduce_frame(1, chunk, true));
  }
  s.loop.run(s.loop.now() + 16 * rto);
  EXPECT_EQ(s.e.counters().result_resends, 1u);
  EXPECT_EQ(s.e.counters().slots_reclaimed, 0u);
}

// A member that never answers is still given up after result_retries tries of each slot: the slots waiting on
// another slot's resend count their tries too.
TEST(IfecEngineReduce, AMemberThatNeverAnswersIsStillGivenUp) {
  Engine s;
  ASSERT_TRUE(s.e.reserve(group_of(7, 2, 0), nullptr));
  for (uint32_t chunk = 0; chunk < 4; ++chunk) {
    deliver(s, reduce_frame(0, chunk));
    deliver(s, reduce_frame(1, chunk));
    deliver(s, reduce_frame(0, chunk, true));
  }
  const routing::IfecParams p;
  s.loop.run(s.loop.now() + p.result_retransmit_ns * 8 * (p.result_retries + 2));
  EXPECT_EQ(s.e.counters().slots_reclaimed, 4u);
  EXPECT_LE(s.e.counters().result_resends, p.result_retries + 4u) << "about one per timeout, not four";
}

// A destination resends its contribution while the slot still lacks member 2's: if member 2 has already contributed
// a later chunk (it sends its chunks in order), its contribution to this one was lost, and the switch asks it for
// that chunk again at once (a NAK, PSN sequence error, once per slot); a member that has not got that far is late
// and is not asked.
TEST(IfecEngineReduce, AMemberThatSkippedAChunkIsAskedForItAndALateOneIsNot) {
  Engine s;
  ASSERT_TRUE(s.e.reserve(group_of(7, 3, 0), nullptr));  // 4 slots
  deliver(s, reduce_frame(0, 0));
  deliver(s, reduce_frame(1, 0));
  deliver(s, reduce_frame(0, 0));  // member 2 has sent nothing yet: late
  ASSERT_EQ(s.out.size(), 1u);
  EXPECT_EQ(s.e.counters().resend_requests, 0u);
  deliver(s, reduce_frame(2, 1));  // member 2's chunk 1 arrives: its chunk 0 was lost
  deliver(s, reduce_frame(1, 0));  // member 1's timer runs out
  ASSERT_EQ(s.out.size(), 3u);
  const common::ParsedFrame nak = parsed(s.out[1]);
  EXPECT_EQ(nak.h.ip.dst, gpu_ip(2));
  EXPECT_EQ(nak.h.bth.opcode, static_cast<uint8_t>(common::Opcode::kAcknowledge));
  ASSERT_TRUE(nak.h.aeth.has_value());
  EXPECT_EQ(nak.h.aeth->kind(), common::AethKind::kNak);
  EXPECT_EQ(nak.h.aeth->value(), static_cast<uint8_t>(common::NakCode::kPsnSequenceError));
  EXPECT_EQ(nak.h.ech->chunk_index, 0u);
  EXPECT_EQ(nak.h.ech->contributor_id, 2u);
  EXPECT_EQ(parsed(s.out[2]).h.ip.dst, gpu_ip(1)) << "member 1 is answered as held";
  deliver(s, reduce_frame(0, 0));
  EXPECT_EQ(s.e.counters().resend_requests, 1u) << "asked once per slot";
  deliver(s, reduce_frame(2, 0));  // its answer completes the chunk
  EXPECT_EQ(s.e.counters().slots_completed, 1u);
}

// A member that acknowledged a later chunk's result but not this one's lost it (results leave in the order slots
// complete): at the result timer it gets it again though it is not silent (a member with no later acknowledgement
// is only slow, and waits as in ResendsToASilentMemberOneResultAtATime).
TEST(IfecEngineReduce, AResultAMemberSkippedIsSentAgainAtTheResultTimer) {
  Engine s;
  ASSERT_TRUE(s.e.reserve(group_of(7, 2, 0), nullptr));
  for (uint32_t chunk = 0; chunk < 2; ++chunk) {
    deliver(s, reduce_frame(0, chunk));
    deliver(s, reduce_frame(1, chunk));
  }
  deliver(s, reduce_frame(0, 0, true));
  deliver(s, reduce_frame(0, 1, true));
  deliver(s, reduce_frame(1, 1, true));  // member 1 has chunk 1's result, not chunk 0's
  const size_t before = s.out.size();
  const common::TimeNs rto = routing::IfecParams{}.result_retransmit_ns;
  s.loop.run(s.loop.now() + rto + 1);
  EXPECT_EQ(s.e.counters().lost_results, 1u);
  EXPECT_EQ(s.e.counters().result_resends, 0u) << "member 1 was heard from: not silent";
  ASSERT_EQ(s.out.size(), before + 1);
  EXPECT_EQ(parsed(s.out.back()).h.ip.dst, gpu_ip(1));
  EXPECT_EQ(parsed(s.out.back()).h.ech->chunk_index, 0u);
}
