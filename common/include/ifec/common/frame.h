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
};

struct ParsedFrame {
  FrameHeaders h;
  size_t ip_offset = 0;
  size_t bth_offset = 0;
  size_t payload_offset = 0;
  size_t payload_size = 0;  // without pad
  uint32_t icrc = 0;
};

// Bytes the headers take before the payload, for the opcode and ECH in `h`.
size_t header_bytes(const FrameHeaders& h);

// Encodes a frame. The opcode decides which extension headers are written; those must be present in `h`
// (an error naming the missing header is thrown otherwise). Fills ip.total_length, the IP checksum,
// udp.length, udp.dst_port (4791, or kEchUdpPort when h.ech is set), bth.pad_count and the ICRC.
// encode_frame builds into a buffer recycle_frame gave back on this thread when there is one.
std::vector<uint8_t> encode_frame(const FrameHeaders& h, const uint8_t* payload, size_t payload_size);
void encode_frame_into(const FrameHeaders& h, const uint8_t* payload, size_t payload_size, std::vector<uint8_t>* out);

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
WireStatus parse_l3(const uint8_t* data, size_t len, L3View* out);

// Rewrites TTL and ECN of the IPv4 header at `ip` and recomputes its checksum (the ICRC masks both fields).
void rewrite_ttl_ecn(uint8_t* ip, uint8_t ttl, uint8_t ecn);

// Parses and validates a frame. On error `out` is left in an unspecified but safe state.
WireStatus parse_frame(const uint8_t* data, size_t len, ParsedFrame* out, const ParseOptions& opts = {});

}  // namespace ifec::common
