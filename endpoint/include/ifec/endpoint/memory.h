// Symmetric memory: windows an endpoint registers (base, size, rkey, job) and the access check every remote
// request passes before it touches a byte. A remote address is (endpoint, window, offset); on the wire it is
// the window's virtual address + offset with the window's rkey, and the job travels as the BTH P_Key.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "ifec/common/protocol.h"

namespace ifec::endpoint {

// Every endpoint maps window `id` at the same virtual address (NVSHMEM-style symmetric heap).
inline constexpr uint64_t kWindowVaBase = 0x0000100000000000ULL;
inline constexpr int kWindowVaShift = 36;  // 64 GiB of address space per window
inline uint64_t window_va(uint16_t id) { return kWindowVaBase + (uint64_t{id} << kWindowVaShift); }
// Window `id`'s rkey at endpoint `endpoint`: distinct per endpoint and window, and never 0, so a zero or stale rkey
// fails the check. (Predictable: the partition key, bounds and rkey together are the protection, as in IB.)
inline uint32_t window_rkey(int endpoint, uint16_t id) {
  return 0x5A000000u ^ (static_cast<uint32_t>(endpoint & 0xFFF) << 12) ^ (uint32_t{id} + 1);
}

struct WindowInfo {
  uint16_t id = 0;
  uint64_t va = 0;
  uint64_t size = 0;
  uint32_t rkey = 0;
  uint32_t job = 0;
  uint8_t* data = nullptr;
};

enum class AccessError : uint8_t { kOk, kBadRkey, kOutOfBounds, kWrongJob, kMisaligned };
const char* access_error_name(AccessError e);

class SymmetricMemory {
 public:
  explicit SymmetricMemory(int endpoint_index) : endpoint_(endpoint_index) {}

  // Registers caller-owned memory (it must outlive the endpoint). Throws ifec::common::Error naming the bad
  // value: duplicate id, size 0 or above 64 GiB, null data, job above 15 bits.
  const WindowInfo& register_window(uint16_t id, void* data, uint64_t size, uint32_t job);
  // Allocates zeroed memory owned by this object and registers it. The memory is an anonymous mapping, so pages a
  // sparse layout never touches cost no RAM (a 64-rank MoE receive window is mostly empty).
  const WindowInfo& allocate_window(uint16_t id, uint64_t size, uint32_t job);
  // Unregisters window `id` (and frees it if this object allocated it); its rkey stops matching. Throws if absent.
  void free_window(uint16_t id);
  // Keeps up to `bytes` of the mappings freed windows leave (the most recently freed; none by default) for the next
  // allocate_window of the same size, up to twice as large, which zeroes and reuses one instead of mapping afresh.
  // A daemon that allocates an operation's windows and frees them after it (ifec-hostd) then writes into memory it
  // has touched before: the first write to a fresh page costs 15-19 us on the VMs this project runs on (a 4 MiB
  // window, 1,024 of them: 16 ms on the endpoint's one thread, inside the operation), zeroing a reused one 1-2 %
  // of that; the pages of a sparse window its last user never touched are dropped, not written, so they stay out
  // of memory.
  void keep_freed_windows(uint64_t bytes);
  uint64_t reused_windows() const { return reused_; }

  const WindowInfo* window(uint16_t id) const;
  // Checks an access of `len` bytes at `va` under `rkey` for `job`; atomics also need 8-byte alignment.
  AccessError check(uint32_t rkey, uint64_t va, uint64_t len, uint32_t job, bool atomic) const;
  // Window id registered under `rkey`, or -1.
  int window_of_rkey(uint32_t rkey) const;
  // Host pointer for a checked access.
  uint8_t* translate(uint32_t rkey, uint64_t va) const;

 private:
  int endpoint_;
  std::map<uint16_t, WindowInfo> windows_;
  std::map<uint32_t, uint16_t> by_rkey_;
  struct Unmap {
    uint64_t size = 0;
    void operator()(uint8_t* p) const;
  };
  std::map<uint16_t, std::unique_ptr<uint8_t, Unmap>> owned_;
  std::vector<std::unique_ptr<uint8_t, Unmap>> spare_;  // freed mappings kept for reuse, the oldest first
  uint64_t spare_limit_ = 0;
  uint64_t spare_bytes_ = 0;
  uint64_t reused_ = 0;
  // A kept mapping of `size` bytes up to twice that (the smallest), taken out of spare_; null when none.
  std::unique_ptr<uint8_t, Unmap> take_spare(uint64_t size);
};

}  // namespace ifec::endpoint
