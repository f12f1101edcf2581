// Bytes for out-of-band exchanges (bootstrap allgathers: window keys, plans, outcome bitmaps): a writer that appends
// little-endian values and a reader that checks every read against the end, naming what it was reading.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "ifec/common/checks.h"

namespace ifec::common {

class BlobWriter {
 public:
  template <typename T>
  BlobWriter& put(T v) {
    static_assert(std::is_trivially_copyable_v<T>, "plain values only");
    const size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    std::memcpy(bytes_.data() + at, &v, sizeof(T));
    return *this;
  }
  template <typename T>
  BlobWriter& put_vector(const std::vector<T>& v) {
    put<uint64_t>(v.size());
    for (const T& x : v) {
      put(x);
    }
    return *this;
  }
  BlobWriter& put_string(const std::string& s) {
    put<uint64_t>(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  std::vector<uint8_t> take() { return std::move(bytes_); }

 private:
  std::vector<uint8_t> bytes_;
};

class BlobReader {
 public:
  BlobReader(const std::vector<uint8_t>& bytes, std::string what) : bytes_(bytes), what_(std::move(what)) {}
  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>, "plain values only");
    IFEC_CHECK(at_ + sizeof(T) <= bytes_.size(),
               what_ << ": truncated at byte " << at_ << " of " << bytes_.size() << " (needed " << sizeof(T) << ")");
    T v;
    std::memcpy(&v, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  template <typename T>
  std::vector<T> get_vector() {
    const uint64_t n = get<uint64_t>();
    IFEC_CHECK(n <= (bytes_.size() - at_) / sizeof(T), what_ << ": a list of " << n << " entries cannot fit");
    std::vector<T> v(n);
    for (T& x : v) {
      x = get<T>();
    }
    return v;
  }
  std::string get_string() {
    const uint64_t n = get<uint64_t>();
    IFEC_CHECK(n <= bytes_.size() - at_, what_ << ": a string of " << n << " bytes cannot fit");
    std::string s(reinterpret_cast<const char*>(bytes_.data()) + at_, n);
    at_ += n;
    return s;
  }
  // Steps over a list written by put_vector<T> without reading it; returns its length.
  template <typename T>
  uint64_t skip_vector() {
    const uint64_t n = get<uint64_t>();
    IFEC_CHECK(n <= (bytes_.size() - at_) / sizeof(T), what_ << ": a list of " << n << " entries cannot fit");
    at_ += n * sizeof(T);
    return n;
  }
  bool at_end() const { return at_ == bytes_.size(); }

 private:
  const std::vector<uint8_t>& bytes_;
  std::string what_;
  size_t at_ = 0;
};

}  // namespace ifec::common
