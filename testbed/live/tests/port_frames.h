// The frames the port tests and the port bench send: a RoCEv2 WRITE ONLY (or, with `ech`, a standard-ECH frame)
// from `src` to `dst`, its payload a pattern that `seq` shifts (and its PSN).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ifec/common/frame.h"

namespace ifec::live::testing {

inline std::vector<uint8_t> roce_frame(const uint8_t* src, const uint8_t* dst, bool ech, size_t payload,
                                       uint32_t seq = 0) {
  common::FrameHeaders h;
  std::copy(src, src + 6, h.eth.src.begin());
  std::copy(dst, dst + 6, h.eth.dst.begin());
  h.ip.src = 0x0A000001;
  h.ip.dst = 0x0A000002;
  h.udp.src_port = 0xC001;
  h.bth.opcode = static_cast<uint8_t>(common::Opcode::kWriteOnly);
  h.bth.dest_qp = 0x102;
  h.bth.psn = seq & 0xFFFFFF;
  h.reth = common::Reth{0x1000, 7, static_cast<uint32_t>(payload)};
  if (ech) {
    common::Ech e;
    e.format = common::EchFormat::kStandard;
    e.op = common::EchOp::kAllReduce;
    e.element_count = static_cast<uint32_t>(payload / 4);
    h.ech = e;
  }
  std::vector<uint8_t> data(payload);
  for (size_t i = 0; i < payload; ++i) {
    data[i] = static_cast<uint8_t>(i * 13 + seq);
  }
  return common::encode_frame(h, data.data(), data.size());
}

}  // namespace ifec::live::testing
