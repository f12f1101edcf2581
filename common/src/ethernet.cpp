// Ethernet II encode/decode.
#include "ifec/common/ethernet.h"

#include <cstdio>
#include <cstring>

#include "ifec/common/byte_order.h"

namespace ifec::common {

std::string mac_to_string(const MacAddress& mac) {
  char buf[18];
  std::snprintf(buf, sizeof(buf), "%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]);
  return buf;
}

void EthernetHeader::encode(uint8_t* out) const {
  std::memcpy(out, dst.data(), 6);
  std::memcpy(out + 6, src.data(), 6);
  store_be16(out + 12, ethertype);
}

EthernetHeader EthernetHeader::decode(const uint8_t* in) {
  EthernetHeader h;
  std::memcpy(h.dst.data(), in, 6);
  std::memcpy(h.src.data(), in + 6, 6);
  h.ethertype = load_be16(in + 12);
  return h;
}

}  // namespace ifec::common
