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
  // A snaplen of 0 would cut every record to nothing: a capture of empty frames.
  IFEC_CHECK(snaplen > 0, "pcap file '" << path << "': snaplen 0, expected 1 or more bytes per record");
  file_ = std::fopen(path.c_str(), "wb");
  IFEC_CHECK(file_ != nullptr, "cannot open pcap file '" << path << "' for writing: " << std::strerror(errno));
  put<uint32_t>(file_, kMagicNanoseconds);
  put<uint16_t>(file_, 2);  // version 2.4
  put<uint16_t>(file_, 4);
  put<int32_t>(file_, 0);   // thiszone
  put<uint32_t>(file_, 0);  // sigfigs
  put<uint32_t>(file_, snaplen_);
  put<uint32_t>(file_, kLinkTypeEthernet);
  const int err = flushed();
  if (err != 0) {  // the destructor does not run for a throwing constructor
    std::fclose(file_);
    IFEC_FAIL("cannot write pcap file '" << path << "': " << std::strerror(err));
  }
}

PcapWriter::~PcapWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
  }
}

int PcapWriter::flushed() {
  errno = 0;
  const bool ok = std::fflush(file_) == 0 && std::ferror(file_) == 0;
  return ok ? 0 : (errno != 0 ? errno : EIO);
}

void PcapWriter::write(uint64_t timestamp_ns, const uint8_t* frame, size_t len) {
  IFEC_CHECK(len <= UINT32_MAX, "pcap file '" << path_ << "': a frame of " << len << " bytes, above 2^32 - 1");
  const uint32_t caplen = static_cast<uint32_t>(len < snaplen_ ? len : snaplen_);
  put<uint32_t>(file_, static_cast<uint32_t>(timestamp_ns / 1000000000ULL));
  put<uint32_t>(file_, static_cast<uint32_t>(timestamp_ns % 1000000000ULL));
  put<uint32_t>(file_, caplen);
  put<uint32_t>(file_, static_cast<uint32_t>(len));
  std::fwrite(frame, 1, caplen, file_);
  // Each record reaches the file as it is written: a full disk fails the write that met it, not a silent close.
  const int err = flushed();
  IFEC_CHECK(err == 0,
             "short write to pcap file '" << path_ << "' at frame " << frames_ + 1 << ": " << std::strerror(err));
  ++frames_;
}

}  // namespace ifec::common
