// UDP encode/decode.
#include "ifec/common/udp.h"

#include "ifec/common/byte_order.h"

namespace ifec::common {

void UdpHeader::encode(uint8_t* out) const {
  store_be16(out, src_port);
  store_be16(out + 2, dst_port);
  store_be16(out + 4, length);
  store_be16(out + 6, checksum);
}

UdpHeader UdpHeader::decode(const uint8_t* in) {
  UdpHeader h;
  h.src_port = load_be16(in);
  h.dst_port = load_be16(in + 2);
  h.length = load_be16(in + 4);
  h.checksum = load_be16(in + 6);
  return h;
}

}  // namespace ifec::common
