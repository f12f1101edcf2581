// libFuzzer target: every parser of received bytes (parse_frame strict and lax, parse_l3, the PFC decoder) must
// return a status for any input, never crash or read out of bounds; what parses must re-encode consistently.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "ifec/common/frame.h"
#include "ifec/common/pfc.h"

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
  // The switch's fast path and its MAC-control branch read the same bytes first.
  L3View l3;
  const bool l3_ok = parse_l3(buf.data(), buf.size(), &l3).ok();
  if (st.ok() && (!l3_ok || l3.dst != pf.h.ip.dst)) {
    std::abort();  // a frame the full parser accepts must have the same L3 view
  }
  if (is_mac_control(buf.data(), buf.size())) {
    PfcFrame pfc;
    (void)PfcFrame::decode(buf.data(), buf.size(), &pfc);
  }
  return 0;
}
