// Bindings for the shared lower layer: frame parsing, the ICRC, sample frames and pcap output.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "ifec/common/checks.h"
#include "ifec/common/frame.h"
#include "ifec/common/icrc.h"
#include "ifec/common/protocol.h"
#include "ifec/common/samples.h"
#include "register.h"

namespace py = pybind11;
using namespace ifec::common;

namespace ifec::bindings {

namespace {

// Parsed frame as a dict of plain values: Python tests compare it field by field against tshark.
py::dict parse(py::bytes frame) {
  std::string_view bytes = frame;
  ParsedFrame pf;
  WireStatus st = parse_frame(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &pf);
  if (!st.ok()) {
    throw py::value_error("frame rejected: " + st.message());
  }
  const FrameHeaders& h = pf.h;
  py::dict d;
  d["opcode"] = h.bth.opcode;
  d["opcode_name"] = opcode_name(h.bth.opcode);
  d["dest_qp"] = h.bth.dest_qp;
  d["psn"] = h.bth.psn;
  d["ack_req"] = h.bth.ack_req;
  d["pad_count"] = h.bth.pad_count;
  d["udp_src_port"] = h.udp.src_port;
  d["udp_dst_port"] = h.udp.dst_port;
  d["ip_src"] = h.ip.src;
  d["ip_dst"] = h.ip.dst;
  d["icrc"] = pf.icrc;
  d["payload_size"] = pf.payload_size;
  d["bth_offset"] = pf.bth_offset;
  if (h.reth) {
    d["va"] = h.reth->virtual_address;
    d["rkey"] = h.reth->rkey;
    d["dma_length"] = h.reth->dma_length;
  }
  if (h.atomic) {
    d["va"] = h.atomic->virtual_address;
    d["rkey"] = h.atomic->rkey;
    d["swap_or_add"] = h.atomic->swap_or_add;
    d["compare"] = h.atomic->compare;
  }
  if (h.aeth) {
    d["syndrome"] = h.aeth->syndrome;
    d["msn"] = h.aeth->msn;
  }
  if (h.atomic_ack) {
    d["original_data"] = h.atomic_ack->original_data;
  }
  if (h.ech) {
    const Ech& e = *h.ech;
    py::dict ech;
    ech["format"] = e.format == EchFormat::kCompact ? "compact" : "standard";
    ech["op"] = ech_op_name(e.op);
    ech["flags"] = e.flags;
    ech["window_id"] = e.window_id;
    if (e.format == EchFormat::kCompact) {
      ech["source_id"] = e.source_id;
      ech["dest_bitmap"] = e.dest_bitmap;
    } else {
      ech["job_id"] = e.job_id;
      ech["group_id"] = e.group_id;
      ech["contributor_id"] = e.contributor_id;
      ech["chunk_index"] = e.chunk_index;
      ech["dtype"] = ech_dtype_name(e.dtype);
      ech["redop"] = ech_redop_name(e.redop);
      ech["element_count"] = e.element_count;
    }
    d["ech"] = ech;
  }
  return d;
}

py::list samples() {
  py::list out;
  for (const auto& s : sample_frames()) {
    out.append(py::make_tuple(s.name, py::bytes(reinterpret_cast<const char*>(s.bytes.data()), s.bytes.size())));
  }
  return out;
}

uint32_t icrc(py::bytes ip_to_pad, size_t bth_offset) {
  std::string_view b = ip_to_pad;
  IFEC_CHECK(b.size() >= 28 && bth_offset >= 28 && bth_offset <= b.size() - 12,  // + 12 wrapped near 2^64
             "compute_icrc: bth_offset " << bth_offset << " with " << b.size()
                                         << " bytes: the IPv4 + UDP headers (28 bytes or more) and a 12-byte BTH must "
                                            "fit");
  return compute_icrc(reinterpret_cast<const uint8_t*>(b.data()), b.size(), bth_offset);
}

// An RDMA WRITE Only frame with the fields a sender chooses (the security tests' crafted frames: another job's
// partition key, a wrong rkey, an address outside a window), ICRC computed; ack_req set.
py::bytes rdma_write_frame(py::bytes src_mac, py::bytes dst_mac, uint32_t src_ip, uint32_t dst_ip, uint32_t dest_qp,
                           uint32_t psn, uint16_t pkey, uint64_t va, uint32_t rkey, py::bytes payload) {
  std::string_view s = src_mac, d = dst_mac, p = payload;
  IFEC_CHECK(s.size() == 6 && d.size() == 6,
             "rdma_write_frame: MAC addresses are 6 bytes (" << s.size() << ", " << d.size() << " given)");
  IFEC_CHECK(psn <= 0xFFFFFF && dest_qp <= 0xFFFFFF,
             "rdma_write_frame: PSN " << psn << " or QP " << dest_qp << " outside 24 bits");
  FrameHeaders h;
  std::copy(s.begin(), s.end(), h.eth.src.begin());
  std::copy(d.begin(), d.end(), h.eth.dst.begin());
  h.ip.src = src_ip;
  h.ip.dst = dst_ip;
  h.ip.dscp = kRoceDscp;
  h.udp.src_port = static_cast<uint16_t>(0xC000 | (dest_qp & 0x3FFF));
  h.bth.opcode = static_cast<uint8_t>(Opcode::kWriteOnly);
  h.bth.dest_qp = dest_qp;
  h.bth.psn = psn;
  h.bth.pkey = pkey;
  h.bth.ack_req = true;
  h.reth = Reth{va, rkey, static_cast<uint32_t>(p.size())};
  const std::vector<uint8_t> f = encode_frame(h, reinterpret_cast<const uint8_t*>(p.data()), p.size());
  return py::bytes(reinterpret_cast<const char*>(f.data()), f.size());
}

}  // namespace

void register_common(py::module_& m) {
  m.def("parse_frame", &parse, py::arg("frame"), "Parse and validate a frame; ValueError names the bad field");
  m.def("rdma_write_frame", &rdma_write_frame, py::arg("src_mac"), py::arg("dst_mac"), py::arg("src_ip"),
        py::arg("dst_ip"), py::arg("dest_qp"), py::arg("psn"), py::arg("pkey"), py::arg("va"), py::arg("rkey"),
        py::arg("payload"), "An RDMA WRITE Only frame (ack_req set, ICRC computed) with the given fields");
  m.def(
      "rc_qpn",
      [](uint32_t peer, uint32_t index) {
        constexpr uint32_t kPeers = (kEchQpn - kFirstRcQpn) / kMaxQpsPerPeer;  // below the ECH QPN, in 24 bits
        IFEC_CHECK(peer < kPeers, "rc_qpn: peer " << peer << " outside 0.." << kPeers - 1);
        IFEC_CHECK(index < kMaxQpsPerPeer, "rc_qpn: index " << index << " outside 0.." << kMaxQpsPerPeer - 1);
        return rc_qpn(peer, index);
      },
      py::arg("peer"), py::arg("index"), "The QP number of an endpoint's QP `index` toward GPU `peer`");
  m.def(
      "pkey_of_job",
      [](uint32_t job) {
        IFEC_CHECK(job <= kMaxJob,
                   "pkey_of_job: job " << job << " does not fit the 15-bit P_Key (0.." << kMaxJob << ")");
        return pkey_of_job(job);
      },
      py::arg("job"), "A job's partition key (full membership | 15-bit job)");
  m.def("sample_frames", &samples, "[(name, bytes)] one frame of every kind the project sends");
  m.def("write_sample_pcap", &write_sample_pcap, py::arg("path"), "Write sample_frames() as pcap; returns count");
  m.def("compute_icrc", &icrc, py::arg("ip_to_pad"), py::arg("bth_offset"),
        "ICRC over bytes from the IPv4 header to the end of the pad");
  m.attr("ROCEV2_PORT") = UdpHeader::kRoceV2Port;
  m.attr("ECH_PORT") = kEchUdpPort;
}

}  // namespace ifec::bindings
