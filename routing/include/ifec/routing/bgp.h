// BGP-4 messages (RFC 4271 §4) as bytes and back: the codec under FARE's BGP speakers. No sockets, no state: a
// session (bgp_session.h) frames its TCP stream with bgp_frame_length() and decodes each message with decode_bgp().
//
// Wire layouts (every field big-endian):
//   header        marker (16 x 0xff) | length u16 (19..4096, header included) | type u8 (1..5)
//   OPEN          version u8 (4) | my AS u16 (AS_TRANS 23456 when the AS needs 4 octets) | hold time u16 (s) |
//                 BGP identifier u32 | opt params length u8 | params { type u8 (2 = capabilities) | length u8 |
//                 capabilities { code u8 | length u8 | value } }        (RFC 9072's extended form is decoded too)
//   UPDATE        withdrawn length u16 | withdrawn prefixes | path attributes length u16 |
//                 attributes { flags u8 (O T P E) | type u8 | length u8 or u16 (E) | value } | NLRI prefixes
//                 prefix = length in bits u8 (0..32) | ceil(bits / 8) address octets
//   MP_REACH_NLRI   AFI u16 | SAFI u8 | next hop length u8 | next hop | reserved u8 | NLRI prefixes   (RFC 4760 §3)
//   MP_UNREACH_NLRI AFI u16 | SAFI u8 | withdrawn prefixes                                          (RFC 4760 §4)
//   KEEPALIVE     header only (19 bytes)
//   NOTIFICATION  code u8 | subcode u8 | data
//   ROUTE-REFRESH AFI u16 | reserved u8 | SAFI u8                       (RFC 2918; 23 bytes)
//
// Extended communities (RFC 4360): type u8 | sub-type u8 | 6 value bytes. The link-bandwidth community
// (draft-ietf-idr-link-bandwidth, now RFC 10005) is type 0x00 (transitive two-octet-AS-specific) or 0x40
// (non-transitive), sub-type 0x04, global administrator = a 2-octet AS (AS_TRANS for a 4-octet one), value = the
// bandwidth as an IEEE-754 single-precision float in BYTES per second. FRR 8.4 (bgpd/bgp_ecommunity.h
// encode_lb_extcomm, ecommunity_linkbw_present) sends 0x00 by default (0x40 with "non-transitive"), accepts both,
// and reads the float as bytes/s, but converts it to a uint32: values above 4,294,967,295 B/s (about 34.36 Gb/s)
// overflow in FRR 8.4 (fixed on FRR's master in 2026, commit e0915132, "handling above ~34 Gbps"). FARE's path
// bandwidth travels in the same community (BgpBandwidthUnits; routing/README.md has the sources and the scaling).
//
// Errors (RFC 7606): decoding never throws and never reads past `len`; each malformation becomes a BgpError with
// the action RFC 7606 prescribes (attribute discard, treat-as-withdraw or session reset) and the NOTIFICATION
// code, subcode and data RFC 4271 §6 names for it (sent only when the action is a session reset).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ifec::routing {

inline constexpr size_t kBgpMarkerSize = 16;
inline constexpr size_t kBgpHeaderSize = 19;
inline constexpr size_t kBgpMaxMessage = 4096;  // RFC 4271; no Extended Message capability (RFC 8654) is offered
inline constexpr size_t kBgpOpenMinSize = 29;
inline constexpr size_t kBgpUpdateMinSize = 23;
inline constexpr size_t kBgpNotificationMinSize = 21;
inline constexpr size_t kBgpRouteRefreshSize = 23;
inline constexpr uint8_t kBgpVersion = 4;
inline constexpr uint16_t kAsTrans = 23456;  // RFC 6793: stands in for a 4-octet AS in 2-octet fields
inline constexpr uint16_t kAfiIpv4 = 1;
inline constexpr uint8_t kSafiUnicast = 1;

enum class BgpMessageType : uint8_t { kOpen = 1, kUpdate = 2, kNotification = 3, kKeepalive = 4, kRouteRefresh = 5 };
const char* bgp_message_type_name(uint8_t type);

// Capability codes (RFC 5492 registry).
inline constexpr uint8_t kCapMultiprotocol = 1;  // RFC 4760: AFI u16 | reserved u8 | SAFI u8
inline constexpr uint8_t kCapRouteRefresh = 2;   // RFC 2918: empty
inline constexpr uint8_t kCapAs4 = 65;           // RFC 6793: the 4-octet AS u32
inline constexpr uint8_t kOptParamCapabilities = 2;

// Path attribute flags and type codes.
inline constexpr uint8_t kAttrOptional = 0x80;
inline constexpr uint8_t kAttrTransitive = 0x40;
inline constexpr uint8_t kAttrPartial = 0x20;
inline constexpr uint8_t kAttrExtendedLength = 0x10;
enum BgpAttrType : uint8_t {
  kAttrOrigin = 1,
  kAttrAsPath = 2,
  kAttrNextHop = 3,
  kAttrMed = 4,
  kAttrLocalPref = 5,
  kAttrAtomicAggregate = 6,
  kAttrAggregator = 7,
  // RFC 4760. AFI 1 / SAFI 1 (IPv4 unicast) is decoded: MP_UNREACH_NLRI's prefixes join BgpUpdate's withdrawn,
  // MP_REACH_NLRI's routes keep its 4-byte next hop (BgpUpdate says where). Other families are skipped
  // (BgpMessage::skipped_families). Never more than once (RFC 7606 §3 g). This project's speakers send IPv4 unicast
  // in the classic fields, as FRR does; MP_REACH_NLRI is encoded only for BgpUpdate::mp_reach.
  kAttrMpReach = 14,
  kAttrMpUnreach = 15,
  kAttrExtCommunities = 16,
  kAttrAs4Path = 17,
  kAttrAs4Aggregator = 18,
};
inline constexpr uint8_t kAsSet = 1;
inline constexpr uint8_t kAsSequence = 2;

// NOTIFICATION codes and the subcodes this code sends (RFC 4271 §4.5, RFC 4486 Cease, RFC 6608 FSM).
enum BgpErrorCode : uint8_t {
  kErrHeader = 1,
  kErrOpen = 2,
  kErrUpdate = 3,
  kErrHoldTimerExpired = 4,
  kErrFsm = 5,
  kErrCease = 6,
};
enum BgpHeaderSubcode : uint8_t { kHdrNotSynchronized = 1, kHdrBadLength = 2, kHdrBadType = 3 };
enum BgpOpenSubcode : uint8_t {
  kOpenUnspecific = 0,
  kOpenBadVersion = 1,
  kOpenBadPeerAs = 2,
  kOpenBadBgpId = 3,
  kOpenUnsupportedParam = 4,
  kOpenBadHoldTime = 6,
};
enum BgpUpdateSubcode : uint8_t {
  kUpdMalformedAttrList = 1,
  kUpdUnrecognizedWellKnown = 2,
  kUpdMissingWellKnown = 3,
  kUpdAttrFlags = 4,
  kUpdAttrLength = 5,
  kUpdInvalidOrigin = 6,
  kUpdInvalidNextHop = 8,
  kUpdOptionalAttr = 9,
  kUpdInvalidNetwork = 10,
  kUpdMalformedAsPath = 11,
};
enum BgpFsmSubcode : uint8_t { kFsmInOpenSent = 1, kFsmInOpenConfirm = 2, kFsmInEstablished = 3 };
enum BgpCeaseSubcode : uint8_t { kCeaseAdminShutdown = 2, kCeaseCollision = 7 };

struct BgpNotification {
  uint8_t code = 0;
  uint8_t subcode = 0;
  std::vector<uint8_t> data;
  bool operator==(const BgpNotification& o) const { return code == o.code && subcode == o.subcode && data == o.data; }
};
// "UPDATE Message Error / Malformed AS_PATH (3/11)"
std::string bgp_notification_name(uint8_t code, uint8_t subcode);

struct BgpCapability {
  uint8_t code = 0;
  std::vector<uint8_t> value;
  bool operator==(const BgpCapability& o) const { return code == o.code && value == o.value; }
};

struct BgpOpen {
  uint8_t version = kBgpVersion;
  uint16_t my_as = 0;  // the 2-octet field as on the wire (AS_TRANS for a 4-octet AS)
  uint16_t hold_time = 0;
  uint32_t bgp_id = 0;
  std::vector<std::pair<uint16_t, uint8_t>> multiprotocol;  // (AFI, SAFI) of each Multiprotocol capability
  std::optional<uint32_t> as4;                              // the 4-octet AS capability
  bool route_refresh = false;
  std::vector<BgpCapability> unknown;  // capabilities this code does not use, kept in the order received

  // The speaker's AS: the 4-octet capability when present, else the 2-octet field.
  uint32_t as() const { return as4 ? *as4 : my_as; }
  // RFC 4760: a speaker that sends no Multiprotocol capability supports IPv4 unicast only.
  bool supports_ipv4_unicast() const;
  bool operator==(const BgpOpen& o) const;
};
// The OPEN this project's speakers send: Multiprotocol IPv4 unicast, Route Refresh and 4-octet AS.
BgpOpen make_bgp_open(uint32_t as, uint16_t hold_time, uint32_t bgp_id);

// An IPv4 prefix; `addr` in host order with the bits past `len` zero.
struct BgpPrefix {
  uint32_t addr = 0;
  uint8_t len = 0;
  bool operator==(const BgpPrefix& o) const { return addr == o.addr && len == o.len; }
  bool operator<(const BgpPrefix& o) const { return addr != o.addr ? addr < o.addr : len < o.len; }
};
// Throws common::Error for a length over 32; clears the host bits.
BgpPrefix bgp_prefix(uint32_t addr, int len);
std::string bgp_prefix_str(const BgpPrefix& p);  // "10.0.0.1/32"

enum class BgpOrigin : uint8_t { kIgp = 0, kEgp = 1, kIncomplete = 2 };

struct BgpAsPathSegment {
  uint8_t type = kAsSequence;  // kAsSet or kAsSequence
  std::vector<uint32_t> asns;
  bool operator==(const BgpAsPathSegment& o) const { return type == o.type && asns == o.asns; }
};

struct BgpAggregator {
  uint32_t as = 0;
  uint32_t addr = 0;
  bool operator==(const BgpAggregator& o) const { return as == o.as && addr == o.addr; }
};

struct BgpExtCommunity {
  std::array<uint8_t, 8> bytes{};
  uint8_t type() const { return bytes[0]; }
  uint8_t subtype() const { return bytes[1]; }
  bool operator==(const BgpExtCommunity& o) const { return bytes == o.bytes; }
};

// An optional transitive attribute this code does not interpret, kept as received. Encoding sets its Partial bit:
// RFC 4271 §5 asks that of a speaker passing on an attribute it did not recognise.
struct BgpRawAttribute {
  uint8_t flags = 0;  // Optional, Transitive and Partial bits (the encoder picks the length form)
  uint8_t type = 0;
  std::vector<uint8_t> value;
  bool operator==(const BgpRawAttribute& o) const { return flags == o.flags && type == o.type && value == o.value; }
};

struct BgpPathAttributes {
  std::optional<BgpOrigin> origin;
  std::optional<std::vector<BgpAsPathSegment>> as_path;  // 4-octet ASes (AS4_PATH already merged in on decode)
  std::optional<uint32_t> next_hop;                      // host order
  std::optional<uint32_t> med;
  std::optional<uint32_t> local_pref;
  bool atomic_aggregate = false;
  std::optional<BgpAggregator> aggregator;
  std::vector<BgpExtCommunity> ext_communities;
  std::vector<BgpRawAttribute> unknown;
  bool operator==(const BgpPathAttributes& o) const;
};

// IPv4 unicast routes of an MP_REACH_NLRI with the next hop it gives them (RFC 4760 §3), not NEXT_HOP's.
struct BgpMpReach {
  uint32_t next_hop = 0;  // host order
  std::vector<BgpPrefix> nlri;
  bool operator==(const BgpMpReach& o) const { return next_hop == o.next_hop && nlri == o.nlri; }
};

// RFC 4760 §3: NEXT_HOP is the classic NLRI's next hop and MP_REACH_NLRI's next hop its own routes'. `nlri` holds
// the routes whose next hop is attrs.next_hop; `mp_reach` those whose next hop is another. Decoding puts
// MP_REACH_NLRI's routes in `nlri` with their next hop as attrs.next_hop when there is no classic NLRI (a NEXT_HOP
// beside them is then ignored) or when both next hops are one, and keeps them in `mp_reach` only beside classic
// NLRI with a different NEXT_HOP; an UPDATE then announces two sets of routes, each with its own next hop.
struct BgpUpdate {
  std::vector<BgpPrefix> withdrawn;  // the classic field's, then an IPv4 unicast MP_UNREACH_NLRI's
  BgpPathAttributes attrs;
  std::vector<BgpPrefix> nlri;  // next hop attrs.next_hop: the classic NLRI field, MP_REACH_NLRI's as above
  std::optional<BgpMpReach> mp_reach;
  bool operator==(const BgpUpdate& o) const {
    return withdrawn == o.withdrawn && attrs == o.attrs && nlri == o.nlri && mp_reach == o.mp_reach;
  }
};

struct BgpRouteRefresh {
  uint16_t afi = kAfiIpv4;
  uint8_t reserved = 0;  // RFC 7313's message subtype; 0 for a plain refresh request
  uint8_t safi = kSafiUnicast;
  bool operator==(const BgpRouteRefresh& o) const { return afi == o.afi && reserved == o.reserved && safi == o.safi; }
};

// ---- Errors (RFC 7606 §2: the approaches, weakest first) ----
enum class BgpErrorAction : uint8_t { kNone = 0, kAttributeDiscard = 1, kTreatAsWithdraw = 2, kSessionReset = 3 };
const char* bgp_error_action_name(BgpErrorAction a);

struct BgpError {
  BgpErrorAction action = BgpErrorAction::kNone;
  BgpNotification notification;  // what RFC 4271 §6 names for it; sent only when action is kSessionReset
  size_t offset = 0;             // byte in the message where it was found
  std::string what;              // names the bad value and what was expected
};

// A decoded message: `type` says which member is meaningful. `errors` lists every malformation found; the most
// severe action applies (RFC 7606 §3 b), and the first error of that action is the one a NOTIFICATION reports.
struct BgpMessage {
  uint8_t type = 0;
  BgpOpen open;
  BgpUpdate update;
  BgpNotification notification;
  BgpRouteRefresh route_refresh;
  std::vector<BgpError> errors;
  // UPDATE: (AFI, SAFI) of each MP_REACH_NLRI / MP_UNREACH_NLRI skipped unread for naming a family other than IPv4
  // unicast, the only one make_bgp_open offers: a family never negotiated, not a malformation to reset over.
  std::vector<std::pair<uint16_t, uint8_t>> skipped_families;
  // UPDATE: the IPv4 unicast End-of-RIB marker (RFC 4724 §2): an empty UPDATE, or one whose only content is an
  // MP_UNREACH_NLRI for AFI 1 / SAFI 1 withdrawing nothing (the form speakers that use MP for IPv4 send).
  bool end_of_rib = false;

  BgpErrorAction action() const;
  const BgpError* worst() const;  // null when no error
  bool ok() const { return errors.empty(); }
};

struct BgpDecodeOptions {
  bool as4 = true;       // 4-octet AS capability negotiated: AS_PATH carries 4-octet ASes, AS4_PATH is discarded
  bool ebgp = true;      // external peer: LOCAL_PREF is ignored, the leftmost AS is checked
  uint32_t peer_as = 0;  // for the leftmost-AS check (RFC 4271 §6.3); 0 skips it
};

// Length of the first message in a stream buffer: 0 while the header or the message is incomplete. A bad header
// (marker, length, type) returns 0 and fills *err with a session reset (Message Header Error).
size_t bgp_frame_length(const uint8_t* buf, size_t len, BgpError* err);
// Decodes one whole message (header included, `len` exactly its length).
BgpMessage decode_bgp(const uint8_t* msg, size_t len, const BgpDecodeOptions& opt = {});

// ---- Encoding: whole messages, header included. Throw common::Error for what cannot be encoded (a message over
// 4096 bytes, a capability or parameter over 255 bytes, an AS_PATH segment type other than SET/SEQUENCE). ----
std::vector<uint8_t> encode_bgp_open(const BgpOpen& m);
// `as4`: the peer has the 4-octet AS capability. Without it AS_PATH carries 2-octet ASes (AS_TRANS for the others)
// and AS4_PATH the full path, AGGREGATOR / AS4_AGGREGATOR likewise (RFC 6793 §4.2.2). `mp_reach`, when present,
// is sent as an IPv4 unicast MP_REACH_NLRI, the first attribute (RFC 7606 §5.1).
std::vector<uint8_t> encode_bgp_update(const BgpUpdate& m, bool as4);
// The same update split over as many messages as it needs (withdrawals first, then the NLRI in chunks that each
// carry the attributes, then mp_reach's routes in chunks of MP_REACH_NLRI with the attributes less NEXT_HOP, RFC
// 4760 §3); an empty update is one empty UPDATE (the End-of-RIB marker).
std::vector<std::vector<uint8_t>> encode_bgp_updates(const BgpUpdate& m, bool as4);
std::vector<uint8_t> encode_bgp_keepalive();
std::vector<uint8_t> encode_bgp_notification(const BgpNotification& m);
std::vector<uint8_t> encode_bgp_route_refresh(const BgpRouteRefresh& m);

// ---- AS_PATH helpers ----
// RFC 4271 §9.1.2.2: a SEQUENCE counts its ASes, a SET counts one.
size_t bgp_as_path_length(const std::vector<BgpAsPathSegment>& path);
bool bgp_as_path_contains(const std::vector<BgpAsPathSegment>& path, uint32_t as);
// RFC 6793 §4.2.3: a 2-octet AS_PATH and an AS4_PATH from a peer without the 4-octet capability as one path.
std::vector<BgpAsPathSegment> bgp_merge_as4_path(const std::vector<BgpAsPathSegment>& as_path,
                                                 const std::vector<BgpAsPathSegment>& as4_path);

// ---- Link bandwidth and FARE path bandwidth ----
inline constexpr uint8_t kExtTypeTwoOctetAs = 0x00;               // transitive
inline constexpr uint8_t kExtTypeTwoOctetAsNonTransitive = 0x40;  // the RFC 4360 non-transitive bit
inline constexpr uint8_t kExtSubtypeLinkBandwidth = 0x04;
// FRR 8.4 keeps the decoded bandwidth in a uint32 of bytes/s: values above this overflow there.
inline constexpr double kFrr84MaxLinkBandwidth = 4294967295.0;

struct BgpLinkBandwidth {
  uint16_t as = 0;             // global administrator
  float bytes_per_second = 0;  // IEEE-754 single on the wire
  bool transitive = true;      // type 0x00 (FRR's default) or 0x40
};
BgpExtCommunity encode_link_bandwidth(const BgpLinkBandwidth& lb);
// Whether `c` is a link-bandwidth community (either transitivity); fills *lb.
bool decode_link_bandwidth(const BgpExtCommunity& c, BgpLinkBandwidth* lb);
// The bandwidth an UPDATE's attributes carry in bytes/s: the lowest of its link-bandwidth communities (RFC 10005
// §4: the lowest, whatever the transitivity), negative or NaN read as 0; nullopt when there is none.
std::optional<double> bgp_link_bandwidth(const BgpPathAttributes& attrs);

// FARE's path bandwidth (fare.h's Gb/s: the minimum along the path, summed over ECMP next hops) rides in the
// link-bandwidth community. `bytes_per_gbps` is what 1 Gb/s is written as: 125,000,000 (true bytes per second, as
// the link-bandwidth spec and FRR's display read it) by default. Weights depend only on ratios, so a fabric whose
// path bandwidths exceed what a peer can hold (FRR 8.4: 34.36 Gb/s) may scale every speaker alike (125,000 puts 1
// Gb/s where 1 Mb/s would be and reaches 34 Tb/s in FRR 8.4); both ends must use the same value.
// `subtype` is the link-bandwidth sub-type; it is a field so that a FARE-specific code point, should the draft's
// final text assign one, is a configuration change rather than a new codec.
struct BgpBandwidthUnits {
  double bytes_per_gbps = 125e6;
  bool transitive = true;
  uint8_t subtype = kExtSubtypeLinkBandwidth;
};
// Throws common::Error for a negative, NaN or infinite bandwidth or one past a float's range: a destination
// advertises its own attachment bandwidth rather than +inf (fare_decide takes min(bundle, advert) either way).
BgpExtCommunity encode_path_bandwidth(uint32_t local_as, double gbps, const BgpBandwidthUnits& units = {});
// Gb/s from an UPDATE's attributes (bgp_link_bandwidth / bytes_per_gbps), nullopt when none is carried.
std::optional<double> bgp_path_bandwidth_gbps(const BgpPathAttributes& attrs, const BgpBandwidthUnits& units = {});

}  // namespace ifec::routing
