// Reading a whole input file (a topology, a GPU profile) with errors that name the path and what it should be.
#pragma once

#include <string>

namespace ifec::common {

// The bytes of the regular file at `path`. Throws common::Error naming the path and `what` ("topology YAML file")
// where the path holds a NUL byte, does not exist, is a directory or another non-file, or cannot be read.
std::string read_regular_file(const std::string& path, const std::string& what);

}  // namespace ifec::common
