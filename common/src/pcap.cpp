// pcap file writer (classic format, nanosecond magic).
#include "ifec/common/pcap.h"

#include <cerrno>
#include <cstring>

#include "ifec/common/checks.h"

namespace ifec::common {

namespace {

// pcap headers are host-endian by definition; readers detect byte order from the magic.
template <typename T>
void put(std::FILE* f, T v) {
  std::fwrite(&v, sizeof(v), 1, f);
}

}  // namespace

PcapWriter::PcapWriter(const std::string& path, uint32_t snaplen) : path_(path), snaplen_(snaplen) {
  file_ = std::fopen(path.c_str(), "wb");
  IFEC_CHECK(file_ != nullptr, "cannot open pcap file '" << path << "' for writing: " << std::strerror(errno));
  put<uint32_t>(file_, kMagicNanoseconds);
  put<uint16_t>(file_, 2);  // version 2.4
  put<uint16_t>(file_, 4);
  put<int32_t>(file_, 0);   // thiszone
  put<uint32_t>(file_, 0);  // sigfigs
  put<uint32_t>(file_, snaplen_);
  put<uint32_t>(file_, kLinkTypeEthernet);
}

PcapWriter::~PcapWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
  }
}

void PcapWriter::write(uint64_t timestamp_ns, const uint8_t* frame, size_t len) {
  const uint32_t caplen = static_cast<uint32_t>(len < snaplen_ ? len : snaplen_);
  put<uint32_t>(file_, static_cast<uint32_t>(timestamp_ns / 1000000000ULL));
  put<uint32_t>(file_, static_cast<uint32_t>(timestamp_ns % 1000000000ULL));
  put<uint32_t>(file_, caplen);
  put<uint32_t>(file_, static_cast<uint32_t>(len));
  IFEC_CHECK(std::fwrite(frame, 1, caplen, file_) == caplen, "short write to pcap file '" << path_ << "'");
  ++frames_;
}

}  // namespace ifec::common
