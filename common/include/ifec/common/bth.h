// InfiniBand Base Transport Header (12 bytes) and the RC opcode table that says which extension headers follow.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace ifec::common {

// Reliable Connection opcodes (IBTA Vol 1, Table 38), plus the RoCEv2 CNP.
enum class Opcode : uint8_t {
  kSendFirst = 0x00,
  kSendMiddle = 0x01,
  kSendLast = 0x02,
  kSendLastImm = 0x03,
  kSendOnly = 0x04,
  kSendOnlyImm = 0x05,
  kWriteFirst = 0x06,
  kWriteMiddle = 0x07,
  kWriteLast = 0x08,
  kWriteLastImm = 0x09,
  kWriteOnly = 0x0A,
  kWriteOnlyImm = 0x0B,
  kReadRequest = 0x0C,
  kReadResponseFirst = 0x0D,
  kReadResponseMiddle = 0x0E,
  kReadResponseLast = 0x0F,
  kReadResponseOnly = 0x10,
  kAcknowledge = 0x11,
  kAtomicAcknowledge = 0x12,
  kCompareSwap = 0x13,
  kFetchAdd = 0x14,
  kCnp = 0x81,
};

// What follows the BTH for one opcode, in wire order: [RETH | AtomicETH] [AETH] [AtomicAckETH] [ImmDt] payload.
struct OpcodeInfo {
  const char* name;
  bool reth;
  bool aeth;
  bool atomic_eth;
  bool atomic_ack_eth;
  bool imm;
  bool payload;  // may carry payload bytes
};

// nullopt for opcodes this project does not speak (decode reports them as kUnknownOpcode).
std::optional<OpcodeInfo> opcode_info(uint8_t opcode);
const char* opcode_name(uint8_t opcode);

struct Bth {
  static constexpr size_t kSize = 12;
  static constexpr uint16_t kDefaultPkey = 0xFFFF;
  static constexpr uint32_t kPsnMask = 0xFFFFFF;
  static constexpr uint32_t kQpnMask = 0xFFFFFF;

  uint8_t opcode = 0;
  bool solicited = false;
  bool mig_req = true;
  uint8_t pad_count = 0;  // 0..3 bytes of padding after the payload
  uint8_t tver = 0;
  uint16_t pkey = kDefaultPkey;
  bool fecn = false;
  bool becn = false;
  uint32_t dest_qp = 0;  // 24 bits
  bool ack_req = false;
  uint32_t psn = 0;  // 24 bits

  void encode(uint8_t* out) const;
  static Bth decode(const uint8_t* in);
};

static_assert(Bth::kSize == 12, "BTH is 12 bytes");

}  // namespace ifec::common
