// RETH, ImmDt, AETH, AtomicETH and AtomicAckETH encode/decode.
#include "ifec/common/aeth.h"
#include "ifec/common/atomic_eth.h"
#include "ifec/common/byte_order.h"
#include "ifec/common/reth.h"

namespace ifec::common {

void Reth::encode(uint8_t* out) const {
  store_be64(out, virtual_address);
  store_be32(out + 8, rkey);
  store_be32(out + 12, dma_length);
}

Reth Reth::decode(const uint8_t* in) { return Reth{load_be64(in), load_be32(in + 8), load_be32(in + 12)}; }

void ImmDt::encode(uint8_t* out) const { store_be32(out, value); }
ImmDt ImmDt::decode(const uint8_t* in) { return ImmDt{load_be32(in)}; }

void Aeth::encode(uint8_t* out) const {
  out[0] = syndrome;
  store_be24(out + 1, msn);
}

Aeth Aeth::decode(const uint8_t* in) { return Aeth{in[0], load_be24(in + 1)}; }

void AtomicEth::encode(uint8_t* out) const {
  store_be64(out, virtual_address);
  store_be32(out + 8, rkey);
  store_be64(out + 12, swap_or_add);
  store_be64(out + 20, compare);
}

AtomicEth AtomicEth::decode(const uint8_t* in) {
  return AtomicEth{load_be64(in), load_be32(in + 8), load_be64(in + 12), load_be64(in + 20)};
}

void AtomicAckEth::encode(uint8_t* out) const { store_be64(out, original_data); }
AtomicAckEth AtomicAckEth::decode(const uint8_t* in) { return AtomicAckEth{load_be64(in)}; }

}  // namespace ifec::common
