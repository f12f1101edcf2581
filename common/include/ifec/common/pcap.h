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

  // Opens (truncates) `path` and writes the global header; throws ifec::common::Error naming the path when it
  // cannot, or when snaplen is 0.
  explicit PcapWriter(const std::string& path, uint32_t snaplen = 65535);
  ~PcapWriter();
  PcapWriter(const PcapWriter&) = delete;
  PcapWriter& operator=(const PcapWriter&) = delete;

  // Appends one record and flushes it; throws naming the path and the frame when the file takes less (disk full).
  void write(uint64_t timestamp_ns, const uint8_t* frame, size_t len);
  void write(uint64_t timestamp_ns, const std::vector<uint8_t>& frame) {
    write(timestamp_ns, frame.data(), frame.size());
  }
  size_t frames_written() const { return frames_; }

 private:
  int flushed();  // 0 once everything written so far is in the file, else the errno of the failure

  std::FILE* file_ = nullptr;
  std::string path_;
  uint32_t snaplen_;
  size_t frames_ = 0;
};

}  // namespace ifec::common
