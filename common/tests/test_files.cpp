#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "ifec/common/checks.h"
#include "ifec/common/files.h"

namespace ifec::common {
namespace {

std::string error_of(const std::string& path) {
  try {
    read_regular_file(path, "test file");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ReadRegularFile, ReadsEveryByteOfAFile) {
  char name[] = "/tmp/ifec_files_XXXXXX";
  const int fd = ::mkstemp(name);
  ASSERT_GE(fd, 0);
  ::close(fd);
  const std::string bytes("a\0b\nc", 5);
  std::ofstream(name, std::ios::binary) << bytes;
  EXPECT_EQ(read_regular_file(name, "test file"), bytes);
  std::remove(name);
}

TEST(ReadRegularFile, NamesThePathAndWhatIsWrongWithIt) {
  EXPECT_EQ(error_of("/tmp"), "/tmp: is a directory, expected a test file");
  EXPECT_EQ(error_of("/dev/null"), "/dev/null: is not a regular file, expected a test file");
  EXPECT_EQ(error_of("/nonexistent/x.yaml"),
            "/nonexistent/x.yaml: cannot open the test file: No such file or directory");
  EXPECT_EQ(error_of(std::string("a\0b", 3)), "'a\\0...': a path with a NUL byte, expected a test file");
}

}  // namespace
}  // namespace ifec::common
