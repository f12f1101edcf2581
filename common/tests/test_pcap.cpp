// pcap writer: global header and record layout read back byte by byte.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <vector>

#include "ifec/common/checks.h"
#include "ifec/common/pcap.h"

using namespace ifec::common;

namespace {

uint32_t le32(const std::vector<uint8_t>& v, size_t off) {
  return uint32_t{v[off]} | (uint32_t{v[off + 1]} << 8) | (uint32_t{v[off + 2]} << 16) | (uint32_t{v[off + 3]} << 24);
}

}  // namespace

TEST(PcapWriter, WritesHeaderAndRecords) {
  const std::string path = testing::TempDir() + "/ifec_test_pcap.pcap";
  {
    PcapWriter w(path);
    w.write(1'500'000'123ULL, std::vector<uint8_t>{1, 2, 3});
    w.write(2'000'000'000ULL, std::vector<uint8_t>(70, 0xAB));
    EXPECT_EQ(w.frames_written(), 2u);
  }
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> v((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(v.size(), 24u + 16 + 3 + 16 + 70);
  EXPECT_EQ(le32(v, 0), PcapWriter::kMagicNanoseconds);
  EXPECT_EQ(le32(v, 20), 1u) << "LINKTYPE_ETHERNET";
  EXPECT_EQ(le32(v, 24), 1u) << "seconds";
  EXPECT_EQ(le32(v, 28), 500'000'123u) << "nanoseconds";
  EXPECT_EQ(le32(v, 32), 3u) << "caplen";
  EXPECT_EQ(v[40], 1);
  EXPECT_EQ(le32(v, 43), 2u);
  EXPECT_EQ(le32(v, 47), 0u);
  EXPECT_EQ(le32(v, 51), 70u);
  std::remove(path.c_str());
}

TEST(PcapWriter, UnwritablePathNamesThePath) {
  try {
    PcapWriter w("/nonexistent-dir/x.pcap");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/x.pcap"), std::string::npos) << e.what();
  }
}

TEST(PcapWriter, SnaplenZeroIsRefusedNamingIt) {
  const std::string path = testing::TempDir() + "/ifec_test_snaplen0.pcap";
  try {
    PcapWriter w(path, 0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("snaplen 0"), std::string::npos) << e.what();
  }
}

TEST(PcapWriter, AFullDeviceFailsAtOpenNamingThePath) {
  if (access("/dev/full", W_OK) != 0) {
    GTEST_SKIP() << "no writable /dev/full here";
  }
  try {
    PcapWriter w("/dev/full");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'/dev/full'"), std::string::npos) << e.what();
  }
}

namespace {

// Writes two 40-byte frames under a file size limit of 100 bytes (the header and the first fit); exits 3 with the
// error of the second write, 0 when it was taken.
[[noreturn]] void write_past_a_size_limit(const std::string& path) {
  std::signal(SIGXFSZ, SIG_IGN);
  const rlimit limit{100, 100};
  setrlimit(RLIMIT_FSIZE, &limit);
  PcapWriter w(path);
  w.write(0, std::vector<uint8_t>(40, 1));
  try {
    w.write(1, std::vector<uint8_t>(40, 2));
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::exit(3);
  }
  std::exit(0);
}

}  // namespace

// A disk that fills up mid-capture: the write that met it throws, naming the file and the frame; the file used to be
// cut short at close, silently.
TEST(PcapWriter, AFileCutShortFailsTheWriteThatMetIt) {
  const std::string path = testing::TempDir() + "/ifec_test_pcap_limit.pcap";
  EXPECT_EXIT(write_past_a_size_limit(path), testing::ExitedWithCode(3),
              "short write to pcap file '.*ifec_test_pcap_limit.pcap' at frame 2");
  std::remove(path.c_str());
}
