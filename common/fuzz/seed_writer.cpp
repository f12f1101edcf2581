// Writes the sample frames into a libFuzzer corpus directory as seeds (one file per frame kind).
#include <cstdio>
#include <string>

#include "ifec/common/samples.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seed_writer DIR\n");
    return 2;
  }
  for (const auto& s : ifec::common::sample_frames()) {
    const std::string path = std::string(argv[1]) + "/seed_" + s.name;
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) {
      std::perror(path.c_str());
      return 1;
    }
    std::fwrite(s.bytes.data(), 1, s.bytes.size(), f);
    std::fclose(f);
  }
  return 0;
}
