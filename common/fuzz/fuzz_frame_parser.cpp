// libFuzzer target: parse_frame must return a status for any input, never crash or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "ifec/common/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ifec::common;
  // A fresh heap copy of exactly `size` bytes, so ASan flags any read past the end.
  std::vector<uint8_t> buf(data, data + size);
  ParsedFrame pf;
  ParseOptions strict;
  WireStatus st = parse_frame(buf.data(), buf.size(), &pf, strict);
  ParseOptions lax;
  lax.verify_icrc = false;  // reach the code behind the ICRC check too
  lax.verify_ip_checksum = false;
  WireStatus lax_st = parse_frame(buf.data(), buf.size(), &pf, lax);
  if (lax_st.ok()) {
    // Whatever was accepted must describe bytes inside the buffer and re-encode to the same length.
    if (pf.payload_offset + pf.payload_size > buf.size()) {
      std::abort();
    }
    std::vector<uint8_t> again = encode_frame(pf.h, buf.data() + pf.payload_offset, pf.payload_size);
    if (pf.h.ip.ihl == 5 && buf.size() >= 60 && again.size() != buf.size()) {
      std::abort();
    }
  }
  if (st.ok() && !lax_st.ok()) {
    std::abort();  // strict accepted what lax refused
  }
  return 0;
}
