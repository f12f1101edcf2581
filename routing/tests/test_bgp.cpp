// The BGP-4 codec and session against hand-computed frames: every message type byte for byte from the RFC 4271
// layouts, round trips, an OPEN as FRR 8.4 sends it, the link-bandwidth community for 400 Gb/s, every RFC 7606
// case with its action and NOTIFICATION bytes, truncated / oversized / empty / corrupted inputs, and two sessions
// wired to each other in memory (Established, UPDATEs, keepalives, hold-timer expiry, OPEN errors, collisions).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <initializer_list>

#include "ifec/common/checks.h"
#include "ifec/routing/bgp.h"
#include "ifec/routing/bgp_session.h"

using namespace ifec;
using namespace ifec::routing;
using ::testing::HasSubstr;
using Bytes = std::vector<uint8_t>;
using Kind = BgpSessionEvent::Kind;

namespace {

Bytes cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const Bytes& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// RFC 4271 §4.1: 16 bytes of 0xff, the length (header included), the type.
Bytes header(uint16_t len, uint8_t type) {
  Bytes h(16, 0xff);
  h.push_back(static_cast<uint8_t>(len >> 8));
  h.push_back(static_cast<uint8_t>(len));
  h.push_back(type);
  return h;
}

Bytes message(uint8_t type, const Bytes& body) {
  return cat({header(static_cast<uint16_t>(19 + body.size()), type), body});
}

// An UPDATE from its three variable fields; the two length fields are computed.
Bytes update_msg(const Bytes& withdrawn, const Bytes& attrs, const Bytes& nlri) {
  const auto be16 = [](size_t v) { return Bytes{static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v)}; };
  return message(2, cat({be16(withdrawn.size()), withdrawn, be16(attrs.size()), attrs, nlri}));
}

BgpMessage decode(const Bytes& b, BgpDecodeOptions opt = {}) { return decode_bgp(b.data(), b.size(), opt); }

uint32_t ip(int a, int b, int c, int d) { return uint32_t(a) << 24 | uint32_t(b) << 16 | uint32_t(c) << 8 | d; }

// The attributes of a well-formed route from external peer AS 65002 (4-octet AS session).
const Bytes kOrigin = {0x40, 0x01, 0x01, 0x00};                                // ORIGIN IGP
const Bytes kAsPath = {0x40, 0x02, 0x06, 0x02, 0x01, 0x00, 0x00, 0xfd, 0xea};  // AS_SEQUENCE [65002]
const Bytes kNextHop = {0x40, 0x03, 0x04, 10, 0, 0, 2};                        // NEXT_HOP 10.0.0.2
const Bytes kNlri = {0x20, 10, 1, 0, 2};                                       // 10.1.0.2/32
BgpDecodeOptions from_peer() {
  BgpDecodeOptions o;
  o.as4 = true;
  o.ebgp = true;
  o.peer_as = 65002;
  return o;
}

}  // namespace

// ================================================================================================================
// Encoding, byte for byte
// ================================================================================================================

TEST(BgpCodec, KeepaliveIsTheBareHeader) {
  // RFC 4271 §4.4: a KEEPALIVE is the 19-byte header alone.
  const Bytes want = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                      0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00, 0x13,  // length 19
                      0x04};                                                 // KEEPALIVE
  EXPECT_EQ(encode_bgp_keepalive(), want);
  const BgpMessage m = decode(want);
  EXPECT_TRUE(m.ok());
  EXPECT_EQ(m.type, 4);
}

TEST(BgpCodec, OpenWithFourOctetAsPutsAsTransInTheTwoOctetField) {
  // AS 4200000001 = 0xFA56EA01 (RFC 6996 private range), hold 90 s, identifier 10.0.0.1.
  const Bytes want = cat({header(49, 1),
                          {0x04,                                               // version 4
                           0x5b, 0xa0,                                         // My AS: AS_TRANS 23456
                           0x00, 0x5a,                                         // hold time 90
                           0x0a, 0x00, 0x00, 0x01,                             // BGP identifier 10.0.0.1
                           20,                                                 // optional parameters length
                           0x02, 0x06, 0x01, 0x04, 0x00, 0x01, 0x00, 0x01,     // capability MP: AFI 1, SAFI 1
                           0x02, 0x02, 0x02, 0x00,                             // capability Route Refresh
                           0x02, 0x06, 0x41, 0x04, 0xfa, 0x56, 0xea, 0x01}});  // capability 4-octet AS
  const Bytes got = encode_bgp_open(make_bgp_open(4200000001u, 90, ip(10, 0, 0, 1)));
  EXPECT_EQ(got, want);
  const BgpMessage m = decode(got);
  ASSERT_TRUE(m.ok()) << m.worst()->what;
  EXPECT_EQ(m.open.my_as, kAsTrans);
  EXPECT_EQ(m.open.as(), 4200000001u);
  EXPECT_EQ(m.open, make_bgp_open(4200000001u, 90, ip(10, 0, 0, 1)));
}

TEST(BgpCodec, OpenWithTwoOctetAsCarriesItInBothPlaces) {
  const Bytes got = encode_bgp_open(make_bgp_open(65001, 180, ip(192, 168, 1, 1)));
  ASSERT_EQ(got.size(), 49u);
  EXPECT_EQ(got[20], 0xfd);  // My AS 65001 = 0xfde9
  EXPECT_EQ(got[21], 0xe9);
  EXPECT_EQ(Bytes(got.begin() + 45, got.end()), (Bytes{0x00, 0x00, 0xfd, 0xe9}));  // and in the capability
}

TEST(BgpCodec, UpdateEncodesFieldsInRfcOrder) {
  BgpUpdate u;
  u.withdrawn = {bgp_prefix(ip(10, 9, 0, 0), 16)};
  u.attrs.origin = BgpOrigin::kIgp;
  u.attrs.as_path = std::vector<BgpAsPathSegment>{{kAsSequence, {4200000001u, 4200000002u}}};
  u.attrs.next_hop = ip(10, 0, 0, 1);
  u.attrs.med = 5;
  u.attrs.ext_communities = {encode_link_bandwidth({65001, 5e10f, true})};
  u.nlri = {bgp_prefix(ip(10, 1, 1, 1), 32), bgp_prefix(ip(10, 2, 0, 0), 15), bgp_prefix(0, 0)};
  const Bytes want =
      cat({header(77, 2), {0x00, 0x03,              // withdrawn routes length 3
                           0x10, 0x0a, 0x09,        // 10.9.0.0/16: 16 bits, 2 octets
                           0x00, 0x2a,              // path attributes length 42
                           0x40, 0x01, 0x01, 0x00,  // ORIGIN (well-known transitive) IGP
                           0x40, 0x02, 0x0a, 0x02, 0x02, 0xfa, 0x56, 0xea, 0x01, 0xfa, 0x56, 0xea, 0x02,  // AS_PATH
                           0x40, 0x03, 0x04, 0x0a, 0x00, 0x00, 0x01,        // NEXT_HOP 10.0.0.1
                           0x80, 0x04, 0x04, 0x00, 0x00, 0x00, 0x05,        // MULTI_EXIT_DISC 5 (optional)
                           0xc0, 0x10, 0x08,                                // EXTENDED_COMMUNITIES (opt. trans.)
                           0x00, 0x04, 0xfd, 0xe9, 0x51, 0x3a, 0x43, 0xb7,  // link bandwidth AS 65001, 5e10 B/s
                           0x20, 0x0a, 0x01, 0x01, 0x01,                    // 10.1.1.1/32
                           0x0f, 0x0a, 0x02,                                // 10.2.0.0/15: 2 octets
                           0x00}});                                         // 0.0.0.0/0: no octets
  const Bytes got = encode_bgp_update(u, true);
  EXPECT_EQ(got, want);
  const BgpMessage m = decode(got, BgpDecodeOptions{true, true, 4200000001u});
  ASSERT_TRUE(m.ok()) << m.worst()->what;
  EXPECT_EQ(m.update, u);
}

TEST(BgpCodec, NotificationAndRouteRefresh) {
  // RFC 4271 §4.5: code, subcode, data.
  EXPECT_EQ(encode_bgp_notification({6, 2, {}}), cat({header(21, 3), {0x06, 0x02}}));
  EXPECT_EQ(encode_bgp_notification({1, 2, {0x00, 0x12}}), cat({header(23, 3), {0x01, 0x02, 0x00, 0x12}}));
  // RFC 2918 §3: AFI 1, reserved, SAFI 1.
  EXPECT_EQ(encode_bgp_route_refresh({}), cat({header(23, 5), {0x00, 0x01, 0x00, 0x01}}));
  const BgpMessage n = decode(encode_bgp_notification({3, 11, {1, 2, 3}}));
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n.notification, (BgpNotification{3, 11, {1, 2, 3}}));
  const BgpMessage r = decode(encode_bgp_route_refresh({1, 0, 1}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.route_refresh, (BgpRouteRefresh{1, 0, 1}));
}

TEST(BgpCodec, LongAttributesUseTheExtendedLength) {
  BgpUpdate u;
  u.attrs.origin = BgpOrigin::kIncomplete;
  u.attrs.as_path = std::vector<BgpAsPathSegment>{{kAsSequence, std::vector<uint32_t>(70, 4200000009u)}};
  u.attrs.next_hop = ip(10, 0, 0, 1);
  u.nlri = {bgp_prefix(ip(10, 0, 0, 0), 8)};
  const Bytes got = encode_bgp_update(u, true);
  // AS_PATH value: segment header 2 + 70 x 4 = 282 > 255: flags 0x50 (transitive + extended length), length u16.
  const Bytes want_head = {0x50, 0x02, 0x01, 0x1a, 0x02, 70};
  EXPECT_EQ(Bytes(got.begin() + 27, got.begin() + 33), want_head);
  const BgpMessage m = decode(got, BgpDecodeOptions{true, true, 4200000009u});
  ASSERT_TRUE(m.ok()) << m.worst()->what;
  EXPECT_EQ(m.update, u);
}

TEST(BgpCodec, SegmentsOverTwoHundredFiftyFiveAsesAreSplit) {
  BgpUpdate u;
  u.attrs.origin = BgpOrigin::kIgp;
  u.attrs.as_path = std::vector<BgpAsPathSegment>{{kAsSequence, std::vector<uint32_t>(300, 7)}};
  u.attrs.next_hop = ip(10, 0, 0, 1);
  u.nlri = {bgp_prefix(ip(10, 0, 0, 0), 8)};
  const BgpMessage m = decode(encode_bgp_update(u, true), BgpDecodeOptions{true, true, 7});
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m.update.attrs.as_path->size(), 2u);
  EXPECT_EQ((*m.update.attrs.as_path)[0].asns.size(), 255u);
  EXPECT_EQ(bgp_as_path_length(*m.update.attrs.as_path), 300u);
}

TEST(BgpCodec, LargeUpdatesSplitIntoMessagesOfAtMost4096Bytes) {
  BgpUpdate u;
  u.attrs.origin = BgpOrigin::kIgp;
  u.attrs.as_path = std::vector<BgpAsPathSegment>{{kAsSequence, {65001}}};
  u.attrs.next_hop = ip(10, 0, 0, 1);
  for (uint32_t i = 0; i < 2000; ++i) u.nlri.push_back(bgp_prefix(ip(10, 0, 0, 0) + i, 32));
  for (uint32_t i = 0; i < 1000; ++i) u.withdrawn.push_back(bgp_prefix(ip(11, 0, 0, 0) + i, 32));
  EXPECT_THROW(encode_bgp_update(u, true), common::Error);  // one message cannot hold it
  const auto msgs = encode_bgp_updates(u, true);
  BgpUpdate back;
  for (const Bytes& b : msgs) {
    ASSERT_LE(b.size(), kBgpMaxMessage);
    const BgpMessage m = decode(b, BgpDecodeOptions{true, true, 65001});
    ASSERT_TRUE(m.ok()) << m.worst()->what;
    back.withdrawn.insert(back.withdrawn.end(), m.update.withdrawn.begin(), m.update.withdrawn.end());
    back.nlri.insert(back.nlri.end(), m.update.nlri.begin(), m.update.nlri.end());
    if (!m.update.nlri.empty()) {
      EXPECT_EQ(m.update.attrs, u.attrs);
    }
  }
  EXPECT_EQ(back.withdrawn, u.withdrawn);
  EXPECT_EQ(back.nlri, u.nlri);
  EXPECT_GE(msgs.size(), 4u);
  // An empty update is the End-of-RIB marker: one 23-byte UPDATE.
  const auto eor = encode_bgp_updates(BgpUpdate{}, true);
  ASSERT_EQ(eor.size(), 1u);
  EXPECT_EQ(eor[0], cat({header(23, 2), {0, 0, 0, 0}}));
}

TEST(BgpCodec, EncodingRefusesWhatCannotBeSent) {
  EXPECT_THROW(bgp_prefix(0, 33), common::Error);
  BgpUpdate u;
  u.attrs.as_path = std::vector<BgpAsPathSegment>{{3, {1}}};  // AS_CONFED_SEQUENCE: not ours to send
  EXPECT_THROW(encode_bgp_update(u, true), common::Error);
  BgpOpen o = make_bgp_open(1, 90, 1);
  o.unknown.push_back({99, Bytes(254, 0)});
  EXPECT_THROW(encode_bgp_open(o), common::Error);
}

// ================================================================================================================
// 4-octet AS numbers toward a peer without the capability (RFC 6793)
// ================================================================================================================

TEST(BgpCodec, TwoOctetPeerGetsAsTransAndAs4Path) {
  BgpUpdate u;
  u.attrs.origin = BgpOrigin::kIgp;
  u.attrs.as_path = std::vector<BgpAsPathSegment>{{kAsSequence, {65001, 4200000001u}}};
  u.attrs.next_hop = ip(10, 0, 0, 1);
  u.nlri = {bgp_prefix(ip(10, 1, 0, 0), 16)};
  const Bytes got = encode_bgp_update(u, false);
  const Bytes want =
      cat({header(59, 2), {0x00, 0x00,                                            // no withdrawn routes
                           0x00, 0x21,                                            // path attributes length 33
                           0x40, 0x01, 0x01, 0x00,                                // ORIGIN IGP
                           0x40, 0x02, 0x06, 0x02, 0x02, 0xfd, 0xe9, 0x5b, 0xa0,  // AS_PATH [65001, AS_TRANS]
                           0x40, 0x03, 0x04, 0x0a, 0x00, 0x00, 0x01,              // NEXT_HOP
                           0xc0, 0x11, 0x0a, 0x02, 0x02,                          // AS4_PATH (opt. transitive)
                           0x00, 0x00, 0xfd, 0xe9, 0xfa, 0x56, 0xea, 0x01,        // [65001, 4200000001]
                           0x10, 0x0a, 0x01}});                                   // 10.1.0.0/16
  EXPECT_EQ(got, want);
  const BgpMessage m = decode(got, BgpDecodeOptions{false, true, 65001});
  ASSERT_TRUE(m.ok()) << m.worst()->what;
  EXPECT_EQ(m.update.attrs.as_path, u.attrs.as_path);  // AS4_PATH merged back in
}

TEST(BgpCodec, MergeAs4PathFollowsRfc6793) {
  using Path = std::vector<BgpAsPathSegment>;
  // Two 2-octet-only speakers prepended 100 and 200 after the path left the 4-octet world.
  const Path as_path = {{kAsSequence, {100, 200, kAsTrans, 300}}, {kAsSet, {1, 2}}};
  const Path as4 = {{kAsSequence, {4200000001u, 300}}, {kAsSet, {1, 2}}};
  EXPECT_EQ(bgp_merge_as4_path(as_path, as4),
            (Path{{kAsSequence, {100, 200}}, {kAsSequence, {4200000001u, 300}}, {kAsSet, {1, 2}}}));
  // AS4_PATH longer than AS_PATH: AS4_PATH is ignored.
  EXPECT_EQ(bgp_merge_as4_path({{kAsSequence, {kAsTrans}}}, as4), (Path{{kAsSequence, {kAsTrans}}}));
  EXPECT_EQ(bgp_as_path_length(as_path), 5u);  // a SET counts one
  EXPECT_TRUE(bgp_as_path_contains(as_path, 300));
  EXPECT_FALSE(bgp_as_path_contains(as_path, 301));
}

// ================================================================================================================
// An OPEN as FRR 8.4 sends it (bgpd/bgp_open.c bgp_open_capability: one optional parameter per capability)
// ================================================================================================================

namespace {

// FRR 8.4 with "frr defaults datacenter" (hold 9 s), AS 65001, router-id 10.0.0.254, hostname leaf1.
Bytes frr_open() {
  const Bytes params = {
      0x02, 0x06, 0x01, 0x04, 0x00, 0x01, 0x00, 0x01,                     // MP IPv4 unicast
      0x02, 0x02, 0x80, 0x00,                                             // route refresh, Cisco's old code 128
      0x02, 0x02, 0x02, 0x00,                                             // route refresh (RFC 2918)
      0x02, 0x02, 0x46, 0x00,                                             // enhanced route refresh (70)
      0x02, 0x06, 0x41, 0x04, 0x00, 0x00, 0xfd, 0xe9,                     // 4-octet AS 65001
      0x02, 0x02, 0x06, 0x00,                                             // extended message (6)
      0x02, 0x06, 0x45, 0x04, 0x00, 0x01, 0x01, 0x01,                     // add-path IPv4 unicast, receive (69)
      0x02, 0x09, 0x49, 0x07, 0x05, 'l',  'e',  'a',  'f',  '1',  0x00,   // hostname "leaf1", no domain (73)
      0x02, 0x04, 0x40, 0x02, 0x00, 0x78,                                 // graceful restart helper, 120 s (64)
      0x02, 0x09, 0x47, 0x07, 0x00, 0x01, 0x01, 0x80, 0x00, 0x00, 0x00};  // long-lived GR (71)
  Bytes body = {0x04, 0xfd, 0xe9, 0x00, 0x09, 0x0a, 0x00, 0x00, 0xfe, static_cast<uint8_t>(params.size())};
  body.insert(body.end(), params.begin(), params.end());
  return message(1, body);
}

}  // namespace

TEST(BgpCodec, FrrOpenKeepsTheCapabilitiesItDoesNotUse) {
  const Bytes b = frr_open();
  ASSERT_EQ(b.size(), 97u);  // 29 + 68 bytes of parameters
  const BgpMessage m = decode(b);
  ASSERT_TRUE(m.ok()) << m.worst()->what;
  EXPECT_EQ(m.open.as(), 65001u);
  EXPECT_EQ(m.open.hold_time, 9);
  EXPECT_EQ(m.open.bgp_id, ip(10, 0, 0, 254));
  EXPECT_TRUE(m.open.supports_ipv4_unicast());
  EXPECT_TRUE(m.open.route_refresh);
  std::vector<int> codes;
  for (const BgpCapability& c : m.open.unknown) codes.push_back(c.code);
  EXPECT_EQ(codes, (std::vector<int>{128, 70, 6, 69, 73, 64, 71}));
  EXPECT_EQ(m.open.unknown[4].value, (Bytes{0x05, 'l', 'e', 'a', 'f', '1', 0x00}));
  // Round trip: the capabilities come back (in this encoder's order), the decoded OPEN is the same.
  EXPECT_EQ(decode(encode_bgp_open(m.open)).open, m.open);
}

TEST(BgpCodec, ExtendedOptionalParametersOfRfc9072AreDecoded) {
  // Non-Ext OP Len 255, Non-Ext OP Type 255, Extended Opt. Parm. Length u16, parameters with u16 lengths.
  const Bytes body = {0x04, 0xfd, 0xe9, 0x00, 0x5a, 0x0a, 0x00, 0x00, 0x01, 0xff, 0xff,
                      0x00, 0x0e, 0x02, 0x00, 0x06, 0x01, 0x04, 0x00, 0x01, 0x00, 0x01,  // MP IPv4 unicast
                      0x02, 0x00, 0x02, 0x02, 0x00};                                     // route refresh
  const BgpMessage m = decode(message(1, body));
  ASSERT_TRUE(m.ok()) << m.worst()->what;
  EXPECT_TRUE(m.open.route_refresh);
  EXPECT_EQ(m.open.multiprotocol.size(), 1u);
}

// ================================================================================================================
// Link bandwidth (draft-ietf-idr-link-bandwidth / RFC 10005, as FRR 8.4 sends it) and FARE path bandwidth
// ================================================================================================================

TEST(BgpBandwidth, FourHundredGbpsIsFiftyGigabytesPerSecondAsAFloat) {
  // 400 Gb/s = 5e10 bytes/s = 1.4551915 x 2^35: sign 0, exponent 35 + 127 = 0xa2, mantissa 0x3a43b7
  // -> 0 10100010 01110100100001110110111 = 0x513a43b7.
  const BgpExtCommunity c = encode_link_bandwidth({65001, 5e10f, true});
  EXPECT_EQ(c.bytes, (std::array<uint8_t, 8>{0x00, 0x04, 0xfd, 0xe9, 0x51, 0x3a, 0x43, 0xb7}));
  const BgpExtCommunity nt = encode_link_bandwidth({65001, 5e10f, false});
  EXPECT_EQ(nt.bytes[0], 0x40);  // FRR's "non-transitive" form
  BgpLinkBandwidth lb;
  ASSERT_TRUE(decode_link_bandwidth(nt, &lb));
  EXPECT_EQ(lb.as, 65001);
  EXPECT_FALSE(lb.transitive);
  EXPECT_FLOAT_EQ(lb.bytes_per_second, 5e10f);
  BgpExtCommunity rt;  // a route target (type 0x00, sub-type 0x02) is not a bandwidth
  rt.bytes = {0x00, 0x02, 0xfd, 0xe9, 0, 0, 0, 1};
  EXPECT_FALSE(decode_link_bandwidth(rt, &lb));
}

TEST(BgpBandwidth, PathBandwidthRidesInTheLinkBandwidthCommunity) {
  // AS 4200000001 does not fit the 2-octet global administrator: AS_TRANS 0x5ba0.
  const BgpExtCommunity c = encode_path_bandwidth(4200000001u, 400);
  EXPECT_EQ(c.bytes, (std::array<uint8_t, 8>{0x00, 0x04, 0x5b, 0xa0, 0x51, 0x3a, 0x43, 0xb7}));
  BgpExtCommunity rt;  // a route target alongside: skipped
  rt.bytes = {0x00, 0x02, 0xfd, 0xe9, 0, 0, 0, 1};
  BgpPathAttributes a;
  a.ext_communities = {rt, c};
  EXPECT_NEAR(*bgp_path_bandwidth_gbps(a), 400.0, 1e-4);
  // RFC 10005: of several, the lowest counts (a route reflector's or a policy's extra community).
  a.ext_communities.push_back(encode_path_bandwidth(4200000001u, 100));
  EXPECT_NEAR(*bgp_path_bandwidth_gbps(a), 100.0, 1e-4);
  EXPECT_FALSE(bgp_path_bandwidth_gbps(BgpPathAttributes{}).has_value());
  // Scaled for FRR 8.4 (uint32 bytes/s): 3.2 Tb/s fits once 1 Gb/s is written as 125,000.
  BgpBandwidthUnits scaled;
  scaled.bytes_per_gbps = 125e3;
  const BgpExtCommunity s = encode_path_bandwidth(65001, 3200, scaled);
  BgpLinkBandwidth lb;
  ASSERT_TRUE(decode_link_bandwidth(s, &lb));
  EXPECT_LE(lb.bytes_per_second, kFrr84MaxLinkBandwidth);
  EXPECT_GT(3200 * 125e6, kFrr84MaxLinkBandwidth);  // unscaled it would overflow FRR 8.4
  BgpPathAttributes sa;
  sa.ext_communities = {s};
  EXPECT_NEAR(*bgp_path_bandwidth_gbps(sa, scaled), 3200.0, 1e-3);
  EXPECT_THROW(encode_path_bandwidth(1, -1), common::Error);
  EXPECT_THROW(encode_path_bandwidth(1, INFINITY), common::Error);
  // A negative float on the wire reads as 0.
  BgpPathAttributes neg;
  neg.ext_communities = {encode_link_bandwidth({1, -5.0f, true})};
  EXPECT_EQ(*bgp_link_bandwidth(neg), 0.0);
}

// ================================================================================================================
// RFC 7606 error handling: each malformation, its action and the NOTIFICATION RFC 4271 §6 names for it
// ================================================================================================================

namespace {

// Decodes `b` and checks the worst error: action, code/subcode/data, the NOTIFICATION's bytes, and that its text
// names `names`.
void expect_error(const Bytes& b, BgpErrorAction action, uint8_t code, uint8_t subcode, const Bytes& data,
                  const std::string& names, BgpDecodeOptions opt = from_peer()) {
  const BgpMessage m = decode(b, opt);
  ASSERT_FALSE(m.ok()) << "expected " << bgp_error_action_name(action) << " for " << names;
  const BgpError& e = *m.worst();
  EXPECT_EQ(e.action, action) << e.what;
  EXPECT_EQ(m.action(), action);
  EXPECT_EQ(e.notification, (BgpNotification{code, subcode, data})) << e.what;
  EXPECT_THAT(e.what, HasSubstr(names));
  EXPECT_EQ(encode_bgp_notification(e.notification),
            cat({header(static_cast<uint16_t>(21 + data.size()), 3), {code, subcode}, data}));
}

const BgpErrorAction kReset = BgpErrorAction::kSessionReset;
const BgpErrorAction kWithdraw = BgpErrorAction::kTreatAsWithdraw;
const BgpErrorAction kDiscard = BgpErrorAction::kAttributeDiscard;

}  // namespace

TEST(BgpRfc7606, TheBaseUpdateIsValid) {
  const BgpMessage m = decode(update_msg({}, cat({kOrigin, kAsPath, kNextHop}), kNlri), from_peer());
  ASSERT_TRUE(m.ok()) << m.worst()->what;
  EXPECT_EQ(m.update.nlri, (std::vector<BgpPrefix>{bgp_prefix(ip(10, 1, 0, 2), 32)}));
  EXPECT_EQ(*m.update.attrs.next_hop, ip(10, 0, 0, 2));
}

TEST(BgpRfc7606, LengthFieldsThatOverrunTheMessageResetTheSession) {
  // Withdrawn Routes Length 16 with 2 bytes after it: RFC 4271 §6.3 Malformed Attribute List (3/1).
  const Bytes w = message(2, {0x00, 0x10, 0x00, 0x00});
  expect_error(w, kReset, 3, 1, {}, "withdrawn routes length 16");
  EXPECT_EQ(encode_bgp_notification(decode(w).worst()->notification),
            (Bytes{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                   0xff, 0xff, 0xff, 0xff, 0xff, 0x00, 0x15, 0x03, 0x03, 0x01}));
  // Total Path Attribute Length 64 with 4 bytes of attributes.
  expect_error(message(2, {0x00, 0x00, 0x00, 0x40, 0x40, 0x01, 0x01, 0x00}), kReset, 3, 1, {},
               "path attributes length 64");
}

TEST(BgpRfc7606, MissingWellKnownAttributesAreTreatAsWithdraw) {
  // RFC 7606 §3 d; the NOTIFICATION data would be the missing type code.
  expect_error(update_msg({}, cat({kAsPath, kNextHop}), kNlri), kWithdraw, 3, 3, {1}, "ORIGIN");
  expect_error(update_msg({}, cat({kOrigin, kNextHop}), kNlri), kWithdraw, 3, 3, {2}, "AS_PATH");
  expect_error(update_msg({}, cat({kOrigin, kAsPath}), kNlri), kWithdraw, 3, 3, {3}, "NEXT_HOP");
  expect_error(update_msg({}, {}, kNlri), kWithdraw, 3, 3, {1}, "ORIGIN");
  // Without NLRI nothing is mandatory: a pure withdrawal, and the empty End-of-RIB UPDATE.
  EXPECT_TRUE(decode(update_msg(kNlri, {}, {}), from_peer()).ok());
  EXPECT_TRUE(decode(update_msg({}, {}, {}), from_peer()).ok());
}

TEST(BgpRfc7606, BadOriginIsTreatAsWithdraw) {
  const Bytes len2 = {0x40, 0x01, 0x02, 0x00, 0x00};
  expect_error(update_msg({}, cat({len2, kAsPath, kNextHop}), kNlri), kWithdraw, 3, 5, len2, "ORIGIN at byte 23");
  const Bytes value3 = {0x40, 0x01, 0x01, 0x03};
  expect_error(update_msg({}, cat({value3, kAsPath, kNextHop}), kNlri), kWithdraw, 3, 6, value3, "ORIGIN value 3");
}

TEST(BgpRfc7606, BadNextHopIsTreatAsWithdraw) {
  for (const Bytes& nh : {Bytes{0x40, 0x03, 0x04, 224, 0, 0, 1}, Bytes{0x40, 0x03, 0x04, 0, 0, 0, 0},
                          Bytes{0x40, 0x03, 0x04, 127, 0, 0, 1}, Bytes{0x40, 0x03, 0x04, 255, 255, 255, 255}}) {
    expect_error(update_msg({}, cat({kOrigin, kAsPath, nh}), kNlri), kWithdraw, 3, 8, nh, "NEXT_HOP");
  }
  expect_error(update_msg({}, cat({kOrigin, kAsPath, Bytes{0x40, 0x03, 0x04, 224, 0, 0, 1}}), kNlri), kWithdraw, 3, 8,
               {0x40, 0x03, 0x04, 224, 0, 0, 1}, "224.0.0.1");
  const Bytes len5 = {0x40, 0x03, 0x05, 10, 0, 0, 2, 0};
  expect_error(update_msg({}, cat({kOrigin, kAsPath, len5}), kNlri), kWithdraw, 3, 5, len5, "length 5");
}

TEST(BgpRfc7606, MalformedAsPathIsTreatAsWithdraw) {
  const auto with_path = [](const Bytes& p) { return update_msg({}, cat({kOrigin, p, kNextHop}), kNlri); };
  // RFC 7606 §7.2: unknown segment type, a zero-length segment, an overrun, a lone byte after the last segment.
  expect_error(with_path({0x40, 0x02, 0x06, 0x05, 0x01, 0, 0, 0xfd, 0xea}), kWithdraw, 3, 11, {}, "segment type 5");
  expect_error(with_path({0x40, 0x02, 0x02, 0x02, 0x00}), kWithdraw, 3, 11, {}, "0 ASes");
  expect_error(with_path({0x40, 0x02, 0x06, 0x02, 0x02, 0, 0, 0xfd, 0xea}), kWithdraw, 3, 11, {}, "runs past");
  expect_error(with_path({0x40, 0x02, 0x07, 0x02, 0x01, 0, 0, 0xfd, 0xea, 0x02}), kWithdraw, 3, 11, {}, "1 byte left");
  // 2-octet ASes on a 4-octet session do not parse.
  expect_error(with_path({0x40, 0x02, 0x04, 0x02, 0x01, 0xfd, 0xea}), kWithdraw, 3, 11, {}, "runs past");
  // RFC 4271 §6.3: an external peer's path must start with its AS.
  expect_error(with_path({0x40, 0x02, 0x06, 0x02, 0x01, 0, 0, 0xfe, 0x4b}), kWithdraw, 3, 11, {}, "leftmost AS 65099");
  expect_error(with_path({0x40, 0x02, 0x00}), kWithdraw, 3, 11, {}, "empty path");
  // An internal peer may send an empty AS_PATH.
  BgpDecodeOptions ibgp;
  ibgp.ebgp = false;
  EXPECT_TRUE(
      decode(update_msg({}, cat({kOrigin, Bytes{0x40, 0x02, 0x00}, kNextHop, Bytes{0x40, 0x05, 0x04, 0, 0, 0, 100}}),
                        kNlri),
             ibgp)
          .ok());
}

TEST(BgpRfc7606, UnparsableNlriOrWithdrawnRoutesResetTheSession) {
  const Bytes attrs = cat({kOrigin, kAsPath, kNextHop});
  expect_error(update_msg({}, attrs, {33, 10, 1, 0, 2, 0}), kReset, 3, 10, {}, "length 33");
  expect_error(update_msg({}, attrs, {24, 10, 1}), kReset, 3, 10, {}, "runs past");
  expect_error(update_msg({40, 1, 2, 3, 4, 5}, attrs, kNlri), kReset, 3, 10, {}, "withdrawn prefix");
}

TEST(BgpRfc7606, AnAttributeOverrunningTheListIsTreatAsWithdrawAndTheNlriStillFound) {
  // RFC 7606 §4: AS_PATH says 32 bytes where 6 remain; the Total Path Attribute Length still locates the NLRI.
  const Bytes attrs = cat({kOrigin, Bytes{0x40, 0x02, 0x20, 0x02, 0x01, 0, 0, 0xfd, 0xea}});
  expect_error(update_msg({}, attrs, kNlri), kWithdraw, 3, 1, {}, "has length 32");
  EXPECT_EQ(decode(update_msg({}, attrs, kNlri), from_peer()).update.nlri.size(), 1u);
  // Two bytes left: fewer than an attribute header.
  expect_error(update_msg({}, cat({kOrigin, kAsPath, kNextHop, Bytes{0x40, 0x05}}), kNlri), kWithdraw, 3, 1, {},
               "fewer than an attribute header");
}

TEST(BgpRfc7606, FlagConflictsAreTreatAsWithdraw) {
  const Bytes optional_origin = {0xc0, 0x01, 0x01, 0x00};
  expect_error(update_msg({}, cat({optional_origin, kAsPath, kNextHop}), kNlri), kWithdraw, 3, 4, optional_origin,
               "flags 0xc0");
  const Bytes wellknown_med = {0x40, 0x04, 0x04, 0, 0, 0, 5};
  expect_error(update_msg({}, cat({kOrigin, kAsPath, kNextHop, wellknown_med}), kNlri), kWithdraw, 3, 4, wellknown_med,
               "MULTI_EXIT_DISC");
  const Bytes partial_next_hop = {0x60, 0x03, 0x04, 10, 0, 0, 2};
  expect_error(update_msg({}, cat({kOrigin, kAsPath, partial_next_hop}), kNlri), kWithdraw, 3, 4, partial_next_hop,
               "NEXT_HOP");
}

TEST(BgpRfc7606, UnrecognizedWellKnownAttributeResetsTheSession) {
  const Bytes unknown = {0x40, 99, 0x01, 0xaa};
  expect_error(update_msg({}, cat({kOrigin, kAsPath, kNextHop, unknown}), kNlri), kReset, 3, 2, unknown, "type 99");
}

TEST(BgpRfc7606, UnknownOptionalAttributes) {
  // Optional transitive: kept and passed on with the Partial bit; optional non-transitive: dropped quietly.
  const Bytes transitive = {0xc0, 99, 0x02, 0xab, 0xcd};
  const Bytes non_transitive = {0x80, 98, 0x01, 0x01};
  const BgpMessage m =
      decode(update_msg({}, cat({kOrigin, kAsPath, kNextHop, transitive, non_transitive}), kNlri), from_peer());
  ASSERT_TRUE(m.ok()) << m.worst()->what;
  ASSERT_EQ(m.update.attrs.unknown.size(), 1u);
  EXPECT_EQ(m.update.attrs.unknown[0], (BgpRawAttribute{0xc0, 99, {0xab, 0xcd}}));
  const Bytes again = encode_bgp_update(m.update, true);
  const Bytes with_partial = {0xe0, 99, 0x02, 0xab, 0xcd};
  EXPECT_NE(std::search(again.begin(), again.end(), with_partial.begin(), with_partial.end()), again.end());
  // The unused low flag bits are ignored on receipt and sent as zero (found by fuzz_bgp's round trip).
  const Bytes odd_flags = {0xcc, 99, 0x01, 0x07};
  const BgpMessage o = decode(update_msg({}, cat({kOrigin, kAsPath, kNextHop, odd_flags}), kNlri), from_peer());
  ASSERT_EQ(o.update.attrs.unknown.size(), 1u);
  EXPECT_EQ(o.update.attrs.unknown[0].flags, 0xc0);
}

TEST(BgpRfc7606, RepeatedAttributesAfterTheFirstAreDiscarded) {
  const Bytes med5 = {0x80, 0x04, 0x04, 0, 0, 0, 5};
  const Bytes med9 = {0x80, 0x04, 0x04, 0, 0, 0, 9};
  const BgpMessage m = decode(update_msg({}, cat({kOrigin, kAsPath, kNextHop, med5, med9}), kNlri), from_peer());
  EXPECT_EQ(m.action(), kDiscard);
  EXPECT_THAT(m.worst()->what, HasSubstr("repeated"));
  EXPECT_EQ(*m.update.attrs.med, 5u);
}

TEST(BgpRfc7606, RepeatedMultiprotocolAttributesResetTheSession) {
  // RFC 7606 §3 g: MP_REACH_NLRI or MP_UNREACH_NLRI more than once is a Malformed Attribute List NOTIFICATION.
  const Bytes unreach = {0x80, 0x0f, 0x03, 0x00, 0x01, 0x01};  // AFI 1, SAFI 1, no withdrawn routes
  expect_error(update_msg({}, cat({kOrigin, kAsPath, kNextHop, unreach, unreach}), kNlri), kReset, 3, 1, {},
               "MP_UNREACH_NLRI repeated");
  const Bytes reach = {0x80, 0x0e, 0x09, 0x00, 0x01, 0x01, 0x04, 10, 0, 0, 2, 0x00};  // next hop 10.0.0.2, no NLRI
  expect_error(update_msg({}, cat({kOrigin, kAsPath, kNextHop, reach, reach}), kNlri), kReset, 3, 1, {},
               "MP_REACH_NLRI repeated");
  // Once is accepted.
  EXPECT_TRUE(decode(update_msg({}, cat({kOrigin, kAsPath, kNextHop, unreach}), kNlri), from_peer()).ok());
  EXPECT_TRUE(decode(update_msg({}, cat({kOrigin, kAsPath, kNextHop, reach}), kNlri), from_peer()).ok());
}

TEST(BgpRfc7606, BadExtendedCommunitiesAreTreatAsWithdraw) {
  const Bytes seven = {0xc0, 0x10, 0x07, 0, 4, 0xfd, 0xe9, 0x51, 0x3a, 0x43};
  expect_error(update_msg({}, cat({kOrigin, kAsPath, kNextHop, seven}), kNlri), kWithdraw, 3, 9, seven, "length 7");
  const Bytes empty = {0xc0, 0x10, 0x00};
  expect_error(update_msg({}, cat({kOrigin, kAsPath, kNextHop, empty}), kNlri), kWithdraw, 3, 9, empty, "length 0");
}

TEST(BgpRfc7606, AggregatorErrorsAreAttributeDiscard) {
  const Bytes atomic = {0x40, 0x06, 0x01, 0x00};
  expect_error(update_msg({}, cat({kOrigin, kAsPath, kNextHop, atomic}), kNlri), kDiscard, 3, 5, atomic,
               "ATOMIC_AGGREGATE");
  const Bytes aggregator = {0xc0, 0x07, 0x05, 0, 0, 0xfd, 0xea, 10};
  expect_error(update_msg({}, cat({kOrigin, kAsPath, kNextHop, aggregator}), kNlri), kDiscard, 3, 5, aggregator,
               "AGGREGATOR");
  // The route itself stands.
  const BgpMessage m = decode(update_msg({}, cat({kOrigin, kAsPath, kNextHop, aggregator}), kNlri), from_peer());
  EXPECT_EQ(m.update.nlri.size(), 1u);
  EXPECT_FALSE(m.update.attrs.aggregator.has_value());
}

TEST(BgpRfc7606, LocalPrefDependsOnThePeer) {
  const Bytes lp = {0x40, 0x05, 0x04, 0, 0, 0, 100};
  // From an external peer it is ignored (RFC 4271 §5.1.5).
  const BgpMessage e = decode(update_msg({}, cat({kOrigin, kAsPath, kNextHop, lp}), kNlri), from_peer());
  ASSERT_TRUE(e.ok());
  EXPECT_FALSE(e.update.attrs.local_pref.has_value());
  // From an internal one it is mandatory and checked.
  BgpDecodeOptions ibgp;
  ibgp.ebgp = false;
  EXPECT_EQ(*decode(update_msg({}, cat({kOrigin, kAsPath, kNextHop, lp}), kNlri), ibgp).update.attrs.local_pref, 100u);
  const Bytes lp3 = {0x40, 0x05, 0x03, 0, 0, 100};
  expect_error(update_msg({}, cat({kOrigin, kAsPath, kNextHop, lp3}), kNlri), kWithdraw, 3, 5, lp3, "LOCAL_PREF", ibgp);
  expect_error(update_msg({}, cat({kOrigin, kAsPath, kNextHop}), kNlri), kWithdraw, 3, 3, {5}, "LOCAL_PREF", ibgp);
}

TEST(BgpRfc7606, As4PathErrorsAreAttributeDiscard) {
  // RFC 6793 §6: a malformed AS4_PATH from a 2-octet peer is discarded and AS_PATH used as it is.
  BgpDecodeOptions two;
  two.as4 = false;
  two.peer_as = 65002;
  const Bytes path2 = {0x40, 0x02, 0x04, 0x02, 0x01, 0xfd, 0xea};
  const Bytes bad4 = {0xc0, 0x11, 0x03, 0x02, 0x01, 0x00};
  expect_error(update_msg({}, cat({kOrigin, path2, kNextHop, bad4}), kNlri), kDiscard, 3, 11, {}, "AS4_PATH", two);
  const BgpMessage m = decode(update_msg({}, cat({kOrigin, path2, kNextHop, bad4}), kNlri), two);
  EXPECT_EQ(*m.update.attrs.as_path, (std::vector<BgpAsPathSegment>{{kAsSequence, {65002}}}));
  // From a 4-octet peer an AS4_PATH has no business being there: discarded.
  const Bytes as4 = {0xc0, 0x11, 0x06, 0x02, 0x01, 0, 0, 0xfd, 0xea};
  expect_error(update_msg({}, cat({kOrigin, kAsPath, kNextHop, as4}), kNlri), kDiscard, 3, 9, {}, "AS4_PATH");
}

TEST(BgpRfc7606, TheMostSevereErrorDecides) {
  const Bytes value3 = {0x40, 0x01, 0x01, 0x03};  // treat-as-withdraw
  const Bytes unknown = {0x40, 99, 0x00};         // session reset
  const BgpMessage m = decode(update_msg({}, cat({value3, kAsPath, kNextHop, unknown}), kNlri), from_peer());
  EXPECT_EQ(m.errors.size(), 2u);
  EXPECT_EQ(m.action(), kReset);
  EXPECT_EQ(m.worst()->notification.subcode, 2);
}

// ================================================================================================================
// Multiprotocol IPv4 unicast (RFC 4760): MP_REACH_NLRI and MP_UNREACH_NLRI as GoBGP (and FRR in some
// configurations) send them, decoded into the same nlri / withdrawn lists as the classic fields, or into mp_reach
// beside classic NLRI whose next hop is another
// ================================================================================================================

namespace {

const std::vector<BgpPrefix> kHostAndSlash16 = {bgp_prefix(ip(10, 1, 0, 2), 32), bgp_prefix(ip(10, 3, 0, 0), 16)};

// MP_REACH_NLRI (RFC 4760 §3): 10.1.0.2/32 and 10.3.0.0/16 via next hop 10.0.0.9.
const Bytes kMpReach = {0x80, 0x0e, 0x11,              // optional non-transitive, type 14, length 17
                        0x00, 0x01,                    // AFI 1 (IPv4)
                        0x01,                          // SAFI 1 (unicast)
                        0x04,                          // next hop length 4
                        0x0a, 0x00, 0x00, 0x09,        // next hop 10.0.0.9
                        0x00,                          // reserved
                        0x20, 0x0a, 0x01, 0x00, 0x02,  // 10.1.0.2/32: 32 bits, 4 octets
                        0x10, 0x0a, 0x03};             // 10.3.0.0/16: 16 bits, 2 octets

// MP_REACH_NLRI announcing 10.3.0.0/16 via 10.0.0.<last>.
Bytes reach_via(uint8_t last) {
  return Bytes{0x80, 0x0e, 0x0c,        // type 14, length 12
               0x00, 0x01, 0x01,        // AFI 1, SAFI 1
               0x04,                    // next hop length 4
               0x0a, 0x00, 0x00, last,  // next hop 10.0.0.<last>
               0x00,                    // reserved
               0x10, 0x0a, 0x03};       // 10.3.0.0/16
}
const BgpPrefix kSlash16 = bgp_prefix(ip(10, 3, 0, 0), 16);
const BgpPrefix kHost = bgp_prefix(ip(10, 1, 0, 2), 32);  // kNlri's

}  // namespace

TEST(BgpMultiprotocol, ReachNlriRoutesAreDecodedWithTheirNextHop) {
  // ORIGIN and AS_PATH (RFC 4760 §3: mandatory with MP_REACH_NLRI), no NEXT_HOP, no classic NLRI.
  const BgpMessage m = decode(update_msg({}, cat({kOrigin, kAsPath, kMpReach}), {}), from_peer());
  ASSERT_TRUE(m.ok()) << m.worst()->what;
  EXPECT_EQ(m.update.nlri, kHostAndSlash16);
  EXPECT_EQ(m.update.attrs.next_hop, ip(10, 0, 0, 9));
  EXPECT_TRUE(m.update.withdrawn.empty());
  EXPECT_TRUE(m.skipped_families.empty());
  EXPECT_FALSE(m.end_of_rib);
  // MP_REACH_NLRI first (where RFC 7606 §5.1 asks senders to put it), and a NEXT_HOP beside it: ignored without
  // classic NLRI (RFC 4760 §3), the MP next hop is the routes'.
  const BgpMessage first = decode(update_msg({}, cat({kMpReach, kOrigin, kAsPath, kNextHop}), {}), from_peer());
  ASSERT_TRUE(first.ok()) << first.worst()->what;
  EXPECT_EQ(first.update, m.update);
  // This code sends them back in the classic fields, NEXT_HOP 10.0.0.9 (what FRR expects of an IPv4 session).
  const Bytes classic =
      update_msg({}, cat({kOrigin, kAsPath, Bytes{0x40, 0x03, 0x04, 10, 0, 0, 9}}), {0x20, 10, 1, 0, 2, 0x10, 10, 3});
  EXPECT_EQ(encode_bgp_update(m.update, true), classic);
  EXPECT_EQ(decode(classic, from_peer()).update, m.update);
}

TEST(BgpMultiprotocol, UnreachNlriRoutesJoinTheWithdrawnRoutes) {
  const Bytes unreach = {0x80, 0x0f, 0x09,              // optional non-transitive, type 15, length 9
                         0x00, 0x01, 0x01,              // AFI 1, SAFI 1
                         0x20, 0x0a, 0x01, 0x00, 0x02,  // 10.1.0.2/32
                         0x00};                         // 0.0.0.0/0: no octets
  // No other attribute is needed (RFC 4760 §4); the classic Withdrawn Routes come first.
  const BgpMessage m = decode(update_msg({0x10, 10, 9}, unreach, {}), from_peer());
  ASSERT_TRUE(m.ok()) << m.worst()->what;
  EXPECT_EQ(m.update.withdrawn, (std::vector<BgpPrefix>{bgp_prefix(ip(10, 9, 0, 0), 16),
                                                        bgp_prefix(ip(10, 1, 0, 2), 32), bgp_prefix(0, 0)}));
  EXPECT_TRUE(m.update.nlri.empty());
  EXPECT_FALSE(m.end_of_rib);
}

TEST(BgpMultiprotocol, AnEmptyIpv4UnicastUnreachIsTheEndOfRibMarker) {
  // RFC 4724 §2: the empty UPDATE, or MP_UNREACH_NLRI for the family withdrawing nothing as the only content.
  const Bytes eor = {0x80, 0x0f, 0x03, 0x00, 0x01, 0x01};  // AFI 1, SAFI 1, no withdrawn routes
  EXPECT_TRUE(decode(update_msg({}, {}, {})).end_of_rib);
  const BgpMessage m = decode(update_msg({}, eor, {}), from_peer());
  ASSERT_TRUE(m.ok()) << m.worst()->what;
  EXPECT_TRUE(m.end_of_rib);
  EXPECT_EQ(m.update, BgpUpdate{});
  // Anything more is not the marker: a prefix, another attribute, another family (IPv6 unicast's marker).
  EXPECT_FALSE(decode(update_msg({}, {0x80, 0x0f, 0x04, 0x00, 0x01, 0x01, 0x00}, {})).end_of_rib);
  EXPECT_FALSE(decode(update_msg({}, cat({eor, kOrigin}), {})).end_of_rib);
  EXPECT_FALSE(decode(update_msg({}, {0x80, 0x0f, 0x03, 0x00, 0x02, 0x01}, {})).end_of_rib);
  EXPECT_FALSE(decode(update_msg({0x00}, {}, {})).end_of_rib);  // withdraws 0.0.0.0/0
}

TEST(BgpMultiprotocol, ClassicNlriAndReachNlriWithOneNextHop) {
  // Attributes from byte 23: ORIGIN (4), AS_PATH (9), NEXT_HOP 10.0.0.2 (7), then MP_REACH_NLRI at byte 43, whose
  // next hop is NEXT_HOP's too: one set of routes.
  const BgpMessage m = decode(update_msg({}, cat({kOrigin, kAsPath, kNextHop, reach_via(2)}), kNlri), from_peer());
  ASSERT_TRUE(m.ok()) << m.worst()->what;
  EXPECT_EQ(m.update.nlri, kHostAndSlash16);  // the classic field's first
  EXPECT_EQ(m.update.attrs.next_hop, ip(10, 0, 0, 2));
  EXPECT_FALSE(m.update.mp_reach);
  // Classic NLRI still needs NEXT_HOP (RFC 7606 §3 d), MP_REACH_NLRI beside it or not.
  expect_error(update_msg({}, cat({kOrigin, kAsPath, reach_via(2)}), kNlri), kWithdraw, 3, 3, {3}, "NEXT_HOP");
  // MP_REACH_NLRI alone needs ORIGIN and AS_PATH as classic NLRI does.
  expect_error(update_msg({}, cat({kAsPath, kMpReach}), {}), kWithdraw, 3, 3, {1}, "ORIGIN");
}

TEST(BgpMultiprotocol, ClassicNlriAndReachNlriKeepTheirOwnNextHops) {
  // RFC 4760 §3: NEXT_HOP 10.0.0.2 is the classic NLRI's (10.1.0.2/32), MP_REACH_NLRI's 10.0.0.9 its own
  // (10.3.0.0/16). Neither is an error; NEXT_HOP's was once kept for both and the other reported discarded.
  const Bytes both = update_msg({}, cat({kOrigin, kAsPath, kNextHop, reach_via(9)}), kNlri);
  const BgpMessage m = decode(both, from_peer());
  ASSERT_TRUE(m.ok()) << m.worst()->what;
  EXPECT_EQ(m.update.nlri, (std::vector<BgpPrefix>{kHost}));
  EXPECT_EQ(m.update.attrs.next_hop, ip(10, 0, 0, 2));
  ASSERT_TRUE(m.update.mp_reach);
  EXPECT_EQ(m.update.mp_reach->next_hop, ip(10, 0, 0, 9));
  EXPECT_EQ(m.update.mp_reach->nlri, (std::vector<BgpPrefix>{kSlash16}));
  // MP_REACH_NLRI first (RFC 7606 §5.1): the same update, and what it encodes back to, byte for byte.
  const Bytes mp_first = update_msg({}, cat({reach_via(9), kOrigin, kAsPath, kNextHop}), kNlri);
  EXPECT_EQ(decode(mp_first, from_peer()).update, m.update);
  EXPECT_EQ(encode_bgp_update(m.update, true), mp_first);
  // Split over messages: the classic route with NEXT_HOP, then the MP one without (RFC 4760 §3), each decoding to
  // its route and its next hop.
  const std::vector<Bytes> msgs = encode_bgp_updates(m.update, true);
  ASSERT_EQ(msgs.size(), 2u);
  EXPECT_EQ(msgs[0], update_msg({}, cat({kOrigin, kAsPath, kNextHop}), kNlri));
  EXPECT_EQ(msgs[1], update_msg({}, cat({reach_via(9), kOrigin, kAsPath}), {}));
  const BgpMessage mp_alone = decode(msgs[1], from_peer());
  ASSERT_TRUE(mp_alone.ok()) << mp_alone.worst()->what;
  EXPECT_EQ(mp_alone.update.nlri, (std::vector<BgpPrefix>{kSlash16}));
  EXPECT_EQ(mp_alone.update.attrs.next_hop, ip(10, 0, 0, 9));
  // Without NEXT_HOP the classic route has no next hop: treat-as-withdraw (3/3), the MP route listed with its own.
  const BgpMessage no_nh = decode(update_msg({}, cat({kOrigin, kAsPath, reach_via(9)}), kNlri), from_peer());
  EXPECT_EQ(no_nh.action(), kWithdraw);
  EXPECT_THAT(no_nh.worst()->what, HasSubstr("lacks the well-known mandatory NEXT_HOP"));
  EXPECT_EQ(no_nh.update.nlri, (std::vector<BgpPrefix>{kHost}));
  ASSERT_TRUE(no_nh.update.mp_reach);
  EXPECT_EQ(no_nh.update.mp_reach->nlri, (std::vector<BgpPrefix>{kSlash16}));
}

TEST(BgpMultiprotocol, OtherFamiliesAreSkippedWithoutError) {
  const Bytes ipv6_reach = {0x80, 0x0e, 0x1c,                                // type 14, length 28
                            0x00, 0x02, 0x01,                                // AFI 2 (IPv6), SAFI 1
                            0x10,                                            // next hop length 16
                            0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,  // next hop 2001:db8::1
                            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,  //
                            0x00,                                            // reserved
                            0x30, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x01};       // 2001:db8:1::/48
  const Bytes ipv6_unreach = {0x80, 0x0f, 0x0a,                              // type 15, length 10
                              0x00, 0x02, 0x01,                              // AFI 2, SAFI 1
                              0x30, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x01};     // 2001:db8:1::/48
  const BgpMessage m =
      decode(update_msg({}, cat({kOrigin, kAsPath, kNextHop, ipv6_reach, ipv6_unreach}), kNlri), from_peer());
  ASSERT_TRUE(m.ok()) << m.worst()->what;
  EXPECT_EQ(m.update.nlri, (std::vector<BgpPrefix>{bgp_prefix(ip(10, 1, 0, 2), 32)}));  // the classic route only
  EXPECT_TRUE(m.update.withdrawn.empty());
  EXPECT_EQ(m.skipped_families, (std::vector<std::pair<uint16_t, uint8_t>>{{2, 1}, {2, 1}}));
  // Not read past AFI and SAFI: a next hop length no family has, IPv4 multicast (SAFI 2), all without error.
  const Bytes odd_ipv6 = {0x80, 0x0e, 0x04, 0x00, 0x02, 0x01, 0xc8};   // AFI 2, SAFI 1, next hop length 200
  const Bytes multicast = {0x80, 0x0f, 0x04, 0x00, 0x01, 0x02, 0x21};  // AFI 1, SAFI 2, a /33 "prefix"
  const BgpMessage o = decode(update_msg({}, cat({kOrigin, kAsPath, odd_ipv6, multicast}), {}), from_peer());
  ASSERT_TRUE(o.ok()) << o.worst()->what;
  EXPECT_EQ(o.skipped_families, (std::vector<std::pair<uint16_t, uint8_t>>{{2, 1}, {1, 2}}));
}

TEST(BgpMultiprotocol, MalformedAttributesResetTheSession) {
  // RFC 7606 §7.11; Optional Attribute Error (3/9) with the attribute as data, as RFC 4760 §7 names it. Each is the
  // third attribute, at byte 36 after ORIGIN (4) and AS_PATH (9); its value starts at byte 39.
  const auto with = [](const Bytes& a) { return update_msg({}, cat({kOrigin, kAsPath, a}), {}); };
  const Bytes truncated = {0x80, 0x0e, 0x06,  // type 14, length 6
                           0x00, 0x01, 0x01,  // AFI 1, SAFI 1
                           0x04,              // next hop length 4...
                           0x0a, 0x00};       // ...of which 2 bytes are there
  expect_error(with(truncated), kReset, 3, 9, truncated,
               "MP_REACH_NLRI at byte 36 has a next hop of length 4 that runs past its 6 bytes");
  const Bytes nh12 = {0x80, 0x0e, 0x13,                                // type 14, length 19
                      0x00, 0x01, 0x01,                                // AFI 1, SAFI 1
                      0x0c,                                            // next hop length 12 (VPN-IPv4's)
                      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // route distinguisher 0
                      0x0a, 0x00, 0x00, 0x09,                          // 10.0.0.9
                      0x00,                                            // reserved
                      0x08, 0x0a};                                     // 10.0.0.0/8
  expect_error(with(nh12), kReset, 3, 9, nh12, "MP_REACH_NLRI at byte 36 has a next hop of length 12");
  const Bytes short_reach = {0x80, 0x0e, 0x04, 0x00, 0x01, 0x01, 0x04};  // no reserved byte
  expect_error(with(short_reach), kReset, 3, 9, short_reach, "MP_REACH_NLRI at byte 36 has length 4");
  const Bytes short_unreach = {0x80, 0x0f, 0x02, 0x00, 0x01};  // no SAFI
  expect_error(with(short_unreach), kReset, 3, 9, short_unreach, "MP_UNREACH_NLRI at byte 36 has length 2");
  // Prefixes as in the NLRI field (RFC 7606 §5.3): Invalid Network Field (3/10), no data.
  const Bytes len33 = {0x80, 0x0e, 0x0f,                     // type 14, length 15
                       0x00, 0x01, 0x01,                     // AFI 1, SAFI 1
                       0x04, 0x0a, 0x00, 0x00, 0x09,         // next hop 10.0.0.9
                       0x00,                                 // reserved
                       0x21, 0x0a, 0x01, 0x00, 0x02, 0x00};  // 33 bits at byte 39 + 9
  expect_error(with(len33), kReset, 3, 10, {}, "MP_REACH_NLRI prefix at byte 48 with length 33 (expected 0..32)");
  const Bytes past = {0x80, 0x0e, 0x0c,              // type 14, length 12: ends at byte 39 + 12 = 51
                      0x00, 0x01, 0x01,              // AFI 1, SAFI 1
                      0x04, 0x0a, 0x00, 0x00, 0x09,  // next hop 10.0.0.9
                      0x00,                          // reserved
                      0x18, 0x0a, 0x01};             // a /24 needs 3 octets, 2 are left
  expect_error(with(past), kReset, 3, 10, {}, "MP_REACH_NLRI prefix at byte 48 with length 24 runs past");
  const Bytes unreach33 = {0x80, 0x0f, 0x09,                     // type 15, length 9
                           0x00, 0x01, 0x01,                     // AFI 1, SAFI 1
                           0x21, 0x0a, 0x01, 0x00, 0x02, 0x00};  // 33 bits at byte 39 + 3
  expect_error(with(unreach33), kReset, 3, 10, {}, "MP_UNREACH_NLRI prefix at byte 42 with length 33");
  // Flags other than optional non-transitive: a reset too (treat-as-withdraw could not find the NLRI).
  Bytes transitive = kMpReach;
  transitive[0] = 0xc0;
  expect_error(with(transitive), kReset, 3, 4, transitive, "MP_REACH_NLRI at byte 36 has flags 0xc0");
}

TEST(BgpMultiprotocol, NextHopsThatCannotServeAreTreatAsWithdraw) {
  // RFC 8950's IPv6 next hop for IPv4 NLRI: not negotiated, nowhere to keep it; the NLRI is found and withdrawn.
  const Bytes ipv6_next_hop = {0x80, 0x0e, 0x1a,                                // type 14, length 26
                               0x00, 0x01, 0x01,                                // AFI 1, SAFI 1
                               0x10,                                            // next hop length 16
                               0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,  // 2001:db8::1
                               0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,  //
                               0x00,                                            // reserved
                               0x20, 0x0a, 0x01, 0x00, 0x02};                   // 10.1.0.2/32
  const Bytes u = update_msg({}, cat({kOrigin, kAsPath, ipv6_next_hop}), {});
  expect_error(u, kWithdraw, 3, 9, ipv6_next_hop, "MP_REACH_NLRI at byte 36 has a 16-byte IPv6 next hop");
  EXPECT_EQ(decode(u, from_peer()).update.nlri, (std::vector<BgpPrefix>{bgp_prefix(ip(10, 1, 0, 2), 32)}));
  // A next hop no route may use (RFC 4271 §6.3), as for NEXT_HOP: Invalid NEXT_HOP (3/8).
  Bytes loopback = kMpReach;
  loopback[7] = 127;  // next hop 127.0.0.9
  expect_error(update_msg({}, cat({kOrigin, kAsPath, loopback}), {}), kWithdraw, 3, 8, loopback,
               "MP_REACH_NLRI next hop 127.0.0.9");
}

// ================================================================================================================
// Header and OPEN errors
// ================================================================================================================

TEST(BgpErrors, HeaderErrors) {
  Bytes marker = encode_bgp_keepalive();
  marker[5] = 0xfe;
  expect_error(marker, kReset, 1, 1, {}, "marker byte 5");
  expect_error(header(18, 4), kReset, 1, 2, {0x00, 0x12}, "length 18");
  Bytes big = header(4097, 2);
  big.resize(4097);
  expect_error(big, kReset, 1, 2, {0x10, 0x01}, "length 4097");
  expect_error(header(19, 6), kReset, 1, 3, {6}, "message type 6");
  expect_error(cat({header(20, 4), {0}}), kReset, 1, 2, {0x00, 0x14}, "KEEPALIVE length 20");
  expect_error(cat({header(28, 1), Bytes(9, 0)}), kReset, 1, 2, {0x00, 0x1c}, "OPEN length 28");
  expect_error(cat({header(24, 5), Bytes(5, 0)}), kReset, 1, 2, {0x00, 0x18}, "ROUTE-REFRESH length 24");
  expect_error(cat({header(20, 3), {6}}), kReset, 1, 2, {0x00, 0x14}, "NOTIFICATION length 20");
}

TEST(BgpErrors, OpenErrors) {
  const auto open = [](BgpOpen o) { return encode_bgp_open(o); };
  BgpOpen v3 = make_bgp_open(65002, 90, 1);
  v3.version = 3;
  expect_error(open(v3), kReset, 2, 1, {0x00, 0x04}, "version 3");  // data: the highest version we support
  expect_error(open(make_bgp_open(65002, 1, 1)), kReset, 2, 6, {}, "hold time 1");
  expect_error(open(make_bgp_open(65002, 2, 1)), kReset, 2, 6, {}, "hold time 2");
  BgpOpen as0 = make_bgp_open(65002, 90, 1);
  as0.as4 = 0;
  expect_error(open(as0), kReset, 2, 2, {}, "AS 0");
  expect_error(open(make_bgp_open(65002, 90, 0)), kReset, 2, 3, {0, 0, 0, 0}, "identifier 0.0.0.0");
  // Optional parameter type 1 (authentication, deprecated): Unsupported Optional Parameter.
  const Bytes fixed = {0x04, 0xfd, 0xea, 0x00, 0x5a, 0, 0, 0, 1};
  expect_error(message(1, cat({fixed, {4, 0x01, 0x02, 0x00, 0x00}})), kReset, 2, 4, {}, "parameter type 1");
  // A capability that runs past its parameter; a parameters length that disagrees with the message.
  expect_error(message(1, cat({fixed, {4, 0x02, 0x02, 0x41, 0x04}})), kReset, 2, 0, {}, "runs past");
  expect_error(message(1, cat({fixed, {9, 0x02, 0x02, 0x02, 0x00}})), kReset, 2, 0, {}, "length 9");
  expect_error(message(1, cat({fixed, {4, 0x02, 0x02, 0x41, 0x00}})), kReset, 2, 0, {}, "capability 65");
}

// ================================================================================================================
// Bad input never crashes and always says what is wrong
// ================================================================================================================

namespace {

Bytes sample_update() {
  BgpUpdate u;
  u.withdrawn = {bgp_prefix(ip(10, 9, 0, 0), 16)};
  u.attrs.origin = BgpOrigin::kIgp;
  u.attrs.as_path = std::vector<BgpAsPathSegment>{{kAsSequence, {4200000001u, 4200000002u}}};
  u.attrs.next_hop = ip(10, 0, 0, 1);
  u.attrs.med = 5;
  u.attrs.ext_communities = {encode_link_bandwidth({65001, 5e10f, true})};
  u.nlri = {bgp_prefix(ip(10, 1, 1, 1), 32), bgp_prefix(ip(10, 2, 0, 0), 15), bgp_prefix(0, 0)};
  return encode_bgp_update(u, true);  // 77 bytes; NLRI from byte 68, prefixes end at 73, 76, 77
}

void expect_explained(const BgpMessage& m, size_t len) {
  for (const BgpError& e : m.errors) {
    EXPECT_NE(e.action, BgpErrorAction::kNone);
    EXPECT_FALSE(e.what.empty());
    EXPECT_LE(e.offset, len);
  }
}

}  // namespace

TEST(BgpRobustness, EveryTruncationOfAValidUpdate) {
  const Bytes full = sample_update();
  ASSERT_EQ(full.size(), 77u);
  const BgpDecodeOptions opt{true, true, 4200000001u};
  for (size_t k = 0; k < full.size(); ++k) {
    SCOPED_TRACE(k);
    // The buffer ends early: the framer waits for more, the decoder refuses it by name.
    BgpError err;
    EXPECT_EQ(bgp_frame_length(full.data(), k, &err), 0u);
    EXPECT_EQ(err.action, BgpErrorAction::kNone);
    const BgpMessage short_buffer = decode_bgp(full.data(), k, opt);
    EXPECT_EQ(short_buffer.action(), kReset);
    expect_explained(short_buffer, k);
    if (k < 19) continue;
    // A peer that sent only k bytes, its header saying so: valid only where a whole prefix ends.
    Bytes cut(full.begin(), full.begin() + static_cast<long>(k));
    cut[16] = static_cast<uint8_t>(k >> 8);
    cut[17] = static_cast<uint8_t>(k);
    const BgpMessage m = decode_bgp(cut.data(), cut.size(), opt);
    const bool whole = k == 68 || k == 73 || k == 76;
    EXPECT_EQ(m.ok(), whole) << (m.ok() ? "" : m.worst()->what);
    if (!whole) {
      EXPECT_NE(m.action(), BgpErrorAction::kNone);
    }
    expect_explained(m, k);
  }
  BgpError err;
  EXPECT_EQ(bgp_frame_length(full.data(), full.size(), &err), full.size());
}

TEST(BgpRobustness, EmptyAndOversizedInput) {
  BgpError err;
  EXPECT_EQ(bgp_frame_length(nullptr, 0, &err), 0u);
  EXPECT_EQ(err.action, BgpErrorAction::kNone);
  const BgpMessage empty = decode_bgp(nullptr, 0);
  EXPECT_EQ(empty.action(), kReset);
  EXPECT_THAT(empty.worst()->what, HasSubstr("0 bytes"));
  // 4096 bytes is the most a message may have; 4097 is refused by the framer with the length as data.
  Bytes big = sample_update();
  const size_t pad = 4096 - big.size();
  big.insert(big.end(), pad, 0);  // /0 prefixes fill the rest
  big[16] = 0x10;
  big[17] = 0x00;
  EXPECT_TRUE(decode(big, BgpDecodeOptions{true, true, 4200000001u}).ok());
  big.push_back(0);
  big[17] = 0x01;
  EXPECT_EQ(bgp_frame_length(big.data(), big.size(), &err), 0u);
  EXPECT_EQ(err.notification, (BgpNotification{1, 2, {0x10, 0x01}}));
}

TEST(BgpRobustness, EveryByteOfAValidUpdateSetToEveryValue) {
  const Bytes full = sample_update();
  size_t refused = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    for (int v = 0; v < 256; ++v) {
      Bytes b = full;
      b[i] = static_cast<uint8_t>(v);
      const BgpMessage m = decode(b, BgpDecodeOptions{true, true, 4200000001u});
      expect_explained(m, b.size());
      refused += !m.ok();
    }
  }
  EXPECT_GT(refused, 16u * 255u);  // at least every marker change
}

TEST(BgpRobustness, EveryByteOfAMultiprotocolUpdateSetToEveryValue) {
  // As fuzz_bgp checks: an UPDATE decoded without error encodes (classic fields, MP_REACH_NLRI for routes with
  // another next hop than NEXT_HOP's) and decodes to the same update. MP routes alone, then beside classic NLRI.
  const Bytes mp_only =
      update_msg({}, cat({kOrigin, kAsPath, kMpReach, Bytes{0x80, 0x0f, 0x05, 0, 1, 1, 0x08, 10}}), {});
  const Bytes both = update_msg({}, cat({reach_via(9), kOrigin, kAsPath, kNextHop}), kNlri);
  for (const Bytes& full : {mp_only, both}) {
    for (size_t i = 19; i < full.size(); ++i) {
      for (int v = 0; v < 256; ++v) {
        Bytes b = full;
        b[i] = static_cast<uint8_t>(v);
        const BgpMessage m = decode(b, from_peer());
        expect_explained(m, b.size());
        if (!m.ok() || m.type != 2) continue;
        const Bytes again = encode_bgp_update(m.update, true);
        const BgpMessage back = decode(again, from_peer());
        ASSERT_TRUE(back.ok()) << "byte " << i << " = " << v << ": " << back.worst()->what;
        EXPECT_EQ(back.update, m.update) << "byte " << i << " = " << v;
      }
    }
  }
}

TEST(BgpRobustness, RandomBodiesBehindValidHeaders) {
  uint64_t s = 0x9e3779b97f4a7c15ull;
  const auto next = [&s]() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  for (int i = 0; i < 20000; ++i) {
    const uint8_t type = static_cast<uint8_t>(1 + next() % 5);
    const size_t min = type == 1 ? 29 : type == 2 ? 23 : type == 3 ? 21 : type == 4 ? 19 : 23;
    const size_t len = type == 4 || type == 5 ? min : min + next() % 80;
    Bytes b = header(static_cast<uint16_t>(len), type);
    while (b.size() < len) b.push_back(static_cast<uint8_t>(next() % 4 == 0 ? next() : next() % 8));
    expect_explained(decode(b), len);
    expect_explained(decode(b, BgpDecodeOptions{false, false, 0}), len);
  }
}

// ================================================================================================================
// Sessions
// ================================================================================================================

namespace {

using common::kForever;
using common::TimeNs;

constexpr uint32_t kAsA = 4200000001u;  // RFC 6996 private 4-octet ASes, one per node (routing/README.md)
constexpr uint32_t kAsB = 4200000002u;

BgpSessionConfig config(uint32_t local, uint32_t peer, uint32_t id, bool passive = false, uint16_t hold = 90) {
  BgpSessionConfig c;
  c.local_as = local;
  c.peer_as = peer;
  c.bgp_id = id;
  c.passive = passive;
  c.hold_time = hold;
  return c;
}

// Two sessions joined by an in-memory connection: what one writes the other reads.
struct Wire {
  BgpSession& a;
  BgpSession& b;
  std::vector<BgpSessionEvent> ea, eb;
  Bytes a_sent, b_sent;  // everything each wrote, for counting

  void collect() {
    for (auto& e : a.take_events()) ea.push_back(std::move(e));
    for (auto& e : b.take_events()) eb.push_back(std::move(e));
  }
  // Delivers until both are quiet; `chunk` bytes at a time (0: all at once).
  void pump(TimeNs now, size_t chunk = 0) {
    for (int round = 0; round < 100; ++round) {
      const Bytes x = a.take_output();
      const Bytes y = b.take_output();
      collect();
      if (x.empty() && y.empty()) return;
      a_sent.insert(a_sent.end(), x.begin(), x.end());
      b_sent.insert(b_sent.end(), y.begin(), y.end());
      deliver(b, x, now, chunk);
      deliver(a, y, now, chunk);
    }
    ADD_FAILURE() << "the sessions never went quiet";
  }
  static void deliver(BgpSession& to, const Bytes& bytes, TimeNs now, size_t chunk) {
    const size_t step = chunk == 0 ? bytes.size() : chunk;
    for (size_t i = 0; i < bytes.size(); i += step) to.receive(bytes.data() + i, std::min(step, bytes.size() - i), now);
  }
  // Connects a (active) to b (passive) at `now` and exchanges OPENs and KEEPALIVEs.
  void establish(TimeNs now, size_t chunk = 0) {
    a.start(now);
    b.start(now);
    a.connected(now);
    b.connected(now);
    pump(now, chunk);
  }
};

std::vector<BgpState> states(const std::vector<BgpSessionEvent>& events) {
  std::vector<BgpState> out;
  for (const BgpSessionEvent& e : events) {
    if (e.kind == Kind::kStateChanged) out.push_back(e.to);
  }
  return out;
}

const BgpSessionEvent* find(const std::vector<BgpSessionEvent>& events, Kind kind) {
  for (const BgpSessionEvent& e : events) {
    if (e.kind == kind) return &e;
  }
  return nullptr;
}

Bytes notification_bytes(uint8_t code, uint8_t subcode) { return cat({header(21, 3), {code, subcode}}); }

BgpUpdate route(uint32_t as, uint32_t next_hop, uint32_t prefix, double gbps) {
  BgpUpdate u;
  u.attrs.origin = BgpOrigin::kIgp;
  u.attrs.as_path = std::vector<BgpAsPathSegment>{{kAsSequence, {as}}};
  u.attrs.next_hop = next_hop;
  u.attrs.ext_communities = {encode_path_bandwidth(as, gbps)};
  u.nlri = {bgp_prefix(prefix, 32)};
  return u;
}

// A session to AS 65002 in OpenSent (its own OPEN already taken), to feed hand-made messages to.
BgpSession open_sent(std::vector<BgpSessionEvent>* events = nullptr) {
  BgpSession s(config(65001, 65002, ip(10, 0, 0, 1)));
  s.start(0);
  s.connected(0);
  s.take_output();
  if (events) *events = s.take_events();
  return s;
}

void feed(BgpSession& s, const Bytes& b, TimeNs now = 0) { s.receive(b.data(), b.size(), now); }

// A session that has exchanged OPEN and KEEPALIVE with AS 65002, its output and events taken.
BgpSession established() {
  BgpSession s = open_sent();
  feed(s, encode_bgp_open(make_bgp_open(65002, 90, 2)));
  feed(s, encode_bgp_keepalive());
  s.take_output();
  s.take_events();
  return s;
}

}  // namespace

TEST(BgpSession, TwoSessionsReachEstablishedAndExchangeRoutes) {
  BgpSession a(config(kAsA, kAsB, ip(10, 0, 0, 1)));
  BgpSession b(config(kAsB, kAsA, ip(10, 0, 0, 2), /*passive=*/true, /*hold=*/30));
  Wire w{a, b, {}, {}, {}, {}};
  const TimeNs t = 1 * kSecondNs;
  w.establish(t);
  ASSERT_EQ(a.state(), BgpState::kEstablished);
  ASSERT_EQ(b.state(), BgpState::kEstablished);
  EXPECT_EQ(states(w.ea), (std::vector<BgpState>{BgpState::kConnect, BgpState::kOpenSent, BgpState::kOpenConfirm,
                                                 BgpState::kEstablished}));
  EXPECT_EQ(states(w.eb), (std::vector<BgpState>{BgpState::kActive, BgpState::kOpenSent, BgpState::kOpenConfirm,
                                                 BgpState::kEstablished}));
  ASSERT_NE(find(w.ea, Kind::kConnect), nullptr);  // the active side asks for the TCP connection
  EXPECT_EQ(find(w.eb, Kind::kConnect), nullptr);  // the passive one only listens
  // Negotiated: the smaller hold time, keepalives at a third of it, 4-octet ASes, IPv4 unicast.
  EXPECT_EQ(a.hold_time(), 30);
  EXPECT_EQ(b.hold_time(), 30);
  EXPECT_EQ(a.next_timer(), t + 10 * kSecondNs);
  EXPECT_TRUE(a.four_octet_as());
  EXPECT_TRUE(a.ipv4_unicast());
  EXPECT_TRUE(a.peer_route_refresh());
  EXPECT_EQ(a.peer_open()->as(), kAsB);

  // A announces its loopback with 400 Gb/s of path bandwidth; B sees the route, its attributes and the bandwidth.
  const BgpUpdate u = route(kAsA, ip(10, 0, 0, 1), ip(10, 255, 0, 1), 400);
  ASSERT_TRUE(a.send_update(u, t));
  w.ea.clear();
  w.eb.clear();
  w.pump(t);
  const BgpSessionEvent* got = find(w.eb, Kind::kRoutes);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->announced, u.nlri);
  EXPECT_TRUE(got->withdrawn.empty());
  EXPECT_EQ(got->attrs, u.attrs);
  EXPECT_NEAR(*bgp_path_bandwidth_gbps(got->attrs), 400.0, 1e-4);

  // B withdraws a route of its own; A sees the withdrawal.
  BgpUpdate wd;
  wd.withdrawn = {bgp_prefix(ip(10, 255, 0, 2), 32)};
  ASSERT_TRUE(b.send_update(wd, t));
  w.pump(t);
  got = find(w.ea, Kind::kRoutes);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->withdrawn, wd.withdrawn);
  EXPECT_TRUE(got->announced.empty());

  // Route refresh: A asks, B is told.
  w.eb.clear();
  ASSERT_TRUE(a.send_route_refresh(t));
  w.pump(t);
  ASSERT_NE(find(w.eb, Kind::kRouteRefresh), nullptr);
}

TEST(BgpSession, MessagesSplitAnywhereInTheStream) {
  BgpSession a(config(kAsA, kAsB, ip(10, 0, 0, 1)));
  BgpSession b(config(kAsB, kAsA, ip(10, 0, 0, 2), true));
  Wire w{a, b, {}, {}, {}, {}};
  w.establish(0, /*chunk=*/1);
  EXPECT_EQ(a.state(), BgpState::kEstablished);
  EXPECT_EQ(b.state(), BgpState::kEstablished);
  ASSERT_TRUE(a.send_update(route(kAsA, ip(10, 0, 0, 1), ip(10, 255, 0, 1), 100), 0));
  w.pump(0, 7);
  ASSERT_NE(find(w.eb, Kind::kRoutes), nullptr);
}

TEST(BgpSession, KeepalivesKeepItUpForTenMinutes) {
  BgpSession a(config(kAsA, kAsB, ip(10, 0, 0, 1), false, 9));
  BgpSession b(config(kAsB, kAsA, ip(10, 0, 0, 2), true, 9));
  Wire w{a, b, {}, {}, {}, {}};
  w.establish(0);
  const size_t before = w.a_sent.size();
  for (TimeNs now = kSecondNs; now <= 600 * kSecondNs; now += kSecondNs) {
    a.tick(now);
    b.tick(now);
    w.pump(now);
  }
  EXPECT_EQ(a.state(), BgpState::kEstablished);
  EXPECT_EQ(b.state(), BgpState::kEstablished);
  EXPECT_EQ(find(w.ea, Kind::kNotificationSent), nullptr);
  EXPECT_EQ((w.a_sent.size() - before) / kBgpHeaderSize, 200u);  // a KEEPALIVE every 3 s for 600 s
}

TEST(BgpSession, HoldTimerExpirySendsNotificationCode4) {
  BgpSession a(config(kAsA, kAsB, ip(10, 0, 0, 1), false, 30));
  BgpSession b(config(kAsB, kAsA, ip(10, 0, 0, 2), true, 30));
  Wire w{a, b, {}, {}, {}, {}};
  w.establish(0);
  w.ea.clear();
  // B falls silent (nothing of it is delivered): after 30 s A gives up.
  a.tick(29 * kSecondNs);
  EXPECT_EQ(a.state(), BgpState::kEstablished);
  a.take_output();  // its KEEPALIVEs
  a.tick(30 * kSecondNs);
  EXPECT_EQ(a.state(), BgpState::kIdle);
  // RFC 4271 §6.5: NOTIFICATION, Hold Timer Expired (4), no subcode.
  EXPECT_EQ(a.take_output(), (Bytes{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                    0xff, 0xff, 0xff, 0xff, 0xff, 0x00, 0x15, 0x03, 0x04, 0x00}));
  w.collect();
  const BgpSessionEvent* sent = find(w.ea, Kind::kNotificationSent);
  ASSERT_NE(sent, nullptr);
  EXPECT_EQ(sent->notification.code, kErrHoldTimerExpired);
  EXPECT_EQ(states(w.ea), (std::vector<BgpState>{BgpState::kIdle}));
  EXPECT_NE(find(w.ea, Kind::kDisconnect), nullptr);
  // AutomaticStart after the idle hold time.
  EXPECT_EQ(a.next_timer(), 35 * kSecondNs);
  a.tick(35 * kSecondNs);
  EXPECT_EQ(a.state(), BgpState::kConnect);
  EXPECT_EQ(a.connect_retry_count(), 1u);
  // The peer, given the NOTIFICATION, goes Idle without answering.
  feed(b, notification_bytes(4, 0), 30 * kSecondNs);
  EXPECT_EQ(b.state(), BgpState::kIdle);
  EXPECT_TRUE(b.take_output().empty());
  w.collect();
  ASSERT_NE(find(w.eb, Kind::kNotificationReceived), nullptr);
}

TEST(BgpSession, HoldTimeZeroMeansNoKeepalivesAndNoHoldTimer) {
  BgpSession a(config(kAsA, kAsB, ip(10, 0, 0, 1), false, 0));
  BgpSession b(config(kAsB, kAsA, ip(10, 0, 0, 2), true, 90));
  Wire w{a, b, {}, {}, {}, {}};
  w.establish(0);
  EXPECT_EQ(a.hold_time(), 0);
  EXPECT_EQ(a.next_timer(), kForever);
  EXPECT_EQ(b.next_timer(), kForever);
  a.tick(3600 * kSecondNs);
  EXPECT_EQ(a.state(), BgpState::kEstablished);
  EXPECT_TRUE(a.take_output().empty());
}

TEST(BgpSession, OpenSentWaitsFourMinutesForTheOpen) {
  BgpSession s = open_sent();
  EXPECT_EQ(s.next_timer(), 240 * kSecondNs);
  s.tick(240 * kSecondNs);
  EXPECT_EQ(s.state(), BgpState::kIdle);
  EXPECT_EQ(s.take_output(), notification_bytes(4, 0));
}

TEST(BgpSession, UnacceptableHoldTimeIsRefused) {
  for (uint16_t hold : {1, 2}) {
    std::vector<BgpSessionEvent> ev;
    BgpSession s = open_sent();
    feed(s, encode_bgp_open(make_bgp_open(65002, hold, ip(10, 0, 0, 2))));
    EXPECT_EQ(s.state(), BgpState::kIdle);
    // OPEN Message Error (2), Unacceptable Hold Time (6).
    EXPECT_EQ(s.take_output(), (Bytes{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                      0xff, 0xff, 0xff, 0xff, 0xff, 0x00, 0x15, 0x03, 0x02, 0x06}));
    ev = s.take_events();
    ASSERT_NE(find(ev, Kind::kDisconnect), nullptr);
    EXPECT_THAT(find(ev, Kind::kDisconnect)->text, HasSubstr("hold time " + std::to_string(hold)));
  }
  BgpSessionConfig c = config(65001, 65002, 1);
  c.hold_time = 2;
  EXPECT_THROW(BgpSession{c}, common::Error);
}

TEST(BgpSession, BadPeerAsIsRefused) {
  BgpSession s = open_sent();
  feed(s, encode_bgp_open(make_bgp_open(65099, 90, ip(10, 0, 0, 2))));
  EXPECT_EQ(s.state(), BgpState::kIdle);
  EXPECT_EQ(s.take_output(), notification_bytes(2, 2));
  const auto ev = s.take_events();
  EXPECT_THAT(find(ev, Kind::kDisconnect)->text, HasSubstr("peer AS 65099"));
  EXPECT_THAT(find(ev, Kind::kDisconnect)->text, HasSubstr("expected 65002"));
  // A peer without the 4-octet capability cannot be a 4-octet AS: its AS_TRANS is refused.
  BgpSession four(config(kAsA, kAsB, 1));
  four.start(0);
  four.connected(0);
  four.take_output();
  BgpOpen old = make_bgp_open(kAsB, 90, 2);
  old.as4.reset();
  feed(four, encode_bgp_open(old));
  EXPECT_EQ(four.take_output(), notification_bytes(2, 2));
}

TEST(BgpSession, InternalPeerWithOurIdentifierIsRefused) {
  BgpSession s(config(65001, 65001, ip(10, 0, 0, 1)));
  s.start(0);
  s.connected(0);
  s.take_output();
  feed(s, encode_bgp_open(make_bgp_open(65001, 90, ip(10, 0, 0, 1))));
  EXPECT_EQ(s.take_output(), cat({header(25, 3), {0x02, 0x03, 10, 0, 0, 1}}));
}

TEST(BgpSession, TwoOctetOnlyPeerGetsAsTransAndAs4Path) {
  BgpSession s(config(kAsA, 65002, ip(10, 0, 0, 1)));
  s.start(0);
  s.connected(0);
  s.take_output();
  BgpOpen old = make_bgp_open(65002, 90, ip(10, 0, 0, 2));
  old.as4.reset();
  old.multiprotocol.clear();  // RFC 4760: no MP capability at all means IPv4 unicast
  feed(s, encode_bgp_open(old));
  feed(s, encode_bgp_keepalive());
  ASSERT_EQ(s.state(), BgpState::kEstablished);
  EXPECT_FALSE(s.four_octet_as());
  EXPECT_TRUE(s.ipv4_unicast());
  s.take_output();
  ASSERT_TRUE(s.send_update(route(kAsA, ip(10, 0, 0, 1), ip(10, 255, 0, 1), 400), 0));
  const Bytes out = s.take_output();
  const BgpMessage m = decode(out, BgpDecodeOptions{false, true, kAsA});
  ASSERT_TRUE(m.ok()) << m.worst()->what;
  EXPECT_EQ((*m.update.attrs.as_path)[0].asns, (std::vector<uint32_t>{kAsA}));
  const Bytes trans = {0x40, 0x02, 0x04, 0x02, 0x01, 0x5b, 0xa0};  // AS_PATH [AS_TRANS]
  EXPECT_NE(std::search(out.begin(), out.end(), trans.begin(), trans.end()), out.end());
}

TEST(BgpSession, FrrOpenNegotiates) {
  BgpSession s(config(kAsA, 65001, ip(10, 0, 0, 1)));
  s.start(0);
  s.connected(0);
  s.take_output();
  feed(s, frr_open());
  EXPECT_EQ(s.state(), BgpState::kOpenConfirm);
  EXPECT_EQ(s.take_output(), encode_bgp_keepalive());
  feed(s, encode_bgp_keepalive());
  ASSERT_EQ(s.state(), BgpState::kEstablished);
  EXPECT_EQ(s.hold_time(), 9);
  EXPECT_EQ(s.next_timer(), 3 * kSecondNs);
  EXPECT_TRUE(s.four_octet_as());
  EXPECT_TRUE(s.ipv4_unicast());
  EXPECT_EQ(s.peer_open()->unknown.size(), 7u);
}

TEST(BgpSession, UnexpectedMessagesAreStateMachineErrors) {
  // RFC 6608 subcodes: 1 in OpenSent, 2 in OpenConfirm, 3 in Established.
  BgpSession s1 = open_sent();
  feed(s1, encode_bgp_keepalive());
  EXPECT_EQ(s1.take_output(), notification_bytes(5, 1));

  BgpSession s2 = open_sent();
  feed(s2, encode_bgp_open(make_bgp_open(65002, 90, 2)));
  s2.take_output();
  feed(s2, update_msg({}, {}, {}));
  EXPECT_EQ(s2.take_output(), notification_bytes(5, 2));

  BgpSession s3 = open_sent();
  feed(s3, encode_bgp_open(make_bgp_open(65002, 90, 2)));
  feed(s3, encode_bgp_keepalive());
  ASSERT_EQ(s3.state(), BgpState::kEstablished);
  s3.take_output();
  feed(s3, encode_bgp_open(make_bgp_open(65002, 90, 2)));
  EXPECT_EQ(s3.take_output(), notification_bytes(5, 3));
  EXPECT_EQ(s3.state(), BgpState::kIdle);
}

TEST(BgpSession, MalformedUpdatesFollowRfc7606) {
  BgpSession s = established();
  ASSERT_EQ(s.state(), BgpState::kEstablished);
  // ORIGIN 3: treat-as-withdraw surfaces as a withdrawal of the NLRI; the session stays up, nothing is sent.
  feed(s, update_msg({}, cat({Bytes{0x40, 0x01, 0x01, 0x03}, kAsPath, kNextHop}), kNlri));
  EXPECT_EQ(s.state(), BgpState::kEstablished);
  EXPECT_TRUE(s.take_output().empty());
  auto ev = s.take_events();
  const BgpSessionEvent* r = find(ev, Kind::kRoutes);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->withdrawn, (std::vector<BgpPrefix>{bgp_prefix(ip(10, 1, 0, 2), 32)}));
  EXPECT_TRUE(r->announced.empty());
  EXPECT_THAT(r->text, HasSubstr("ORIGIN value 3"));
  ASSERT_NE(find(ev, Kind::kProblem), nullptr);
  // A valid one is announced.
  feed(s, update_msg({}, cat({kOrigin, kAsPath, kNextHop}), kNlri));
  ev = s.take_events();
  ASSERT_NE(find(ev, Kind::kRoutes), nullptr);
  EXPECT_EQ(find(ev, Kind::kRoutes)->announced.size(), 1u);
  // An unparsable NLRI: UPDATE Message Error / Invalid Network Field, then Idle.
  feed(s, update_msg({}, cat({kOrigin, kAsPath, kNextHop}), {33, 1, 2, 3, 4, 5}));
  EXPECT_EQ(s.take_output(), notification_bytes(3, 10));
  EXPECT_EQ(s.state(), BgpState::kIdle);
}

// A peer that carries IPv4 unicast in MP_REACH_NLRI / MP_UNREACH_NLRI (GoBGP; FRR in some configurations).
TEST(BgpSession, MultiprotocolIpv4UnicastUpdates) {
  BgpSession s = established();
  ASSERT_EQ(s.state(), BgpState::kEstablished);
  feed(s, update_msg({}, cat({kOrigin, kAsPath, kMpReach}), {}));
  auto ev = s.take_events();
  const BgpSessionEvent* r = find(ev, Kind::kRoutes);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->announced, kHostAndSlash16);
  EXPECT_EQ(r->attrs.next_hop, ip(10, 0, 0, 9));
  feed(s, update_msg({}, {0x80, 0x0f, 0x08, 0x00, 0x01, 0x01, 0x20, 10, 1, 0, 2}, {}));  // withdraws 10.1.0.2/32
  ev = s.take_events();
  ASSERT_NE(find(ev, Kind::kRoutes), nullptr);
  EXPECT_EQ(find(ev, Kind::kRoutes)->withdrawn, (std::vector<BgpPrefix>{bgp_prefix(ip(10, 1, 0, 2), 32)}));
  // The End-of-RIB marker in its MP form reads as the classic one does.
  feed(s, update_msg({}, {0x80, 0x0f, 0x03, 0x00, 0x01, 0x01}, {}));
  ev = s.take_events();
  ASSERT_NE(find(ev, Kind::kRoutes), nullptr);
  EXPECT_EQ(find(ev, Kind::kRoutes)->text, "End-of-RIB");
  // IPv6 unicast's marker is another family's: said so in a kProblem, not taken for ours, the session stays up.
  feed(s, update_msg({}, {0x80, 0x0f, 0x03, 0x00, 0x02, 0x01}, {}));
  ev = s.take_events();
  ASSERT_NE(find(ev, Kind::kProblem), nullptr);
  EXPECT_THAT(find(ev, Kind::kProblem)->text, HasSubstr("AFI 2 SAFI 1, not negotiated: ignored"));
  ASSERT_NE(find(ev, Kind::kRoutes), nullptr);
  EXPECT_EQ(find(ev, Kind::kRoutes)->text, "");
  EXPECT_EQ(s.state(), BgpState::kEstablished);
  EXPECT_TRUE(s.take_output().empty());
  // A next hop that runs past the attribute: UPDATE Message Error / Optional Attribute Error with it, then Idle.
  const Bytes truncated = {0x80, 0x0e, 0x06, 0x00, 0x01, 0x01, 0x04, 10, 0};
  feed(s, update_msg({}, cat({kOrigin, kAsPath, truncated}), {}));
  EXPECT_EQ(s.take_output(), cat({header(30, 3), {3, 9}, truncated}));
  EXPECT_EQ(s.state(), BgpState::kIdle);
}

// RFC 4760 §3: an UPDATE with classic NLRI via NEXT_HOP and MP_REACH_NLRI via another next hop announces both
// sets, each with its own next hop; a treat-as-withdraw withdraws both.
TEST(BgpSession, ClassicAndMultiprotocolRoutesKeepTheirOwnNextHops) {
  BgpSession s = established();
  feed(s, update_msg({}, cat({kOrigin, kAsPath, kNextHop, reach_via(9)}), kNlri));
  auto ev = s.take_events();
  EXPECT_EQ(find(ev, Kind::kProblem), nullptr) << find(ev, Kind::kProblem)->text;
  const BgpSessionEvent* r = find(ev, Kind::kRoutes);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->announced, (std::vector<BgpPrefix>{kHost}));
  EXPECT_EQ(r->attrs.next_hop, ip(10, 0, 0, 2));
  ASSERT_TRUE(r->mp_reach);
  EXPECT_EQ(r->mp_reach->next_hop, ip(10, 0, 0, 9));
  EXPECT_EQ(r->mp_reach->nlri, (std::vector<BgpPrefix>{kSlash16}));
  const std::vector<BgpAsPathSegment> path = {{kAsSequence, {65002}}};
  EXPECT_EQ(r->attrs.as_path, path);  // the attributes both sets share
  // ORIGIN 3 (treat-as-withdraw): both sets withdrawn, nothing announced.
  feed(s, update_msg({}, cat({Bytes{0x40, 0x01, 0x01, 0x03}, kAsPath, kNextHop, reach_via(9)}), kNlri));
  ev = s.take_events();
  r = find(ev, Kind::kRoutes);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->withdrawn, (std::vector<BgpPrefix>{kHost, kSlash16}));
  EXPECT_TRUE(r->announced.empty());
  EXPECT_FALSE(r->mp_reach);
  EXPECT_EQ(s.state(), BgpState::kEstablished);
}

TEST(BgpSession, BadHeaderResetsTheSession) {
  BgpSession s = open_sent();
  Bytes k = encode_bgp_keepalive();
  k[0] = 0;
  feed(s, k);
  EXPECT_EQ(s.take_output(), notification_bytes(1, 1));
  EXPECT_EQ(s.state(), BgpState::kIdle);
}

// RFC 4271 §6.4: an error found in a received NOTIFICATION is not reported with a NOTIFICATION; the session
// closes (it answered a NOTIFICATION of a bad length with Message Header Error / Bad Message Length).
TEST(BgpSession, AMalformedNotificationIsNotAnsweredWithOne) {
  for (const uint16_t len : {uint16_t{19}, uint16_t{20}}) {
    BgpSession s = open_sent();
    Bytes n = notification_bytes(6, 2);
    n.resize(len);
    n[16] = 0;
    n[17] = static_cast<uint8_t>(len);
    feed(s, n);
    EXPECT_TRUE(s.take_output().empty()) << "length " << len;
    EXPECT_EQ(s.state(), BgpState::kIdle);
  }
}

TEST(BgpSession, StopSendsCeaseAndStaysIdle) {
  BgpSession a(config(kAsA, kAsB, ip(10, 0, 0, 1)));
  BgpSession b(config(kAsB, kAsA, ip(10, 0, 0, 2), true));
  Wire w{a, b, {}, {}, {}, {}};
  w.establish(0);
  a.stop(kSecondNs);
  EXPECT_EQ(a.take_output(), notification_bytes(6, 2));  // Cease / Administrative Shutdown
  EXPECT_EQ(a.state(), BgpState::kIdle);
  EXPECT_EQ(a.next_timer(), kForever);  // no AutomaticStart after a ManualStop
  EXPECT_EQ(a.connect_retry_count(), 0u);
}

TEST(BgpSession, ConnectRetryAndFailedConnections) {
  BgpSession a(config(kAsA, kAsB, ip(10, 0, 0, 1)));
  a.start(0);
  a.take_events();
  EXPECT_EQ(a.next_timer(), 120 * kSecondNs);
  a.tick(120 * kSecondNs);  // nobody answered: try again
  auto ev = a.take_events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].kind, Kind::kDisconnect);
  EXPECT_EQ(ev[1].kind, Kind::kConnect);
  a.connect_failed(121 * kSecondNs);  // refused: listening (Active) until ConnectRetry connects again
  EXPECT_EQ(a.state(), BgpState::kActive);
  EXPECT_EQ(a.take_events().back().kind, Kind::kDisconnect);
  EXPECT_EQ(a.next_timer(), 241 * kSecondNs);
  a.connected(122 * kSecondNs);  // meanwhile the peer's connection arrives: taken
  EXPECT_EQ(a.state(), BgpState::kOpenSent);
  a.closed(123 * kSecondNs);
  a.tick(243 * kSecondNs);
  EXPECT_EQ(a.state(), BgpState::kConnect);
  // A connection lost in OpenSent goes back to Active and tries again after ConnectRetry.
  a.connected(244 * kSecondNs);
  a.closed(245 * kSecondNs);
  EXPECT_EQ(a.state(), BgpState::kActive);
  a.tick(365 * kSecondNs);
  EXPECT_EQ(a.state(), BgpState::kConnect);
}

TEST(BgpCollision, TheHigherIdentifiersConnectionSurvives) {
  using S = BgpState;
  // Local identifier lower: keep the connection the peer opened; higher: keep ours.
  EXPECT_EQ(bgp_collision_winner(S::kOpenConfirm, S::kOpenConfirm, 1, 2, 10, 20), BgpCollision::kKeepIncoming);
  EXPECT_EQ(bgp_collision_winner(S::kOpenConfirm, S::kOpenSent, 2, 1, 10, 20), BgpCollision::kKeepOutgoing);
  // An Established connection is kept whatever the identifiers.
  EXPECT_EQ(bgp_collision_winner(S::kEstablished, S::kOpenConfirm, 1, 2, 10, 20), BgpCollision::kKeepOutgoing);
  EXPECT_EQ(bgp_collision_winner(S::kOpenConfirm, S::kEstablished, 2, 1, 10, 20), BgpCollision::kKeepIncoming);
  // Equal identifiers (allowed between ASes, RFC 6286): the higher AS's connection.
  EXPECT_EQ(bgp_collision_winner(S::kOpenConfirm, S::kOpenConfirm, 5, 5, 30, 20), BgpCollision::kKeepOutgoing);
  EXPECT_EQ(bgp_collision_winner(S::kOpenConfirm, S::kOpenConfirm, 5, 5, 10, 20), BgpCollision::kKeepIncoming);
  // No OPEN on one of them yet: no collision.
  EXPECT_EQ(bgp_collision_winner(S::kConnect, S::kOpenConfirm, 1, 2, 10, 20), BgpCollision::kNone);
  EXPECT_EQ(bgp_collision_winner(S::kOpenSent, S::kActive, 1, 2, 10, 20), BgpCollision::kNone);
}

TEST(BgpCollision, BothSpeakersKeepTheSameConnection) {
  // A (identifier 10.0.0.1) and B (10.0.0.2) connect to each other at once: connection 1 is A's (a_out <-> b_in),
  // connection 2 is B's (b_out <-> a_in). Both resolve the collision alone and must agree: B's identifier is
  // higher, so connection 2 survives on both sides.
  for (bool a_higher : {false, true}) {
    SCOPED_TRACE(a_higher);
    const uint32_t id_a = a_higher ? ip(10, 0, 0, 9) : ip(10, 0, 0, 1);
    const uint32_t id_b = ip(10, 0, 0, 2);
    BgpSession a_out(config(kAsA, kAsB, id_a)), a_in(config(kAsA, kAsB, id_a, true));
    BgpSession b_out(config(kAsB, kAsA, id_b)), b_in(config(kAsB, kAsA, id_b, true));
    for (BgpSession* s : {&a_out, &a_in, &b_out, &b_in}) {
      s->start(0);
      s->connected(0);
    }
    Wire one{a_out, b_in, {}, {}, {}, {}};
    Wire two{b_out, a_in, {}, {}, {}, {}};
    // Deliver the OPENs only: every session reaches OpenConfirm with a KEEPALIVE queued.
    for (Wire* w : {&one, &two}) {
      const Bytes x = w->a.take_output(), y = w->b.take_output();
      feed(w->b, x);
      feed(w->a, y);
    }
    for (BgpSession* s : {&a_out, &a_in, &b_out, &b_in}) ASSERT_EQ(s->state(), BgpState::kOpenConfirm);
    const BgpCollision at_a = bgp_collision_winner(a_out.state(), a_in.state(), id_a, id_b, kAsA, kAsB);
    const BgpCollision at_b = bgp_collision_winner(b_out.state(), b_in.state(), id_b, id_a, kAsB, kAsA);
    // The survivor is the connection opened by the higher identifier, seen from both ends.
    EXPECT_EQ(at_a, a_higher ? BgpCollision::kKeepOutgoing : BgpCollision::kKeepIncoming);
    EXPECT_EQ(at_b, a_higher ? BgpCollision::kKeepIncoming : BgpCollision::kKeepOutgoing);
    BgpSession& a_loser = at_a == BgpCollision::kKeepOutgoing ? a_in : a_out;
    BgpSession& b_loser = at_b == BgpCollision::kKeepOutgoing ? b_in : b_out;
    a_loser.take_output();  // its queued KEEPALIVE is never sent
    b_loser.take_output();
    a_loser.close_for_collision(0);
    b_loser.close_for_collision(0);
    EXPECT_EQ(a_loser.take_output(), notification_bytes(6, 7));  // Cease / Connection Collision Resolution
    EXPECT_EQ(b_loser.take_output(), notification_bytes(6, 7));
    Wire& kept = a_higher ? one : two;
    kept.pump(0);
    EXPECT_EQ(kept.a.state(), BgpState::kEstablished);
    EXPECT_EQ(kept.b.state(), BgpState::kEstablished);
    EXPECT_EQ(a_loser.state(), BgpState::kIdle);
    EXPECT_EQ(a_loser.next_timer(), kForever);  // a collision's loser does not restart
  }
}
