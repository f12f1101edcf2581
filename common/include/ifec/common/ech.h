// ECH v1: the project's Extended Computing Header for IFEC; byte layout documented in docs/ech-v1.md.
//
// An ECH frame is Ethernet | IPv4 | UDP (dst port kEchUdpPort) | ECH | BTH | ... | payload | ICRC.
// A plain RoCEv2 frame (UDP 4791) carries no ECH and is untouched by this header's existence.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ifec/common/wire_status.h"

namespace ifec::common {

// Project-local UDP destination port that says "ECH follows, then the BTH" (not IANA-assigned; see docs/ech-v1.md).
inline constexpr uint16_t kEchUdpPort = 4793;
inline constexpr uint8_t kEchVersion = 1;
// ECH v2 changes only the compact header: a bitmap base, so a multicast reaches endpoints past 63 and a source past
// 63 can send one. Senders use v1 whenever it can carry the header (the frames of fabrics up to 64 GPUs are v1's).
inline constexpr uint8_t kEchVersion2 = 2;

enum class EchFormat : uint8_t { kCompact = 0, kStandard = 1 };
enum class EchOp : uint8_t { kMulticast = 1, kReduce = 2, kAllReduce = 3, kBarrier = 4 };
enum class EchDtype : uint8_t { kFp32 = 0, kFp16 = 1, kBf16 = 2, kInt32 = 3 };
enum class EchRedOp : uint8_t { kSum = 0, kMin = 1, kMax = 2 };

namespace ech_flags {
inline constexpr uint8_t kStrongOrdering = 0x80;
inline constexpr uint8_t kRetransmission = 0x40;
inline constexpr uint8_t kAnomaly = 0x20;
inline constexpr uint8_t kDefined = kStrongOrdering | kRetransmission | kAnomaly;
}  // namespace ech_flags

const char* ech_op_name(EchOp op);
const char* ech_dtype_name(EchDtype dtype);
const char* ech_redop_name(EchRedOp op);
// fp32 (or float) | bf16 | fp16 (or half) | int32; sum | min | max. Throw Error naming the text and the names.
EchDtype parse_ech_dtype(std::string_view text);
EchRedOp parse_ech_redop(std::string_view text);
size_t ech_dtype_size(EchDtype dtype);

// One struct for both formats; `format` says which fields are on the wire.
struct Ech {
  static constexpr size_t kCommonSize = 4;
  static constexpr size_t kCompactSize = 16;
  static constexpr size_t kCompactV2Size = 20;
  static constexpr size_t kStandardSize = 24;
  static constexpr size_t kMaxSize = kStandardSize;

  EchFormat format = EchFormat::kCompact;
  EchOp op = EchOp::kMulticast;
  uint8_t flags = 0;

  // Compact: lightweight multicast, no reservation.
  uint16_t source_id = 0;    // sender's endpoint index (v1: 0..63)
  uint64_t dest_bitmap = 0;  // bit i set: deliver to endpoint bitmap_base + i
  uint16_t bitmap_base = 0;  // v2 only (v1: 0)

  // Both: symmetric-memory window the switch maps per destination (RETH VA is an offset inside it).
  uint16_t window_id = 0;

  // Standard: reserved resources.
  uint32_t job_id = 0;
  uint16_t group_id = 0;
  uint16_t contributor_id = 0;
  uint32_t chunk_index = 0;
  EchDtype dtype = EchDtype::kFp32;
  EchRedOp redop = EchRedOp::kSum;
  uint16_t element_count = 0;
  uint8_t expected = 0;  // standard: contributors this chunk waits for (0: every member of the group)

  // A compact header v1 cannot carry (a source or a destination past endpoint 63): encoded as v2.
  bool compact_v2() const { return format == EchFormat::kCompact && (source_id >= 64 || bitmap_base != 0); }
  size_t size() const {
    return format == EchFormat::kCompact ? (compact_v2() ? kCompactV2Size : kCompactSize) : kStandardSize;
  }
  // Compact: whether endpoint `e` is a destination; makes endpoint `e` the only one (base: e's block of 64).
  bool addresses(int e) const {
    return e >= bitmap_base && e - bitmap_base < 64 && ((dest_bitmap >> (e - bitmap_base)) & 1) != 0;
  }
  void set_destination(int e) {
    bitmap_base = static_cast<uint16_t>(e / 64 * 64);
    dest_bitmap = 1ULL << (e % 64);
  }
  void encode(uint8_t* out) const;
  // Validates version, format, length, operation, enums and reserved bits; never reads past `len`.
  static WireStatus decode(const uint8_t* in, size_t len, Ech* out);

 private:
  static WireStatus decode_compact(const uint8_t* in, uint8_t version, Ech e, Ech* out);
};

static_assert(Ech::kCompactSize == 4 + 2 + 2 + 8, "compact ECH is 16 bytes");
static_assert(Ech::kCompactV2Size == 4 + 2 + 2 + 2 + 2 + 8, "compact ECH v2 is 20 bytes");
static_assert(Ech::kStandardSize == 4 + 4 + 2 + 2 + 4 + 1 + 1 + 2 + 2 + 2, "standard ECH is 24 bytes");
// Byte 17 of the standard header ("expected contributors") was reserved-zero in the first drafts of v1; zero keeps
// that meaning (every member), so frames from before it was defined decode the same.

}  // namespace ifec::common
