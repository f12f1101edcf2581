// Whole frames: encode/parse round trips for every sample kind, and a parser that never trusts its input.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <stdexcept>
#include <vector>

#include "ifec/common/byte_order.h"
#include "ifec/common/checks.h"
#include "ifec/common/frame.h"
#include "ifec/common/icrc.h"
#include "ifec/common/samples.h"

using namespace ifec::common;

namespace {

WireStatus parse(const std::vector<uint8_t>& f, ParsedFrame* pf = nullptr, ParseOptions opts = {}) {
  ParsedFrame local;
  return parse_frame(f.data(), f.size(), pf ? pf : &local, opts);
}

// Re-seals a frame after a deliberate header edit so only the edit is wrong, not the checksums.
void reseal(std::vector<uint8_t>* f, size_t bth_offset) {
  uint8_t* ip = f->data() + 14;
  store_be16(ip + 10, 0);
  store_be16(ip + 10, ipv4_checksum(ip, 20));
  const size_t n = f->size() - 14 - 4;
  const uint32_t icrc = compute_icrc(ip, n, bth_offset - 14);
  for (int i = 0; i < 4; ++i) {
    (*f)[f->size() - 4 + i] = static_cast<uint8_t>(icrc >> (8 * i));
  }
}

const SampleFrame& sample(const std::string& name) {
  static const std::vector<SampleFrame> all = sample_frames();
  for (const auto& s : all) {
    if (s.name == name) {
      return s;
    }
  }
  throw std::runtime_error("no sample " + name);
}

}  // namespace

TEST(Frame, EverySampleRoundTrips) {
  for (const SampleFrame& s : sample_frames()) {
    ParsedFrame pf;
    WireStatus st = parse(s.bytes, &pf);
    ASSERT_TRUE(st.ok()) << s.name << ": " << st.message();
    EXPECT_EQ(pf.h.bth.opcode, s.headers.bth.opcode) << s.name;
    EXPECT_EQ(pf.h.bth.dest_qp, s.headers.bth.dest_qp) << s.name;
    EXPECT_EQ(pf.h.bth.psn, s.headers.bth.psn) << s.name;
    EXPECT_EQ(pf.payload_size, s.payload.size()) << s.name;
    EXPECT_EQ(std::vector<uint8_t>(s.bytes.begin() + pf.payload_offset,
                                   s.bytes.begin() + pf.payload_offset + pf.payload_size),
              s.payload)
        << s.name;
    EXPECT_EQ(pf.h.reth.has_value(), s.headers.reth.has_value()) << s.name;
    if (pf.h.reth) {
      EXPECT_EQ(pf.h.reth->virtual_address, s.headers.reth->virtual_address) << s.name;
      EXPECT_EQ(pf.h.reth->rkey, s.headers.reth->rkey) << s.name;
      EXPECT_EQ(pf.h.reth->dma_length, s.headers.reth->dma_length) << s.name;
    }
    EXPECT_EQ(pf.h.ech.has_value(), s.headers.ech.has_value()) << s.name;
    EXPECT_EQ(pf.h.udp.dst_port, s.headers.ech ? kEchUdpPort : UdpHeader::kRoceV2Port) << s.name;
    EXPECT_EQ((pf.payload_size + pf.h.bth.pad_count) % 4, 0u) << s.name;
  }
}

// Every sample with a payload, elided: its headers alone, the real frame's headers and lengths once parsed (where
// the simulation allows it), its whole length on the wire, and refused everywhere else.
TEST(Frame, ElidedPayloadsKeepHeadersAndLengthsAndAreRefusedUnlessAllowed) {
  ParseOptions allow;
  allow.allow_elided = true;
  int elided = 0;
  for (const SampleFrame& s : sample_frames()) {
    if (s.payload.empty()) {
      continue;
    }
    ++elided;
    const std::vector<uint8_t> f = encode_frame(s.headers, nullptr, s.payload.size());
    ParsedFrame real;
    ParsedFrame pf;
    ASSERT_TRUE(parse(s.bytes, &real).ok()) << s.name;
    ASSERT_TRUE(parse(f, &pf, allow).ok()) << s.name << ": " << parse(f, &pf, allow).message();
    EXPECT_EQ(f.size(), real.payload_offset) << s.name << ": the headers and nothing else";
    EXPECT_TRUE(pf.elided) << s.name;
    EXPECT_FALSE(real.elided) << s.name;
    EXPECT_EQ(pf.payload_size, s.payload.size()) << s.name;
    EXPECT_EQ(pf.payload_offset, real.payload_offset) << s.name;
    EXPECT_EQ(pf.h.ip.total_length, real.h.ip.total_length) << s.name;
    EXPECT_EQ(pf.h.udp.length, real.h.udp.length) << s.name;
    EXPECT_EQ(pf.h.bth.pad_count, real.h.bth.pad_count) << s.name;
    EXPECT_EQ(wire_frame_bytes(f), s.bytes.size()) << s.name;
    EXPECT_EQ(wire_frame_bytes(s.bytes), s.bytes.size()) << s.name;
    EXPECT_FALSE(parse(f).ok()) << s.name << ": elided frames are refused where they are not allowed";
    L3View l3;
    EXPECT_FALSE(parse_l3(f.data(), f.size(), &l3).ok()) << s.name;
    EXPECT_TRUE(parse_l3(f.data(), f.size(), &l3, true).ok()) << s.name;
    // A frame cut anywhere inside its headers is malformed even where elision is allowed.
    for (size_t n = 0; n < f.size(); ++n) {
      EXPECT_FALSE(parse(std::vector<uint8_t>(f.begin(), f.begin() + static_cast<long>(n)), nullptr, allow).ok())
          << s.name << " cut at " << n;
    }
  }
  EXPECT_GE(elided, 5);
}

// A recycled buffer is reused by the next frame of its size class on this thread, and what it held before leaks
// into nothing: every sample encodes to the same bytes as on a fresh buffer, after a larger frame of 0xAA bytes.
TEST(Frame, RecycledBuffersAreReusedAndLeaveNoStaleBytes) {
  const SampleFrame& s = sample("rdma_write_only");
  std::vector<uint8_t> junk(4200, 0xAA);
  const uint8_t* junk_data = junk.data();
  recycle_frame(std::move(junk));
  std::vector<uint8_t> small = encode_frame(s.headers, s.payload.data(), s.payload.size());
  EXPECT_NE(small.data(), junk_data) << "a small frame took a full-sized buffer";
  std::vector<uint8_t> big_payload(4000, 0x5C);
  FrameHeaders h = s.headers;
  h.reth->dma_length = static_cast<uint32_t>(big_payload.size());
  std::vector<uint8_t> big = encode_frame(h, big_payload.data(), big_payload.size());
  EXPECT_EQ(big.data(), junk_data) << "the recycled buffer was not reused";
  ASSERT_TRUE(parse(big).ok());
  for (const SampleFrame& each : sample_frames()) {
    std::vector<uint8_t> stale(9000, 0xAA);
    recycle_frame(std::move(stale));
    recycle_frame(std::vector<uint8_t>(300, 0xAA));
    EXPECT_EQ(encode_frame(each.headers, each.payload.data(), each.payload.size()), each.bytes) << each.name;
  }
}

TEST(Frame, LengthsAndPaddingFilledIn) {
  const SampleFrame& s = sample("rdma_write_only");  // 61-byte payload
  // 14 Eth + 20 IP + 8 UDP + 12 BTH + 16 RETH + 61 payload + 3 pad + 4 ICRC
  ASSERT_EQ(s.bytes.size(), 14u + 20 + 8 + 12 + 16 + 61 + 3 + 4);
  EXPECT_EQ(load_be16(s.bytes.data() + 16), s.bytes.size() - 14) << "IP total length";
  EXPECT_EQ(load_be16(s.bytes.data() + 38), s.bytes.size() - 34) << "UDP length";
  EXPECT_EQ((s.bytes[43] >> 4) & 3, 3) << "pad count";
}

TEST(Frame, EncodeRefusesMissingHeadersAndStrayPayload) {
  FrameHeaders h;
  h.bth.opcode = static_cast<uint8_t>(Opcode::kWriteOnly);
  EXPECT_THROW(encode_frame(h, nullptr, 0), Error) << "WRITE_ONLY without RETH";
  h.bth.opcode = static_cast<uint8_t>(Opcode::kAcknowledge);
  h.aeth = Aeth::ack(1);
  const uint8_t byte = 1;
  EXPECT_THROW(encode_frame(h, &byte, 1), Error) << "ACK with payload";
  h.bth.opcode = 0x55;
  EXPECT_THROW(encode_frame(h, nullptr, 0), Error) << "unknown opcode";
}

TEST(Frame, TruncationAtEveryLengthIsAnErrorNotACrash) {
  for (const SampleFrame& s : sample_frames()) {
    for (size_t n = 0; n < s.bytes.size(); ++n) {
      std::vector<uint8_t> cut(s.bytes.begin(), s.bytes.begin() + n);
      EXPECT_FALSE(parse(cut).ok()) << s.name << " cut to " << n << " bytes parsed";
    }
  }
}

TEST(Frame, EverySingleBitFlipIsCaughtOrHarmless) {
  // Flipping any bit must either be rejected or land in a field nothing protects by design: the MAC addresses
  // (the FCS covers them on a real link), the UDP checksum (ignored for RoCEv2) and BTH byte 4 (FECN/BECN,
  // which switches rewrite in flight, so the ICRC masks it).
  const SampleFrame& s = sample("ech_standard_allreduce");
  const size_t udp_checksum = 14 + 20 + 6;
  const size_t bth_byte4 = 14 + 20 + 8 + Ech::kStandardSize + 4;
  size_t accepted = 0;
  for (size_t i = 0; i < s.bytes.size() * 8; ++i) {
    std::vector<uint8_t> f = s.bytes;
    const size_t byte = i / 8;
    f[byte] ^= static_cast<uint8_t>(1u << (i % 8));
    if (parse(f).ok()) {
      ++accepted;
      const bool variant = byte < 12 || byte == udp_checksum || byte == udp_checksum + 1 || byte == bth_byte4;
      EXPECT_TRUE(variant) << "bit " << i << " (byte " << byte << ") was accepted";
    }
  }
  EXPECT_EQ(accepted, (12u + 2 + 1) * 8);
}

TEST(Frame, PadCountLargerThanPaddedBytesRejected) {
  std::vector<uint8_t> f = sample("rdma_read_request").bytes;  // no payload
  const size_t bth = 14 + 20 + 8;
  f[bth + 1] |= 0x30;
  reseal(&f, bth);
  EXPECT_EQ(parse(f).error, WireError::kBadPadCount);
}

TEST(Frame, SpecificMalformationsNameTheirError) {
  const SampleFrame& w = sample("rdma_write_only");
  const size_t bth = 14 + 20 + 8;
  struct Case {
    const char* what;
    std::function<void(std::vector<uint8_t>*)> edit;
    bool reseal;
    WireError expect;
  };
  const std::vector<Case> cases = {
      {"ethertype IPv6", [](auto* f) { store_be16(f->data() + 12, 0x86DD); }, false, WireError::kBadEtherType},
      {"IP version 6", [](auto* f) { (*f)[14] = 0x65; }, false, WireError::kBadIpVersion},
      {"IHL 4", [](auto* f) { (*f)[14] = 0x44; }, false, WireError::kBadIpHeaderLength},
      {"IP checksum", [](auto* f) { (*f)[24] ^= 1; }, false, WireError::kBadIpChecksum},
      {"IP total length +4", [](auto* f) { store_be16(f->data() + 16, load_be16(f->data() + 16) + 4); }, true,
       WireError::kBadIpTotalLength},
      {"fragment", [](auto* f) { store_be16(f->data() + 20, 0x2000); }, true, WireError::kIpFragment},
      {"TCP", [](auto* f) { (*f)[23] = 6; }, true, WireError::kNotUdp},
      {"UDP length", [](auto* f) { store_be16(f->data() + 38, 8); }, true, WireError::kBadUdpLength},
      {"UDP port 53", [](auto* f) { store_be16(f->data() + 36, 53); }, true, WireError::kNotRoce},
      {"opcode 0x3F", [=](auto* f) { (*f)[bth] = 0x3F; }, true, WireError::kUnknownOpcode},
      {"opcode becomes ACK (payload not allowed)", [=](auto* f) { (*f)[bth] = 0x11; }, true,
       WireError::kPayloadNotAllowed},
      {"ICRC", [](auto* f) { f->back() ^= 0x80; }, false, WireError::kBadIcrc},
      {"payload byte", [](auto* f) { (*f)[70] ^= 0x80; }, false, WireError::kBadIcrc},
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> f = w.bytes;
    c.edit(&f);
    if (c.reseal) {
      reseal(&f, bth);
    }
    EXPECT_EQ(parse(f).error, c.expect) << c.what << ": got " << parse(f).message();
  }
}

TEST(Frame, OversizedAndOverMtuRejected) {
  const SampleFrame& w = sample("rdma_write_first");  // 1024-byte payload
  ParseOptions small_mtu;
  small_mtu.path_mtu = 512;
  EXPECT_EQ(parse(w.bytes, nullptr, small_mtu).error, WireError::kPayloadTooLarge);
  ParseOptions small_frame;
  small_frame.max_frame = 1000;
  EXPECT_EQ(parse(w.bytes, nullptr, small_frame).error, WireError::kOversized);
  std::vector<uint8_t> huge(100000, 0);
  EXPECT_EQ(parse(huge).error, WireError::kOversized);
}

TEST(Frame, EchPayloadMustMatchElementCount) {
  const SampleFrame& s = sample("ech_standard_allreduce");
  std::vector<uint8_t> f = s.bytes;
  const size_t ech = 14 + 20 + 8;
  store_be16(f.data() + ech + 18, 65);  // 65 bf16 elements = 130 bytes, payload is 128
  reseal(&f, ech + Ech::kStandardSize);
  EXPECT_EQ(parse(f).error, WireError::kEchPayloadMismatch);
  FrameHeaders h = s.headers;
  h.ech->element_count = 10;
  EXPECT_THROW(encode_frame(h, s.payload.data(), s.payload.size()), Error);
}

TEST(Frame, EthernetPaddingAcceptedOnlyUpToMinimumFrame) {
  const SampleFrame& ack = sample("ack");  // 62 bytes
  std::vector<uint8_t> f = ack.bytes;
  f.resize(60 + 4);  // 2 bytes beyond the datagram, frame longer than 60: reject
  EXPECT_EQ(parse(f).error, WireError::kBadIpTotalLength);
  const SampleFrame& rr = sample("rdma_read_request");
  EXPECT_TRUE(parse(rr.bytes).ok());
}

TEST(Frame, RandomGarbageNeverCrashes) {
  std::mt19937 rng(42);
  const std::vector<SampleFrame> samples = sample_frames();
  size_t ok = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> f = samples[static_cast<size_t>(i) % samples.size()].bytes;
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits; ++e) {
      f[rng() % f.size()] = static_cast<uint8_t>(rng());
    }
    f.resize(rng() % (f.size() + 8));
    ok += parse(f).ok();
  }
  EXPECT_LT(ok, 200u) << "random edits should almost never survive the checksums";
}
