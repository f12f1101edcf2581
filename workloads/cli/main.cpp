// ifec-cli: the native program behind `./ifec pcap|decode|...`; one subcommand per function, errors to stderr.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "ifec/common/checks.h"
#include "ifec/common/frame.h"
#include "ifec/common/samples.h"

namespace {

int usage(std::FILE* to) {
  std::fprintf(to,
               "usage: ifec-cli <command> [args]\n"
               "  pcap FILE      write one frame of every kind (RoCEv2 RC operations, ACK/NAK, compact and\n"
               "                 standard ECH) to FILE as pcap\n"
               "  frames         list the sample frames with their sizes and decoded headers\n");
  return 2;
}

int cmd_pcap(int argc, char** argv) {
  if (argc != 1) {
    std::fprintf(stderr, "ifec-cli pcap: expected exactly one FILE argument, got %d\n", argc);
    return 2;
  }
  const size_t n = ifec::common::write_sample_pcap(argv[0]);
  std::printf("wrote %zu frames to %s\n", n, argv[0]);
  return 0;
}

int cmd_frames() {
  using namespace ifec::common;
  std::printf("%-26s %6s  %-26s %8s %8s %s\n", "sample", "bytes", "opcode", "dest_qp", "psn", "ech");
  for (const auto& s : sample_frames()) {
    ParsedFrame pf;
    WireStatus st = parse_frame(s.bytes.data(), s.bytes.size(), &pf);
    if (!st.ok()) {
      std::fprintf(stderr, "sample %s does not parse: %s\n", s.name.c_str(), st.message().c_str());
      return 1;
    }
    std::string ech = "-";
    if (pf.h.ech) {
      ech = std::string(pf.h.ech->format == EchFormat::kCompact ? "compact " : "standard ") + ech_op_name(pf.h.ech->op);
    }
    std::printf("%-26s %6zu  %-26s %#8x %8u %s\n", s.name.c_str(), s.bytes.size(), opcode_name(pf.h.bth.opcode),
                pf.h.bth.dest_qp, pf.h.bth.psn, ech.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    return usage(stderr);
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "pcap") {
      return cmd_pcap(argc - 2, argv + 2);
    }
    if (cmd == "frames") {
      return cmd_frames();
    }
    if (cmd == "help" || cmd == "--help" || cmd == "-h") {
      usage(stdout);
      return 0;
    }
  } catch (const ifec::common::Error& e) {
    std::fprintf(stderr, "ifec-cli %s: %s\n", cmd.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "ifec-cli: unknown command '%s'\n", cmd.c_str());
  return usage(stderr);
}
