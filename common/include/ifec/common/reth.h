// RDMA Extended Transport Header: virtual address, R_Key, DMA length (first/only WRITE and READ request).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ifec::common {

struct Reth {
  static constexpr size_t kSize = 16;

  uint64_t virtual_address = 0;
  uint32_t rkey = 0;
  uint32_t dma_length = 0;

  void encode(uint8_t* out) const;
  static Reth decode(const uint8_t* in);
};

static_assert(Reth::kSize == 8 + 4 + 4, "RETH is 16 bytes");

// Immediate data (ImmDt) carried by *_IMM opcodes.
struct ImmDt {
  static constexpr size_t kSize = 4;
  uint32_t value = 0;
  void encode(uint8_t* out) const;
  static ImmDt decode(const uint8_t* in);
};

static_assert(ImmDt::kSize == 4, "ImmDt is 4 bytes");

}  // namespace ifec::common
