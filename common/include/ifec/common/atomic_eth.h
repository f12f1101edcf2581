// Atomic Extended Transport Header (CMP_SWAP / FETCH_ADD request) and AtomicAckETH (original remote value).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ifec::common {

struct AtomicEth {
  static constexpr size_t kSize = 28;

  uint64_t virtual_address = 0;  // must be 8-byte aligned at the responder
  uint32_t rkey = 0;
  uint64_t swap_or_add = 0;  // swap value (CMP_SWAP) or addend (FETCH_ADD)
  uint64_t compare = 0;      // compare value (CMP_SWAP only)

  void encode(uint8_t* out) const;
  static AtomicEth decode(const uint8_t* in);
};

static_assert(AtomicEth::kSize == 8 + 4 + 8 + 8, "AtomicETH is 28 bytes");

struct AtomicAckEth {
  static constexpr size_t kSize = 8;

  uint64_t original_data = 0;

  void encode(uint8_t* out) const;
  static AtomicAckEth decode(const uint8_t* in);
};

static_assert(AtomicAckEth::kSize == 8, "AtomicAckETH is 8 bytes");

}  // namespace ifec::common
