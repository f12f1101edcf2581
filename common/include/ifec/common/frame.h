// Whole RoCEv2 frames: encode headers + payload into bytes (lengths, padding, checksums and ICRC filled in),
// and parse bytes back without trusting them (every length checked against the buffer before it is used).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "ifec/common/aeth.h"
#include "ifec/common/atomic_eth.h"
#include "ifec/common/bth.h"
#include "ifec/common/ech.h"
#include "ifec/common/ethernet.h"
#include "ifec/common/ipv4.h"
#include "ifec/common/reth.h"
#include "ifec/common/udp.h"
#include "ifec/common/wire_status.h"

namespace ifec::common {

inline constexpr size_t kIcrcSize = 4;
inline constexpr size_t kDefaultMaxFrame = 9216;  // jumbo frame, without FCS
inline constexpr size_t kDefaultPathMtu = 4096;   // largest RoCE path MTU: payload bytes per packet

struct FrameHeaders {
  EthernetHeader eth;
  Ipv4Header ip;
  UdpHeader udp;
  std::optional<Ech> ech;
  Bth bth;
  std::optional<Reth> reth;
  std::optional<Aeth> aeth;
  std::optional<AtomicEth> atomic;
  std::optional<AtomicAckEth> atomic_ack;
  std::optional<ImmDt> imm;
};

struct ParseOptions {
  size_t max_frame = kDefaultMaxFrame;
  size_t path_mtu = kDefaultPathMtu;
  bool verify_ip_checksum = true;
  bool verify_icrc = true;
  // A simulation whose payloads are elided (encode_frame with a null payload): a frame may end where its payload
  // would start, its lengths the whole frame's; it is parsed, and has no payload and no ICRC to check. Never set
  // where frames come from outside (the live testbed): a truncated frame would pass for an elided one.
  bool allow_elided = false;
};

struct ParsedFrame {
  FrameHeaders h;
  size_t ip_offset = 0;
  size_t bth_offset = 0;
  size_t payload_offset = 0;
  size_t payload_size = 0;  // without pad
  uint32_t icrc = 0;
  bool elided = false;  // the payload (and the ICRC) are not in the buffer: payload_size is what the frame carries
};

// Bytes the headers take before the payload, for the opcode and ECH in `h`.
size_t header_bytes(const FrameHeaders& h);

// Encodes a frame. The opcode decides which extension headers are written; those must be present in `h`
// (an error naming the missing header is thrown otherwise). Fills ip.total_length, the IP checksum,
// udp.length, udp.dst_port (4791, or kEchUdpPort when h.ech is set), bth.pad_count and the ICRC.
// A null `payload` with a size elides the payload: the frame's buffer ends after its headers, and its lengths
// (IP total length, UDP length, pad count) are those of the frame with the payload (wire_frame_bytes).
// encode_frame builds into a buffer recycle_frame gave back on this thread when there is one.
std::vector<uint8_t> encode_frame(const FrameHeaders& h, const uint8_t* payload, size_t payload_size);
void encode_frame_into(const FrameHeaders& h, const uint8_t* payload, size_t payload_size, std::vector<uint8_t>* out);

// The frame's length on the wire: its buffer's, or, for a frame whose payload was elided, what its IPv4 total
// length says the whole frame takes (padded to the 60-byte minimum, as the real frame would be).
size_t wire_frame_bytes(const uint8_t* data, size_t len);
inline size_t wire_frame_bytes(const std::vector<uint8_t>& frame) {
  return wire_frame_bytes(frame.data(), frame.size());
}

// Gives the buffer of a frame that has ended back for encode_frame to reuse (a bounded pool per thread); an
// empty or moved-from vector is ignored.
void recycle_frame(std::vector<uint8_t>&& frame);

// What a switch needs from a frame to forward it, read without trusting the buffer: IPv4 addresses, DSCP/ECN,
// TTL and the UDP ports (flow hash). Only Ethernet + IPv4 (+ UDP ports when present) are checked.
struct L3View {
  size_t ip_offset = 0;
  uint32_t src = 0;
  uint32_t dst = 0;
  uint8_t dscp = 0;
  uint8_t ecn = 0;
  uint8_t ttl = 0;
  uint8_t protocol = 0;
  uint16_t src_port = 0;  // 0 when not UDP
  uint16_t dst_port = 0;
};
// allow_elided: as ParseOptions::allow_elided (the IPv4 total length may exceed the buffer).
WireStatus parse_l3(const uint8_t* data, size_t len, L3View* out, bool allow_elided = false);

// Rewrites TTL and ECN of the IPv4 header at `ip` and recomputes its checksum (the ICRC masks both fields).
void rewrite_ttl_ecn(uint8_t* ip, uint8_t ttl, uint8_t ecn);

// Parses and validates a frame. On error `out` is left in an unspecified but safe state.
WireStatus parse_frame(const uint8_t* data, size_t len, ParsedFrame* out, const ParseOptions& opts = {});

}  // namespace ifec::common
