// Little-endian byte messages between the processes of one simulation (control calls, frames crossing MPI
// processes): a writer of fixed-width fields, strings and blobs, and a reader that names every field it reads and
// bounds-checks it, so a truncated or garbled message is an Error saying where and what, never a read past its end.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "ifec/common/checks.h"

namespace ifec::common {

class ByteWriter {
 public:
  void u8(uint8_t v) { bytes_.push_back(v); }
  void u16(uint16_t v) { put(v, 2); }
  void u32(uint32_t v) { put(v, 4); }
  void u64(uint64_t v) { put(v, 8); }
  void i32(int32_t v) { u32(static_cast<uint32_t>(v)); }
  void boolean(bool v) { u8(v ? 1 : 0); }
  void f64(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    u64(bits);
  }
  void str(const std::string& s) {
    IFEC_CHECK(s.size() <= UINT32_MAX, "byte message: a string of " << s.size() << " bytes");
    u32(static_cast<uint32_t>(s.size()));
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  void blob(const std::vector<uint8_t>& b) {  // a u32 length, then the bytes
    IFEC_CHECK(b.size() <= UINT32_MAX, "byte message: a blob of " << b.size() << " bytes");
    u32(static_cast<uint32_t>(b.size()));
    bytes_.insert(bytes_.end(), b.begin(), b.end());
  }
  std::vector<uint8_t> take() { return std::move(bytes_); }
  void reserve(size_t bytes) { bytes_.reserve(bytes); }  // a message of known size written without regrowing
  size_t size() const { return bytes_.size(); }

 private:
  void put(uint64_t v, int n) {
    uint8_t le[8];
    for (int i = 0; i < n; ++i) {
      le[i] = static_cast<uint8_t>(v >> (8 * i));
    }
    bytes_.insert(bytes_.end(), le, le + n);
  }
  std::vector<uint8_t> bytes_;
};

// Every read names its field, so an error says where a message went wrong and what was being read there.
class ByteReader {
 public:
  // `what` names the message in errors ("control request", "window from rank 1"); `msg` outlives the reader.
  ByteReader(const std::vector<uint8_t>& msg, std::string what) : msg_(msg), what_(std::move(what)) {}
  const char* what() const { return what_.c_str(); }
  size_t pos() const { return pos_; }

  uint8_t u8(const char* field) { return static_cast<uint8_t>(get(1, field)); }
  uint16_t u16(const char* field) { return static_cast<uint16_t>(get(2, field)); }
  uint32_t u32(const char* field) { return static_cast<uint32_t>(get(4, field)); }
  uint64_t u64(const char* field) { return get(8, field); }
  int32_t i32(const char* field) { return static_cast<int32_t>(u32(field)); }
  bool boolean(const char* field) {
    const size_t at = pos_;
    const uint8_t b = u8(field);
    IFEC_CHECK(b <= 1, what_ << ": " << field << " at byte " << at << " is " << int{b} << ", not a bool (0 or 1)");
    return b == 1;
  }
  double f64(const char* field) {
    const uint64_t bits = u64(field);
    double v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  std::vector<uint8_t> blob(const char* field) {
    const uint32_t n = u32(field);
    need(n, field);
    std::vector<uint8_t> b(msg_.begin() + pos_, msg_.begin() + pos_ + n);
    pos_ += n;
    return b;
  }
  std::string str(const char* field) {
    const uint32_t n = u32(field);
    need(n, field);
    std::string s(msg_.begin() + pos_, msg_.begin() + pos_ + n);
    pos_ += n;
    return s;
  }
  // An element count, checked against the bytes left (elements of at least `min_bytes` each) before anything is
  // allocated for it: a garbage count fails here instead of reserving gigabytes.
  uint32_t count(const char* field, size_t min_bytes) {
    const size_t at = pos_;
    const uint32_t n = u32(field);
    IFEC_CHECK(n * min_bytes <= left(), what_ << ": " << field << " count " << n << " at byte " << at << " needs "
                                              << n * min_bytes << " bytes or more, " << left() << " left");
    return n;
  }
  void end(const std::string& of) {
    IFEC_CHECK(left() == 0, what_ << ": " << left() << " trailing bytes after byte " << pos_ << " (the end of " << of
                                  << ", " << msg_.size() << " bytes in all)");
  }

 private:
  size_t left() const { return msg_.size() - pos_; }
  void need(size_t n, const char* field) {
    IFEC_CHECK(n <= left(), what_ << ": truncated at byte " << pos_ << " reading " << field << " (" << n << " bytes, "
                                  << left() << " left)");
  }
  uint64_t get(size_t n, const char* field) {
    need(n, field);
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) {
      v |= uint64_t{msg_[pos_ + i]} << (8 * i);
    }
    pos_ += n;
    return v;
  }

  const std::vector<uint8_t>& msg_;
  std::string what_;
  size_t pos_ = 0;
};

}  // namespace ifec::common
