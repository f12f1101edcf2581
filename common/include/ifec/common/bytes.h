// Little-endian byte messages between the processes of one simulation (frames crossing MPI processes, control
// calls as messages): a writer that appends fixed-width fields and strings, and a reader that bounds-checks every
// field, so a truncated or garbled message is an Error naming what it lacked, never a read past its end.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ifec/common/checks.h"

namespace ifec::common {

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>& out) : out_(out) {}
  template <typename T>
  ByteWriter& put(T v) {  // an integer, a bool or a double, its bytes as stored (little-endian here)
    static_assert(std::is_arithmetic_v<T>, "put() takes numbers");
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &v, sizeof(T));
    return *this;
  }
  ByteWriter& bytes(const void* p, size_t n) {  // a u32 length, then the bytes
    put<uint32_t>(static_cast<uint32_t>(n));
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
    return *this;
  }
  ByteWriter& str(const std::string& s) { return bytes(s.data(), s.size()); }

 private:
  std::vector<uint8_t>& out_;
};

class ByteReader {
 public:
  // `what` names the message in errors ("control request", "frames from rank 1").
  ByteReader(const uint8_t* p, size_t n, std::string what) : p_(p), n_(n), what_(std::move(what)) {}
  template <typename T>
  T get(const char* field) {
    static_assert(std::is_arithmetic_v<T>, "get() takes numbers");
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, p_ + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  std::vector<uint8_t> bytes(const char* field) {
    const uint32_t n = get<uint32_t>(field);
    need(n, field);
    std::vector<uint8_t> v(p_ + at_, p_ + at_ + n);
    at_ += n;
    return v;
  }
  std::string str(const char* field) {
    const std::vector<uint8_t> v = bytes(field);
    return std::string(v.begin(), v.end());
  }
  bool done() const { return at_ == n_; }
  size_t offset() const { return at_; }
  // Throws unless every byte was read.
  void expect_end() const { IFEC_CHECK(at_ == n_, what_ << ": " << n_ - at_ << " trailing bytes after byte " << at_); }

 private:
  void need(size_t k, const char* field) const {
    IFEC_CHECK(k <= n_ - at_, what_ << ": truncated at byte " << at_ << " of " << n_ << " (reading " << field << ", "
                                    << k << " bytes)");
  }
  const uint8_t* p_;
  size_t n_;
  size_t at_ = 0;
  std::string what_;
};

}  // namespace ifec::common
