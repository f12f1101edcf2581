// Minimal pcap writer (LINKTYPE_ETHERNET, nanosecond timestamps) for captures tshark and Wireshark read.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace ifec::common {

class PcapWriter {
 public:
  static constexpr uint32_t kMagicNanoseconds = 0xA1B23C4D;
  static constexpr uint32_t kLinkTypeEthernet = 1;

  // Opens (truncates) `path`; throws ifec::common::Error naming the path when it cannot.
  explicit PcapWriter(const std::string& path, uint32_t snaplen = 65535);
  ~PcapWriter();
  PcapWriter(const PcapWriter&) = delete;
  PcapWriter& operator=(const PcapWriter&) = delete;

  void write(uint64_t timestamp_ns, const uint8_t* frame, size_t len);
  void write(uint64_t timestamp_ns, const std::vector<uint8_t>& frame) {
    write(timestamp_ns, frame.data(), frame.size());
  }
  size_t frames_written() const { return frames_; }

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
  uint32_t snaplen_;
  size_t frames_ = 0;
};

}  // namespace ifec::common
