// BGP-4 message codec: encoders, the header and message decoders, RFC 7606 error classification.
#include "ifec/routing/bgp.h"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <sstream>

#include "ifec/common/byte_order.h"
#include "ifec/common/checks.h"
#include "ifec/common/ipv4.h"

namespace ifec::routing {

using common::load_be16;
using common::load_be32;

namespace {

void put8(std::vector<uint8_t>& o, uint8_t v) { o.push_back(v); }
void put16(std::vector<uint8_t>& o, uint16_t v) {
  o.push_back(static_cast<uint8_t>(v >> 8));
  o.push_back(static_cast<uint8_t>(v));
}
void put32(std::vector<uint8_t>& o, uint32_t v) {
  put16(o, static_cast<uint16_t>(v >> 16));
  put16(o, static_cast<uint16_t>(v));
}
void put_bytes(std::vector<uint8_t>& o, const std::vector<uint8_t>& v) { o.insert(o.end(), v.begin(), v.end()); }

std::vector<uint8_t> be16_bytes(uint16_t v) { return {static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v)}; }
std::vector<uint8_t> be32_bytes(uint32_t v) {
  return {static_cast<uint8_t>(v >> 24), static_cast<uint8_t>(v >> 16), static_cast<uint8_t>(v >> 8),
          static_cast<uint8_t>(v)};
}

// Header + body as one message; throws past 4096 bytes.
std::vector<uint8_t> finish(BgpMessageType type, const std::vector<uint8_t>& body) {
  const size_t len = kBgpHeaderSize + body.size();
  IFEC_CHECK(len <= kBgpMaxMessage, "BGP " << bgp_message_type_name(static_cast<uint8_t>(type)) << " of " << len
                                           << " bytes exceeds the " << kBgpMaxMessage << "-byte maximum");
  std::vector<uint8_t> out(kBgpMarkerSize, 0xff);
  out.reserve(len);
  put16(out, static_cast<uint16_t>(len));
  put8(out, static_cast<uint8_t>(type));
  put_bytes(out, body);
  return out;
}

BgpError make_error(BgpErrorAction a, uint8_t code, uint8_t subcode, std::vector<uint8_t> data, size_t offset,
                    std::string what) {
  BgpError e;
  e.action = a;
  e.notification = BgpNotification{code, subcode, std::move(data)};
  e.offset = offset;
  e.what = std::move(what);
  return e;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Names
// ---------------------------------------------------------------------------------------------------------------

const char* bgp_message_type_name(uint8_t type) {
  switch (type) {
    case 1:
      return "OPEN";
    case 2:
      return "UPDATE";
    case 3:
      return "NOTIFICATION";
    case 4:
      return "KEEPALIVE";
    case 5:
      return "ROUTE-REFRESH";
    default:
      return "unknown";
  }
}

std::string bgp_notification_name(uint8_t code, uint8_t subcode) {
  static const char* const kCodes[] = {"",
                                       "Message Header Error",
                                       "OPEN Message Error",
                                       "UPDATE Message Error",
                                       "Hold Timer Expired",
                                       "Finite State Machine Error",
                                       "Cease",
                                       "ROUTE-REFRESH Message Error"};
  static const char* const kHeader[] = {"", "Connection Not Synchronized", "Bad Message Length", "Bad Message Type"};
  static const char* const kOpen[] = {"Unspecific",
                                      "Unsupported Version Number",
                                      "Bad Peer AS",
                                      "Bad BGP Identifier",
                                      "Unsupported Optional Parameter",
                                      "(deprecated)",
                                      "Unacceptable Hold Time",
                                      "Unsupported Capability"};
  static const char* const kUpdate[] = {"",
                                        "Malformed Attribute List",
                                        "Unrecognized Well-known Attribute",
                                        "Missing Well-known Attribute",
                                        "Attribute Flags Error",
                                        "Attribute Length Error",
                                        "Invalid ORIGIN Attribute",
                                        "(deprecated)",
                                        "Invalid NEXT_HOP Attribute",
                                        "Optional Attribute Error",
                                        "Invalid Network Field",
                                        "Malformed AS_PATH"};
  static const char* const kFsm[] = {"Unspecified", "Unexpected Message in OpenSent",
                                     "Unexpected Message in OpenConfirm", "Unexpected Message in Established"};
  static const char* const kCease[] = {"",
                                       "Maximum Number of Prefixes Reached",
                                       "Administrative Shutdown",
                                       "Peer De-configured",
                                       "Administrative Reset",
                                       "Connection Rejected",
                                       "Other Configuration Change",
                                       "Connection Collision Resolution",
                                       "Out of Resources",
                                       "Hard Reset"};
  std::ostringstream os;
  os << (code < 8 && code > 0 ? kCodes[code] : "unknown code");
  const char* sub = nullptr;
  if (code == kErrHeader && subcode >= 1 && subcode <= 3) sub = kHeader[subcode];
  if (code == kErrOpen && subcode <= 7) sub = kOpen[subcode];
  if (code == kErrUpdate && subcode >= 1 && subcode <= 11) sub = kUpdate[subcode];
  if (code == kErrFsm && subcode <= 3) sub = kFsm[subcode];
  if (code == kErrCease && subcode >= 1 && subcode <= 9) sub = kCease[subcode];
  if (sub != nullptr) os << " / " << sub;
  os << " (" << int(code) << '/' << int(subcode) << ')';
  return os.str();
}

const char* bgp_error_action_name(BgpErrorAction a) {
  switch (a) {
    case BgpErrorAction::kNone:
      return "none";
    case BgpErrorAction::kAttributeDiscard:
      return "attribute-discard";
    case BgpErrorAction::kTreatAsWithdraw:
      return "treat-as-withdraw";
    case BgpErrorAction::kSessionReset:
      return "session-reset";
  }
  return "?";
}

BgpErrorAction BgpMessage::action() const {
  BgpErrorAction a = BgpErrorAction::kNone;
  for (const BgpError& e : errors) a = std::max(a, e.action);
  return a;
}

const BgpError* BgpMessage::worst() const {
  const BgpError* w = nullptr;
  for (const BgpError& e : errors) {
    if (w == nullptr || e.action > w->action) w = &e;
  }
  return w;
}

// ---------------------------------------------------------------------------------------------------------------
// Value types
// ---------------------------------------------------------------------------------------------------------------

bool BgpOpen::supports_ipv4_unicast() const {
  if (multiprotocol.empty()) return true;
  return std::find(multiprotocol.begin(), multiprotocol.end(), std::make_pair(kAfiIpv4, kSafiUnicast)) !=
         multiprotocol.end();
}

bool BgpOpen::operator==(const BgpOpen& o) const {
  return version == o.version && my_as == o.my_as && hold_time == o.hold_time && bgp_id == o.bgp_id &&
         multiprotocol == o.multiprotocol && as4 == o.as4 && route_refresh == o.route_refresh && unknown == o.unknown;
}

BgpOpen make_bgp_open(uint32_t as, uint16_t hold_time, uint32_t bgp_id) {
  BgpOpen m;
  m.my_as = as > 0xffff ? kAsTrans : static_cast<uint16_t>(as);
  m.hold_time = hold_time;
  m.bgp_id = bgp_id;
  m.multiprotocol = {{kAfiIpv4, kSafiUnicast}};
  m.as4 = as;
  m.route_refresh = true;
  return m;
}

BgpPrefix bgp_prefix(uint32_t addr, int len) {
  IFEC_CHECK(len >= 0 && len <= 32, "IPv4 prefix length " << len << " (expected 0..32)");
  const uint32_t mask = len == 0 ? 0 : ~uint32_t{0} << (32 - len);
  return BgpPrefix{addr & mask, static_cast<uint8_t>(len)};
}

std::string bgp_prefix_str(const BgpPrefix& p) { return common::ipv4_to_string(p.addr) + "/" + std::to_string(p.len); }

bool BgpPathAttributes::operator==(const BgpPathAttributes& o) const {
  return origin == o.origin && as_path == o.as_path && next_hop == o.next_hop && med == o.med &&
         local_pref == o.local_pref && atomic_aggregate == o.atomic_aggregate && aggregator == o.aggregator &&
         ext_communities == o.ext_communities && unknown == o.unknown;
}

// ---------------------------------------------------------------------------------------------------------------
// AS_PATH helpers
// ---------------------------------------------------------------------------------------------------------------

size_t bgp_as_path_length(const std::vector<BgpAsPathSegment>& path) {
  size_t n = 0;
  for (const BgpAsPathSegment& s : path) n += s.type == kAsSet ? 1 : s.asns.size();
  return n;
}

bool bgp_as_path_contains(const std::vector<BgpAsPathSegment>& path, uint32_t as) {
  for (const BgpAsPathSegment& s : path) {
    if (std::find(s.asns.begin(), s.asns.end(), as) != s.asns.end()) return true;
  }
  return false;
}

std::vector<BgpAsPathSegment> bgp_merge_as4_path(const std::vector<BgpAsPathSegment>& as_path,
                                                 const std::vector<BgpAsPathSegment>& as4_path) {
  const size_t n2 = bgp_as_path_length(as_path);
  const size_t n4 = bgp_as_path_length(as4_path);
  if (n2 < n4) return as_path;  // RFC 6793 §4.2.3: AS4_PATH longer than AS_PATH is ignored
  size_t keep = n2 - n4;        // the leading ASes only AS_PATH knows (added by 2-octet-only speakers)
  std::vector<BgpAsPathSegment> out;
  for (const BgpAsPathSegment& s : as_path) {
    if (keep == 0) break;
    if (s.type == kAsSet) {
      out.push_back(s);
      --keep;
      continue;
    }
    const size_t take = std::min(keep, s.asns.size());
    out.push_back(BgpAsPathSegment{kAsSequence, {s.asns.begin(), s.asns.begin() + static_cast<long>(take)}});
    keep -= take;
  }
  out.insert(out.end(), as4_path.begin(), as4_path.end());
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------------------------------------------

namespace {

void put_capability(std::vector<uint8_t>& params, uint8_t code, const std::vector<uint8_t>& value) {
  IFEC_CHECK(value.size() <= 253,
             "BGP capability " << int(code) << " of " << value.size() << " bytes does not fit one optional parameter");
  put8(params, kOptParamCapabilities);  // one parameter per capability, as FRR sends them
  put8(params, static_cast<uint8_t>(2 + value.size()));
  put8(params, code);
  put8(params, static_cast<uint8_t>(value.size()));
  put_bytes(params, value);
}

void put_prefixes(std::vector<uint8_t>& o, const std::vector<BgpPrefix>& ps) {
  for (const BgpPrefix& p : ps) {
    IFEC_CHECK(p.len <= 32, "IPv4 prefix length " << int(p.len) << " (expected 0..32)");
    put8(o, p.len);
    for (int i = 0; i < (p.len + 7) / 8; ++i) put8(o, static_cast<uint8_t>(p.addr >> (24 - 8 * i)));
  }
}

size_t prefix_bytes(const BgpPrefix& p) { return 1 + (p.len + 7) / 8; }

void put_attr(std::vector<uint8_t>& o, uint8_t flags, uint8_t type, const std::vector<uint8_t>& value) {
  IFEC_CHECK(value.size() <= 0xffff, "BGP path attribute " << int(type) << " of " << value.size() << " bytes");
  flags &= static_cast<uint8_t>(~kAttrExtendedLength & 0xf0);  // the low four bits are unused: sent as zero
  if (value.size() > 0xff) flags |= kAttrExtendedLength;
  put8(o, flags);
  put8(o, type);
  if (flags & kAttrExtendedLength) {
    put16(o, static_cast<uint16_t>(value.size()));
  } else {
    put8(o, static_cast<uint8_t>(value.size()));
  }
  put_bytes(o, value);
}

// AS_PATH value with `width`-octet ASes (2: AS_TRANS for those that need 4); segments over 255 ASes are split.
std::vector<uint8_t> as_path_value(const std::vector<BgpAsPathSegment>& path, int width) {
  std::vector<uint8_t> v;
  for (const BgpAsPathSegment& s : path) {
    IFEC_CHECK(s.type == kAsSet || s.type == kAsSequence,
               "AS_PATH segment type " << int(s.type) << " (expected 1 AS_SET or 2 AS_SEQUENCE)");
    for (size_t first = 0; first < s.asns.size(); first += 255) {  // an empty segment is malformed: none sent
      const size_t n = std::min<size_t>(255, s.asns.size() - first);
      put8(v, s.type);
      put8(v, static_cast<uint8_t>(n));
      for (size_t i = first; i < first + n; ++i) {
        const uint32_t as = s.asns[i];
        if (width == 4) {
          put32(v, as);
        } else {
          put16(v, as > 0xffff ? kAsTrans : static_cast<uint16_t>(as));
        }
      }
    }
  }
  return v;
}

bool needs_as4(const std::vector<BgpAsPathSegment>& path) {
  for (const BgpAsPathSegment& s : path) {
    for (uint32_t as : s.asns) {
      if (as > 0xffff) return true;
    }
  }
  return false;
}

std::vector<uint8_t> attributes_value(const BgpPathAttributes& a, bool as4) {
  std::vector<uint8_t> o;
  const uint8_t wk = kAttrTransitive;  // well-known: transitive, not optional
  const uint8_t opt_trans = kAttrOptional | kAttrTransitive;
  if (a.origin) put_attr(o, wk, kAttrOrigin, {static_cast<uint8_t>(*a.origin)});
  if (a.as_path) put_attr(o, wk, kAttrAsPath, as_path_value(*a.as_path, as4 ? 4 : 2));
  if (a.next_hop) put_attr(o, wk, kAttrNextHop, be32_bytes(*a.next_hop));
  if (a.med) put_attr(o, kAttrOptional, kAttrMed, be32_bytes(*a.med));
  if (a.local_pref) put_attr(o, wk, kAttrLocalPref, be32_bytes(*a.local_pref));
  if (a.atomic_aggregate) put_attr(o, wk, kAttrAtomicAggregate, {});
  if (a.aggregator) {
    std::vector<uint8_t> v;
    if (as4) {
      put32(v, a.aggregator->as);
    } else {
      put16(v, a.aggregator->as > 0xffff ? kAsTrans : static_cast<uint16_t>(a.aggregator->as));
    }
    put32(v, a.aggregator->addr);
    put_attr(o, opt_trans, kAttrAggregator, v);
  }
  if (!a.ext_communities.empty()) {
    std::vector<uint8_t> v;
    for (const BgpExtCommunity& c : a.ext_communities) v.insert(v.end(), c.bytes.begin(), c.bytes.end());
    put_attr(o, opt_trans, kAttrExtCommunities, v);
  }
  if (!as4 && a.as_path && needs_as4(*a.as_path)) put_attr(o, opt_trans, kAttrAs4Path, as_path_value(*a.as_path, 4));
  if (!as4 && a.aggregator && a.aggregator->as > 0xffff) {
    std::vector<uint8_t> v;
    put32(v, a.aggregator->as);
    put32(v, a.aggregator->addr);
    put_attr(o, opt_trans, kAttrAs4Aggregator, v);
  }
  std::vector<BgpRawAttribute> raw = a.unknown;
  std::stable_sort(raw.begin(), raw.end(), [](const auto& x, const auto& y) { return x.type < y.type; });
  for (const BgpRawAttribute& r : raw) put_attr(o, static_cast<uint8_t>(r.flags | kAttrPartial), r.type, r.value);
  return o;
}

// An IPv4 unicast MP_REACH_NLRI (RFC 4760 §3) announcing `nlri` via `next_hop`, as a whole attribute.
std::vector<uint8_t> mp_reach_attribute(uint32_t next_hop, const std::vector<BgpPrefix>& nlri) {
  std::vector<uint8_t> v;
  put16(v, kAfiIpv4);
  put8(v, kSafiUnicast);
  put8(v, 4);  // next hop length
  put32(v, next_hop);
  put8(v, 0);  // reserved
  put_prefixes(v, nlri);
  std::vector<uint8_t> o;
  put_attr(o, kAttrOptional, kAttrMpReach, v);
  return o;
}

// Attribute header (extended length) and MP_REACH_NLRI's fields before its prefixes.
constexpr size_t kMpReachOverhead = 4 + 9;

std::vector<uint8_t> update_body(const std::vector<BgpPrefix>& withdrawn, const std::vector<uint8_t>& attrs,
                                 const std::vector<BgpPrefix>& nlri) {
  std::vector<uint8_t> w;
  put_prefixes(w, withdrawn);
  std::vector<uint8_t> body;
  IFEC_CHECK(w.size() <= 0xffff && attrs.size() <= 0xffff, "UPDATE fields over 65535 bytes");
  put16(body, static_cast<uint16_t>(w.size()));
  put_bytes(body, w);
  put16(body, static_cast<uint16_t>(attrs.size()));
  put_bytes(body, attrs);
  put_prefixes(body, nlri);
  return body;
}

}  // namespace

std::vector<uint8_t> encode_bgp_open(const BgpOpen& m) {
  std::vector<uint8_t> params;
  for (const auto& [afi, safi] : m.multiprotocol) {
    put_capability(params, kCapMultiprotocol, {static_cast<uint8_t>(afi >> 8), static_cast<uint8_t>(afi), 0, safi});
  }
  if (m.route_refresh) put_capability(params, kCapRouteRefresh, {});
  if (m.as4) put_capability(params, kCapAs4, be32_bytes(*m.as4));
  for (const BgpCapability& c : m.unknown) put_capability(params, c.code, c.value);
  IFEC_CHECK(params.size() <= 255, "OPEN optional parameters of " << params.size() << " bytes exceed 255");
  std::vector<uint8_t> body;
  put8(body, m.version);
  put16(body, m.my_as);
  put16(body, m.hold_time);
  put32(body, m.bgp_id);
  put8(body, static_cast<uint8_t>(params.size()));
  put_bytes(body, params);
  return finish(BgpMessageType::kOpen, body);
}

std::vector<uint8_t> encode_bgp_update(const BgpUpdate& m, bool as4) {
  std::vector<uint8_t> attrs;
  if (m.mp_reach) attrs = mp_reach_attribute(m.mp_reach->next_hop, m.mp_reach->nlri);
  put_bytes(attrs, attributes_value(m.attrs, as4));
  return finish(BgpMessageType::kUpdate, update_body(m.withdrawn, attrs, m.nlri));
}

std::vector<std::vector<uint8_t>> encode_bgp_updates(const BgpUpdate& m, bool as4) {
  std::vector<std::vector<uint8_t>> out;
  const size_t room = kBgpMaxMessage - kBgpUpdateMinSize;  // bytes for prefixes and attributes
  std::vector<BgpPrefix> chunk;
  size_t used = 0;
  for (const BgpPrefix& p : m.withdrawn) {
    if (used + prefix_bytes(p) > room) {
      out.push_back(finish(BgpMessageType::kUpdate, update_body(chunk, {}, {})));
      chunk.clear();
      used = 0;
    }
    chunk.push_back(p);
    used += prefix_bytes(p);
  }
  if (!chunk.empty()) out.push_back(finish(BgpMessageType::kUpdate, update_body(chunk, {}, {})));
  const bool mp = m.mp_reach && !m.mp_reach->nlri.empty();
  if (m.nlri.empty() && !mp) {
    if (out.empty()) out.push_back(finish(BgpMessageType::kUpdate, update_body({}, {}, {})));
    return out;
  }
  // Chunks of `nlri`, each behind `overhead` bytes of attributes; `emit` makes one message of a chunk.
  const auto split = [&](const std::vector<BgpPrefix>& nlri, size_t overhead, const auto& emit) {
    IFEC_CHECK(overhead + 5 <= room, "UPDATE path attributes of " << overhead << " bytes leave no room for NLRI");
    std::vector<BgpPrefix> part;
    size_t size = overhead;
    for (const BgpPrefix& p : nlri) {
      if (size + prefix_bytes(p) > room) {
        out.push_back(emit(part));
        part.clear();
        size = overhead;
      }
      part.push_back(p);
      size += prefix_bytes(p);
    }
    out.push_back(emit(part));
  };
  if (!m.nlri.empty()) {
    const std::vector<uint8_t> attrs = attributes_value(m.attrs, as4);
    split(m.nlri, attrs.size(), [&](const std::vector<BgpPrefix>& part) {
      return finish(BgpMessageType::kUpdate, update_body({}, attrs, part));
    });
  }
  if (mp) {  // RFC 4760 §3: an UPDATE with MP_REACH_NLRI alone carries no NEXT_HOP
    BgpPathAttributes rest = m.attrs;
    rest.next_hop.reset();
    const std::vector<uint8_t> attrs = attributes_value(rest, as4);
    split(m.mp_reach->nlri, kMpReachOverhead + attrs.size(), [&](const std::vector<BgpPrefix>& part) {
      std::vector<uint8_t> both = mp_reach_attribute(m.mp_reach->next_hop, part);
      put_bytes(both, attrs);
      return finish(BgpMessageType::kUpdate, update_body({}, both, {}));
    });
  }
  return out;
}

std::vector<uint8_t> encode_bgp_keepalive() { return finish(BgpMessageType::kKeepalive, {}); }

std::vector<uint8_t> encode_bgp_notification(const BgpNotification& m) {
  std::vector<uint8_t> body{m.code, m.subcode};
  put_bytes(body, m.data);
  return finish(BgpMessageType::kNotification, body);
}

std::vector<uint8_t> encode_bgp_route_refresh(const BgpRouteRefresh& m) {
  std::vector<uint8_t> body;
  put16(body, m.afi);
  put8(body, m.reserved);
  put8(body, m.safi);
  return finish(BgpMessageType::kRouteRefresh, body);
}

// ---------------------------------------------------------------------------------------------------------------
// Header and framing
// ---------------------------------------------------------------------------------------------------------------

namespace {

// Checks the 19 header bytes at `buf`; false with *err (a Message Header Error) when they are bad.
bool check_header(const uint8_t* buf, BgpError* err) {
  for (size_t i = 0; i < kBgpMarkerSize; ++i) {
    if (buf[i] != 0xff) {
      std::ostringstream os;
      os << "marker byte " << i << " is 0x" << std::hex << int(buf[i]) << " (expected 16 bytes of 0xff)";
      *err = make_error(BgpErrorAction::kSessionReset, kErrHeader, kHdrNotSynchronized, {}, i, os.str());
      return false;
    }
  }
  const uint16_t len = load_be16(buf + 16);
  const uint8_t type = buf[18];
  const auto bad_length = [&](const char* expected) {
    std::ostringstream os;
    os << bgp_message_type_name(type) << " length " << len << " (expected " << expected << ")";
    *err = make_error(BgpErrorAction::kSessionReset, kErrHeader, kHdrBadLength, be16_bytes(len), 16, os.str());
    return false;
  };
  if (len < kBgpHeaderSize || len > kBgpMaxMessage) return bad_length("19..4096");
  switch (type) {
    case 1:
      return len >= kBgpOpenMinSize || bad_length("at least 29");
    case 2:
      return len >= kBgpUpdateMinSize || bad_length("at least 23");
    case 3:
      return len >= kBgpNotificationMinSize || bad_length("at least 21");
    case 4:
      return len == kBgpHeaderSize || bad_length("exactly 19");
    case 5:
      return len == kBgpRouteRefreshSize || bad_length("exactly 23");
    default: {
      std::ostringstream os;
      os << "message type " << int(type) << " (expected 1 OPEN .. 5 ROUTE-REFRESH)";
      *err = make_error(BgpErrorAction::kSessionReset, kErrHeader, kHdrBadType, {type}, 18, os.str());
      return false;
    }
  }
}

}  // namespace

size_t bgp_frame_length(const uint8_t* buf, size_t len, BgpError* err) {
  *err = BgpError{};
  if (buf == nullptr || len < kBgpHeaderSize) return 0;
  if (!check_header(buf, err)) return 0;
  const size_t msg_len = load_be16(buf + 16);
  return len >= msg_len ? msg_len : 0;
}

// ---------------------------------------------------------------------------------------------------------------
// OPEN
// ---------------------------------------------------------------------------------------------------------------

namespace {

struct OpenDecoder {
  const uint8_t* msg;
  size_t len;
  BgpMessage* out;

  void fail(uint8_t subcode, size_t at, const std::string& what, std::vector<uint8_t> data = {}) {
    out->errors.push_back(make_error(BgpErrorAction::kSessionReset, kErrOpen, subcode, std::move(data), at, what));
  }

  // One capability; false when it is malformed.
  bool capability(uint8_t code, const uint8_t* v, uint8_t n, size_t at) {
    BgpOpen& o = out->open;
    const auto malformed = [&](const char* expected) {
      std::ostringstream os;
      os << "capability " << int(code) << " of length " << int(n) << " at byte " << at << " (expected " << expected
         << ")";
      fail(kOpenUnspecific, at, os.str());
      return false;
    };
    if (code == kCapMultiprotocol) {
      if (n != 4) return malformed("4: AFI, reserved, SAFI");
      o.multiprotocol.emplace_back(load_be16(v), v[3]);
    } else if (code == kCapRouteRefresh) {
      if (n != 0) return malformed("0");
      o.route_refresh = true;
    } else if (code == kCapAs4) {
      if (n != 4) return malformed("4: the AS");
      o.as4 = load_be32(v);
    } else {
      o.unknown.push_back(BgpCapability{code, std::vector<uint8_t>(v, v + n)});
    }
    return true;
  }

  // The capabilities in one optional parameter's value [at, at + n).
  bool capabilities(size_t at, size_t n) {
    const size_t end = at + n;
    while (at < end) {
      if (end - at < 2 || end - at - 2 < msg[at + 1]) {
        std::ostringstream os;
        os << "capability at byte " << at << " runs past its optional parameter (ends at byte " << end << ")";
        fail(kOpenUnspecific, at, os.str());
        return false;
      }
      if (!capability(msg[at], msg + at + 2, msg[at + 1], at)) return false;
      at += 2 + msg[at + 1];
    }
    return true;
  }

  // Optional parameters in [at, end); `wide`: RFC 9072 two-octet parameter lengths.
  void parameters(size_t at, size_t end, bool wide) {
    const size_t hdr = wide ? 3 : 2;
    while (at < end) {
      const size_t n = end - at < hdr ? 0 : (wide ? load_be16(msg + at + 1) : msg[at + 1]);
      if (end - at < hdr || end - at - hdr < n) {
        std::ostringstream os;
        os << "optional parameter at byte " << at << " runs past the parameters' end at byte " << end;
        fail(kOpenUnspecific, at, os.str());
        return;
      }
      if (msg[at] != kOptParamCapabilities) {
        std::ostringstream os;
        os << "optional parameter type " << int(msg[at]) << " at byte " << at << " (expected 2, capabilities)";
        fail(kOpenUnsupportedParam, at, os.str());
        return;
      }
      if (!capabilities(at + hdr, n)) return;
      at += hdr + n;
    }
  }

  void run() {
    BgpOpen& o = out->open;
    const uint8_t* p = msg + kBgpHeaderSize;
    o.version = p[0];
    o.my_as = load_be16(p + 1);
    o.hold_time = load_be16(p + 3);
    o.bgp_id = load_be32(p + 5);
    if (o.version != kBgpVersion) {
      fail(kOpenBadVersion, 19, "BGP version " + std::to_string(o.version) + " (expected 4)", {0, kBgpVersion});
      return;
    }
    size_t at = kBgpHeaderSize + 10;
    size_t params = p[9];
    bool wide = false;
    if (params == 255 && len > at && msg[at] == 255) {  // RFC 9072 extended optional parameters
      if (len < at + 3) {
        fail(kOpenUnspecific, at, "RFC 9072 extended optional parameters length is truncated");
        return;
      }
      params = load_be16(msg + at + 1);
      at += 3;
      wide = true;
    }
    if (at + params != len) {
      std::ostringstream os;
      os << "optional parameters length " << params << " does not match the " << len - at
         << " bytes after the fixed fields";
      fail(kOpenUnspecific, kBgpHeaderSize + 9, os.str());
      return;
    }
    parameters(at, len, wide);
    if (!out->errors.empty()) return;
    checks();
  }

  // The values RFC 4271 §6.2, RFC 6286 and RFC 7607 reject whatever the local configuration.
  void checks() {
    const BgpOpen& o = out->open;
    if (o.hold_time == 1 || o.hold_time == 2) {
      fail(kOpenBadHoldTime, 22, "hold time " + std::to_string(o.hold_time) + " s (expected 0 or at least 3)");
    } else if (o.as() == 0) {
      fail(kOpenBadPeerAs, 20, "AS 0 (RFC 7607: never a valid peer AS)");
    } else if (o.bgp_id == 0) {
      fail(kOpenBadBgpId, 24, "BGP identifier 0.0.0.0 (expected non-zero)", be32_bytes(0));
    }
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// UPDATE
// ---------------------------------------------------------------------------------------------------------------

namespace {

struct UpdateDecoder {
  const uint8_t* msg;
  size_t len;
  const BgpDecodeOptions& opt;
  BgpMessage* out;
  std::array<bool, 256> seen{};
  std::optional<std::vector<BgpAsPathSegment>> as4_path;
  std::optional<BgpAggregator> as4_aggregator;
  // MP_REACH_NLRI's IPv4 unicast routes and their next hop (none when it cannot serve them), placed beside the
  // classic NLRI by settle_next_hop().
  std::vector<BgpPrefix> mp_nlri;
  std::optional<uint32_t> mp_next_hop;
  size_t empty_unreach = 0;  // size of an IPv4 unicast MP_UNREACH_NLRI withdrawing nothing (End-of-RIB)

  void error(BgpErrorAction a, uint8_t subcode, size_t at, std::vector<uint8_t> data, const std::string& what) {
    out->errors.push_back(make_error(a, kErrUpdate, subcode, std::move(data), at, what));
  }

  // Prefixes in [at, end) into *ps; false (a session reset: the field cannot be parsed) when malformed.
  bool prefixes(size_t at, size_t end, std::vector<BgpPrefix>* ps, const char* field) {
    while (at < end) {
      const uint8_t bits = msg[at];
      const size_t n = (bits + 7u) / 8u;
      if (bits > 32 || end - at - 1 < n) {
        std::ostringstream os;
        os << field << " prefix at byte " << at << " with length " << int(bits);
        if (bits > 32) {
          os << " (expected 0..32)";
        } else {
          os << " runs past the field's end at byte " << end;
        }
        error(BgpErrorAction::kSessionReset, kUpdInvalidNetwork, at, {}, os.str());
        return false;
      }
      uint32_t addr = 0;
      for (size_t i = 0; i < n; ++i) addr |= uint32_t{msg[at + 1 + i]} << (24 - 8 * i);
      ps->push_back(bgp_prefix(addr, bits));
      at += 1 + n;
    }
    return true;
  }

  // AS_PATH or AS4_PATH segments with `width`-octet ASes; "" or why they are malformed.
  static std::string segments(const uint8_t* v, size_t n, int width, std::vector<BgpAsPathSegment>* path) {
    size_t at = 0;
    while (at < n) {
      if (n - at < 2) return "1 byte left after the last segment";
      const uint8_t type = v[at];
      const uint8_t count = v[at + 1];
      if (type != kAsSet && type != kAsSequence) {
        return "segment type " + std::to_string(type) + " (expected 1 AS_SET or 2 AS_SEQUENCE)";
      }
      if (count == 0) return "a segment of 0 ASes";
      if (n - at - 2 < size_t{count} * width) {
        return "a segment of " + std::to_string(count) + " ASes runs past the attribute";
      }
      BgpAsPathSegment s{type, {}};
      for (size_t i = 0; i < count; ++i) {
        const uint8_t* a = v + at + 2 + i * width;
        s.asns.push_back(width == 4 ? load_be32(a) : load_be16(a));
      }
      path->push_back(std::move(s));
      at += 2 + size_t{count} * width;
    }
    return "";
  }

  void attributes(size_t at, size_t end);
  void attribute(uint8_t flags, uint8_t type, const uint8_t* v, size_t n, size_t at, size_t total);
  bool flags_ok(uint8_t flags, uint8_t type, size_t at, const std::vector<uint8_t>& whole);
  void value(uint8_t type, const uint8_t* v, size_t n, size_t at, const std::vector<uint8_t>& whole);
  void aggregators(uint8_t type, const uint8_t* v, size_t n, size_t at, const std::vector<uint8_t>& whole);
  bool ipv4_unicast(uint8_t type, const uint8_t* v, size_t n, size_t at, const std::vector<uint8_t>& whole);
  void mp_reach(const uint8_t* v, size_t n, size_t at, const std::vector<uint8_t>& whole);
  void mp_reach_next_hop(const uint8_t* nh, size_t nh_len, size_t at, const std::vector<uint8_t>& whole);
  void mp_unreach(const uint8_t* v, size_t n, size_t at, const std::vector<uint8_t>& whole);
  void settle_next_hop(bool classic_nlri);
  void mandatory(size_t attrs, bool classic_nlri);
  void finish_path();
  void run();
};

// The action RFC 7606 §7 gives a malformed instance of a recognised attribute.
BgpErrorAction malformed_action(uint8_t type) {
  switch (type) {
    case kAttrAtomicAggregate:
    case kAttrAggregator:
    case kAttrAs4Path:
    case kAttrAs4Aggregator:
      return BgpErrorAction::kAttributeDiscard;
    // RFC 7606 §7.11: "session reset" or "AFI/SAFI disable", which this code does not have. Even a flags conflict
    // resets (as FRR does): treat-as-withdraw could not withdraw the NLRI of an attribute left unread.
    case kAttrMpReach:
    case kAttrMpUnreach:
      return BgpErrorAction::kSessionReset;
    default:
      return BgpErrorAction::kTreatAsWithdraw;
  }
}

// (Optional, Transitive) bits each recognised attribute must carry.
int expected_flags(uint8_t type) {
  switch (type) {
    case kAttrOrigin:
    case kAttrAsPath:
    case kAttrNextHop:
    case kAttrLocalPref:
    case kAttrAtomicAggregate:
      return kAttrTransitive;
    case kAttrMed:
    case kAttrMpReach:
    case kAttrMpUnreach:
      return kAttrOptional;
    case kAttrAggregator:
    case kAttrExtCommunities:
    case kAttrAs4Path:
    case kAttrAs4Aggregator:
      return kAttrOptional | kAttrTransitive;
    default:
      return -1;
  }
}

// Not "this network", loopback, multicast or reserved: the addresses RFC 4271 §6.3 calls no valid next hop.
bool unicast_next_hop(uint32_t nh) {
  const uint32_t first = nh >> 24;
  return first != 0 && first != 127 && first < 224;
}

const char* attr_name(uint8_t type) {
  switch (type) {
    case kAttrOrigin:
      return "ORIGIN";
    case kAttrAsPath:
      return "AS_PATH";
    case kAttrNextHop:
      return "NEXT_HOP";
    case kAttrMed:
      return "MULTI_EXIT_DISC";
    case kAttrLocalPref:
      return "LOCAL_PREF";
    case kAttrAtomicAggregate:
      return "ATOMIC_AGGREGATE";
    case kAttrAggregator:
      return "AGGREGATOR";
    case kAttrMpReach:
      return "MP_REACH_NLRI";
    case kAttrMpUnreach:
      return "MP_UNREACH_NLRI";
    case kAttrExtCommunities:
      return "EXTENDED_COMMUNITIES";
    case kAttrAs4Path:
      return "AS4_PATH";
    case kAttrAs4Aggregator:
      return "AS4_AGGREGATOR";
    default:
      return "attribute";
  }
}

void UpdateDecoder::attributes(size_t at, size_t end) {
  while (at < end) {
    const uint8_t flags = msg[at];
    const size_t hdr = (flags & kAttrExtendedLength) ? 4 : 3;
    if (end - at < hdr) {  // RFC 7606 §4: too few bytes left for an attribute header
      std::ostringstream os;
      os << end - at << " bytes left at byte " << at << ", fewer than an attribute header (" << hdr << ")";
      error(BgpErrorAction::kTreatAsWithdraw, kUpdMalformedAttrList, at, {}, os.str());
      return;
    }
    const uint8_t type = msg[at + 1];
    const size_t n = hdr == 4 ? load_be16(msg + at + 2) : msg[at + 2];
    if (end - at - hdr < n) {  // RFC 7606 §4: the last attribute overruns the Total Path Attribute Length
      std::ostringstream os;
      os << attr_name(type) << " (type " << int(type) << ") at byte " << at << " has length " << n << " but only "
         << end - at - hdr << " bytes remain in the path attributes";
      error(BgpErrorAction::kTreatAsWithdraw, kUpdMalformedAttrList, at, {}, os.str());
      return;
    }
    if (seen[type] && (type == kAttrMpReach || type == kAttrMpUnreach)) {  // RFC 7606 §3 g: these reset the session
      std::ostringstream os;
      os << attr_name(type) << " repeated at byte " << at;
      error(BgpErrorAction::kSessionReset, kUpdMalformedAttrList, at, {}, os.str());
      return;
    }
    if (seen[type]) {  // RFC 7606 §3 g: repeats of the others after the first are discarded
      std::ostringstream os;
      os << attr_name(type) << " (type " << int(type) << ") repeated at byte " << at << ": discarded";
      error(BgpErrorAction::kAttributeDiscard, kUpdMalformedAttrList, at, {}, os.str());
    } else {
      seen[type] = true;
      attribute(flags, type, msg + at + hdr, n, at, hdr + n);
    }
    at += hdr + n;
  }
}

bool UpdateDecoder::flags_ok(uint8_t flags, uint8_t type, size_t at, const std::vector<uint8_t>& whole) {
  const int want = expected_flags(type);
  const int got = flags & (kAttrOptional | kAttrTransitive);
  const bool partial_bad = (flags & kAttrPartial) && want != (kAttrOptional | kAttrTransitive);
  if (got == want && !partial_bad) return true;
  std::ostringstream os;
  os << attr_name(type) << " at byte " << at << " has flags 0x" << std::hex << int(flags) << " (expected "
     << (want == kAttrTransitive ? "well-known: transitive, not optional, not partial"
         : want == kAttrOptional ? "optional non-transitive, not partial"
                                 : "optional transitive")
     << ")";
  error(malformed_action(type), kUpdAttrFlags, at, whole, os.str());
  return false;
}

void UpdateDecoder::attribute(uint8_t flags, uint8_t type, const uint8_t* v, size_t n, size_t at, size_t total) {
  const std::vector<uint8_t> whole(msg + at, msg + at + total);  // NOTIFICATION data: type, length, value
  if (expected_flags(type) < 0) {
    if (!(flags & kAttrOptional)) {
      std::ostringstream os;
      os << "unrecognized well-known attribute type " << int(type) << " at byte " << at;
      error(BgpErrorAction::kSessionReset, kUpdUnrecognizedWellKnown, at, whole, os.str());
    } else if (flags & kAttrTransitive) {
      const uint8_t otp = flags & (kAttrOptional | kAttrTransitive | kAttrPartial);  // not E, not the unused bits
      out->update.attrs.unknown.push_back(BgpRawAttribute{otp, type, std::vector<uint8_t>(v, v + n)});
    }  // unrecognized optional non-transitive: quietly ignored (RFC 4271 §5)
    return;
  }
  if (type == kAttrLocalPref && opt.ebgp) return;  // RFC 4271 §5.1.5: ignored from an external peer
  if (!flags_ok(flags, type, at, whole)) return;
  value(type, v, n, at, whole);
}

void UpdateDecoder::value(uint8_t type, const uint8_t* v, size_t n, size_t at, const std::vector<uint8_t>& whole) {
  BgpPathAttributes& a = out->update.attrs;
  const auto bad_length = [&](const char* expected) {
    std::ostringstream os;
    os << attr_name(type) << " at byte " << at << " has length " << n << " (expected " << expected << ")";
    error(malformed_action(type), kUpdAttrLength, at, whole, os.str());
  };
  switch (type) {
    case kAttrOrigin:
      if (n != 1) return bad_length("1");
      if (v[0] > 2) {
        std::ostringstream os;
        os << "ORIGIN value " << int(v[0]) << " at byte " << at << " (expected 0 IGP, 1 EGP or 2 INCOMPLETE)";
        return error(BgpErrorAction::kTreatAsWithdraw, kUpdInvalidOrigin, at, whole, os.str());
      }
      a.origin = static_cast<BgpOrigin>(v[0]);
      return;
    case kAttrAsPath:
    case kAttrAs4Path: {
      std::vector<BgpAsPathSegment> path;
      const bool four = type == kAttrAs4Path || opt.as4;
      const std::string why = segments(v, n, four ? 4 : 2, &path);
      if (!why.empty()) {
        std::ostringstream os;
        os << attr_name(type) << " at byte " << at << " is malformed: " << why;
        return error(malformed_action(type), kUpdMalformedAsPath, at, {}, os.str());
      }
      if (type == kAttrAsPath) {
        a.as_path = std::move(path);
      } else if (opt.as4) {  // RFC 6793 §4.1: a 4-octet speaker's peer never sends it; discarded
        error(BgpErrorAction::kAttributeDiscard, kUpdOptionalAttr, at, {},
              "AS4_PATH from a peer with the 4-octet AS capability: discarded");
      } else {
        as4_path = std::move(path);
      }
      return;
    }
    case kAttrNextHop: {
      if (n != 4) return bad_length("4");
      const uint32_t nh = load_be32(v);
      if (!unicast_next_hop(nh)) {
        std::ostringstream os;
        os << "NEXT_HOP " << common::ipv4_to_string(nh) << " at byte " << at << " (expected a unicast address)";
        return error(BgpErrorAction::kTreatAsWithdraw, kUpdInvalidNextHop, at, whole, os.str());
      }
      a.next_hop = nh;
      return;
    }
    case kAttrMed:
      if (n != 4) return bad_length("4");
      a.med = load_be32(v);
      return;
    case kAttrLocalPref:
      if (n != 4) return bad_length("4");
      a.local_pref = load_be32(v);
      return;
    case kAttrAtomicAggregate:
      if (n != 0) return bad_length("0");
      a.atomic_aggregate = true;
      return;
    case kAttrExtCommunities:
      if (n == 0 || n % 8 != 0) {  // RFC 7606 §7.14; subcode 9 as FRR sends it
        std::ostringstream os;
        os << "EXTENDED_COMMUNITIES at byte " << at << " has length " << n << " (expected a non-zero multiple of 8)";
        return error(BgpErrorAction::kTreatAsWithdraw, kUpdOptionalAttr, at, whole, os.str());
      }
      for (size_t i = 0; i < n; i += 8) {
        BgpExtCommunity c;
        std::copy(v + i, v + i + 8, c.bytes.begin());
        a.ext_communities.push_back(c);
      }
      return;
    case kAttrMpReach:
      return mp_reach(v, n, at, whole);
    case kAttrMpUnreach:
      return mp_unreach(v, n, at, whole);
    default:
      return aggregators(type, v, n, at, whole);
  }
}

void UpdateDecoder::aggregators(uint8_t type, const uint8_t* v, size_t n, size_t at,
                                const std::vector<uint8_t>& whole) {
  const size_t want = type == kAttrAggregator && !opt.as4 ? 6 : 8;
  if (n != want) {
    std::ostringstream os;
    os << attr_name(type) << " at byte " << at << " has length " << n << " (expected " << want << ")";
    return error(BgpErrorAction::kAttributeDiscard, kUpdAttrLength, at, whole, os.str());
  }
  const BgpAggregator agg =
      want == 6 ? BgpAggregator{load_be16(v), load_be32(v + 2)} : BgpAggregator{load_be32(v), load_be32(v + 4)};
  if (type == kAttrAggregator) {
    out->update.attrs.aggregator = agg;
  } else if (!opt.as4) {
    as4_aggregator = agg;
  }  // AS4_AGGREGATOR from a 4-octet peer: discarded (RFC 6793 §4.1)
}

// The family of an MP attribute (RFC 4760 §3, §4): true for IPv4 unicast, the one decoded. Another is skipped unread
// and listed: its layout past AFI and SAFI is that family's, and a family never negotiated is no reason to reset.
// Malformed MP attributes reset the session (malformed_action) with Optional Attribute Error, as RFC 4760 §7 names.
bool UpdateDecoder::ipv4_unicast(uint8_t type, const uint8_t* v, size_t n, size_t at,
                                 const std::vector<uint8_t>& whole) {
  if (n < 3) {
    std::ostringstream os;
    os << attr_name(type) << " at byte " << at << " has length " << n << " (expected at least 3: AFI, SAFI)";
    error(BgpErrorAction::kSessionReset, kUpdOptionalAttr, at, whole, os.str());
    return false;
  }
  const uint16_t afi = load_be16(v);
  if (afi == kAfiIpv4 && v[2] == kSafiUnicast) return true;
  out->skipped_families.emplace_back(afi, v[2]);
  return false;
}

// IPv4 unicast MP_REACH_NLRI: its prefixes join the NLRI. RFC 7606 §7.11: a next hop length other than expected
// leaves the NLRI unlocatable, a session reset; so does a prefix over /32 or past the attribute (as in the NLRI field).
void UpdateDecoder::mp_reach(const uint8_t* v, size_t n, size_t at, const std::vector<uint8_t>& whole) {
  if (!ipv4_unicast(kAttrMpReach, v, n, at, whole)) return;
  const size_t nh = n < 5 ? 0 : v[3];
  const bool known = nh == 4 || nh == 16 || nh == 32;
  if (n < 5 || !known || n - 5 < nh) {
    std::ostringstream os;
    os << "MP_REACH_NLRI at byte " << at;
    if (n < 5) {
      os << " has length " << n << " (expected at least 5: AFI, SAFI, next hop length, reserved)";
    } else if (!known) {
      os << " has a next hop of length " << nh << " for IPv4 unicast (expected 4, or 16 or 32 under RFC 8950)";
    } else {
      os << " has a next hop of length " << nh << " that runs past its " << n << " bytes";
    }
    return error(BgpErrorAction::kSessionReset, kUpdOptionalAttr, at, whole, os.str());
  }
  const size_t base = static_cast<size_t>(v - msg);
  std::vector<BgpPrefix> ps;
  if (!prefixes(base + 5 + nh, base + n, &ps, "MP_REACH_NLRI")) return;  // after the reserved byte (ignored)
  mp_nlri = std::move(ps);
  mp_reach_next_hop(v + 4, nh, at, whole);
}

// The next hop of IPv4 unicast MP_REACH_NLRI, kept for settle_next_hop(); one that cannot serve its routes makes
// them treat-as-withdraw (their NLRI was found, and is withdrawn), as a bad NEXT_HOP does.
void UpdateDecoder::mp_reach_next_hop(const uint8_t* nh, size_t nh_len, size_t at, const std::vector<uint8_t>& whole) {
  std::ostringstream os;
  if (nh_len != 4) {
    // RFC 8950's IPv6 next hop for IPv4 NLRI: this speaker does not offer its Extended Next Hop capability and
    // BgpPathAttributes has no place for an IPv6 address, so the routes are withdrawn, not installed without one.
    os << "MP_REACH_NLRI at byte " << at << " has a " << nh_len
       << "-byte IPv6 next hop for IPv4 unicast (RFC 8950, not negotiated; expected 4 bytes)";
    return error(BgpErrorAction::kTreatAsWithdraw, kUpdOptionalAttr, at, whole, os.str());
  }
  const uint32_t addr = load_be32(nh);
  if (!unicast_next_hop(addr)) {
    os << "MP_REACH_NLRI next hop " << common::ipv4_to_string(addr) << " at byte " << at
       << " (expected a unicast address)";
    return error(BgpErrorAction::kTreatAsWithdraw, kUpdInvalidNextHop, at, whole, os.str());
  }
  mp_next_hop = addr;
}

// IPv4 unicast MP_UNREACH_NLRI: its prefixes join the withdrawn routes.
void UpdateDecoder::mp_unreach(const uint8_t* v, size_t n, size_t at, const std::vector<uint8_t>& whole) {
  if (!ipv4_unicast(kAttrMpUnreach, v, n, at, whole)) return;
  const size_t base = static_cast<size_t>(v - msg);
  std::vector<BgpPrefix> ps;
  if (!prefixes(base + 3, base + n, &ps, "MP_UNREACH_NLRI")) return;
  if (ps.empty()) empty_unreach = whole.size();
  out->update.withdrawn.insert(out->update.withdrawn.end(), ps.begin(), ps.end());
}

// RFC 4760 §3: MP_REACH_NLRI's next hop is its NLRI's, NEXT_HOP the classic NLRI's, and a NEXT_HOP without classic
// NLRI is ignored. MP routes whose next hop differs from the classic NLRI's stay apart in mp_reach (BgpUpdate);
// the others join nlri. Routes whose MP next hop could not serve join nlri too: a treat-as-withdraw withdraws them.
void UpdateDecoder::settle_next_hop(bool classic_nlri) {
  BgpPathAttributes& a = out->update.attrs;
  if (!classic_nlri && mp_next_hop) a.next_hop = mp_next_hop;
  if (mp_nlri.empty()) return;
  // A missing NEXT_HOP beside classic NLRI is mandatory()'s to report; the MP routes keep their own next hop.
  if (classic_nlri && mp_next_hop && a.next_hop != mp_next_hop) {
    out->update.mp_reach = BgpMpReach{*mp_next_hop, std::move(mp_nlri)};
    return;
  }
  out->update.nlri.insert(out->update.nlri.end(), mp_nlri.begin(), mp_nlri.end());
}

// RFC 7606 §3 d for an UPDATE with NLRI: ORIGIN and AS_PATH; NEXT_HOP only for classic NLRI (RFC 4760 §3: the
// MP_REACH_NLRI ones have their own); LOCAL_PREF from an internal peer.
void UpdateDecoder::mandatory(size_t attrs, bool classic_nlri) {
  for (uint8_t t : {kAttrOrigin, kAttrAsPath, kAttrNextHop}) {
    if (seen[t] || (t == kAttrNextHop && !classic_nlri)) continue;
    error(BgpErrorAction::kTreatAsWithdraw, kUpdMissingWellKnown, attrs, {t},
          std::string("UPDATE with NLRI lacks the well-known mandatory ") + attr_name(t));
  }
  if (!opt.ebgp && !seen[kAttrLocalPref]) {
    error(BgpErrorAction::kTreatAsWithdraw, kUpdMissingWellKnown, attrs, {kAttrLocalPref},
          "UPDATE from an internal peer lacks LOCAL_PREF");
  }
}

// RFC 6793 §4.2.3 for a 2-octet peer, then the leftmost-AS check (RFC 4271 §6.3) for an external one.
void UpdateDecoder::finish_path() {
  BgpPathAttributes& a = out->update.attrs;
  // An AGGREGATOR that is not AS_TRANS means an old speaker aggregated: AS4_PATH and AS4_AGGREGATOR are stale.
  const bool old_aggregator = a.aggregator && a.aggregator->as != kAsTrans;
  if (as4_aggregator && a.aggregator && !old_aggregator) a.aggregator = as4_aggregator;
  if (as4_path && a.as_path && !old_aggregator) {
    a.as_path = bgp_merge_as4_path(*a.as_path, *as4_path);
  }
  if (!opt.ebgp || opt.peer_as == 0 || !a.as_path || out->update.nlri.empty()) return;  // (mp_reach implies nlri)
  const auto& p = *a.as_path;
  if (p.empty() || p[0].type != kAsSequence || p[0].asns[0] != opt.peer_as) {
    std::ostringstream os;
    os << "AS_PATH from external peer AS " << opt.peer_as << " does not start with it ("
       << (p.empty() ? std::string("empty path")
                     : (p[0].type != kAsSequence ? std::string("starts with an AS_SET")
                                                 : "leftmost AS " + std::to_string(p[0].asns[0])))
       << ")";
    error(BgpErrorAction::kTreatAsWithdraw, kUpdMalformedAsPath, kBgpHeaderSize, {}, os.str());
  }
}

void UpdateDecoder::run() {
  const size_t body = kBgpHeaderSize;
  const size_t wlen = load_be16(msg + body);
  if (body + 2 + wlen + 2 > len) {
    std::ostringstream os;
    os << "withdrawn routes length " << wlen << " leaves no room for the path attributes length in a " << len
       << "-byte UPDATE";
    return error(BgpErrorAction::kSessionReset, kUpdMalformedAttrList, body, {}, os.str());
  }
  const size_t alen = load_be16(msg + body + 2 + wlen);
  const size_t attrs = body + 4 + wlen;
  if (attrs + alen > len) {
    std::ostringstream os;
    os << "withdrawn routes length " << wlen << " + path attributes length " << alen << " + 23 exceeds the " << len
       << "-byte UPDATE";
    return error(BgpErrorAction::kSessionReset, kUpdMalformedAttrList, attrs - 2, {}, os.str());
  }
  if (!prefixes(body + 2, body + 2 + wlen, &out->update.withdrawn, "withdrawn")) return;
  if (!prefixes(attrs + alen, len, &out->update.nlri, "NLRI")) return;
  const bool classic_nlri = !out->update.nlri.empty();
  attributes(attrs, attrs + alen);  // MP_UNREACH_NLRI prefixes join withdrawn here
  settle_next_hop(classic_nlri);    // MP_REACH_NLRI's routes join nlri or fill mp_reach here
  finish_path();
  // RFC 4724 §2: nothing at all, or an IPv4 unicast MP_UNREACH_NLRI withdrawing nothing as the only attribute.
  out->end_of_rib = wlen == 0 && !classic_nlri && (alen == 0 || alen == empty_unreach);
  if (!out->update.nlri.empty()) mandatory(attrs, classic_nlri);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Message dispatch
// ---------------------------------------------------------------------------------------------------------------

BgpMessage decode_bgp(const uint8_t* msg, size_t len, const BgpDecodeOptions& opt) {
  BgpMessage m;
  BgpError err;
  if (msg == nullptr || len < kBgpHeaderSize) {
    m.errors.push_back(make_error(BgpErrorAction::kSessionReset, kErrHeader, kHdrBadLength, be16_bytes(uint16_t(len)),
                                  0, "message of " + std::to_string(len) + " bytes is shorter than the header (19)"));
    return m;
  }
  m.type = msg[18];
  if (!check_header(msg, &err)) {
    m.errors.push_back(err);
    return m;
  }
  const size_t hlen = load_be16(msg + 16);
  if (hlen != len) {
    std::ostringstream os;
    os << "header says " << hlen << " bytes but the message holds " << len;
    m.errors.push_back(
        make_error(BgpErrorAction::kSessionReset, kErrHeader, kHdrBadLength, be16_bytes(uint16_t(hlen)), 16, os.str()));
    return m;
  }
  const uint8_t* body = msg + kBgpHeaderSize;
  switch (static_cast<BgpMessageType>(m.type)) {
    case BgpMessageType::kOpen:
      OpenDecoder{msg, len, &m}.run();
      break;
    case BgpMessageType::kUpdate:
      UpdateDecoder{msg, len, opt, &m, {}, {}, {}, {}, {}, 0}.run();
      break;
    case BgpMessageType::kNotification:
      m.notification = BgpNotification{body[0], body[1], std::vector<uint8_t>(body + 2, msg + len)};
      break;
    case BgpMessageType::kRouteRefresh:
      m.route_refresh = BgpRouteRefresh{load_be16(body), body[2], body[3]};
      break;
    case BgpMessageType::kKeepalive:
      break;
  }
  return m;
}

// ---------------------------------------------------------------------------------------------------------------
// Link bandwidth and path bandwidth
// ---------------------------------------------------------------------------------------------------------------

namespace {

uint32_t float_bits(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float bits_float(uint32_t u) {
  float f = 0;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

bool is_bandwidth(const BgpExtCommunity& c, uint8_t subtype) {
  return (c.type() == kExtTypeTwoOctetAs || c.type() == kExtTypeTwoOctetAsNonTransitive) && c.subtype() == subtype;
}

std::optional<double> lowest_bandwidth(const BgpPathAttributes& attrs, uint8_t subtype) {
  std::optional<double> low;
  for (const BgpExtCommunity& c : attrs.ext_communities) {
    if (!is_bandwidth(c, subtype)) continue;
    double bw = bits_float(load_be32(c.bytes.data() + 4));
    if (!(bw > 0)) bw = 0;  // negative and NaN read as 0
    if (!low || bw < *low) low = bw;
  }
  return low;
}

}  // namespace

BgpExtCommunity encode_link_bandwidth(const BgpLinkBandwidth& lb) {
  BgpExtCommunity c;
  c.bytes[0] = lb.transitive ? kExtTypeTwoOctetAs : kExtTypeTwoOctetAsNonTransitive;
  c.bytes[1] = kExtSubtypeLinkBandwidth;
  common::store_be16(c.bytes.data() + 2, lb.as);
  common::store_be32(c.bytes.data() + 4, float_bits(lb.bytes_per_second));
  return c;
}

bool decode_link_bandwidth(const BgpExtCommunity& c, BgpLinkBandwidth* lb) {
  if (!is_bandwidth(c, kExtSubtypeLinkBandwidth)) return false;
  lb->transitive = c.type() == kExtTypeTwoOctetAs;
  lb->as = load_be16(c.bytes.data() + 2);
  lb->bytes_per_second = bits_float(load_be32(c.bytes.data() + 4));
  return true;
}

std::optional<double> bgp_link_bandwidth(const BgpPathAttributes& attrs) {
  return lowest_bandwidth(attrs, kExtSubtypeLinkBandwidth);
}

BgpExtCommunity encode_path_bandwidth(uint32_t local_as, double gbps, const BgpBandwidthUnits& units) {
  const double bytes = gbps * units.bytes_per_gbps;
  IFEC_CHECK(std::isfinite(bytes) && bytes >= 0 && bytes <= FLT_MAX,
             "path bandwidth " << gbps << " Gb/s x " << units.bytes_per_gbps
                               << " bytes per Gb/s (expected finite, non-negative, within an IEEE-754 single)");
  IFEC_CHECK(units.bytes_per_gbps > 0, "bytes_per_gbps " << units.bytes_per_gbps << " (expected > 0)");
  BgpLinkBandwidth lb;
  lb.as = local_as > 0xffff ? kAsTrans : static_cast<uint16_t>(local_as);
  lb.bytes_per_second = static_cast<float>(bytes);
  lb.transitive = units.transitive;
  BgpExtCommunity c = encode_link_bandwidth(lb);
  c.bytes[1] = units.subtype;
  return c;
}

std::optional<double> bgp_path_bandwidth_gbps(const BgpPathAttributes& attrs, const BgpBandwidthUnits& units) {
  const std::optional<double> bytes = lowest_bandwidth(attrs, units.subtype);
  if (!bytes) return std::nullopt;
  return *bytes / units.bytes_per_gbps;
}

}  // namespace ifec::routing
