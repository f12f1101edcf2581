// PFC frame encode/decode.
#include "ifec/common/pfc.h"

#include <cstring>

#include "ifec/common/byte_order.h"

namespace ifec::common {

std::vector<uint8_t> PfcFrame::encode() const {
  std::vector<uint8_t> f(kPfcFrameSize, 0);
  EthernetHeader eth;
  eth.dst = kPfcDestination;
  eth.src = src;
  eth.ethertype = EthernetHeader::kEtherTypeMacControl;
  eth.encode(f.data());
  store_be16(f.data() + 14, kPfcOpcode);
  store_be16(f.data() + 16, class_enable);
  for (int p = 0; p < 8; ++p) {
    store_be16(f.data() + 18 + 2 * p, quanta[p]);
  }
  return f;
}

WireStatus PfcFrame::decode(const uint8_t* data, size_t len, PfcFrame* out) {
  if (len < 34) {
    return WireStatus::fail(WireError::kTruncated, len, 34);
  }
  EthernetHeader eth = EthernetHeader::decode(data);
  if (eth.ethertype != EthernetHeader::kEtherTypeMacControl) {
    return WireStatus::fail(WireError::kBadEtherType, 12, eth.ethertype);
  }
  const uint16_t opcode = load_be16(data + 14);
  if (opcode != kPfcOpcode) {
    return WireStatus::fail(WireError::kBadMacControl, 14, opcode);
  }
  const uint16_t cev = load_be16(data + 16);
  if (cev > 0xFF) {
    return WireStatus::fail(WireError::kBadMacControl, 16, cev);
  }
  out->src = eth.src;
  out->class_enable = static_cast<uint8_t>(cev);
  for (int p = 0; p < 8; ++p) {
    out->quanta[p] = load_be16(data + 18 + 2 * p);
  }
  return {};
}

bool is_mac_control(const uint8_t* data, size_t len) {
  return len >= EthernetHeader::kSize && load_be16(data + 12) == EthernetHeader::kEtherTypeMacControl;
}

uint64_t pfc_quanta_ns(uint16_t quanta, uint64_t rate_bps) {
  const unsigned __int128 bits = static_cast<unsigned __int128>(quanta) * 512;
  return static_cast<uint64_t>((bits * 1'000'000'000ULL + rate_bps - 1) / rate_bps);
}

}  // namespace ifec::common
