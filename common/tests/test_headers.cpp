// Per-protocol headers against hand-computed bytes (one TEST group per header file).
#include <gtest/gtest.h>

#include <vector>

#include "ifec/common/aeth.h"
#include "ifec/common/atomic_eth.h"
#include "ifec/common/bth.h"
#include "ifec/common/ethernet.h"
#include "ifec/common/ipv4.h"
#include "ifec/common/reth.h"
#include "ifec/common/udp.h"

using namespace ifec::common;

TEST(EthernetHeader, EncodesDstSrcEtherType) {
  EthernetHeader h;
  h.dst = {0x02, 0x11, 0x22, 0x33, 0x44, 0x55};
  h.src = {0x02, 0xAA, 0xBB, 0xCC, 0xDD, 0xEE};
  uint8_t out[EthernetHeader::kSize];
  h.encode(out);
  const uint8_t expect[] = {0x02, 0x11, 0x22, 0x33, 0x44, 0x55, 0x02, 0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0x08, 0x00};
  EXPECT_EQ(std::vector<uint8_t>(out, out + 14), std::vector<uint8_t>(expect, expect + 14));
  EthernetHeader d = EthernetHeader::decode(out);
  EXPECT_EQ(d.dst, h.dst);
  EXPECT_EQ(d.src, h.src);
  EXPECT_EQ(d.ethertype, 0x0800);
  EXPECT_EQ(mac_to_string(h.src), "02:aa:bb:cc:dd:ee");
}

// Every length from 0 to 64 bytes (odd ones too) and random contents, against RFC 1071's definition: 16-bit
// big-endian words summed with end-around carry, an odd last byte padded with zero, complemented.
TEST(Ipv4Header, ChecksumEqualsTheDefinitionAtEveryLength) {
  uint32_t x = 7;
  std::vector<uint8_t> data(64 + 3);
  for (int round = 0; round < 50; ++round) {
    for (uint8_t& b : data) {
      x = x * 1103515245u + 12345u;
      b = round == 0 ? 0xFF : static_cast<uint8_t>(x >> 16);
    }
    for (size_t len = 0; len <= 64; ++len) {
      for (size_t at : {size_t{0}, size_t{3}}) {
        uint32_t sum = 0;
        for (size_t i = 0; i < len; i += 2) {
          sum += uint32_t{data[at + i]} << 8 | (i + 1 < len ? data[at + i + 1] : 0);
          sum = (sum & 0xFFFF) + (sum >> 16);
        }
        ASSERT_EQ(ipv4_checksum(data.data() + at, len), static_cast<uint16_t>(~sum)) << len << " at " << at;
      }
    }
  }
}

TEST(Ipv4Header, ChecksumMatchesTextbookExample) {
  // The worked example from RFC 1071 tutorials: 192.168.0.1 -> 192.168.0.199, checksum 0xB861.
  const uint8_t hdr[] = {0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11,
                         0x00, 0x00, 0xC0, 0xA8, 0x00, 0x01, 0xC0, 0xA8, 0x00, 0xC7};
  EXPECT_EQ(ipv4_checksum(hdr, sizeof(hdr)), 0xB861);
  Ipv4Header h;
  h.total_length = 0x73;
  h.identification = 0;
  h.dont_fragment = true;
  h.ttl = 64;
  h.src = 0xC0A80001;
  h.dst = 0xC0A800C7;
  uint8_t out[Ipv4Header::kSize];
  h.encode(out);
  EXPECT_EQ(out[10], 0xB8);
  EXPECT_EQ(out[11], 0x61);
  EXPECT_EQ(ipv4_checksum(out, sizeof(out)), 0) << "a correct header sums to zero";
  Ipv4Header d = Ipv4Header::decode(out);
  EXPECT_EQ(d.ihl, 5);
  EXPECT_EQ(d.src, h.src);
  EXPECT_EQ(d.dst, h.dst);
  EXPECT_TRUE(d.dont_fragment);
  EXPECT_EQ(ipv4_to_string(d.dst), "192.168.0.199");
}

TEST(Ipv4Header, DscpAndEcnShareTheTosByte) {
  Ipv4Header h;
  h.dscp = 26;
  h.ecn = 3;
  uint8_t out[Ipv4Header::kSize];
  h.encode(out);
  EXPECT_EQ(out[1], (26 << 2) | 3);
  EXPECT_EQ(Ipv4Header::decode(out).dscp, 26);
  EXPECT_EQ(Ipv4Header::decode(out).ecn, 3);
}

TEST(UdpHeader, EncodesPortsLengthChecksum) {
  UdpHeader h{0xC123, 4791, 52, 0};
  uint8_t out[UdpHeader::kSize];
  h.encode(out);
  const uint8_t expect[] = {0xC1, 0x23, 0x12, 0xB7, 0x00, 0x34, 0x00, 0x00};
  EXPECT_EQ(std::vector<uint8_t>(out, out + 8), std::vector<uint8_t>(expect, expect + 8));
  EXPECT_EQ(UdpHeader::decode(out).dst_port, 4791);
}

TEST(Bth, EncodesEveryBitField) {
  Bth b;
  b.opcode = static_cast<uint8_t>(Opcode::kWriteOnly);
  b.solicited = false;
  b.mig_req = true;
  b.pad_count = 3;
  b.pkey = 0xFFFF;
  b.fecn = true;
  b.becn = true;
  b.dest_qp = 0x123456;
  b.ack_req = true;
  b.psn = 0xABCDEF;
  uint8_t out[Bth::kSize];
  b.encode(out);
  const uint8_t expect[] = {0x0A, 0x70, 0xFF, 0xFF, 0xC0, 0x12, 0x34, 0x56, 0x80, 0xAB, 0xCD, 0xEF};
  EXPECT_EQ(std::vector<uint8_t>(out, out + 12), std::vector<uint8_t>(expect, expect + 12));
  Bth d = Bth::decode(out);
  EXPECT_EQ(d.opcode, b.opcode);
  EXPECT_EQ(d.pad_count, 3);
  EXPECT_TRUE(d.fecn);
  EXPECT_TRUE(d.becn);
  EXPECT_EQ(d.dest_qp, 0x123456u);
  EXPECT_TRUE(d.ack_req);
  EXPECT_EQ(d.psn, 0xABCDEFu);
}

TEST(Bth, MasksQpAndPsnTo24Bits) {
  Bth b;
  b.dest_qp = 0xFF000001;
  b.psn = 0x01000002;
  uint8_t out[Bth::kSize];
  b.encode(out);
  EXPECT_EQ(Bth::decode(out).dest_qp, 1u);
  EXPECT_EQ(Bth::decode(out).psn, 2u);
}

TEST(OpcodeTable, ExtensionHeadersFollowTheSpec) {
  auto write_first = opcode_info(0x06);
  ASSERT_TRUE(write_first);
  EXPECT_TRUE(write_first->reth);
  EXPECT_TRUE(write_first->payload);
  EXPECT_FALSE(opcode_info(0x07)->reth) << "WRITE_MIDDLE has no RETH";
  EXPECT_TRUE(opcode_info(0x0C)->reth) << "READ_REQUEST has a RETH";
  EXPECT_FALSE(opcode_info(0x0C)->payload);
  EXPECT_TRUE(opcode_info(0x0D)->aeth) << "READ_RESPONSE_FIRST has an AETH";
  EXPECT_FALSE(opcode_info(0x0E)->aeth) << "READ_RESPONSE_MIDDLE has none";
  EXPECT_TRUE(opcode_info(0x12)->atomic_ack_eth);
  EXPECT_TRUE(opcode_info(0x13)->atomic_eth);
  EXPECT_TRUE(opcode_info(0x14)->atomic_eth);
  EXPECT_TRUE(opcode_info(0x0B)->reth && opcode_info(0x0B)->imm) << "WRITE_ONLY_IMM has RETH and ImmDt";
  EXPECT_FALSE(opcode_info(0x15)) << "0x15 is not an RC opcode here";
  EXPECT_FALSE(opcode_info(0x64)) << "UD SEND is not spoken";
  EXPECT_STREQ(opcode_name(0x14), "FETCH_ADD");
}

TEST(Reth, EncodesVaRkeyLength) {
  Reth r{0x0102030405060708ULL, 0xA0B0C0D0, 0x00001000};
  uint8_t out[Reth::kSize];
  r.encode(out);
  const uint8_t expect[] = {1, 2, 3, 4, 5, 6, 7, 8, 0xA0, 0xB0, 0xC0, 0xD0, 0, 0, 0x10, 0};
  EXPECT_EQ(std::vector<uint8_t>(out, out + 16), std::vector<uint8_t>(expect, expect + 16));
  Reth d = Reth::decode(out);
  EXPECT_EQ(d.virtual_address, r.virtual_address);
  EXPECT_EQ(d.rkey, r.rkey);
  EXPECT_EQ(d.dma_length, r.dma_length);
}

TEST(Aeth, AckAndNakSyndromes) {
  Aeth ack = Aeth::ack(0x010203);
  uint8_t out[Aeth::kSize];
  ack.encode(out);
  EXPECT_EQ(out[0], 0x1F) << "ACK with invalid credit count";
  EXPECT_EQ(out[1], 0x01);
  EXPECT_EQ(out[3], 0x03);
  EXPECT_EQ(Aeth::decode(out).kind(), AethKind::kAck);
  Aeth nak = Aeth::nak(NakCode::kRemoteAccessError, 5);
  nak.encode(out);
  EXPECT_EQ(out[0], 0x62) << "NAK kind 0b11, code 2";
  EXPECT_EQ(Aeth::decode(out).kind(), AethKind::kNak);
  EXPECT_EQ(Aeth::decode(out).value(), 2);
  EXPECT_EQ(Aeth::decode(out).msn, 5u);
}

TEST(AtomicEth, EncodesAllFields) {
  AtomicEth a{0x1122334455667788ULL, 0xCAFEF00D, 0x0000000000000005ULL, 0xFFFFFFFFFFFFFFFEULL};
  uint8_t out[AtomicEth::kSize];
  a.encode(out);
  EXPECT_EQ(out[0], 0x11);
  EXPECT_EQ(out[7], 0x88);
  EXPECT_EQ(out[8], 0xCA);
  EXPECT_EQ(out[11], 0x0D);
  EXPECT_EQ(out[19], 0x05);
  EXPECT_EQ(out[20], 0xFF);
  EXPECT_EQ(out[27], 0xFE);
  AtomicEth d = AtomicEth::decode(out);
  EXPECT_EQ(d.virtual_address, a.virtual_address);
  EXPECT_EQ(d.rkey, a.rkey);
  EXPECT_EQ(d.swap_or_add, a.swap_or_add);
  EXPECT_EQ(d.compare, a.compare);
  AtomicAckEth ack{0x8000000000000001ULL};
  uint8_t ack_out[AtomicAckEth::kSize];
  ack.encode(ack_out);
  EXPECT_EQ(ack_out[0], 0x80);
  EXPECT_EQ(ack_out[7], 0x01);
  EXPECT_EQ(AtomicAckEth::decode(ack_out).original_data, ack.original_data);
}
