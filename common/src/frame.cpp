// Frame encode and the untrusting frame parser.
#include "ifec/common/frame.h"

#include <optional>

#include "ifec/common/byte_order.h"
#include "ifec/common/checks.h"
#include "ifec/common/icrc.h"

namespace ifec::common {

namespace {

size_t ext_header_bytes(const OpcodeInfo& info) {
  return (info.reth ? Reth::kSize : 0) + (info.atomic_eth ? AtomicEth::kSize : 0) + (info.aeth ? Aeth::kSize : 0) +
         (info.atomic_ack_eth ? AtomicAckEth::kSize : 0) + (info.imm ? ImmDt::kSize : 0);
}

OpcodeInfo checked_info(uint8_t opcode) {
  auto info = opcode_info(opcode);
  IFEC_CHECK(info.has_value(), "encode_frame: opcode 0x" << std::hex << int{opcode} << " is not an RC opcode");
  return *info;
}

}  // namespace

size_t header_bytes(const FrameHeaders& h) {
  const OpcodeInfo info = checked_info(h.bth.opcode);
  return EthernetHeader::kSize + Ipv4Header::kSize + UdpHeader::kSize + (h.ech ? h.ech->size() : 0) + Bth::kSize +
         ext_header_bytes(info);
}

namespace {

// Buffers of frames that ended, kept for the next ones built on this thread (last in, first out: the buffer a
// receiver just read is still in the cache). Two sizes, so that a small frame does not take a full-sized buffer.
// Up to 4096 (17 MiB of 4 KiB frames): an all-to-all sends and receives in waves a thousand frames long, and a
// smaller pool went back to malloc in every wave (64 x 4 all-to-all: 512 buffers 1.6 M frame-hops/s, 4096 1.8 M).
// In those waves the buffer taken was mostly given back 256 to 1024 buffers earlier, out of this core's cache: when
// the next one is that old, it is prefetched for writing as this one is taken (64 x 4: 1.85 -> 1.96 M frame-hops/s;
// prefetching young ones too slowed the 8 x 2 fabric, whose frames stay in the cache, by 3%).
constexpr size_t kSmallFrame = 512;
constexpr size_t kPoolBuffers = 4096;
constexpr uint64_t kCachedBuffers = 256;  // given back fewer buffers ago than this: still in the cache
struct Pooled {
  std::vector<uint8_t> buffer;
  uint64_t given_back;  // the pool's count of buffers given back when this one was
};
struct Pool {
  std::vector<Pooled> free;
  uint64_t given_back = 0;
};
thread_local Pool t_pool[2];

std::vector<uint8_t> take_buffer(size_t bytes) {
  Pool& pool = t_pool[bytes > kSmallFrame];
  if (pool.free.empty()) {
    return {};
  }
  std::vector<uint8_t> out = std::move(pool.free.back().buffer);
  pool.free.pop_back();
  if (!pool.free.empty() && pool.given_back - pool.free.back().given_back >= kCachedBuffers) {
    const std::vector<uint8_t>& next = pool.free.back().buffer;
    for (size_t off = 0; off < next.capacity(); off += 64) {
      __builtin_prefetch(next.data() + off, 1, 3);
    }
  }
  return out;
}

}  // namespace

void recycle_frame(std::vector<uint8_t>&& frame) {
  if (frame.capacity() == 0) {
    return;
  }
  Pool& pool = t_pool[frame.capacity() > kSmallFrame];
  if (pool.free.size() < kPoolBuffers) {
    frame.clear();
    pool.free.push_back({std::move(frame), ++pool.given_back});
  }
}

std::vector<uint8_t> encode_frame(const FrameHeaders& h, const uint8_t* payload, size_t payload_size) {
  std::vector<uint8_t> out = take_buffer(header_bytes(h) + payload_size + 8);
  encode_frame_into(h, payload, payload_size, &out);
  return out;
}

void encode_frame_into(const FrameHeaders& h, const uint8_t* payload, size_t payload_size, std::vector<uint8_t>* out) {
  const OpcodeInfo info = checked_info(h.bth.opcode);
  const char* name = info.name;
  IFEC_CHECK(!info.reth || h.reth, "encode_frame: " << name << " needs a RETH");
  IFEC_CHECK(!info.atomic_eth || h.atomic, "encode_frame: " << name << " needs an AtomicETH");
  IFEC_CHECK(!info.aeth || h.aeth, "encode_frame: " << name << " needs an AETH");
  IFEC_CHECK(!info.atomic_ack_eth || h.atomic_ack, "encode_frame: " << name << " needs an AtomicAckETH");
  IFEC_CHECK(!info.imm || h.imm, "encode_frame: " << name << " needs ImmDt");
  IFEC_CHECK(info.payload || payload_size == 0,
             "encode_frame: " << name << " carries no payload, got " << payload_size << " bytes");
  if (h.ech && h.ech->format == EchFormat::kStandard) {
    const size_t expect = size_t{h.ech->element_count} * ech_dtype_size(h.ech->dtype);
    IFEC_CHECK(expect == payload_size, "encode_frame: standard ECH says "
                                           << h.ech->element_count << " x " << ech_dtype_name(h.ech->dtype) << " = "
                                           << expect << " bytes, payload is " << payload_size);
  }

  const size_t pad = (4 - (payload_size & 3)) & 3;
  const size_t ech_size = h.ech ? h.ech->size() : 0;
  const size_t ip_off = EthernetHeader::kSize;
  const size_t udp_off = ip_off + Ipv4Header::kSize;
  const size_t ech_off = udp_off + UdpHeader::kSize;
  const size_t bth_off = ech_off + ech_size;
  size_t off = bth_off + Bth::kSize;
  const size_t total = off + ext_header_bytes(info) + payload_size + pad + kIcrcSize;
  IFEC_CHECK(total - ip_off <= 0xFFFF, "encode_frame: IP datagram of " << (total - ip_off) << " bytes exceeds 65535");

  // Headers into a zeroed local block, then the frame in one pass (the payload is not zeroed first to be overwritten).
  const size_t headers = off + ext_header_bytes(info);
  uint8_t head[256];
  IFEC_CHECK(headers <= sizeof head, "encode_frame: " << headers << " bytes of headers");
  std::fill(head, head + headers, uint8_t{0});
  uint8_t* p = head;
  EthernetHeader eth = h.eth;
  eth.ethertype = EthernetHeader::kEtherTypeIpv4;
  eth.encode(p);
  Ipv4Header ip = h.ip;
  ip.total_length = static_cast<uint16_t>(total - ip_off);
  ip.protocol = Ipv4Header::kProtocolUdp;
  ip.encode(p + ip_off);
  UdpHeader udp = h.udp;
  udp.length = static_cast<uint16_t>(total - udp_off);
  udp.dst_port = h.ech ? kEchUdpPort : UdpHeader::kRoceV2Port;
  udp.encode(p + udp_off);
  if (h.ech) {
    h.ech->encode(p + ech_off);
  }
  Bth bth = h.bth;
  bth.pad_count = static_cast<uint8_t>(pad);
  bth.encode(p + bth_off);
  if (info.reth) {
    h.reth->encode(p + off);
    off += Reth::kSize;
  }
  if (info.atomic_eth) {
    h.atomic->encode(p + off);
    off += AtomicEth::kSize;
  }
  if (info.aeth) {
    h.aeth->encode(p + off);
    off += Aeth::kSize;
  }
  if (info.atomic_ack_eth) {
    h.atomic_ack->encode(p + off);
    off += AtomicAckEth::kSize;
  }
  if (info.imm) {
    h.imm->encode(p + off);
    off += ImmDt::kSize;
  }
  if (payload == nullptr && payload_size > 0) {  // elided: the headers alone, the lengths of the whole frame
    out->assign(head, head + off);
    return;
  }
  // The ICRC from the pieces: reading back the bytes just stored would wait for those stores (a fifth of the time
  // of a 64 x 4 all-to-all went there).
  const uint32_t icrc = compute_icrc_parts(head + ip_off, off - ip_off, bth_off - ip_off, payload, payload_size, pad);
  out->clear();
  out->reserve(total);
  out->insert(out->end(), head, head + off);
  out->insert(out->end(), payload, payload + payload_size);
  out->insert(out->end(), pad + kIcrcSize, uint8_t{0});
  p = out->data();
  off += payload_size + pad;
  // Little-endian on the wire, like the Ethernet FCS.
  p[off] = static_cast<uint8_t>(icrc);
  p[off + 1] = static_cast<uint8_t>(icrc >> 8);
  p[off + 2] = static_cast<uint8_t>(icrc >> 16);
  p[off + 3] = static_cast<uint8_t>(icrc >> 24);
}

namespace {

// parse_frame's steps, outermost header first; each checks every length it uses before reading.

// Ethernet and IPv4 (lengths, checksum, no fragments, UDP): where the UDP header starts and the datagram ends.
// `len` is the frame's length, `avail` the bytes its buffer holds (less than len only for an elided frame).
WireStatus parse_ipv4(const uint8_t* data, size_t len, size_t avail, const ParseOptions& opts, FrameHeaders& h,
                      size_t* udp_off, size_t* ip_end) {
  if (len > opts.max_frame) {
    return WireStatus::fail(WireError::kOversized, opts.max_frame, len);
  }
  if (len < EthernetHeader::kSize) {
    return WireStatus::fail(WireError::kTruncated, len, EthernetHeader::kSize);
  }
  h = FrameHeaders{};
  h.eth = EthernetHeader::decode(data);
  if (h.eth.ethertype != EthernetHeader::kEtherTypeIpv4) {
    return WireStatus::fail(WireError::kBadEtherType, 12, h.eth.ethertype);
  }

  const size_t ip_off = EthernetHeader::kSize;
  if (len < ip_off + Ipv4Header::kSize) {
    return WireStatus::fail(WireError::kTruncated, len, ip_off + Ipv4Header::kSize);
  }
  if ((data[ip_off] >> 4) != 4) {
    return WireStatus::fail(WireError::kBadIpVersion, ip_off, data[ip_off] >> 4);
  }
  h.ip = Ipv4Header::decode(data + ip_off);
  const size_t ihl_bytes = size_t{h.ip.ihl} * 4;
  if (h.ip.ihl < 5 || ip_off + ihl_bytes > avail) {
    return WireStatus::fail(WireError::kBadIpHeaderLength, ip_off, h.ip.ihl);
  }
  if (opts.verify_ip_checksum && ipv4_checksum(data + ip_off, ihl_bytes) != 0) {
    return WireStatus::fail(WireError::kBadIpChecksum, ip_off + 10, h.ip.checksum);
  }
  *ip_end = ip_off + h.ip.total_length;
  // Bytes past the IP datagram are only legal as Ethernet padding up to the 60-byte minimum frame.
  if (h.ip.total_length < ihl_bytes + UdpHeader::kSize || *ip_end > len || (*ip_end < len && len > 60)) {
    return WireStatus::fail(WireError::kBadIpTotalLength, ip_off + 2, h.ip.total_length);
  }
  if (h.ip.more_fragments || h.ip.fragment_offset != 0) {
    return WireStatus::fail(WireError::kIpFragment, ip_off + 6, h.ip.fragment_offset);
  }
  if (h.ip.protocol != Ipv4Header::kProtocolUdp) {
    return WireStatus::fail(WireError::kNotUdp, ip_off + 9, h.ip.protocol);
  }
  *udp_off = ip_off + ihl_bytes;
  return {};
}

// UDP to RoCEv2's port, or to ECH's with a valid ECH behind it: where the BTH starts.
WireStatus parse_udp(const uint8_t* data, size_t udp_off, size_t ip_end, size_t avail, FrameHeaders& h,
                     size_t* bth_off) {
  if (udp_off + UdpHeader::kSize > avail) {  // an elided frame shorter than its headers (a real one: its length says)
    return WireStatus::fail(WireError::kTruncated, avail, udp_off + UdpHeader::kSize);
  }
  h.udp = UdpHeader::decode(data + udp_off);
  if (udp_off + h.udp.length != ip_end) {
    return WireStatus::fail(WireError::kBadUdpLength, udp_off + 4, h.udp.length);
  }
  size_t off = udp_off + UdpHeader::kSize;
  if (h.udp.dst_port == kEchUdpPort) {
    Ech ech;
    WireStatus st = Ech::decode(data + off, std::min(ip_end, avail) - off, &ech);
    if (!st.ok()) {
      st.offset += static_cast<uint32_t>(off);
      return st;
    }
    h.ech = ech;
    off += ech.size();
  } else if (h.udp.dst_port != UdpHeader::kRoceV2Port) {
    return WireStatus::fail(WireError::kNotRoce, udp_off + 2, h.udp.dst_port);
  }
  *bth_off = off;
  return {};
}

// The BTH and the extended transport headers its opcode carries: where the payload starts.
WireStatus parse_transport(const uint8_t* data, size_t bth_off, size_t ip_end, size_t avail, FrameHeaders& h,
                           OpcodeInfo* info, size_t* payload_off) {
  if (std::min(ip_end, avail) < bth_off + Bth::kSize) {
    return WireStatus::fail(WireError::kTruncated, std::min(ip_end, avail), bth_off + Bth::kSize);
  }
  h.bth = Bth::decode(data + bth_off);
  const std::optional<OpcodeInfo> info_opt = opcode_info(h.bth.opcode);
  if (!info_opt) {
    return WireStatus::fail(WireError::kUnknownOpcode, bth_off, h.bth.opcode);
  }
  *info = *info_opt;
  size_t off = bth_off + Bth::kSize;
  if (ip_end < off + ext_header_bytes(*info) + kIcrcSize || avail < off + ext_header_bytes(*info)) {
    return WireStatus::fail(WireError::kTruncated, std::min(ip_end, avail), off + ext_header_bytes(*info) + kIcrcSize);
  }
  if (info->reth) {
    h.reth = Reth::decode(data + off);
    off += Reth::kSize;
  }
  if (info->atomic_eth) {
    h.atomic = AtomicEth::decode(data + off);
    off += AtomicEth::kSize;
  }
  if (info->aeth) {
    h.aeth = Aeth::decode(data + off);
    off += Aeth::kSize;
  }
  if (info->atomic_ack_eth) {
    h.atomic_ack = AtomicAckEth::decode(data + off);
    off += AtomicAckEth::kSize;
  }
  if (info->imm) {
    h.imm = ImmDt::decode(data + off);
    off += ImmDt::kSize;
  }
  *payload_off = off;
  return {};
}

// The payload between the headers and the ICRC (pad, opcode, path MTU, a standard ECH's element count): its size
// without the pad; then the ICRC, read into `icrc` and checked.
WireStatus parse_payload(const uint8_t* data, const FrameHeaders& h, const OpcodeInfo& info, size_t bth_off, size_t off,
                         size_t ip_end, bool elided, const ParseOptions& opts, size_t* payload, uint32_t* icrc) {
  const size_t icrc_off = ip_end - kIcrcSize;
  const size_t padded = icrc_off - off;
  if (h.bth.pad_count > padded || (padded & 3) != 0) {
    return WireStatus::fail(WireError::kBadPadCount, bth_off + 1, h.bth.pad_count);
  }
  *payload = padded - h.bth.pad_count;
  if (!info.payload && padded != 0) {
    return WireStatus::fail(WireError::kPayloadNotAllowed, off, padded);
  }
  if (*payload > opts.path_mtu) {
    return WireStatus::fail(WireError::kPayloadTooLarge, off, *payload);
  }
  if (h.ech && h.ech->format == EchFormat::kStandard &&
      size_t{h.ech->element_count} * ech_dtype_size(h.ech->dtype) != *payload) {
    const size_t ech_off = bth_off - h.ech->size();
    return WireStatus::fail(WireError::kEchPayloadMismatch, ech_off + 18, *payload);
  }

  if (elided) {
    *icrc = 0;  // neither the payload nor the ICRC is here
    return {};
  }
  *icrc = uint32_t{data[icrc_off]} | (uint32_t{data[icrc_off + 1]} << 8) | (uint32_t{data[icrc_off + 2]} << 16) |
          (uint32_t{data[icrc_off + 3]} << 24);
  if (opts.verify_icrc) {
    const size_t ip_off = EthernetHeader::kSize;
    const uint32_t expect = compute_icrc(data + ip_off, icrc_off - ip_off, bth_off - ip_off);
    if (expect != *icrc) {
      return WireStatus::fail(WireError::kBadIcrc, icrc_off, *icrc);
    }
  }
  return {};
}

// The whole length of an elided frame (its IPv4 total length goes past the buffer), or 0 for any other.
size_t elided_length(const uint8_t* data, size_t len) {
  if (len < EthernetHeader::kSize + Ipv4Header::kSize || load_be16(data + 12) != EthernetHeader::kEtherTypeIpv4 ||
      (data[EthernetHeader::kSize] >> 4) != 4) {
    return 0;
  }
  const size_t whole = EthernetHeader::kSize + load_be16(data + EthernetHeader::kSize + 2);
  return whole > len ? whole : 0;
}

}  // namespace

size_t wire_frame_bytes(const uint8_t* data, size_t len) {
  const size_t whole = elided_length(data, len);
  return whole > 0 ? std::max<size_t>(60, whole) : len;
}

WireStatus parse_frame(const uint8_t* data, size_t len, ParsedFrame* out, const ParseOptions& opts) {
  FrameHeaders& h = out->h;
  size_t udp_off = 0;
  size_t ip_end = 0;
  size_t bth_off = 0;
  size_t payload_off = 0;
  size_t payload = 0;
  OpcodeInfo info{};
  const size_t whole = opts.allow_elided ? elided_length(data, len) : 0;
  const size_t frame_len = whole > 0 ? whole : len;
  if (WireStatus st = parse_ipv4(data, frame_len, len, opts, h, &udp_off, &ip_end); !st.ok()) {
    return st;
  }
  if (WireStatus st = parse_udp(data, udp_off, ip_end, len, h, &bth_off); !st.ok()) {
    return st;
  }
  if (WireStatus st = parse_transport(data, bth_off, ip_end, len, h, &info, &payload_off); !st.ok()) {
    return st;
  }
  if (whole > 0 && len != payload_off) {
    return WireStatus::fail(WireError::kTruncated, len, whole);  // an elided frame is its headers, nothing else
  }
  if (WireStatus st = parse_payload(data, h, info, bth_off, payload_off, ip_end, whole > 0, opts, &payload, &out->icrc);
      !st.ok()) {
    return st;
  }
  out->ip_offset = EthernetHeader::kSize;
  out->bth_offset = bth_off;
  out->payload_offset = payload_off;
  out->payload_size = payload;
  out->elided = whole > 0;
  return {};
}

WireStatus parse_l3(const uint8_t* data, size_t len, L3View* out, bool allow_elided) {
  if (len < EthernetHeader::kSize + Ipv4Header::kSize) {
    return WireStatus::fail(WireError::kTruncated, len, EthernetHeader::kSize + Ipv4Header::kSize);
  }
  const uint16_t ethertype = load_be16(data + 12);
  if (ethertype != EthernetHeader::kEtherTypeIpv4) {
    return WireStatus::fail(WireError::kBadEtherType, 12, ethertype);
  }
  const uint8_t* ip = data + EthernetHeader::kSize;
  if ((ip[0] >> 4) != 4) {
    return WireStatus::fail(WireError::kBadIpVersion, EthernetHeader::kSize, ip[0] >> 4);
  }
  const size_t ihl = size_t{static_cast<uint8_t>(ip[0] & 0x0F)} * 4;
  if (ihl < Ipv4Header::kSize || EthernetHeader::kSize + ihl > len) {
    return WireStatus::fail(WireError::kBadIpHeaderLength, EthernetHeader::kSize, ihl / 4);
  }
  const size_t total = load_be16(ip + 2);
  if (total < ihl || (EthernetHeader::kSize + total > len && !allow_elided)) {
    return WireStatus::fail(WireError::kBadIpTotalLength, EthernetHeader::kSize + 2, total);
  }
  out->ip_offset = EthernetHeader::kSize;
  out->dscp = ip[1] >> 2;
  out->ecn = ip[1] & 3;
  out->ttl = ip[8];
  out->protocol = ip[9];
  out->src = load_be32(ip + 12);
  out->dst = load_be32(ip + 16);
  out->src_port = out->dst_port = 0;
  if (out->protocol == Ipv4Header::kProtocolUdp && total >= ihl + UdpHeader::kSize &&
      EthernetHeader::kSize + ihl + UdpHeader::kSize <= len) {
    out->src_port = load_be16(ip + ihl);
    out->dst_port = load_be16(ip + ihl + 2);
  }
  return {};
}

void rewrite_ttl_ecn(uint8_t* ip, uint8_t ttl, uint8_t ecn) {
  ip[8] = ttl;
  ip[1] = static_cast<uint8_t>((ip[1] & 0xFC) | (ecn & 3));
  const size_t ihl = size_t{static_cast<uint8_t>(ip[0] & 0x0F)} * 4;
  store_be16(ip + 10, 0);
  store_be16(ip + 10, ipv4_checksum(ip, ihl));
}

}  // namespace ifec::common
