// A set of byte ranges [begin, end) kept merged: what landed in a receive buffer, counted once however often the
// same bytes arrive (a multicast replica and a fallback store of the same row, a retransmitted packet).
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>

namespace ifec::common {

class RangeSet {
 public:
  // Adds [begin, begin + len); returns how many of those bytes were not in the set before.
  uint64_t insert(uint64_t begin, uint64_t len) {
    if (len == 0) {
      return 0;
    }
    uint64_t end = begin + len;
    uint64_t covered = 0;
    auto it = ranges_.upper_bound(begin);
    if (it != ranges_.begin() && std::prev(it)->second >= begin) {
      --it;
    }
    while (it != ranges_.end() && it->first <= end) {
      covered += std::min(end, it->second) - std::max(begin, it->first);
      begin = std::min(begin, it->first);
      end = std::max(end, it->second);
      it = ranges_.erase(it);
    }
    ranges_[begin] = end;
    total_ += len - covered;
    return len - covered;
  }
  uint64_t bytes() const { return total_; }
  // True when every byte of [begin, begin + len) is in the set.
  bool contains(uint64_t begin, uint64_t len) const {
    auto it = ranges_.upper_bound(begin);
    return it != ranges_.begin() && std::prev(it)->second >= begin + len;
  }
  void clear() {
    ranges_.clear();
    total_ = 0;
  }

 private:
  std::map<uint64_t, uint64_t> ranges_;  // begin -> end, disjoint and not touching
  uint64_t total_ = 0;
};

}  // namespace ifec::common
