// One example frame of every kind the project puts on the wire; feeds `./ifec pcap`, the tshark test and fuzz seeds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ifec/common/frame.h"

namespace ifec::common {

struct SampleFrame {
  std::string name;  // "rdma_write_first", "ech_compact_multicast", ...
  FrameHeaders headers;
  std::vector<uint8_t> payload;
  std::vector<uint8_t> bytes;  // encode_frame(headers, payload)
};

std::vector<SampleFrame> sample_frames();

// Writes sample_frames() to `path`, 1 us apart; returns how many frames were written.
size_t write_sample_pcap(const std::string& path);

}  // namespace ifec::common
