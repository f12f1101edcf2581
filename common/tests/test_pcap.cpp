// pcap writer: global header and record layout read back byte by byte.
#include <gtest/gtest.h>

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
