// A set of byte ranges [begin, end) kept merged: what landed in a receive buffer, counted once however often the
// same bytes arrive (a multicast replica and a fallback store of the same row, a retransmitted packet).
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <utility>
#include <vector>

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

// The count a RangeSet gives, for a buffer whose expected ranges (a batch's rows) are known up front: an arrival is
// found by binary search among them and merged into its range's pieces (a row's few packets), and a range that is
// complete forgets its pieces. One contiguous array instead of a tree node per row walked on every packet (30 K rows
// per rank of an EP 256 MoE layer). Bytes outside every expected range are counted too, in a RangeSet of their own.
class ExpectedRanges {
 public:
  ExpectedRanges() = default;
  // (offset, length) pairs in any order; overlapping ones are merged (touching ones stay apart).
  explicit ExpectedRanges(std::vector<std::pair<uint64_t, uint64_t>> ranges) {
    std::sort(ranges.begin(), ranges.end());
    for (const auto& [begin, len] : ranges) {
      if (len == 0) {
        continue;
      }
      if (!ranges_.empty() && begin < ranges_.back().end) {
        ranges_.back().end = std::max(ranges_.back().end, begin + len);
        continue;
      }
      ranges_.push_back({begin, begin + len, 0, {}});
    }
  }
  // Adds [begin, begin + len); returns how many of those bytes were not in the set before.
  uint64_t insert(uint64_t begin, uint64_t len) {
    const uint64_t end = begin + len;
    uint64_t added = 0;
    auto it =
        std::upper_bound(ranges_.begin(), ranges_.end(), begin, [](uint64_t b, const Range& r) { return b < r.end; });
    while (begin < end) {
      if (it == ranges_.end() || it->begin >= end) {
        added += stray_.insert(begin, end - begin);
        break;
      }
      if (begin < it->begin) {
        added += stray_.insert(begin, it->begin - begin);
        begin = it->begin;
      }
      const uint64_t to = std::min(end, it->end);
      added += it->add(begin, to);
      begin = to;
      ++it;
    }
    total_ += added;
    return added;
  }
  uint64_t bytes() const { return total_; }

 private:
  struct Range {
    uint64_t begin = 0;
    uint64_t end = 0;
    uint64_t got = 0;
    std::vector<std::pair<uint64_t, uint64_t>> pieces;  // landed [b, e), sorted, disjoint, not touching
    // Merges [b, e) (inside the range) into the pieces; returns the bytes it added.
    uint64_t add(uint64_t b, uint64_t e) {
      if (got == end - begin) {
        return 0;
      }
      uint64_t covered = 0;
      auto p = std::lower_bound(pieces.begin(), pieces.end(), b,
                                [](const std::pair<uint64_t, uint64_t>& x, uint64_t v) { return x.second < v; });
      auto q = p;
      uint64_t nb = b;
      uint64_t ne = e;
      for (; q != pieces.end() && q->first <= e; ++q) {
        covered += std::min(e, q->second) - std::max(b, q->first);
        nb = std::min(nb, q->first);
        ne = std::max(ne, q->second);
      }
      p = pieces.erase(p, q);
      pieces.insert(p, {nb, ne});
      got += (e - b) - covered;
      if (got == end - begin) {
        std::vector<std::pair<uint64_t, uint64_t>>().swap(pieces);
      }
      return (e - b) - covered;
    }
  };
  std::vector<Range> ranges_;  // sorted, disjoint
  RangeSet stray_;
  uint64_t total_ = 0;
};

}  // namespace ifec::common
