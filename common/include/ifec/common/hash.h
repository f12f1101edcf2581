// The project's one 64-bit mixer: splitmix64's finaliser, a cheap, well-distributed hash of one word (flow hashing
// in the switches, counter-based generators of collective inputs).
#pragma once

#include <cstdint>

namespace ifec::common {

inline constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace ifec::common
