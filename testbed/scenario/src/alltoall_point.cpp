// The all-to-all both drivers run (alltoall_point.h).
#include "ifec/testbed/alltoall_point.h"

namespace ifec::testbed {

uint8_t alltoall_byte(uint64_t seed, int from, int to, uint64_t i) {
  return static_cast<uint8_t>((seed * 131 + static_cast<uint64_t>(from) * 31 + static_cast<uint64_t>(to) * 7 + i * 13) ^
                              (i >> 8));
}

workloads::BatchPutArgs alltoall_rows(uint64_t seed, int me, int n, uint64_t bytes, uint16_t src, uint16_t dst,
                                      uint8_t* source) {
  workloads::BatchPutArgs a;
  a.source_window = src;
  a.dest_window = dst;
  a.row_bytes = bytes;
  for (int d = 0; d < n; ++d) {
    for (uint64_t i = 0; i < bytes; ++i) {
      source[d * bytes + i] = alltoall_byte(seed, me, d, i);
    }
    if (d != me) {
      a.rows.push_back({d * bytes, d, me * bytes});
      a.incoming.emplace_back(d * bytes, bytes);
    }
  }
  return a;
}

uint64_t alltoall_wrong(uint64_t seed, int me, int n, uint64_t bytes, const uint8_t* received) {
  uint64_t wrong = 0;
  for (int s = 0; s < n; ++s) {
    for (uint64_t i = 0; s != me && i < bytes; ++i) {
      wrong += received[s * bytes + i] != alltoall_byte(seed, s, me, i);
    }
  }
  return wrong;
}

}  // namespace ifec::testbed
