// The switch's FIB index: destination /32 -> route slot, an open-addressing table of 8-byte slots (a switch of a
// 16,384-GPU fabric holds a route for every GPU: a node-based hash map would take five times the memory and a
// pointer chase per frame).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ifec::switchemu {

class IpMap {
 public:
  // The value of `ip`, or -1.
  int32_t find(uint32_t ip) const {
    if (slots_.empty()) {
      return -1;
    }
    for (size_t i = hash(ip) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.value == kEmpty) {
        return -1;
      }
      if (s.value >= 0 && s.ip == ip) {
        return s.value;
      }
    }
  }
  // Sets `ip` to `value` (>= 0); returns the value it had, or -1.
  int32_t set(uint32_t ip, int32_t value) {
    if ((used_ + 1) * 2 > slots_.size()) {
      grow();
    }
    size_t free = SIZE_MAX;
    for (size_t i = hash(ip) & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.value >= 0 && s.ip == ip) {
        const int32_t old = s.value;
        s.value = value;
        return old;
      }
      if (s.value == kErased && free == SIZE_MAX) {
        free = i;
      }
      if (s.value == kEmpty) {
        if (free == SIZE_MAX) {
          free = i;
          ++used_;
        }
        slots_[free] = Slot{ip, value};
        ++size_;
        return -1;
      }
    }
  }
  // Removes `ip`; returns the value it had, or -1.
  int32_t erase(uint32_t ip) {
    for (size_t i = slots_.empty() ? 0 : hash(ip) & mask_; !slots_.empty(); i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.value == kEmpty) {
        break;
      }
      if (s.value >= 0 && s.ip == ip) {
        const int32_t old = s.value;
        s.value = kErased;
        --size_;
        return old;
      }
    }
    return -1;
  }
  size_t size() const { return size_; }
  size_t memory_bytes() const { return slots_.capacity() * sizeof(Slot); }

 private:
  struct Slot {
    uint32_t ip = 0;
    int32_t value = kEmpty;
  };
  static constexpr int32_t kEmpty = -1;
  static constexpr int32_t kErased = -2;  // a tombstone: lookups go on past it

  static size_t hash(uint32_t ip) { return static_cast<size_t>((uint64_t{ip} * 0x9E3779B97F4A7C15ULL) >> 32); }

  // Doubles the table (or rebuilds it at its size when tombstones filled it), keeping every live entry.
  void grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    const size_t n = size_ * 4 > old.size() ? std::max<size_t>(16, old.size() * 2) : std::max<size_t>(16, old.size());
    slots_.assign(n, Slot{});
    mask_ = n - 1;
    used_ = 0;
    size_ = 0;
    for (const Slot& s : old) {
      if (s.value >= 0) {
        set(s.ip, s.value);
      }
    }
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t used_ = 0;  // slots ever filled since the last rebuild (live + tombstones)
  size_t size_ = 0;  // live entries
};

}  // namespace ifec::switchemu
