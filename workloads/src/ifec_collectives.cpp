// Endpoint side of in-fabric collectives and multicast: chunking over planes, contributions with retransmission,
// result acknowledgement, protection checks, and completion of whatever the fabric could not serve.
#include "ifec/workloads/ifec_collectives.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <unordered_map>

#include "ifec/common/checks.h"
#include "ifec/common/frame.h"
#include "ifec_frames.h"

namespace ifec::workloads {

using common::Ech;
using common::EchFormat;
using common::EchOp;
using common::Opcode;
using common::TimeNs;

namespace detail {

constexpr uint32_t kEchQpn = 0xFFFFFE;

uint16_t pkey_for(uint32_t job) { return static_cast<uint16_t>(0x8000 | (job & 0x7FFF)); }

EchOp ech_op(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return EchOp::kAllReduce;
    case Collective::kReduce:
      return EchOp::kReduce;
    case Collective::kBarrier:
      return EchOp::kBarrier;
    case Collective::kMulticast:
      return EchOp::kMulticast;
  }
  return EchOp::kAllReduce;
}

// Ethernet/IPv4/UDP/BTH of an ECH frame GPU `gpu` sends on `port` to `dst_ip`; the caller adds ECH, RETH or AETH.
common::FrameHeaders ech_headers(endpoint::Endpoint& e, int port, uint32_t dst_ip, uint16_t udp_entropy, uint8_t opcode,
                                 uint16_t pkey, uint32_t psn) {
  common::FrameHeaders h;
  h.eth.src = e.port_info(port).mac;
  h.eth.dst = e.port_info(port).peer_mac;
  h.ip.src = e.config().ip;
  h.ip.dst = dst_ip;
  h.ip.dscp = 26;
  h.ip.ecn = 2;
  h.udp.src_port = static_cast<uint16_t>(0xC000 | (udp_entropy & 0x3FFF));
  h.bth.opcode = opcode;
  h.bth.pkey = pkey;
  h.bth.dest_qp = kEchQpn;
  h.bth.psn = psn & 0xFFFFFF;
  return h;
}

}  // namespace detail

using detail::ech_headers;
using detail::ech_op;
using detail::pkey_for;

// How a (member, chunk) finished in the fabric.
enum class Outcome : uint8_t { kPending, kResult, kAck, kAnomaly, kStuck };

struct IfecCollectives::Op {
  CollectiveSpec spec;
  uint64_t generation = 0;
  size_t esize = 4;
  size_t epc = 1;     // elements per chunk
  size_t chunks = 0;  // C
  std::map<int, uint16_t> group_of_plane;
  std::map<uint32_t, int> plane_of_switch_ip;            // one group id on every plane: the answering switch says which
  std::map<int, std::vector<uint32_t>> chunks_of_plane;  // plane -> chunk k by sequence j
  std::map<int, int> switch_of_plane;                    // multicast: the source's switch per plane
  std::map<int, std::vector<uint32_t>> target_ip;        // plane -> per member: the switch it contributes to
  std::vector<std::pair<int, uint16_t>> reservations;    // (switch, group) to release at the end
  std::map<int, int> member_of_gpu;
  struct Lane {
    uint32_t next = 0;
    uint32_t base = 0;
    std::vector<int> tries;
  };
  std::vector<std::map<int, Lane>> lanes;     // [member][plane]
  std::vector<std::vector<Outcome>> outcome;  // [member][chunk]
  uint64_t pending = 0;                       // (member, chunk) pairs still kPending
  uint64_t anomalies = 0;
  // multicast: packets of rows, each from its source through that source's plane switch to a destination bitmap
  bool multicast = false;
  uint16_t window = 0;
  size_t packets = 0;
  struct Packet {
    int source = 0;
    int plane = 0;
    uint32_t psn = 0;
    uint32_t len = 0;
    uint64_t offset = 0;   // in the window, at the source and every destination
    uint64_t bitmap = 0;   // destinations
    uint64_t written = 0;  // destinations that wrote it (each exactly once)
    int tries = 0;
    bool done = false;
  };
  std::vector<Packet> packet;
  std::unordered_map<uint32_t, uint32_t> packet_of_psn;
  std::map<std::pair<int, int>, int> switch_of;                // (source, plane) -> switch
  std::map<std::pair<int, int>, std::deque<uint32_t>> unsent;  // (source, plane) -> packets not yet sent
  std::map<std::pair<int, int>, uint32_t> inflight;
  uint64_t packets_pending = 0;
  std::vector<uint32_t> packet_fallback;
};

IfecCollectives::IfecCollectives(Cluster& cluster, IfecOptions opts)
    : cluster_(cluster), opts_(opts), alive_(std::make_shared<bool>(true)) {
  for (int g = 0; g < cluster_.size(); ++g) {
    cluster_.ep(g).set_ech_handler(
        [this, g](int port, const common::ParsedFrame& pf, const uint8_t* frame) { on_ech(g, port, pf, frame); });
  }
}

IfecCollectives::~IfecCollectives() {
  *alive_ = false;
  for (int g = 0; g < cluster_.size(); ++g) {
    cluster_.ep(g).set_ech_handler(nullptr);
  }
}

void IfecCollectives::suppress_contributions(int gpu, bool on) {
  if (on) {
    suppressed_.insert(gpu);
  } else {
    suppressed_.erase(gpu);
  }
}

int IfecCollectives::port_for(int gpu, int plane, uint32_t salt) const {
  endpoint::Endpoint& e = cluster_.ep(gpu);
  std::vector<int> live;
  for (int p = 0; p < e.num_ports(); ++p) {
    if (e.port_info(p).plane == plane && e.port_info(p).port->link_up()) {
      live.push_back(p);
    }
  }
  if (live.empty()) {
    return -1;
  }
  return live[salt % live.size()];
}

CollectiveResult IfecCollectives::run(const CollectiveSpec& spec, TimeNs limit) {
  IFEC_CHECK(!op_ && !rows_, "an IFEC operation is already running on this cluster");
  validate_spec(cluster_, spec);
  if (spec.kind == Collective::kMulticast) {
    return run_multicast(spec, limit);
  }
  common::EventLoop& loop = cluster_.loop();
  switchemu::Fabric& fabric = cluster_.fabric();
  const routing::Topology& topo = fabric.topology();
  CollectiveResult res;
  res.start_ns = loop.now();
  stats_.operations++;
  auto op = std::make_unique<Op>();
  op->spec = spec;
  op->generation = stats_.operations;
  op->esize = element_size(spec.dtype);
  op->epc = spec.kind == Collective::kBarrier
                ? 1
                : std::max<size_t>(1, std::min<uint32_t>(topo.params.mtu, 4096) / op->esize);
  op->chunks = spec.kind == Collective::kBarrier ? 1 : (spec.count + op->epc - 1) / op->epc;
  const size_t n = spec.members.size();
  for (size_t m = 0; m < n; ++m) {
    op->member_of_gpu[spec.members[m]] = static_cast<int>(m);
  }
  // Planes every member reaches, weighted by the smallest member's live bandwidth there. One-tier planes aggregate
  // at the plane switch; two-tier planes at each member's leaf, whose partials meet at one spine.
  const uint16_t group = next_group_++;
  const uint16_t spine_group = static_cast<uint16_t>(group | 0x8000);
  std::vector<std::pair<int, double>> reserved;
  bool two_tier_fp32 = false;
  std::string reasons;
  auto member_of = [&](int g, bool local, bool destination) {
    const endpoint::WindowInfo* win = cluster_.ep(g).memory().window(spec.window);
    switchemu::GroupMember gm;
    gm.local = local;
    gm.ip = fabric.gpu_ip(g);
    gm.result_va = win->va + spec.offset;
    gm.rkey = win->rkey;
    gm.destination = destination;
    return gm;
  };
  auto base_reservation = [&](uint16_t id) {
    switchemu::GroupReservation r;
    r.job = opts_.job;
    r.group = id;
    r.op = ech_op(spec.kind);
    r.dtype = spec.dtype;
    r.redop = spec.op;
    r.window = spec.window;
    r.slots = opts_.slots_per_plane;
    return r;
  };
  for (int p = 0; p < topo.num_planes; ++p) {
    double w = -1;
    std::vector<int> leaf(n, -1);
    for (size_t m = 0; m < n; ++m) {
      const int g = spec.members[m];
      double live = 0;
      for (const auto& gp : fabric.gpu_ports(g)) {
        if (gp.plane == p && gp.io->link_up()) {
          live += gp.io->rate_bps() / 1e9;
        }
      }
      leaf[m] = fabric.switch_of_plane(g, p);
      w = w < 0 ? live : std::min(w, live);
    }
    if (w <= 0 || std::count(leaf.begin(), leaf.end(), -1) > 0) {
      continue;
    }
    std::vector<int> leaves = leaf;
    std::sort(leaves.begin(), leaves.end());
    leaves.erase(std::unique(leaves.begin(), leaves.end()), leaves.end());
    bool ok = true;
    for (int sw : leaves) {
      ok = ok && fabric.switch_at(sw).ifec() != nullptr;
    }
    if (!ok) {
      continue;
    }
    std::vector<std::pair<int, uint16_t>> made;
    std::string why;
    int spine = -1;
    if (leaves.size() > 1) {
      // A spine every leaf links to (a full leaf-spine mesh has all of them): spread groups over them.
      std::vector<int> common_spines;
      for (int sw = 0; sw < fabric.num_switches(); ++sw) {
        const int node = fabric.switch_node(sw);
        if (topo.nodes[node].plane != p || std::count(leaves.begin(), leaves.end(), sw) ||
            fabric.switch_at(sw).ifec() == nullptr) {
          continue;
        }
        bool reaches_all = true;
        for (int l : leaves) {
          bool linked = false;
          for (int link : topo.links_of(node)) {
            linked = linked || topo.peer(link, node).first == fabric.switch_node(l);
          }
          reaches_all = reaches_all && linked;
        }
        if (reaches_all) {
          common_spines.push_back(sw);
        }
      }
      if (common_spines.empty()) {
        continue;
      }
      spine = common_spines[group % common_spines.size()];
      switchemu::GroupReservation r = base_reservation(spine_group);
      if (opts_.upstream_fp32 && spec.dtype != common::EchDtype::kInt32) {
        r.dtype = common::EchDtype::kFp32;  // partials and the spine's result stay in fp32 until the leaves
      }
      for (int l : leaves) {
        bool has_destination = false;
        for (size_t m = 0; m < n; ++m) {
          has_destination =
              has_destination || (leaf[m] == l && (spec.kind != Collective::kReduce || spec.members[m] == spec.root));
        }
        switchemu::GroupMember gm;
        gm.ip = fabric.switch_ip(l);
        gm.destination = has_destination;
        r.members.push_back(gm);  // result VA 0: the leaf reads the chunk offset from the RETH
      }
      ok = fabric.switch_at(spine).ifec()->reserve(r, &why);
      if (ok) {
        made.push_back({spine, spine_group});
      }
    }
    for (size_t li = 0; ok && li < leaves.size(); ++li) {
      switchemu::GroupReservation r = base_reservation(group);
      for (size_t m = 0; m < n; ++m) {
        r.members.push_back(member_of(spec.members[m], leaf[m] == leaves[li],
                                      spec.kind != Collective::kReduce || spec.members[m] == spec.root));
      }
      if (spine >= 0) {
        r.upstream_ip = fabric.switch_ip(spine);
        r.upstream_group = spine_group;
        r.upstream_contributor = static_cast<uint16_t>(li);
        r.upstream_fp32 = opts_.upstream_fp32;
      }
      ok = fabric.switch_at(leaves[li]).ifec()->reserve(r, &why);
      if (ok) {
        made.push_back({leaves[li], group});
      }
    }
    if (!ok) {
      for (const auto& [sw, id] : made) {
        fabric.switch_at(sw).ifec()->release(opts_.job, id);  // this plane's share moves to the others
      }
      reasons += (reasons.empty() ? "" : "; ") + std::string("plane ") + std::to_string(p) + ": " + why;
      continue;
    }
    // fp32 partials must fit one packet too: such a plane's chunks hold MTU / 4 elements.
    two_tier_fp32 = two_tier_fp32 || (spine >= 0 && opts_.upstream_fp32);
    op->reservations.insert(op->reservations.end(), made.begin(), made.end());
    reserved.push_back({p, w});
    op->group_of_plane[p] = group;
    op->target_ip[p].resize(n);
    for (size_t m = 0; m < n; ++m) {
      op->target_ip[p][m] = fabric.switch_ip(leaf[m]);
      op->plane_of_switch_ip[fabric.switch_ip(leaf[m])] = p;
    }
  }
  if (two_tier_fp32 && spec.kind != Collective::kBarrier) {
    op->epc = std::max<size_t>(1, std::min<uint32_t>(topo.params.mtu, 4096) / 4);
    op->chunks = (spec.count + op->epc - 1) / op->epc;
  }
  if (reserved.empty()) {
    // No in-fabric resources at all: the whole operation runs on the endpoint-based path.
    stats_.fallback_operations++;
    stats_.fallback_chunks += op->chunks;
    CollectiveResult fb = run_endpoint_collective(cluster_, spec, limit);
    fb.start_ns = res.start_ns;
    fb.fell_back = true;
    fb.fallback_chunks = op->chunks;
    fb.fallback_reason = reasons.empty() ? "no plane reaches every member through IFEC switches" : reasons;
    return fb;
  }
  // Chunks over the reserved planes, in proportion to their weights (smooth weighted round robin).
  {
    double total = 0;
    for (const auto& pw : reserved) {
      total += pw.second;
    }
    std::vector<double> cur(reserved.size(), 0);
    for (size_t k = 0; k < op->chunks; ++k) {
      size_t best = 0;
      for (size_t i = 0; i < reserved.size(); ++i) {
        cur[i] += reserved[i].second;
        if (cur[i] > cur[best]) {
          best = i;
        }
      }
      cur[best] -= total;
      op->chunks_of_plane[reserved[best].first].push_back(static_cast<uint32_t>(k));
    }
  }
  op->lanes.assign(n, {});
  op->outcome.assign(n, std::vector<Outcome>(op->chunks, Outcome::kPending));
  for (size_t m = 0; m < n; ++m) {
    for (const auto& [p, ks] : op->chunks_of_plane) {
      Op::Lane lane;
      lane.tries.assign(ks.size(), 0);
      op->lanes[m][p] = lane;
    }
  }
  op->pending = n * op->chunks;
  op_ = std::move(op);
  for (size_t m = 0; m < n; ++m) {
    pump(static_cast<int>(m));
  }
  const TimeNs deadline = loop.now() + limit;
  while (op_->pending > 0) {
    if (loop.idle() || loop.next_event_time() > deadline) {
      break;
    }
    loop.run(loop.next_event_time());
  }
  Op& o = *op_;
  for (const auto& [sw, id] : o.reservations) {
    fabric.switch_at(sw).ifec()->release(opts_.job, id);
  }
  if (o.pending > 0) {
    res.ok = false;
    res.error = "in-fabric " + std::string(collective_name(spec.kind)) + ": " + std::to_string(o.pending) +
                " member chunks unfinished after the time limit";
    res.end_ns = loop.now();
    op_.reset();
    return res;
  }
  // Resolve what the fabric did not finish: a member stuck on a chunk others received copies it from one of
  // them; a chunk nobody received (anomaly) is reduced again from the untouched inputs on the endpoint path.
  std::vector<char> redo(o.chunks, 0);
  std::vector<endpoint::OpHandle> copies;
  for (size_t k = 0; k < o.chunks; ++k) {
    int holder = -1;
    bool any_anomaly = false;
    bool any_stuck = false;
    for (size_t m = 0; m < n; ++m) {
      if (o.outcome[m][k] == Outcome::kResult && holder < 0) {
        holder = static_cast<int>(m);
      }
      any_anomaly |= o.outcome[m][k] == Outcome::kAnomaly;
      any_stuck |= o.outcome[m][k] == Outcome::kStuck;
    }
    if (holder < 0 && (any_anomaly || any_stuck)) {
      redo[k] = 1;
      continue;
    }
    if (!any_stuck || spec.kind == Collective::kBarrier) {
      continue;
    }
    const size_t elems = std::min(o.epc, spec.count - k * o.epc);
    const uint64_t off = spec.offset + k * o.epc * o.esize;
    const uint8_t* src = cluster_.window_data(spec.members[holder], spec.window) + off;
    for (size_t m = 0; m < n; ++m) {
      const bool needs = spec.kind == Collective::kAllReduce || spec.members[m] == spec.root;
      if (o.outcome[m][k] == Outcome::kStuck && needs) {
        copies.push_back(
            cluster_.ep(spec.members[holder]).store(spec.members[m], spec.window, off, src, elems * o.esize));
        res.fallback_chunks++;
      }
    }
  }
  if (!copies.empty() && !cluster_.wait(copies, deadline > loop.now() ? deadline - loop.now() : 1)) {
    res.ok = false;
    res.error = "copying results to members that lost them did not finish";
    op_.reset();
    return res;
  }
  res.anomalies = o.anomalies;
  res.ok = true;
  for (size_t k = 0; k < o.chunks;) {
    if (!redo[k]) {
      ++k;
      continue;
    }
    size_t end = k;
    while (end < o.chunks && redo[end]) {
      ++end;
    }
    CollectiveSpec sub = spec;
    if (spec.kind != Collective::kBarrier) {
      sub.offset = spec.offset + k * o.epc * o.esize;
      sub.count = std::min(spec.count, end * o.epc) - k * o.epc;
    }
    res.fallback_chunks += end - k;
    CollectiveResult fb = run_endpoint_collective(cluster_, sub, deadline > loop.now() ? deadline - loop.now() : 1);
    if (!fb.ok) {
      res.ok = false;
      res.error = "fallback for chunks " + std::to_string(k) + ".." + std::to_string(end - 1) + ": " + fb.error;
      break;
    }
    k = end;
  }
  if (res.fallback_chunks > 0) {
    res.fell_back = true;
    stats_.fallback_operations++;
    stats_.fallback_chunks += res.fallback_chunks;
  }
  res.end_ns = loop.now();
  op_.reset();
  return res;
}

void IfecCollectives::pump(int m) {
  Op& o = *op_;
  for (auto& [p, lane] : o.lanes[m]) {
    const auto& ks = o.chunks_of_plane[p];
    while (lane.base < ks.size() && o.outcome[m][ks[lane.base]] != Outcome::kPending) {
      ++lane.base;
    }
    while (lane.next < ks.size() && lane.next < lane.base + opts_.slots_per_plane) {
      send_contribution(m, p, lane.next, false);
      ++lane.next;
    }
  }
}

void IfecCollectives::send_contribution(int m, int plane, uint32_t j, bool retransmit) {
  Op& o = *op_;
  const int gpu = o.spec.members[m];
  const uint32_t k = o.chunks_of_plane[plane][j];
  arm(m, plane, j);
  if (suppressed_.count(gpu)) {
    return;  // fault injection: this contributor never arrives
  }
  const int port = port_for(gpu, plane, j);
  if (port < 0) {
    return;  // its link to that plane is down: the timer will give up and the chunk is resolved later
  }
  endpoint::Endpoint& e = cluster_.ep(gpu);
  const size_t elems = o.spec.kind == Collective::kBarrier ? 0 : std::min(o.epc, o.spec.count - k * o.epc);
  const uint64_t rel = static_cast<uint64_t>(k) * o.epc * o.esize;
  common::FrameHeaders h = ech_headers(e, port, o.target_ip[plane][m], static_cast<uint16_t>(gpu * 977 + j),
                                       static_cast<uint8_t>(Opcode::kWriteOnly), pkey_for(opts_.job), j);
  Ech ech;
  ech.format = EchFormat::kStandard;
  ech.op = ech_op(o.spec.kind);
  ech.flags = retransmit ? common::ech_flags::kRetransmission : 0;
  ech.job_id = opts_.job;
  ech.group_id = o.group_of_plane[plane];
  ech.contributor_id = static_cast<uint16_t>(m);
  ech.chunk_index = j;
  ech.dtype = o.spec.dtype;
  ech.redop = o.spec.op;
  ech.element_count = static_cast<uint16_t>(elems);
  ech.window_id = o.spec.window;
  h.ech = ech;
  h.reth = common::Reth{rel, 0, static_cast<uint32_t>(elems * o.esize)};
  const uint8_t* src = cluster_.window_data(gpu, o.spec.window) + o.spec.offset + rel;
  e.send_frame(port, common::encode_frame(h, src, elems * o.esize));
  stats_.contributions_sent++;
  stats_.retransmissions += retransmit;
}

void IfecCollectives::arm(int m, int plane, uint32_t j) {
  Op& o = *op_;
  int& tries = o.lanes[m][plane].tries[j];
  const TimeNs rto = std::min<TimeNs>(opts_.retransmit_max_ns, opts_.retransmit_ns << std::min(tries, 20));
  const uint64_t gen = o.generation;
  std::weak_ptr<bool> alive = alive_;
  cluster_.loop().schedule(cluster_.loop().now() + rto, [this, alive, gen, m, plane, j] {
    if (auto a = alive.lock(); !a || !*a || !op_ || op_->generation != gen) {
      return;
    }
    Op& o = *op_;
    const uint32_t k = o.chunks_of_plane[plane][j];
    if (o.outcome[m][k] != Outcome::kPending) {
      return;
    }
    if (++o.lanes[m][plane].tries[j] > opts_.max_retries) {
      o.outcome[m][k] = Outcome::kStuck;  // resolved after the in-fabric phase
      o.pending--;
      pump(m);
      return;
    }
    send_contribution(m, plane, j, true);
  });
}

void IfecCollectives::send_ech_ack(int gpu, int port, const common::ParsedFrame& pf, uint64_t bitmap) {
  endpoint::Endpoint& e = cluster_.ep(gpu);
  common::FrameHeaders h = ech_headers(e, port, pf.h.ip.src, static_cast<uint16_t>(pf.h.bth.psn),
                                       static_cast<uint8_t>(Opcode::kAcknowledge), pf.h.bth.pkey, pf.h.bth.psn);
  Ech ech = *pf.h.ech;
  ech.element_count = 0;
  ech.flags = 0;
  if (ech.format == EchFormat::kCompact) {
    ech.dest_bitmap = bitmap;
  }
  h.ech = ech;
  h.aeth = common::Aeth::ack(0);
  e.send_frame(port, common::encode_frame(h, nullptr, 0));
}

void IfecCollectives::on_ech(int gpu, int port, const common::ParsedFrame& pf, const uint8_t* frame) {
  if (rows_) {
    on_row_ech(gpu, port, pf, frame);
    return;
  }
  if (!op_) {
    return;  // nothing in flight: a stray copy from an operation that already finished
  }
  Op& o = *op_;
  const Ech& ech = *pf.h.ech;
  const bool write = pf.h.bth.opcode == static_cast<uint8_t>(Opcode::kWriteOnly);
  if (ech.format == EchFormat::kCompact) {
    if (!o.multicast) {
      return;
    }
    auto it = o.packet_of_psn.find(pf.h.bth.psn);
    if (it == o.packet_of_psn.end() || o.packet[it->second].source != ech.source_id) {
      return;  // not a packet of this operation
    }
    Op::Packet& pk = o.packet[it->second];
    if (write) {
      // A replica: written once per destination, acknowledged every time.
      const uint64_t bit = 1ULL << gpu;
      if (!(pk.written & bit)) {
        const common::Reth& r = *pf.h.reth;
        endpoint::SymmetricMemory& mem = cluster_.ep(gpu).memory();
        if (!(pk.bitmap & bit) || mem.check(r.rkey, r.virtual_address, pf.payload_size, pf.h.bth.pkey & 0x7FFF,
                                            false) != endpoint::AccessError::kOk) {
          stats_.protection_drops++;
          return;
        }
        std::memcpy(mem.translate(r.rkey, r.virtual_address), frame + pf.payload_offset, pf.payload_size);
        pk.written |= bit;
      } else {
        stats_.duplicate_results++;
      }
      send_ech_ack(gpu, port, pf, bit);
      return;
    }
    // The switch's single completion for a packet to all destinations.
    if (gpu == pk.source && !pk.done) {
      pk.done = true;
      o.packets_pending--;
      o.inflight[{pk.source, pk.plane}]--;
      multicast_pump();
    }
    return;
  }
  auto pit = o.plane_of_switch_ip.find(pf.h.ip.src);
  auto mit = o.member_of_gpu.find(gpu);
  if (pit == o.plane_of_switch_ip.end() || mit == o.member_of_gpu.end() || ech.job_id != opts_.job ||
      o.group_of_plane[pit->second] != ech.group_id) {
    return;
  }
  const int plane = pit->second;
  const int m = mit->second;
  const auto& ks = o.chunks_of_plane[plane];
  if (ech.chunk_index >= ks.size()) {
    return;
  }
  const uint32_t k = ks[ech.chunk_index];
  Outcome& out = o.outcome[m][k];
  if (!write) {
    if (pf.h.aeth && pf.h.aeth->kind() == common::AethKind::kRnrNak) {
      return;  // slot busy at the switch: the retransmission timer sends it again
    }
    if (out == Outcome::kPending) {  // contribution accepted (reduce, not the root)
      out = Outcome::kAck;
      o.pending--;
    }
    pump(m);
    return;
  }
  const bool timed_out = (ech.flags & common::ech_flags::kAnomaly) && pf.payload_size == 0 &&
                         (o.spec.kind == Collective::kBarrier || ech.element_count == 0);
  if (out != Outcome::kPending) {
    stats_.duplicate_results++;  // already landed: acknowledge again, write nothing
    send_ech_ack(gpu, port, pf, 0);
    return;
  }
  if (timed_out) {
    out = Outcome::kAnomaly;
    o.anomalies++;
    stats_.anomalies++;
  } else {
    const size_t elems = o.spec.kind == Collective::kBarrier ? 0 : std::min(o.epc, o.spec.count - k * o.epc);
    const common::Reth& r = *pf.h.reth;
    endpoint::SymmetricMemory& mem = cluster_.ep(gpu).memory();
    if (pf.payload_size != elems * o.esize ||
        (pf.payload_size > 0 && mem.check(r.rkey, r.virtual_address, pf.payload_size, pf.h.bth.pkey & 0x7FFF, false) !=
                                    endpoint::AccessError::kOk)) {
      stats_.protection_drops++;
      return;  // not acknowledged: a wrong result never lands and the switch cannot free the slot for it
    }
    if (pf.payload_size > 0) {
      std::memcpy(mem.translate(r.rkey, r.virtual_address), frame + pf.payload_offset, pf.payload_size);
    }
    if (ech.flags & common::ech_flags::kAnomaly) {
      o.anomalies++;  // NaN/Inf among the inputs: a valid result, flagged
      stats_.anomalies++;
    }
    out = Outcome::kResult;
    stats_.results_received++;
  }
  o.pending--;
  send_ech_ack(gpu, port, pf, 0);
  pump(m);
}

// --------------------------------------------------------------------------------------------- multicast --

CollectiveResult IfecCollectives::run_multicast(const CollectiveSpec& spec, TimeNs limit) {
  BatchMulticastSpec b;
  b.window = spec.window;
  b.row_bytes = spec.count * element_size(spec.dtype);
  RowMulticast row;
  row.source = spec.root;
  row.offset = spec.offset;
  for (int g : spec.members) {
    if (g != spec.root) {
      row.destinations.push_back(g);
    }
  }
  if (b.row_bytes > 0 && !row.destinations.empty()) {
    b.rows.push_back(row);
  }
  return multicast_rows(b, limit);
}

CollectiveResult IfecCollectives::multicast_rows(const BatchMulticastSpec& spec, TimeNs limit) {
  IFEC_CHECK(!op_ && !rows_, "an IFEC operation is already running on this cluster");
  common::EventLoop& loop = cluster_.loop();
  switchemu::Fabric& fabric = cluster_.fabric();
  const routing::Topology& topo = fabric.topology();
  const int n = cluster_.size();
  auto check_window = [&](int g, uint64_t offset, const char* who) {
    IFEC_CHECK(g >= 0 && g < std::min(n, 64), "multicast: " << who << " GPU " << g << " outside 0.."
                                                            << std::min(n, 64) - 1
                                                            << " (the compact ECH's 64-bit destination bitmap)");
    const endpoint::WindowInfo* w = cluster_.ep(g).memory().window(spec.window);
    IFEC_CHECK(w != nullptr, "multicast: GPU " << g << " has no window " << spec.window);
    IFEC_CHECK(offset + spec.row_bytes <= w->size, "multicast: row at offset "
                                                       << offset << " + " << spec.row_bytes << " B overruns window "
                                                       << spec.window << " (" << w->size << " B) of GPU " << g);
  };
  std::set<int> involved;
  for (const RowMulticast& r : spec.rows) {
    check_window(r.source, r.offset, "source");
    involved.insert(r.source);
    for (int d : r.destinations) {
      check_window(d, r.offset, "destination");
      IFEC_CHECK(d != r.source,
                 "multicast: row at offset " << r.offset << " lists its source " << d << " among its destinations");
      involved.insert(d);
    }
  }
  CollectiveResult res;
  res.start_ns = loop.now();
  stats_.operations++;
  auto op = std::make_unique<Op>();
  op->generation = stats_.operations;
  op->multicast = true;
  op->window = spec.window;
  const uint32_t packet_bytes = topo.params.mtu;
  // Each source's usable planes (its live bandwidth there), and the destinations' windows registered at the plane
  // switches for the per-destination rewrite (control-plane set-up, idempotent).
  std::map<int, std::vector<std::pair<int, double>>> planes_of;
  std::set<int> registered;
  for (const RowMulticast& r : spec.rows) {
    if (planes_of.count(r.source)) {
      continue;
    }
    auto& planes = planes_of[r.source];
    for (int p = 0; p < topo.num_planes; ++p) {
      const int sw = fabric.switch_of_plane(r.source, p);
      double w = 0;
      for (const auto& gp : fabric.gpu_ports(r.source)) {
        w += gp.plane == p && gp.io->link_up() ? gp.io->rate_bps() / 1e9 : 0;
      }
      if (sw < 0 || w <= 0 || fabric.switch_at(sw).ifec() == nullptr) {
        continue;
      }
      op->switch_of[{r.source, p}] = sw;
      planes.push_back({p, w});
      if (registered.insert(sw).second) {
        for (int g : involved) {
          const endpoint::WindowInfo* win = cluster_.ep(g).memory().window(spec.window);
          fabric.switch_at(sw).ifec()->register_window(g, fabric.gpu_ip(g), spec.window, win->va, win->rkey, win->job);
        }
      }
    }
  }
  // Packets over each source's planes in proportion to their bandwidth, by bytes (a row's short tail packet goes
  // to whichever plane is least loaded, not always to the same one).
  std::map<int, std::vector<double>> load;
  std::vector<std::pair<int, uint64_t>> direct;  // (row, byte offset in the row): no plane, sent point to point
  for (size_t ri = 0; ri < spec.rows.size(); ++ri) {
    const RowMulticast& r = spec.rows[ri];
    uint64_t bitmap = 0;
    for (int d : r.destinations) {
      bitmap |= 1ULL << d;
    }
    const auto& planes = planes_of[r.source];
    auto& l = load[r.source];
    l.resize(planes.size(), 0);
    for (uint64_t rel = 0; bitmap != 0 && rel < spec.row_bytes; rel += packet_bytes) {
      if (planes.empty()) {
        direct.push_back({static_cast<int>(ri), rel});
        continue;
      }
      const uint64_t len = std::min<uint64_t>(packet_bytes, spec.row_bytes - rel);
      size_t best = 0;
      for (size_t q = 1; q < planes.size(); ++q) {
        if ((l[q] + len) / planes[q].second < (l[best] + len) / planes[best].second) {
          best = q;
        }
      }
      l[best] += len;
      Op::Packet pk;
      pk.source = r.source;
      pk.plane = planes[best].first;
      pk.offset = r.offset + rel;
      pk.len = static_cast<uint32_t>(len);
      pk.bitmap = bitmap;
      pk.psn = next_multicast_psn_++ & 0xFFFFFF;
      const uint32_t i = static_cast<uint32_t>(op->packet.size());
      IFEC_CHECK(i < (1u << 24), "multicast: more than 2^24 packets in one operation (PSNs would repeat)");
      op->packet_of_psn[pk.psn] = i;
      op->unsent[{pk.source, pk.plane}].push_back(i);
      op->packet.push_back(pk);
    }
  }
  op->packets = op->packet.size();
  op->packets_pending = op->packets;
  op_ = std::move(op);
  multicast_pump();
  const TimeNs deadline = loop.now() + limit;
  while (op_->packets_pending > 0) {
    if (loop.idle() || loop.next_event_time() > deadline) {
      break;
    }
    loop.run(loop.next_event_time());
  }
  Op& o = *op_;
  if (o.packets_pending > 0) {
    res.error = "multicast: " + std::to_string(o.packets_pending) + " packets unfinished after the time limit";
    res.end_ns = loop.now();
    op_.reset();
    return res;
  }
  res.ok = true;
  // Packets the fabric never completed, and rows of sources without a usable plane, go point to point from the
  // source (its bytes are intact), to each destination that has not written them.
  std::vector<endpoint::OpHandle> hs;
  auto store = [&](int src, int dst, uint64_t off, uint64_t len) {
    hs.push_back(cluster_.ep(src).store(dst, spec.window, off, cluster_.window_data(src, spec.window) + off, len));
  };
  for (uint32_t i : o.packet_fallback) {
    const Op::Packet& pk = o.packet[i];
    for (int d = 0; d < 64; ++d) {
      if ((pk.bitmap & ~pk.written) & (1ULL << d)) {
        store(pk.source, d, pk.offset, pk.len);
      }
    }
  }
  for (const auto& [ri, rel] : direct) {
    const RowMulticast& r = spec.rows[ri];
    for (int d : r.destinations) {
      store(r.source, d, r.offset + rel, std::min<uint64_t>(packet_bytes, spec.row_bytes - rel));
    }
  }
  if (!hs.empty()) {
    res.fell_back = true;
    res.fallback_chunks = o.packet_fallback.size() + direct.size();
    res.fallback_reason = !direct.empty() ? "a source reaches no IFEC switch on any live plane"
                                          : "packets the fabric did not complete within the retry budget";
    stats_.fallback_operations++;
    stats_.fallback_chunks += res.fallback_chunks;
    if (const std::string err =
            cluster_.wait_ok(hs, deadline > loop.now() ? deadline - loop.now() : 1, "multicast fallback stores");
        !err.empty()) {
      res.ok = false;
      res.error = err;
    }
  }
  res.end_ns = loop.now();
  op_.reset();
  return res;
}

void IfecCollectives::multicast_pump() {
  Op& o = *op_;
  for (auto& [key, q] : o.unsent) {
    detail::drain_window(q, o.inflight[key], opts_.multicast_window, [this](uint32_t i) { send_multicast(i, false); });
  }
}

void IfecCollectives::send_multicast(uint32_t i, bool retransmit) {
  Op& o = *op_;
  Op::Packet& pk = o.packet[i];
  const uint64_t gen = o.generation;
  const TimeNs rto = std::min<TimeNs>(opts_.retransmit_max_ns, opts_.retransmit_ns << std::min(pk.tries, 20));
  std::weak_ptr<bool> alive = alive_;
  cluster_.loop().schedule(cluster_.loop().now() + rto, [this, alive, gen, i] {
    if (auto a = alive.lock(); !a || !*a || !op_ || op_->generation != gen || op_->packet[i].done) {
      return;
    }
    Op& o = *op_;
    Op::Packet& pk = o.packet[i];
    if (++pk.tries > opts_.max_retries) {
      pk.done = true;  // finished point to point after the multicast phase
      o.packet_fallback.push_back(i);
      o.packets_pending--;
      o.inflight[{pk.source, pk.plane}]--;
      multicast_pump();
      return;
    }
    send_multicast(i, true);
  });
  const int port = port_for(pk.source, pk.plane, i);
  if (port < 0) {
    return;
  }
  endpoint::Endpoint& e = cluster_.ep(pk.source);
  common::FrameHeaders h =
      ech_headers(e, port, cluster_.fabric().switch_ip(o.switch_of[{pk.source, pk.plane}]), static_cast<uint16_t>(i),
                  static_cast<uint8_t>(Opcode::kWriteOnly), pkey_for(e.config().job), pk.psn);
  Ech ech;
  ech.format = EchFormat::kCompact;
  ech.op = EchOp::kMulticast;
  ech.flags = retransmit ? common::ech_flags::kRetransmission : 0;
  ech.source_id = static_cast<uint16_t>(pk.source);
  ech.window_id = o.window;
  ech.dest_bitmap = pk.bitmap;
  h.ech = ech;
  h.reth = common::Reth{pk.offset, 0, pk.len};
  const uint8_t* src = cluster_.window_data(pk.source, o.window) + pk.offset;
  e.send_frame(port, common::encode_frame(h, src, pk.len));
  stats_.multicast_packets++;
  stats_.retransmissions += retransmit;
}

}  // namespace ifec::workloads
