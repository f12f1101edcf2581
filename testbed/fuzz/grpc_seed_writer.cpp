// Writes seeds for fuzz_grpc: every unary rpc of both services with an empty request and with a typical one (the
// record format is fuzz_grpc.cpp's: [service][method][target][flags][request bytes]).
#include <cstdio>
#include <string>

#include "ifec/v1/control.pb.h"

namespace {

namespace pb = google::protobuf;
using namespace ifec;

// A typical request of `type`: the fields the daemons read, set to values they accept.
std::string typical(const std::string& type) {
  if (type == "ifec.v1.SetLossRequest") {
    v1::SetLossRequest r;
    r.set_port(1);
    r.set_probability(0.25);
    return r.SerializeAsString();
  }
  if (type == "ifec.v1.SetLinkRequest") {
    v1::SetLinkRequest r;
    r.set_port(0);
    r.set_up(true);
    return r.SerializeAsString();
  }
  if (type == "ifec.v1.ReadWindowRequest") {
    v1::ReadWindowRequest r;
    r.set_window(1);
    r.set_length(64);
    return r.SerializeAsString();
  }
  if (type == "ifec.v1.FareWeightsRequest") {
    v1::FareWeightsRequest r;
    r.set_dest_gpu(1);
    return r.SerializeAsString();
  }
  if (type == "ifec.v1.RunRequest") {
    v1::RunRequest r;
    r.set_what("allreduce");
    r.set_algo("ifec");
    r.set_bytes(4096);
    r.set_dtype("fp32");
    r.set_op("sum");
    return r.SerializeAsString();
  }
  if (type == "ifec.v1.GroupReservation") {
    v1::GroupReservation r;
    r.set_job(1);
    r.set_group(7);
    r.set_slots(4);
    return r.SerializeAsString();
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_grpc_seeds DIR\n");
    return 2;
  }
  const pb::FileDescriptor* f = v1::Empty::descriptor()->file();
  int n = 0;
  for (int s = 0; s < 2; ++s) {
    const pb::ServiceDescriptor* svc = f->FindServiceByName(s == 0 ? "Switch" : "Host");
    int unary = 0;
    for (int m = 0; m < svc->method_count(); ++m) {
      if (svc->method(m)->server_streaming()) {
        continue;
      }
      for (const std::string& body : {std::string(), typical(svc->method(m)->input_type()->full_name())}) {
        std::string rec = {static_cast<char>(s), static_cast<char>(unary), 0, 1};
        rec += body;
        const std::string path = std::string(argv[1]) + "/seed-" + std::to_string(n++);
        std::FILE* out = std::fopen(path.c_str(), "wb");
        if (out == nullptr) {
          std::perror(path.c_str());
          return 1;
        }
        std::fwrite(rec.data(), 1, rec.size(), out);
        std::fclose(out);
      }
      ++unary;
    }
  }
  // Oversized: a 64 KiB request to each service (a switch's Reserve, a hostd's Run with caller data).
  for (int s = 0; s < 2; ++s) {
    std::string rec = {static_cast<char>(s), 1, 0, 0};
    rec += std::string(64 << 10, '\x0a');
    const std::string path = std::string(argv[1]) + "/seed-" + std::to_string(n++);
    if (std::FILE* out = std::fopen(path.c_str(), "wb")) {
      std::fwrite(rec.data(), 1, rec.size(), out);
      std::fclose(out);
    }
  }
  std::printf("fuzz_grpc_seeds: %d seeds in %s\n", n, argv[1]);
  return 0;
}
