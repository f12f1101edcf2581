// libFuzzer target: frames into a switch (pipeline + IFEC engine with reserved groups and registered windows) and
// into an endpoint (RC queue pairs, protection checks), on in-memory ports. Whatever arrives, neither may crash,
// read out of bounds (ASan), or loop: every input runs a bounded stretch of simulated time.
//
// Input: records of [target u8][flags u8][length u16 big-endian][frame bytes]; target % 4 picks switch port 0..2
// or the endpoint; flag bit 0 re-encodes a frame that parses without its checksums, so mutations get past the
// ICRC and reach the engine's and the transport's state machines.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ifec/common/channel_port.h"
#include "ifec/common/frame.h"
#include "ifec/common/sim.h"
#include "ifec/endpoint/endpoint.h"
#include "ifec/switchemu/switch.h"

namespace {

using namespace ifec;

constexpr uint32_t kSwitchIp = 0x0AFF0001;
constexpr int kGpus = 3;
uint32_t gpu_ip(int g) { return 0x0A000001 + g; }

struct Rig {
  common::EventLoop loop;
  std::vector<std::unique_ptr<common::ChannelPort>> switch_ports;
  std::unique_ptr<common::ChannelPort> ep_port = std::make_unique<common::ChannelPort>();
  std::unique_ptr<switchemu::Switch> sw;
  std::unique_ptr<endpoint::Endpoint> ep;

  Rig() {
    std::vector<common::Port*> ports;
    for (int g = 0; g < kGpus; ++g) {
      switch_ports.push_back(std::make_unique<common::ChannelPort>());
      ports.push_back(switch_ports.back().get());
    }
    switchemu::SwitchConfig sc;
    sc.ip = kSwitchIp;
    sc.params.ifec.slot_pool = 64;
    sw = std::make_unique<switchemu::Switch>(loop, sc, ports);
    for (int g = 0; g < kGpus; ++g) {
      sw->set_route(gpu_ip(g), {switchemu::NextHopPort{g, 1, {}}});
    }
    reserve(1, common::EchOp::kAllReduce, common::EchDtype::kFp32, 0b111);
    reserve(2, common::EchOp::kReduce, common::EchDtype::kBf16, 0b001);
    for (int g = 0; g < kGpus; ++g) {
      sw->ifec()->register_window({g, gpu_ip(g), 1, 0x100000u * (g + 1), 0x1000u + g, 1});
    }
    endpoint::EndpointConfig ec;
    ec.index = 0;
    ec.ip = gpu_ip(0);
    ep = std::make_unique<endpoint::Endpoint>(loop, ec, std::vector<endpoint::EndpointPort>{{ep_port.get(), 0, {}, {}}},
                                              std::vector<uint32_t>{gpu_ip(0), gpu_ip(1), gpu_ip(2)});
    ep->memory().allocate_window(1, 1 << 16, 1);
    // Requests in flight toward both peers, so fuzzed ACKs, NAKs, read responses and atomic ACKs meet a requester
    // with state (PSNs, outstanding work requests) and not only the responder.
    for (int peer = 1; peer < kGpus; ++peer) {
      endpoint::WindowInfo w;
      w.id = 1;
      w.va = 0x100000u * (peer + 1);
      w.rkey = 0x1000u + peer;
      w.size = 1 << 16;
      w.job = 1;
      ep->set_remote_window(peer, w);
      static const uint8_t kData[8192] = {};
      handles.push_back(ep->store(peer, 1, 0, kData, sizeof(kData)));
      handles.push_back(ep->load(load_buf, peer, 1, 64, 64));
      handles.push_back(ep->fetch_add(peer, 1, 128, 5));
      handles.push_back(ep->compare_swap(peer, 1, 136, 0, 9));
    }
  }

  std::vector<endpoint::OpHandle> handles;
  uint8_t load_buf[64] = {};

  void reserve(uint16_t group, common::EchOp op, common::EchDtype dtype, unsigned destinations) {
    switchemu::GroupReservation r;
    r.group = group;
    r.op = op;
    r.dtype = dtype;
    r.slots = 4;
    for (int g = 0; g < kGpus; ++g) {
      r.members.push_back({true, gpu_ip(g), 0x100000u * (g + 1), 0x1000u + g, ((destinations >> g) & 1) != 0});
    }
    sw->ifec()->reserve(r, nullptr);
  }
};

std::vector<uint8_t> valid_form(const uint8_t* data, size_t size) {
  common::ParsedFrame pf;
  common::ParseOptions lax;
  lax.verify_icrc = false;
  lax.verify_ip_checksum = false;
  if (!common::parse_frame(data, size, &pf, lax).ok()) {
    return {data, data + size};
  }
  return common::encode_frame(pf.h, data + pf.payload_offset, pf.payload_size);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Rig rig;
  size_t off = 0;
  for (int records = 0; records < 8 && off + 4 <= size; ++records) {
    const int target = data[off] % 4;
    const bool fix = data[off + 1] & 1;
    const size_t len = std::min<size_t>((size_t{data[off + 2]} << 8) | data[off + 3], size - off - 4);
    off += 4;
    std::vector<uint8_t> frame = fix ? valid_form(data + off, len) : std::vector<uint8_t>(data + off, data + off + len);
    off += len;
    if (target < kGpus) {
      rig.switch_ports[target]->inject(std::move(frame));
    } else {
      rig.ep_port->inject(std::move(frame));
    }
    rig.loop.run(rig.loop.now() + 20'000'000);  // 20 ms: every timer the frame started has fired or re-armed
  }
  return 0;
}
