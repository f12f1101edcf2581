#include "ifec/common/files.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "ifec/common/checks.h"

namespace ifec::common {

std::string read_regular_file(const std::string& path, const std::string& what) {
  const size_t nul = path.find('\0');
  IFEC_CHECK(nul == std::string::npos,
             "'" << path.substr(0, nul) << "\\0...': a path with a NUL byte, expected a " << what);
  struct stat st {};
  IFEC_CHECK(::stat(path.c_str(), &st) == 0, path << ": cannot open the " << what << ": " << std::strerror(errno));
  IFEC_CHECK(S_ISREG(st.st_mode), path << ": is " << (S_ISDIR(st.st_mode) ? "a directory" : "not a regular file")
                                       << ", expected a " << what);
  std::ifstream in(path, std::ios::binary);
  IFEC_CHECK(in.good(), path << ": cannot open the " << what << ": " << std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  IFEC_CHECK(!in.bad(), path << ": cannot read the " << what << ": " << std::strerror(errno));
  return text.str();
}

}  // namespace ifec::common
