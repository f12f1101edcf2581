// Example frames of every kind: the RC operations a store/load/atomic produces, their ACKs, and both ECH formats.
#include "ifec/common/samples.h"

#include <utility>

#include "ifec/common/pcap.h"
#include "ifec/common/protocol.h"

namespace ifec::common {

namespace {

FrameHeaders base_headers(uint8_t opcode, uint32_t dest_qp, uint32_t psn) {
  FrameHeaders h;
  h.eth.src = {0x02, 0x00, 0x00, 0x00, 0x00, 0x01};
  h.eth.dst = {0x02, 0x00, 0x00, 0x00, 0x00, 0x02};
  h.ip.src = 0x0A000001;  // 10.0.0.1: GPU 1's loopback
  h.ip.dst = 0x0A000002;
  h.ip.dscp = kRoceDscp;
  h.ip.ecn = 2;  // ECT(0)
  h.ip.identification = static_cast<uint16_t>(psn);
  h.udp.src_port = static_cast<uint16_t>(0xC000 | (dest_qp & 0x3FFF));
  h.bth.opcode = opcode;
  h.bth.dest_qp = dest_qp;
  h.bth.psn = psn;
  return h;
}

// Responder-to-requester frames (ACKs, READ responses, AtomicAcks) travel from 10.0.0.2 back to 10.0.0.1.
FrameHeaders reply_headers(uint8_t opcode, uint32_t dest_qp, uint32_t psn) {
  FrameHeaders h = base_headers(opcode, dest_qp, psn);
  std::swap(h.eth.src, h.eth.dst);
  std::swap(h.ip.src, h.ip.dst);
  return h;
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = static_cast<uint8_t>(seed + i * 7);
  }
  return v;
}

SampleFrame make(std::string name, FrameHeaders h, std::vector<uint8_t> payload) {
  SampleFrame s{std::move(name), std::move(h), std::move(payload), {}};
  s.bytes = encode_frame(s.headers, s.payload.data(), s.payload.size());
  return s;
}

uint8_t op(Opcode o) { return static_cast<uint8_t>(o); }

}  // namespace

std::vector<SampleFrame> sample_frames() {
  std::vector<SampleFrame> v;
  constexpr uint32_t kQp = 0x000123;
  constexpr uint64_t kVa = 0x00007F0012340000ULL;
  constexpr uint32_t kRkey = 0x00ABCDEF;
  constexpr size_t kMtu = 1024;

  // A 2.5 KiB store segmented at a 1024-byte MTU: FIRST (RETH) / MIDDLE / LAST.
  {
    FrameHeaders h = base_headers(op(Opcode::kWriteFirst), kQp, 100);
    h.reth = Reth{kVa, kRkey, 2 * kMtu + 512};
    v.push_back(make("rdma_write_first", h, pattern(kMtu, 1)));
    v.push_back(make("rdma_write_middle", base_headers(op(Opcode::kWriteMiddle), kQp, 101), pattern(kMtu, 2)));
    FrameHeaders last = base_headers(op(Opcode::kWriteLast), kQp, 102);
    last.bth.ack_req = true;
    v.push_back(make("rdma_write_last", last, pattern(512, 3)));
  }
  {
    FrameHeaders h = base_headers(op(Opcode::kWriteOnly), kQp, 103);
    h.reth = Reth{kVa + 0x1000, kRkey, 61};  // odd length: exercises pad count 3
    h.bth.ack_req = true;
    v.push_back(make("rdma_write_only", h, pattern(61, 4)));
  }
  {
    FrameHeaders h = base_headers(op(Opcode::kReadRequest), kQp, 104);
    h.reth = Reth{kVa + 0x2000, kRkey, 256};
    v.push_back(make("rdma_read_request", h, {}));
    FrameHeaders r = reply_headers(op(Opcode::kReadResponseOnly), 0x000456, 104);
    r.aeth = Aeth::ack(7);
    v.push_back(make("rdma_read_response_only", r, pattern(256, 5)));
  }
  {
    FrameHeaders h = base_headers(op(Opcode::kFetchAdd), kQp, 105);
    h.atomic = AtomicEth{kVa + 0x3000, kRkey, 5, 0};
    v.push_back(make("fetch_add", h, {}));
    FrameHeaders a = reply_headers(op(Opcode::kAtomicAcknowledge), 0x000456, 105);
    a.aeth = Aeth::ack(8);
    a.atomic_ack = AtomicAckEth{41};
    v.push_back(make("fetch_add_ack", a, {}));
  }
  {
    FrameHeaders h = base_headers(op(Opcode::kCompareSwap), kQp, 106);
    h.atomic = AtomicEth{kVa + 0x3008, kRkey, 0x1111222233334444ULL, 0x5555666677778888ULL};
    v.push_back(make("compare_swap", h, {}));
    FrameHeaders a = reply_headers(op(Opcode::kAtomicAcknowledge), 0x000456, 106);
    a.aeth = Aeth::ack(9);
    a.atomic_ack = AtomicAckEth{0x5555666677778888ULL};
    v.push_back(make("compare_swap_ack", a, {}));
  }
  {
    FrameHeaders h = reply_headers(op(Opcode::kAcknowledge), 0x000456, 103);
    h.aeth = Aeth::ack(6);
    v.push_back(make("ack", h, {}));
    FrameHeaders n = reply_headers(op(Opcode::kAcknowledge), 0x000456, 101);
    n.aeth = Aeth::nak(NakCode::kPsnSequenceError, 5);
    v.push_back(make("nak_psn_sequence_error", n, {}));
  }
  {
    // Compact ECH: one store multicast to endpoints 2, 5 and 63 through window 3, no reservation.
    FrameHeaders h = base_headers(op(Opcode::kWriteOnly), kQp, 107);
    Ech e;
    e.format = EchFormat::kCompact;
    e.op = EchOp::kMulticast;
    e.source_id = 1;
    e.window_id = 3;
    e.dest_bitmap = (1ULL << 2) | (1ULL << 5) | (1ULL << 63);
    h.ech = e;
    h.reth = Reth{0x8000, 0, 128};  // VA is an offset inside the window; the switch rewrites VA and rkey
    h.bth.ack_req = true;
    v.push_back(make("ech_compact_multicast", h, pattern(128, 6)));
  }
  {
    // Standard ECH: contributor 4's bf16 chunk 9 of an AllReduce (sum) in job 7, group 2.
    FrameHeaders h = base_headers(op(Opcode::kWriteOnly), kQp, 108);
    Ech e;
    e.format = EchFormat::kStandard;
    e.op = EchOp::kAllReduce;
    e.flags = ech_flags::kStrongOrdering;
    e.job_id = 7;
    e.group_id = 2;
    e.contributor_id = 4;
    e.chunk_index = 9;
    e.dtype = EchDtype::kBf16;
    e.redop = EchRedOp::kSum;
    e.element_count = 64;
    e.window_id = 1;
    h.ech = e;
    h.reth = Reth{9 * 128, 0, 128};
    h.bth.ack_req = true;
    v.push_back(make("ech_standard_allreduce", h, pattern(128, 7)));
  }
  {
    // Compact ECH v2: endpoint 300 multicasts to endpoints 256 and 263 (a bitmap based at 256).
    FrameHeaders h = base_headers(op(Opcode::kWriteOnly), kQp, 109);
    Ech e;
    e.format = EchFormat::kCompact;
    e.op = EchOp::kMulticast;
    e.source_id = 300;
    e.window_id = 3;
    e.bitmap_base = 256;
    e.dest_bitmap = (1ULL << 0) | (1ULL << 7);
    h.ech = e;
    h.reth = Reth{0x9000, 0, 128};
    h.bth.ack_req = true;
    v.push_back(make("ech_compact_v2_multicast", h, pattern(128, 8)));
  }
  return v;
}

size_t write_sample_pcap(const std::string& path) {
  PcapWriter w(path);
  uint64_t t = 1000;
  for (const auto& s : sample_frames()) {
    w.write(t, s.bytes);
    t += 1000;
  }
  return w.frames_written();
}

}  // namespace ifec::common
