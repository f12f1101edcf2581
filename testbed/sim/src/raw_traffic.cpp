// Raw RoCEv2 flows over a Fabric: FARE-weighted split over ports, round-robin drain, verifying receivers.
#include "ifec/testbed/raw_traffic.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <random>

#include "ifec/common/checks.h"
#include "ifec/common/frame.h"
#include "ifec/common/names.h"
#include "ifec/common/pfc.h"
#include "ifec/common/protocol.h"

namespace ifec::testbed {

using common::TimeNs;

namespace {

constexpr uint64_t kWindowBase = 0x0000100000000000ULL;

// The GPU index of a loopback address (routing's scheme: GPU i is 10.0.(i / 250).(i % 250 + 1)), or -1.
int gpu_of_ip(uint32_t ip) {
  const int low = static_cast<int>(ip & 0xFF);
  return (ip >> 16) == (10u << 8) && low >= 1 && low <= 250 ? static_cast<int>((ip >> 8) & 0xFF) * 250 + low - 1 : -1;
}

}  // namespace

namespace {

constexpr common::Name<Pattern> kPatternNames[] = {
    {Pattern::kAllToAll, "alltoall"}, {Pattern::kPermutation, "permutation"}, {Pattern::kIncast, "incast"}};
constexpr common::Vocabulary kPatterns("traffic pattern", kPatternNames);

}  // namespace

Pattern parse_pattern(const std::string& name) { return kPatterns.parse(name); }
const char* pattern_name(Pattern p) { return kPatterns.name(p); }

std::vector<FlowSpec> make_flows(Pattern p, int gpus, uint64_t bytes, uint64_t seed, int incast_target, int group) {
  IFEC_CHECK(gpus >= 2, "traffic needs at least 2 GPUs, topology has " << gpus);
  IFEC_CHECK(bytes > 0 && bytes <= kMaxFlowBytes,
             "--bytes " << bytes << " outside 1.." << kMaxFlowBytes << " (1 TiB per flow)");
  IFEC_CHECK(group == 0 || (group >= 2 && group <= gpus && gpus % group == 0),
             "--group " << group << " must be 0 (every GPU) or 2.." << gpus << " dividing the " << gpus << " GPUs");
  IFEC_CHECK(group == 0 || p != Pattern::kIncast, "--group " << group << " does not apply to incast");
  // 0 is every other pattern's default; a target given to one was ignored.
  IFEC_CHECK(incast_target == 0 || p == Pattern::kIncast, "incast target GPU " << incast_target << " does not apply to "
                                                                               << pattern_name(p)
                                                                               << " traffic (incast only)");
  const int size = group == 0 ? gpus : group;
  std::vector<FlowSpec> flows;
  std::mt19937_64 rng(seed);
  for (int first = 0; first < gpus; first += size) {
    switch (p) {
      case Pattern::kAllToAll:
        for (int s = first; s < first + size; ++s) {
          for (int d = first; d < first + size; ++d) {
            if (s != d) {
              flows.push_back({s, d, bytes});
            }
          }
        }
        break;
      case Pattern::kPermutation: {
        // A seeded derangement within the group: every GPU sends to exactly one other and receives from one.
        std::vector<int> perm(size);
        std::iota(perm.begin(), perm.end(), first);
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int i = 0; i < size; ++i) {
          flows.push_back({perm[i], perm[(i + 1) % size], bytes});
        }
        break;
      }
      case Pattern::kIncast:
        IFEC_CHECK(incast_target >= 0 && incast_target < gpus,
                   "incast target GPU " << incast_target << " outside 0.." << gpus - 1);
        for (int s = 0; s < gpus; ++s) {
          if (s != incast_target) {
            flows.push_back({s, incast_target, bytes});
          }
        }
        break;
    }
  }
  return flows;
}

RawTraffic::RawTraffic(testbed::Fabric& fabric, std::vector<FlowSpec> flows, bool verify_icrc)
    : fabric_(fabric),
      clock_(fabric.clock()),
      verify_icrc_(verify_icrc),
      groups_(static_cast<size_t>(std::max(fabric.options().leaf_groups, 1))) {
  const auto& topo = fabric_.topology();
  const int gpus = fabric_.num_gpus();
  mtu_ = topo.params.mtu;
  prio_ = topo.params.pfc.lossless_priority;
  nics_.resize(gpus);
  for (int g = 0; g < gpus; ++g) {
    // Its NIC ports, then its in-node ports (the NVLink lane, after the planes).
    const std::vector<GpuPort>& gp = fabric_.gpu_ports(g);
    const std::vector<GpuPort>& nv = fabric_.nvlink_ports(g);
    nics_[g].ports.resize(gp.size() + nv.size());
    for (size_t i = 0; i < nics_[g].ports.size(); ++i) {
      NicPort& p = nics_[g].ports[i];
      p.io = i < gp.size() ? &gp[i] : &nv[i - gp.size()];
      p.paused_until.assign(topo.params.priorities, 0);
      // An in-node port runs on its GPU's partition's clock and counts on its plane's in-node lane (planes +
      // plane): the partition that owns the GPU owns it. Its counters: its lane's, in its leaf group's slot.
      const int own = std::max(topo.nodes[topo.gpu_node(g)].plane, 0);
      const bool in_node = p.io->plane == routing::kNvlinkPlane;
      p.plane = in_node ? topo.num_planes + own : p.io->plane;
      p.slot = p.plane * groups_ + p.io->partition % groups_;
      p.clock = p.io->clock;
    }
  }
  for (const FlowSpec& f : flows) {
    IFEC_CHECK(f.src >= 0 && f.src < gpus && f.dst >= 0 && f.dst < gpus && f.src != f.dst,
               "flow " << f.src << " -> " << f.dst << " is not between two distinct GPUs of 0.." << gpus - 1);
    Flow fl;
    fl.spec = f;
    fl.packets = (f.bytes + mtu_ - 1) / mtu_;
    fl.short_port = f.bytes % mtu_ != 0 ? 0 : -1;  // which port sends it: resplit says
    max_ports_ = std::max(max_ports_, nics_[f.src].ports.size());
    nics_[f.src].flows.push_back(static_cast<int>(flows_.size()));
    nics_[f.dst].inflows.push_back({f.src, static_cast<int>(flows_.size())});
    flows_.push_back(std::move(fl));
  }
  ports_.resize(max_ports_ * flows_.size());
  for (Nic& nic : nics_) {
    std::sort(nic.inflows.begin(), nic.inflows.end());
    for (size_t i = 1; i < nic.inflows.size(); ++i) {
      const Flow& f = flows_[nic.inflows[i].second];
      IFEC_CHECK(nic.inflows[i].first != nic.inflows[i - 1].first,
                 "duplicate flow " << f.spec.src << " -> " << f.spec.dst);
    }
  }
  for (int g = 0; g < gpus; ++g) {
    order_flows(g);
  }
  lanes_ = static_cast<size_t>(topo.num_planes) * (fabric_.has_nvlink() ? 2 : 1);
  rx_by_plane_.assign(flows_.size() * lanes_, 0);
  tx_by_plane_.assign(rx_by_plane_.size(), 0);
  last_rx_.assign(rx_by_plane_.size(), 0);
  counters_.assign(lanes_ * groups_, PlaneCounters{});
  active_.assign(counters_.size(), true);
  for (int g = 0; g < gpus; ++g) {
    for (size_t i = 0; i < nics_[g].ports.size(); ++i) {
      const int pi = static_cast<int>(i);
      common::LinkPort* io = nics_[g].ports[i].io->io;
      io->set_receiver([this, g, pi](std::vector<uint8_t>&& f) { receive(g, pi, std::move(f)); });
      io->set_tx_ready([this, g, pi] { pump(g, pi); });
    }
  }
  fabric_.on_routes_changed([this](TimeNs) {
    if (!started_) {
      return;
    }
    gather_sent();
    for (size_t g = 0; g < nics_.size(); ++g) {
      resplit(static_cast<int>(g));
    }
  });
}

void RawTraffic::spread_over_processes(std::vector<bool> active_slots, SumFn sum) {
  IFEC_CHECK(active_slots.size() == counters_.size(),
             active_slots.size() << " active-port flags for " << counters_.size() << " lanes x leaf groups");
  active_ = std::move(active_slots);
  sum_ = std::move(sum);
}

// Before a re-split: what every process's ports sent of each flow, and whether its short packet went. Each
// process gives its own ports' counts (the others' are zero in its sum) and takes the totals.
void RawTraffic::gather_sent() {
  if (!sum_) {
    return;
  }
  const size_t nf = flows_.size();
  std::vector<uint64_t> v(max_ports_ * nf + nf, 0);
  for (size_t fi = 0; fi < nf; ++fi) {
    const Nic& nic = nics_[flows_[fi].spec.src];
    for (size_t pi = 0; pi < nic.ports.size(); ++pi) {
      v[pi * nf + fi] = active_[nic.ports[pi].slot] ? port_of(static_cast<int>(fi), pi).sent : 0;
    }
    v[max_ports_ * nf + fi] = short_pending(static_cast<int>(fi)) ? 0 : 1;
  }
  sum_(v);
  for (size_t fi = 0; fi < nf; ++fi) {
    for (size_t pi = 0; pi < nics_[flows_[fi].spec.src].ports.size(); ++pi) {
      port_of(static_cast<int>(fi), pi).sent = v[pi * nf + fi];
    }
    if (v[max_ports_ * nf + fi] > 0) {
      flows_[fi].short_port = -1;  // sent (or none): some process says so
    }
  }
}

void RawTraffic::merge(const SumFn& sum) {
  std::vector<uint64_t> v;
  for (const auto* a : {&rx_by_plane_, &tx_by_plane_, &last_rx_}) {
    v.insert(v.end(), a->begin(), a->end());
  }
  for (PlaneCounters& c : counters_) {
    for (uint64_t* x : c.fields()) {
      v.push_back(*x);
    }
  }
  sum(v);
  size_t i = 0;
  for (auto* a : {&rx_by_plane_, &tx_by_plane_, &last_rx_}) {
    for (uint64_t& x : *a) {
      x = v[i++];
    }
  }
  for (PlaneCounters& c : counters_) {
    for (uint64_t* x : c.fields()) {
      *x = v[i++];
    }
  }
}

int RawTraffic::flow_between(int src, int dst) const {
  const std::vector<std::pair<int, int>>& in = nics_[dst].inflows;
  auto it = std::lower_bound(in.begin(), in.end(), std::make_pair(src, -1));
  return it != in.end() && it->first == src ? it->second : -1;
}

int RawTraffic::port_index_of(int gpu, int port) const {
  const std::vector<NicPort>& ports = nics_[gpu].ports;
  for (size_t i = 0; i < ports.size(); ++i) {
    if (ports[i].io->port == port) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

void RawTraffic::resplit(int gpu) {
  Nic& nic = nics_[gpu];
  const size_t nports = nic.ports.size();
  for (auto& p : nic.ports) {
    p.ring.clear();
    p.cursor = 0;
  }
  std::vector<double> w(nports);
  std::vector<uint64_t> alloc(nports);
  for (int fi : nic.flows) {
    Flow& f = flows_[fi];
    uint64_t sent = 0;
    for (size_t i = 0; i < nports; ++i) {
      sent += port_of(fi, i).sent;
      port_of(fi, i).alloc = 0;
    }
    const uint64_t remaining = f.packets - sent;
    if (remaining == 0) {
      continue;
    }
    std::fill(alloc.begin(), alloc.end(), 0);
    std::fill(w.begin(), w.end(), 0.0);
    double total = 0;
    for (const routing::NextHop& h : fabric_.gpu_next_hops(gpu, f.spec.dst)) {
      const int pi = port_index_of(gpu, h.port);
      if (pi >= 0 && h.weight > 0) {
        w[pi] += h.weight;
        total += h.weight;
      }
    }
    if (total <= 0) {
      continue;  // unreachable for now: packets wait for FARE to find a path
    }
    // Largest remainder: shares match the weights to within one packet per port.
    uint64_t given = 0;
    std::vector<std::pair<double, size_t>> frac;
    for (size_t i = 0; i < nports; ++i) {
      const double exact = static_cast<double>(remaining) * w[i] / total;
      alloc[i] = static_cast<uint64_t>(std::floor(exact));
      given += alloc[i];
      frac.push_back({exact - std::floor(exact), i});
    }
    std::stable_sort(frac.begin(), frac.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    for (size_t k = 0; given < remaining && k < frac.size(); ++k) {
      if (w[frac[k].second] > 0) {
        alloc[frac[k].second]++;
        given++;
      }
    }
    for (size_t i = 0; i < nports; ++i) {
      port_of(fi, i).alloc = alloc[i];
      if (alloc[i] > 0) {
        nic.ports[i].ring.push_back(fi);
      }
    }
    // The short last packet (if still to send) goes as the last packet of the port given the most.
    if (short_pending(fi)) {
      f.short_port = static_cast<int>(std::max_element(alloc.begin(), alloc.end()) - alloc.begin());
    }
  }
  for (size_t i = 0; i < nports; ++i) {
    pump(gpu, static_cast<int>(i));
  }
}

void RawTraffic::order_flows(int gpu) {
  // Visit destinations starting just after this GPU (a shifted all-to-all schedule): at any instant the GPUs
  // send to different destinations instead of all hammering the same one.
  const int n = static_cast<int>(nics_.size());
  std::vector<int>& fl = nics_[gpu].flows;
  std::stable_sort(fl.begin(), fl.end(), [&](int a, int b) {
    return (flows_[a].spec.dst - gpu + n) % n < (flows_[b].spec.dst - gpu + n) % n;
  });
}

void RawTraffic::start(TimeNs at) {
  clock_.schedule(at, [this] {
    start_ = clock_.now();
    started_ = true;
    for (size_t g = 0; g < nics_.size(); ++g) {
      resplit(static_cast<int>(g));
    }
  });
}

void RawTraffic::pump(int gpu, int pi) {
  Nic& nic = nics_[gpu];
  NicPort& np = nic.ports[pi];
  const testbed::GpuPort& gp = *np.io;
  if (!started_ || gp.io->busy() || !gp.io->link_up() || !active_[np.slot]) {
    return;  // (another process sends this port's traffic)
  }
  if (!np.relay.empty()) {  // forwarded frames first: they have crossed the fabric already
    std::vector<uint8_t> frame = std::move(np.relay.front());
    np.relay.pop_front();
    const size_t fbytes = fabric_.options().elided_payloads ? common::wire_frame_bytes(frame) : frame.size();
    PlaneCounters& pc = counters_[np.slot];
    if (!gp.io->send(std::move(frame))) {
      pc.nic_drops++;
      return;
    }
    pc.relayed_bytes += fbytes;
    return;
  }
  if (np.ring.empty()) {
    return;
  }
  const TimeNs now = np.clock->now();
  if (np.paused_until[prio_] > now) {
    if (!np.wakeup_pending) {
      np.wakeup_pending = true;
      np.clock->schedule(np.paused_until[prio_], [this, gpu, pi] {
        nics_[gpu].ports[pi].wakeup_pending = false;
        pump(gpu, pi);
      });
    }
    return;
  }
  if (np.cursor >= np.ring.size()) {
    np.cursor = 0;
  }
  const int fi = np.ring[np.cursor];
  FlowPort& fp = port_of(fi, pi);
  const bool last = --fp.alloc == 0;
  if (last) {
    np.ring.erase(np.ring.begin() + static_cast<long>(np.cursor));
  } else {
    ++np.cursor;
  }
  send_packet(gpu, pi, fi, last);
}

// One RDMA WRITE of flow `fi` out of port `pi`: a full MTU, or the flow's short remainder when this is the last
// packet of the port that sends it.
void RawTraffic::send_packet(int gpu, int pi, int fi, bool last_of_port) {
  Flow& f = flows_[fi];
  FlowPort& fp = port_of(fi, pi);
  const testbed::GpuPort& gp = *nics_[gpu].ports[pi].io;
  const uint64_t k = fp.sent++;
  uint32_t len = mtu_;
  if (last_of_port && f.short_port == pi && !fp.sent_short) {  // (short_port: read only while partitions run)
    len = static_cast<uint32_t>(f.spec.bytes % mtu_);
    fp.sent_short = true;
  }
  // Each port writes its own stretch of the window (the packets a port sends are its own sequence).
  const uint64_t offset = (static_cast<uint64_t>(pi) << 36) + k * mtu_;

  common::FrameHeaders h;
  h.eth.src = gp.mac;
  h.eth.dst = gp.peer_mac;
  h.ip.src = fabric_.gpu_ip(gpu);
  h.ip.dst = fabric_.gpu_ip(f.spec.dst);
  h.ip.dscp = common::kRoceDscp;
  h.ip.ecn = 2;
  h.ip.identification = static_cast<uint16_t>(k);
  // One QP per (flow, port): its own UDP source port, so per-flow hashing can spread QPs over paths.
  h.udp.src_port = static_cast<uint16_t>(0xC000 | ((gpu * 131 + f.spec.dst * 31 + pi * 7) & 0x3FFF));
  h.bth.opcode = static_cast<uint8_t>(common::Opcode::kWriteOnly);
  h.bth.dest_qp = common::rc_qpn(gpu, pi);  // the receiver's QP toward this source on this port
  h.bth.psn = fp.psn++ & common::Bth::kPsnMask;
  h.reth = common::Reth{kWindowBase + offset, 0x1000u + static_cast<uint32_t>(gpu), len};
  static const std::vector<uint8_t> kZeros(65536, 0);
  const bool elided = fabric_.options().elided_payloads;
  std::vector<uint8_t> frame = common::encode_frame(h, elided ? nullptr : kZeros.data(), len);

  const size_t fbytes = elided ? common::wire_frame_bytes(frame) : frame.size();
  const int plane = nics_[gpu].ports[pi].plane;  // its lane
  PlaneCounters& pc = counters_[nics_[gpu].ports[pi].slot];
  if (!gp.io->send(std::move(frame))) {
    pc.nic_drops++;
    return;
  }
  pc.packets_sent++;
  pc.frame_bytes_sent += fbytes;
  pc.wire_bytes_sent += fbytes + fabric_.topology().params.wire_overhead_bytes;
  tx_by_plane_[at(fi, plane)] += len;
}

void RawTraffic::receive_pfc(int gpu, int pi, const std::vector<uint8_t>& frame) {
  common::PfcFrame pfc;
  NicPort& np = nics_[gpu].ports[pi];
  if (!common::PfcFrame::decode(frame.data(), frame.size(), &pfc).ok()) {
    counters_[np.slot].rx_bad_frames++;
    return;
  }
  const uint64_t rate = np.io->io->rate_bps();
  for (size_t p = 0; p < np.paused_until.size(); ++p) {
    if (pfc.class_enable & (1u << p)) {
      np.paused_until[p] = pfc.quanta[p] == 0 ? 0 : np.clock->now() + common::pfc_quanta_ns(pfc.quanta[p], rate);
      counters_[np.slot].pfc_pauses_at_nics += pfc.quanta[p] != 0;
    }
  }
  pump(gpu, pi);
}

bool RawTraffic::relay(int gpu, int dst, std::vector<uint8_t>&& frame) {
  const int k = dst >= 0 && fabric_.has_nvlink() ? fabric_.nvlink_port_to(gpu, dst) : -1;
  if (k < 0) {
    return false;
  }
  const int pi = static_cast<int>(fabric_.gpu_ports(gpu).size()) + k;
  NicPort& np = nics_[gpu].ports[pi];
  std::copy(np.io->peer_mac.begin(), np.io->peer_mac.end(), frame.begin());
  std::copy(np.io->mac.begin(), np.io->mac.end(), frame.begin() + 6);
  np.relay.push_back(std::move(frame));
  counters_[np.slot].relayed_frames++;
  pump(gpu, pi);
  return true;
}

void RawTraffic::receive(int gpu, int pi, std::vector<uint8_t>&& frame) {
  if (common::is_mac_control(frame.data(), frame.size())) {
    receive_pfc(gpu, pi, frame);
    return;
  }
  const NicPort& np = nics_[gpu].ports[pi];
  PlaneCounters& pc = counters_[np.slot];
  common::ParsedFrame pf;
  common::ParseOptions opts;
  opts.verify_icrc = verify_icrc_;
  opts.path_mtu = mtu_;
  opts.allow_elided = fabric_.options().elided_payloads;
  if (!common::parse_frame(frame.data(), frame.size(), &pf, opts).ok() || !pf.h.reth) {
    pc.rx_bad_frames++;
    return;
  }
  // The sender from the destination QP (each of its ports is a QP of ours, numbered by peer and sub-port), checked
  // against the source address; then its flow among ours.
  if (pf.h.ip.dst != fabric_.gpu_ip(gpu)) {  // a node peer's, on another plane (else misrouted)
    if (!relay(gpu, gpu_of_ip(pf.h.ip.dst), std::move(frame))) {
      pc.rx_bad_frames++;
    }
    return;
  }
  const std::optional<common::RcQp> qp = common::decode_rc_qpn(pf.h.bth.dest_qp);
  const int src = qp && qp->peer < nics_.size() ? static_cast<int>(qp->peer) : -1;
  const int fi = src >= 0 && pf.h.ip.src == fabric_.gpu_ip(src) ? flow_between(src, gpu) : -1;
  if (fi < 0 || qp->index >= nics_[src].ports.size()) {
    pc.rx_bad_frames++;
    return;
  }
  // Counted on the lane the sender sent it on (its port, named by the QP): the plane it crossed the fabric on.
  const size_t i = at(fi, nics_[src].ports[qp->index].plane);
  rx_by_plane_[i] += pf.payload_size;
  last_rx_[i] = np.clock->now();
  pc.packets_delivered++;
  pc.payload_bytes_delivered += pf.payload_size;
}

uint64_t RawTraffic::received_bytes(int src, int dst, int plane) const {
  const int fi = flow_between(src, dst);
  return fi < 0 || plane < 0 || plane >= static_cast<int>(lanes_) ? 0 : rx_by_plane_[at(fi, plane)];
}

uint64_t RawTraffic::sent_bytes(int src, int dst, int plane) const {
  const int fi = flow_between(src, dst);
  return fi < 0 || plane < 0 || plane >= static_cast<int>(lanes_) ? 0 : tx_by_plane_[at(fi, plane)];
}

size_t RawTraffic::memory_bytes() const {
  size_t bytes = flows_.capacity() * sizeof(Flow) + ports_.capacity() * sizeof(FlowPort) +
                 (rx_by_plane_.capacity() + tx_by_plane_.capacity()) * sizeof(uint64_t) +
                 last_rx_.capacity() * sizeof(TimeNs);
  for (const Nic& n : nics_) {
    bytes += sizeof n + n.flows.capacity() * sizeof(int) + n.inflows.capacity() * sizeof(std::pair<int, int>);
    for (const NicPort& p : n.ports) {
      bytes += sizeof p + p.ring.capacity() * sizeof(int) + p.paused_until.capacity() * sizeof(common::TimeNs);
    }
  }
  return bytes;
}

TrafficResult RawTraffic::result() const {
  TrafficResult r;
  r.start_ns = start_;
  r.flows = flows_.size();
  const size_t planes = static_cast<size_t>(fabric_.topology().num_planes);
  r.plane_bytes.assign(planes, 0);
  for (size_t k = 0; k < counters_.size(); ++k) {
    const PlaneCounters& c = counters_[k];
    const size_t p = k / groups_;  // its lane
    r.packets_sent += c.packets_sent;
    r.frame_bytes_sent += c.frame_bytes_sent;
    r.wire_bytes_sent += c.wire_bytes_sent;
    r.nic_drops += c.nic_drops;
    r.packets_delivered += c.packets_delivered;
    r.payload_bytes_delivered += c.payload_bytes_delivered;
    r.rx_bad_frames += c.rx_bad_frames;
    r.pfc_pauses_at_nics += c.pfc_pauses_at_nics;
    r.relayed_frames += c.relayed_frames;
    if (p < planes) {
      r.plane_bytes[p] += c.frame_bytes_sent;
    } else {
      r.nvlink_bytes += c.frame_bytes_sent + c.relayed_bytes;
    }
  }
  TimeNs last = start_;
  std::vector<char> sender(nics_.size(), 0);
  std::vector<char> receiver(nics_.size(), 0);
  for (size_t fi = 0; fi < flows_.size(); ++fi) {
    const Flow& f = flows_[fi];
    r.payload_bytes_offered += f.spec.bytes;
    uint64_t delivered = 0;
    for (size_t p = 0; p < lanes_; ++p) {
      delivered += rx_by_plane_[at(static_cast<int>(fi), static_cast<int>(p))];
      last = std::max(last, last_rx_[at(static_cast<int>(fi), static_cast<int>(p))]);
    }
    if (delivered < f.spec.bytes) {
      r.incomplete_flows++;
    }
    sender[f.spec.src] = 1;
    receiver[f.spec.dst] = 1;
  }
  r.complete = r.incomplete_flows == 0;
  r.completion_ns = last - start_;
  double send_gbps = 0;
  double recv_gbps = 0;
  for (size_t g = 0; g < nics_.size(); ++g) {
    double access = 0;  // the GPU's access bandwidth (Topology::gpu_access_gbps without its scan of every link)
    for (const GpuPort& p : fabric_.gpu_ports(static_cast<int>(g))) {
      access += fabric_.topology().links[p.link].rate_gbps;
    }
    send_gbps += sender[g] ? access : 0;
    recv_gbps += receiver[g] ? access : 0;
  }
  r.line_rate_gbps = std::min(send_gbps, recv_gbps);
  r.goodput_gbps = r.completion_ns > 0 ? static_cast<double>(r.payload_bytes_delivered) * 8.0 / r.completion_ns : 0;
  r.payload_efficiency = r.wire_bytes_sent > 0 ? static_cast<double>(r.payload_bytes_delivered) / r.wire_bytes_sent : 0;
  return r;
}

}  // namespace ifec::testbed
