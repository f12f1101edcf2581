// BTH encode/decode and the RC opcode table.
#include "ifec/common/bth.h"

#include "ifec/common/byte_order.h"

namespace ifec::common {

namespace {

//                     name                     reth   aeth   atomic ackETH imm    payload
constexpr OpcodeInfo kRc[] = {
    {"SEND_FIRST", false, false, false, false, false, true},
    {"SEND_MIDDLE", false, false, false, false, false, true},
    {"SEND_LAST", false, false, false, false, false, true},
    {"SEND_LAST_IMM", false, false, false, false, true, true},
    {"SEND_ONLY", false, false, false, false, false, true},
    {"SEND_ONLY_IMM", false, false, false, false, true, true},
    {"RDMA_WRITE_FIRST", true, false, false, false, false, true},
    {"RDMA_WRITE_MIDDLE", false, false, false, false, false, true},
    {"RDMA_WRITE_LAST", false, false, false, false, false, true},
    {"RDMA_WRITE_LAST_IMM", false, false, false, false, true, true},
    {"RDMA_WRITE_ONLY", true, false, false, false, false, true},
    {"RDMA_WRITE_ONLY_IMM", true, false, false, false, true, true},
    {"RDMA_READ_REQUEST", true, false, false, false, false, false},
    {"RDMA_READ_RESPONSE_FIRST", false, true, false, false, false, true},
    {"RDMA_READ_RESPONSE_MIDDLE", false, false, false, false, false, true},
    {"RDMA_READ_RESPONSE_LAST", false, true, false, false, false, true},
    {"RDMA_READ_RESPONSE_ONLY", false, true, false, false, false, true},
    {"ACKNOWLEDGE", false, true, false, false, false, false},
    {"ATOMIC_ACKNOWLEDGE", false, true, false, true, false, false},
    {"COMPARE_SWAP", false, false, true, false, false, false},
    {"FETCH_ADD", false, false, true, false, false, false},
};

// CNP carries 16 reserved bytes as its payload.
constexpr OpcodeInfo kCnpInfo = {"CNP", false, false, false, false, false, true};

}  // namespace

std::optional<OpcodeInfo> opcode_info(uint8_t opcode) {
  if (opcode < sizeof(kRc) / sizeof(kRc[0])) {
    return kRc[opcode];
  }
  if (opcode == static_cast<uint8_t>(Opcode::kCnp)) {
    return kCnpInfo;
  }
  return std::nullopt;
}

const char* opcode_name(uint8_t opcode) {
  auto info = opcode_info(opcode);
  return info ? info->name : "UNKNOWN";
}

void Bth::encode(uint8_t* out) const {
  out[0] = opcode;
  out[1] =
      static_cast<uint8_t>((solicited ? 0x80 : 0) | (mig_req ? 0x40 : 0) | ((pad_count & 0x3) << 4) | (tver & 0xF));
  store_be16(out + 2, pkey);
  out[4] = static_cast<uint8_t>((fecn ? 0x80 : 0) | (becn ? 0x40 : 0));
  store_be24(out + 5, dest_qp & kQpnMask);
  out[8] = ack_req ? 0x80 : 0;
  store_be24(out + 9, psn & kPsnMask);
}

Bth Bth::decode(const uint8_t* in) {
  Bth b;
  b.opcode = in[0];
  b.solicited = (in[1] & 0x80) != 0;
  b.mig_req = (in[1] & 0x40) != 0;
  b.pad_count = (in[1] >> 4) & 0x3;
  b.tver = in[1] & 0xF;
  b.pkey = load_be16(in + 2);
  b.fecn = (in[4] & 0x80) != 0;
  b.becn = (in[4] & 0x40) != 0;
  b.dest_qp = load_be24(in + 5);
  b.ack_req = (in[8] & 0x80) != 0;
  b.psn = load_be24(in + 9);
  return b;
}

}  // namespace ifec::common
