// The all-to-all both drivers run and check (`./ifec live run alltoall`, `ifec.collectives.measure(kind=
// "alltoall")`): every rank stores `bytes` to every other rank with RC WRITEs, one row per peer
// (Communicator::put_rows); byte i of the block rank `from` sends rank `to` is a pure function of (seed, from, to,
// i), so every rank checks what it received without a copy of anyone's input.
#pragma once

#include <cstdint>

#include "ifec/workloads/communicator.h"

namespace ifec::testbed {

uint8_t alltoall_byte(uint64_t seed, int from, int to, uint64_t i);

// Rank `me` of `n`: writes its n blocks of `bytes` (block d for rank d) into `source` (window `src`) and returns the
// rows that store each to its peer's window `dst`, at offset me * bytes.
workloads::BatchPutArgs alltoall_rows(uint64_t seed, int me, int n, uint64_t bytes, uint16_t src, uint16_t dst,
                                      uint8_t* source);

// The bytes of what rank `me` received in `received` (window `dst`, n blocks) that differ from what their senders
// wrote.
uint64_t alltoall_wrong(uint64_t seed, int me, int n, uint64_t bytes, const uint8_t* received);

}  // namespace ifec::testbed
