// Endpoint side of in-fabric collectives and multicast: chunking over planes, contributions with retransmission,
// result acknowledgement, protection checks, and completion of whatever the fabric could not serve.
#include "ifec/workloads/ifec_collectives.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <unordered_map>

#include "ifec/common/checks.h"
#include "ifec/common/frame.h"
#include "ifec/common/swrr.h"
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

// How a (member, chunk) finished in one round: kIdle chunks are not part of the round.
enum class Outcome : uint8_t { kIdle, kPending, kResult, kAck, kAnomaly, kStuck };

namespace {

constexpr int kRounds = 3;  // in-fabric rounds (the first and two redos) before the endpoint path takes the rest

}  // namespace

struct IfecCollectives::Op {
  CollectiveSpec spec;
  uint64_t generation = 0;
  int round = 0;
  size_t esize = 4;
  size_t epc = 1;     // elements per chunk
  size_t chunks = 0;  // C
  TimeNs rto_ns = 0;  // this operation's first retransmission timeout (at least a few windows' drain time)
  detail::RttEstimator rtt;
  std::map<int, uint16_t> group_of_plane;
  std::map<uint32_t, int> plane_of_switch_ip;            // one group id on every plane: the answering switch says which
  std::map<int, std::vector<uint32_t>> chunks_of_plane;  // plane -> chunk k by sequence j
  std::map<int, std::vector<uint32_t>> target_ip;        // plane -> per member: the switch it contributes to
  std::vector<std::pair<int, uint16_t>> reservations;    // (switch, group) to release at the end of the round
  std::map<int, int> member_of_gpu;
  struct Lane {
    uint32_t next = 0;
    uint32_t base = 0;
    bool dead = false;            // this member gave the plane up (its link, or FARE lost a path to a member)
    std::vector<uint8_t> tries;   // per sequence j: retransmissions so far
    std::vector<uint8_t> busy;    // RNR NAKs so far
    std::vector<uint32_t> epoch;  // the live timer of j (older ones do nothing)
    std::vector<TimeNs> sent_ns;  // first transmission of j
  };
  std::vector<std::map<int, Lane>> lanes;     // [member][plane]
  std::vector<std::vector<Outcome>> outcome;  // [member][chunk]
  uint64_t pending = 0;                       // (member, chunk) pairs still kPending
  uint64_t anomalies = 0;
  std::map<int, std::string> plane_lost;  // this round: plane -> why members gave it up (first report)
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
    TimeNs sent_ns = 0;
    bool sent = false;  // left the queue (counts in the window)
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
    cluster_.ep(g).set_routes_listener([this, g] { on_routes_changed(g); });
  }
}

IfecCollectives::~IfecCollectives() {
  *alive_ = false;
  for (int g = 0; g < cluster_.size(); ++g) {
    cluster_.ep(g).set_ech_handler(nullptr);
    cluster_.ep(g).set_routes_listener(nullptr);
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

TimeNs IfecCollectives::backoff(TimeNs base, int tries) const {
  return std::min<TimeNs>(std::max(base, opts_.retransmit_max_ns), base << std::min(tries, 3));
}

TimeNs IfecCollectives::rto(int tries) const {
  return backoff(op_ && op_->rto_ns ? op_->rtt.rto(op_->rto_ns) : opts_.retransmit_ns, tries);
}

// Why member `gpu` cannot use `plane` toward the other members: "" when it can. Its own live ports say it at once;
// FARE's path bandwidth toward each member says it one control-plane round per hop later.
std::string IfecCollectives::plane_problem(int gpu, int plane, const std::vector<int>& members) const {
  if (port_for(gpu, plane, 0) < 0) {
    return "GPU " + std::to_string(gpu) + " has no live link on plane " + std::to_string(plane);
  }
  for (int x : members) {
    if (x != gpu && cluster_.ep(gpu).plane_weight(x, plane) <= 0) {
      return "FARE: no path from GPU " + std::to_string(gpu) + " to GPU " + std::to_string(x) + " on plane " +
             std::to_string(plane);
    }
  }
  return "";
}

CollectiveResult IfecCollectives::run(const CollectiveSpec& spec, TimeNs limit) {
  IFEC_CHECK(!op_ && !rows_, "an IFEC operation is already running on this cluster");
  validate_spec(cluster_, spec);
  if (spec.kind == Collective::kMulticast) {
    return run_multicast(spec, limit);
  }
  common::EventLoop& loop = cluster_.loop();
  const routing::Topology& topo = cluster_.fabric().topology();
  CollectiveResult res;
  res.start_ns = loop.now();
  const TimeNs deadline = loop.now() + limit;
  stats_.operations++;
  auto op = std::make_unique<Op>();
  op->spec = spec;
  op->generation = stats_.operations;
  op->esize = element_size(spec.dtype);
  // fp32 partials of a two-tier plane must fit one packet: then every chunk holds MTU / 4 elements, so a chunk
  // means the same bytes on every plane and in every round.
  const bool fp32_partials = opts_.upstream_fp32 && spec.dtype != common::EchDtype::kInt32 && any_two_tier(spec);
  const size_t mtu = std::min<uint32_t>(topo.params.mtu, 4096);
  op->epc = spec.kind == Collective::kBarrier ? 1 : std::max<size_t>(1, mtu / (fp32_partials ? 4 : op->esize));
  op->chunks = spec.kind == Collective::kBarrier ? 1 : (spec.count + op->epc - 1) / op->epc;
  const size_t n = spec.members.size();
  for (size_t m = 0; m < n; ++m) {
    op->member_of_gpu[spec.members[m]] = static_cast<int>(m);
  }
  op->outcome.assign(n, std::vector<Outcome>(op->chunks, Outcome::kIdle));
  op_ = std::move(op);
  detail::ScopeExit cleanup([this] { abandon(); });  // an exception (Interrupted) leaves nothing reserved or running
  std::vector<uint32_t> todo(op_->chunks);
  for (uint32_t k = 0; k < todo.size(); ++k) {
    todo[k] = k;
  }
  std::string no_plane;
  for (int round = 1; round <= kRounds && !todo.empty(); ++round) {
    op_->round = round;
    if (!start_round(todo, &no_plane)) {
      break;
    }
    if (round > 1) {
      std::string planes;
      for (const auto& [p, ks] : op_->chunks_of_plane) {
        planes += (planes.empty() ? "" : ",") + std::to_string(p);
      }
      res.faults.push_back("round " + std::to_string(round) + ": " + std::to_string(todo.size()) +
                           " chunks redone in the fabric on plane(s) " + planes);
    }
    while (op_->pending > 0 && !loop.idle() && loop.next_event_time() <= deadline) {
      loop.run(loop.next_event_time());
    }
    for (const auto& [sw, id] : op_->reservations) {
      cluster_.fabric().switch_at(sw).ifec()->release(opts_.job, id);
    }
    op_->reservations.clear();
    if (op_->pending > 0) {
      res.error = "in-fabric " + std::string(collective_name(spec.kind)) + ": " + std::to_string(op_->pending) +
                  " member chunks unfinished after the time limit (round " + std::to_string(round) + ")";
      res.end_ns = loop.now();
      op_.reset();
      return res;
    }
    const std::string err = resolve_round(&todo, deadline, &res);
    if (!err.empty()) {
      res.error = err;
      res.end_ns = loop.now();
      op_.reset();
      return res;
    }
  }
  res.anomalies = op_->anomalies;
  res.ok = true;
  if (!todo.empty()) {
    const std::string why = op_->round == 1 && !no_plane.empty() ? no_plane
                            : no_plane.empty() ? "still unfinished after " + std::to_string(kRounds) + " rounds"
                                               : "no plane left for another round: " + no_plane;
    finish_on_endpoint_path(todo, deadline, why, &res);
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

void IfecCollectives::abandon() {
  if (op_) {
    for (const auto& [sw, id] : op_->reservations) {
      cluster_.fabric().switch_at(sw).ifec()->release(opts_.job, id);
    }
    op_.reset();
  }
}

bool IfecCollectives::any_two_tier(const CollectiveSpec& spec) const {
  switchemu::Fabric& fabric = cluster_.fabric();
  for (int p = 0; p < fabric.topology().num_planes; ++p) {
    std::set<int> leaves;
    for (int g : spec.members) {
      leaves.insert(fabric.switch_of_plane(g, p));
    }
    if (leaves.size() > 1) {
      return true;
    }
  }
  return false;
}

// Reserves groups for this round on every plane all members can use, spreads `todo` over them by the group's plane
// bandwidth and starts every member. False (with the reasons) when no plane could be reserved.
bool IfecCollectives::start_round(const std::vector<uint32_t>& todo, std::string* reasons) {
  Op& o = *op_;
  const CollectiveSpec& spec = o.spec;
  switchemu::Fabric& fabric = cluster_.fabric();
  const routing::Topology& topo = fabric.topology();
  const size_t n = spec.members.size();
  const uint16_t group = next_group_++;
  const uint16_t spine_group = static_cast<uint16_t>(group | 0x8000);
  std::vector<std::pair<int, double>> reserved;
  reasons->clear();
  auto note = [&](int p, const std::string& why) {
    *reasons += (reasons->empty() ? "" : "; ") + std::string("plane ") + std::to_string(p) + ": " + why;
  };
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
  o.group_of_plane.clear();
  o.plane_of_switch_ip.clear();
  o.target_ip.clear();
  o.plane_lost.clear();
  double slowest_gbps = 0;
  for (int p = 0; p < topo.num_planes; ++p) {
    double w = -1;
    std::vector<int> leaf(n, -1);
    std::string problem;
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
      if (problem.empty()) {
        problem = plane_problem(g, p, spec.members);
      }
    }
    if (w <= 0 || std::count(leaf.begin(), leaf.end(), -1) > 0 || !problem.empty()) {
      note(p, problem.empty() ? "a member has no live link" : problem);
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
      note(p, "not every member's switch runs an IFEC engine");
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
            linked = linked || (topo.peer(link, node).first == fabric.switch_node(l) && fabric.link(link).up());
          }
          reaches_all = reaches_all && linked;
        }
        if (reaches_all) {
          common_spines.push_back(sw);
        }
      }
      if (common_spines.empty()) {
        note(p, "no IFEC spine reaches every member's leaf");
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
      note(p, why);
      continue;
    }
    o.reservations.insert(o.reservations.end(), made.begin(), made.end());
    reserved.push_back({p, w});
    slowest_gbps = slowest_gbps > 0 ? std::min(slowest_gbps, w) : w;
    o.group_of_plane[p] = group;
    o.target_ip[p].resize(n);
    for (size_t m = 0; m < n; ++m) {
      o.target_ip[p][m] = fabric.switch_ip(leaf[m]);
      o.plane_of_switch_ip[fabric.switch_ip(leaf[m])] = p;
    }
  }
  if (reserved.empty()) {
    return false;
  }
  // A window of chunks must drain well within the timeout: on slow links the first timeout grows with it.
  const double window_ns = opts_.slots_per_plane * static_cast<double>(o.epc * o.esize + 100) * 8 / slowest_gbps;
  // Every member contributes and receives at its own rate (no fan-in): four windows' drain time is safe here.
  o.rto_ns = std::max<TimeNs>(opts_.min_rto_ns, static_cast<TimeNs>(4 * window_ns));
  // Chunks over the reserved planes, in proportion to their weights (smooth weighted round robin).
  std::vector<double> weights;
  for (const auto& pw : reserved) {
    weights.push_back(pw.second);
  }
  common::SmoothWrr wrr(weights);
  o.chunks_of_plane.clear();
  for (uint32_t k : todo) {
    o.chunks_of_plane[reserved[wrr.next()].first].push_back(k);
  }
  o.lanes.assign(n, {});
  for (size_t m = 0; m < n; ++m) {
    for (const auto& [p, ks] : o.chunks_of_plane) {
      Op::Lane& lane = o.lanes[m][p];
      lane.tries.assign(ks.size(), 0);
      lane.busy.assign(ks.size(), 0);
      lane.epoch.assign(ks.size(), 0);
      lane.sent_ns.assign(ks.size(), 0);
    }
    for (uint32_t k : todo) {
      o.outcome[m][k] = Outcome::kPending;
    }
  }
  o.pending = n * todo.size();
  o.rtt = detail::RttEstimator(opts_.min_rto_ns);
  for (size_t m = 0; m < n; ++m) {
    pump(static_cast<int>(m));
  }
  return true;
}

// After a round: a member that lacks a chunk's result while another member has it gets a copy from that member
// (its own buffer may still hold its input, or nothing changed); a chunk nobody received is still every member's
// untouched input and goes to the next round. `todo` becomes those chunks.
std::string IfecCollectives::resolve_round(std::vector<uint32_t>* todo, TimeNs deadline, CollectiveResult* res) {
  Op& o = *op_;
  const CollectiveSpec& spec = o.spec;
  const size_t n = spec.members.size();
  common::EventLoop& loop = cluster_.loop();
  std::vector<uint32_t> redo;
  std::vector<endpoint::OpHandle> copies;
  uint64_t copied = 0;
  uint64_t anomalies = 0;
  uint64_t stuck = 0;
  std::vector<int> lacking;
  for (uint32_t k : *todo) {
    int holder = -1;
    lacking.clear();
    for (size_t m = 0; m < n; ++m) {
      const Outcome out = o.outcome[m][k];
      holder = holder < 0 && out == Outcome::kResult ? static_cast<int>(m) : holder;
      anomalies += out == Outcome::kAnomaly;
      stuck += out == Outcome::kStuck;
      if ((spec.kind != Collective::kReduce || spec.members[m] == spec.root) && out != Outcome::kResult) {
        lacking.push_back(static_cast<int>(m));
      }
      o.outcome[m][k] = Outcome::kIdle;
    }
    if (lacking.empty()) {
      continue;
    }
    if (holder < 0) {
      redo.push_back(k);
      continue;
    }
    if (spec.kind == Collective::kBarrier) {
      continue;  // the switch saw every member arrive: the barrier is complete for all of them
    }
    const size_t elems = std::min(o.epc, spec.count - k * o.epc);
    const uint64_t off = spec.offset + k * o.epc * o.esize;
    const uint8_t* src = cluster_.window_data(spec.members[holder], spec.window) + off;
    for (int m : lacking) {
      copies.push_back(
          cluster_.ep(spec.members[holder]).store(spec.members[m], spec.window, off, src, elems * o.esize));
      copied++;
    }
    res->fallback_chunks++;
  }
  if (anomalies + stuck > 0 || !o.plane_lost.empty()) {
    std::string line = "round " + std::to_string(o.round) + ": ";
    for (const auto& [p, why] : o.plane_lost) {
      line += "plane " + std::to_string(p) + " given up (" + why + "); ";
    }
    line += std::to_string(anomalies) + " anomaly notices (slot timeouts or released results), " +
            std::to_string(stuck) + " member chunks given up; " + std::to_string(copied) +
            " results copied from a member that had them; " + std::to_string(redo.size()) + " chunks nobody received";
    res->faults.push_back(line);
  }
  *todo = std::move(redo);
  if (!copies.empty()) {
    return cluster_.wait_ok(copies, deadline > loop.now() ? deadline - loop.now() : 1,
                            "copying results to members that lost them");
  }
  return "";
}

// What no round finished runs on the endpoint-based path from the members' untouched inputs, in contiguous runs.
void IfecCollectives::finish_on_endpoint_path(const std::vector<uint32_t>& todo, TimeNs deadline,
                                              const std::string& why, CollectiveResult* res) {
  Op& o = *op_;
  const CollectiveSpec& spec = o.spec;
  common::EventLoop& loop = cluster_.loop();
  res->fallback_reason = why;
  res->faults.push_back("endpoint path for " + std::to_string(todo.size()) + " chunks: " + why);
  for (size_t i = 0; i < todo.size();) {
    size_t j = i + 1;
    while (j < todo.size() && todo[j] == todo[j - 1] + 1) {
      ++j;
    }
    const size_t k = todo[i];
    const size_t end = todo[j - 1] + 1;
    CollectiveSpec sub = spec;
    if (spec.kind != Collective::kBarrier) {
      sub.offset = spec.offset + k * o.epc * o.esize;
      sub.count = std::min(spec.count, end * o.epc) - k * o.epc;
    }
    res->fallback_chunks += end - k;
    CollectiveResult fb = run_endpoint_collective(cluster_, sub, deadline > loop.now() ? deadline - loop.now() : 1);
    if (!fb.ok) {
      res->ok = false;
      res->error = "fallback for chunks " + std::to_string(k) + ".." + std::to_string(end - 1) + ": " + fb.error;
      return;
    }
    i = j;
  }
}

void IfecCollectives::pump(int m) {
  Op& o = *op_;
  for (auto& [p, lane] : o.lanes[m]) {
    const auto& ks = o.chunks_of_plane[p];
    while (lane.base < ks.size() && o.outcome[m][ks[lane.base]] != Outcome::kPending) {
      ++lane.base;
    }
    while (!lane.dead && lane.next < ks.size() && lane.next < lane.base + opts_.slots_per_plane) {
      if (o.outcome[m][ks[lane.next]] == Outcome::kPending) {
        lane.sent_ns[lane.next] = cluster_.loop().now();
        send_contribution(m, p, lane.next, false);
      }
      ++lane.next;
    }
  }
}

// Member `m` stops using `plane` this round: every chunk it still waits for there is given up at once (resolved
// after the round: copied from a member that has the result, or redone on the planes that remain).
void IfecCollectives::give_up_plane(int m, int plane, const std::string& why) {
  Op& o = *op_;
  auto it = o.lanes[m].find(plane);
  if (it == o.lanes[m].end() || it->second.dead) {
    return;
  }
  it->second.dead = true;
  o.plane_lost.emplace(plane, why);
  for (uint32_t k : o.chunks_of_plane[plane]) {
    if (o.outcome[m][k] == Outcome::kPending) {
      o.outcome[m][k] = Outcome::kStuck;
      o.pending--;
    }
  }
}

void IfecCollectives::on_routes_changed(int gpu) {
  if (rows_) {
    rows_routes_changed(gpu);
    return;
  }
  if (op_ && op_->multicast) {
    multicast_routes_changed(gpu);
    return;
  }
  if (!op_ || op_->pending == 0) {
    return;
  }
  auto mit = op_->member_of_gpu.find(gpu);
  if (mit == op_->member_of_gpu.end()) {
    return;
  }
  for (const auto& [p, ks] : op_->chunks_of_plane) {
    if (const std::string why = plane_problem(gpu, p, op_->spec.members); !why.empty()) {
      give_up_plane(mit->second, p, why);
    }
  }
}

void IfecCollectives::send_contribution(int m, int plane, uint32_t j, bool retransmit) {
  Op& o = *op_;
  const int gpu = o.spec.members[m];
  const uint32_t k = o.chunks_of_plane[plane][j];
  const int port = port_for(gpu, plane, j);
  if (port < 0) {
    give_up_plane(m, plane, "GPU " + std::to_string(gpu) + " has no live link on plane " + std::to_string(plane));
    return;
  }
  arm(m, plane, j, rto(o.lanes[m][plane].tries[j]), true);
  if (suppressed_.count(gpu)) {
    return;  // fault injection: this contributor never arrives
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

// One live timer per (member, plane, j): a newer arm() makes older ones do nothing. A timeout counts as a try
// (after max_retries the member gives the chunk up); a retry after an RNR NAK (slot busy) does not.
void IfecCollectives::arm(int m, int plane, uint32_t j, TimeNs delay, bool counts_as_try) {
  Op& o = *op_;
  const uint32_t epoch = ++o.lanes[m][plane].epoch[j];
  const uint64_t gen = o.generation;
  const int round = o.round;
  std::weak_ptr<bool> alive = alive_;
  cluster_.loop().schedule(cluster_.loop().now() + delay, [this, alive, gen, round, m, plane, j, epoch, counts_as_try] {
    if (auto a = alive.lock(); !a || !*a || !op_ || op_->generation != gen || op_->round != round) {
      return;
    }
    Op& o = *op_;
    Op::Lane& lane = o.lanes[m][plane];
    const uint32_t k = o.chunks_of_plane[plane][j];
    if (lane.epoch[j] != epoch || o.outcome[m][k] != Outcome::kPending) {
      return;
    }
    if (counts_as_try && ++lane.tries[j] > opts_.max_retries) {
      o.outcome[m][k] = Outcome::kStuck;  // resolved after the round
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
  if (pf.h.ech->format == EchFormat::kCompact) {
    on_multicast_ech(gpu, port, pf, frame);
  } else if (!op_->multicast) {
    on_reduce_ech(gpu, port, pf, frame);
  }
}

void IfecCollectives::on_multicast_ech(int gpu, int port, const common::ParsedFrame& pf, const uint8_t* frame) {
  Op& o = *op_;
  const Ech& ech = *pf.h.ech;
  if (!o.multicast) {
    return;
  }
  auto it = o.packet_of_psn.find(pf.h.bth.psn);
  if (it == o.packet_of_psn.end() || o.packet[it->second].source != ech.source_id) {
    return;  // not a packet of this operation
  }
  Op::Packet& pk = o.packet[it->second];
  if (pf.h.bth.opcode == static_cast<uint8_t>(Opcode::kWriteOnly)) {
    // A replica: written once per destination, acknowledged every time.
    const uint64_t bit = 1ULL << gpu;
    if (!(pk.written & bit)) {
      const common::Reth& r = *pf.h.reth;
      endpoint::SymmetricMemory& mem = cluster_.ep(gpu).memory();
      if (!(pk.bitmap & bit) || mem.check(r.rkey, r.virtual_address, pf.payload_size, pf.h.bth.pkey & 0x7FFF, false) !=
                                    endpoint::AccessError::kOk) {
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
    if (pk.tries == 0) {
      o.rtt.sample(cluster_.loop().now() - pk.sent_ns);
    }
    pk.done = true;
    o.packets_pending--;
    o.inflight[{pk.source, pk.plane}]--;
    multicast_pump();
  }
}

// A round trip measured on a chunk sent once and never refused (Karn: retransmitted ones say nothing).
void IfecCollectives::sample_rtt(int m, int plane, uint32_t j) {
  const Op::Lane& lane = op_->lanes[m][plane];
  if (lane.tries[j] == 0 && lane.busy[j] == 0) {
    op_->rtt.sample(cluster_.loop().now() - lane.sent_ns[j]);
  }
}

void IfecCollectives::on_reduce_ech(int gpu, int port, const common::ParsedFrame& pf, const uint8_t* frame) {
  Op& o = *op_;
  const Ech& ech = *pf.h.ech;
  const bool write = pf.h.bth.opcode == static_cast<uint8_t>(Opcode::kWriteOnly);
  auto pit = o.plane_of_switch_ip.find(pf.h.ip.src);
  auto mit = o.member_of_gpu.find(gpu);
  if (pit == o.plane_of_switch_ip.end() || mit == o.member_of_gpu.end() || ech.job_id != opts_.job ||
      o.group_of_plane[pit->second] != ech.group_id) {
    return;  // not this round's group: an older round's or operation's frame
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
      if (out == Outcome::kPending) {  // slot busy with an older chunk: retry soon, not after the loss timeout
        stats_.busy_naks++;
        uint8_t& busy = o.lanes[m][plane].busy[ech.chunk_index];
        arm(m, plane, ech.chunk_index, opts_.busy_retry_ns << std::min<int>(busy++, 3), false);
      }
      return;
    }
    if (out == Outcome::kPending) {  // contribution accepted (reduce, not the root)
      out = Outcome::kAck;
      o.pending--;
      sample_rtt(m, plane, ech.chunk_index);
    }
    pump(m);
    return;
  }
  const bool notice = (ech.flags & common::ech_flags::kAnomaly) && pf.payload_size == 0 &&
                      (o.spec.kind == Collective::kBarrier || ech.element_count == 0);
  if (out != Outcome::kPending) {
    stats_.duplicate_results++;  // already landed, or given up: acknowledge again, write nothing
    send_ech_ack(gpu, port, pf, 0);
    return;
  }
  if (notice) {
    out = Outcome::kAnomaly;  // the slot timed out, or our result was released: resolved after the round
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
    sample_rtt(m, plane, ech.chunk_index);
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
          fabric.switch_at(sw).ifec()->register_window(
              {g, fabric.gpu_ip(g), spec.window, win->va, win->rkey, win->job});
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
  double slowest_gbps = 0;
  for (const auto& [src, planes] : planes_of) {
    for (const auto& pw : planes) {
      slowest_gbps = slowest_gbps > 0 ? std::min(slowest_gbps, pw.second) : pw.second;
    }
  }
  op->rtt = detail::RttEstimator(opts_.min_rto_ns);
  if (slowest_gbps > 0) {  // a window of packets must cross the slowest plane well within the timeout
    op->rto_ns = std::max<TimeNs>(opts_.retransmit_ns, static_cast<TimeNs>(4.0 * opts_.multicast_window *
                                                                           (packet_bytes + 100) * 8 / slowest_gbps));
  }
  op_ = std::move(op);
  detail::ScopeExit cleanup([this] { abandon(); });
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
  for (const auto& [p, why] : o.plane_lost) {
    res.faults.push_back("plane " + std::to_string(p) + " given up (" + why + ")");
  }
  if (!hs.empty()) {
    res.fell_back = true;
    res.fallback_chunks = o.packet_fallback.size() + direct.size();
    res.fallback_reason = !direct.empty() ? "a source reaches no IFEC switch on any live plane"
                          : !o.plane_lost.empty()
                              ? "packets on planes given up, or not completed within the retry budget"
                              : "packets the fabric did not complete within the retry budget";
    res.faults.push_back(std::to_string(res.fallback_chunks) + " packets sent point to point (" +
                         std::to_string(hs.size()) + " stores): " + res.fallback_reason);
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

// A source whose plane lost its path to one of a packet's destinations sends that packet point to point at once.
void IfecCollectives::multicast_routes_changed(int gpu) {
  Op& o = *op_;
  for (uint32_t i = 0; i < o.packet.size(); ++i) {
    const Op::Packet& pk = o.packet[i];
    if (pk.done || pk.source != gpu) {
      continue;
    }
    bool reaches = true;
    for (int d = 0; d < 64 && reaches; ++d) {
      reaches = !(pk.bitmap & (1ULL << d)) || cluster_.ep(gpu).plane_weight(d, pk.plane) > 0;
    }
    if (!reaches) {
      o.plane_lost.emplace(pk.plane, "FARE: no path from GPU " + std::to_string(gpu) + " to a destination");
      give_up_packet(i, true);
    }
  }
}

void IfecCollectives::multicast_pump() {
  Op& o = *op_;
  for (auto& [key, q] : o.unsent) {
    detail::drain_window(q, o.inflight[key], opts_.multicast_window, [this](uint32_t i) {
      if (op_->packet[i].done) {
        return false;
      }
      op_->packet[i].sent = true;
      op_->packet[i].sent_ns = cluster_.loop().now();
      send_multicast(i, false);
      return true;
    });
  }
}

// Packet `i` is finished point to point after the multicast phase, toward the destinations that did not write it.
// `pump`: send what the freed window allows (false when called from inside the pump itself).
void IfecCollectives::give_up_packet(uint32_t i, bool pump) {
  Op& o = *op_;
  Op::Packet& pk = o.packet[i];
  if (pk.done) {
    return;
  }
  pk.done = true;
  o.packet_fallback.push_back(i);
  o.packets_pending--;
  if (pk.sent) {
    o.inflight[{pk.source, pk.plane}]--;  // (one still queued is skipped when the window reaches it)
  }
  if (pump) {
    multicast_pump();
  }
}

void IfecCollectives::send_multicast(uint32_t i, bool retransmit) {
  Op& o = *op_;
  Op::Packet& pk = o.packet[i];
  const uint64_t gen = o.generation;
  const int port = port_for(pk.source, pk.plane, i);
  if (port < 0) {
    give_up_packet(i, false);  // the source's link to that plane is down: point to point at once
    return;
  }
  std::weak_ptr<bool> alive = alive_;
  cluster_.loop().schedule(cluster_.loop().now() + rto(pk.tries), [this, alive, gen, i] {
    if (auto a = alive.lock(); !a || !*a || !op_ || op_->generation != gen || op_->packet[i].done) {
      return;
    }
    if (++op_->packet[i].tries > opts_.max_retries) {
      give_up_packet(i, true);
      return;
    }
    send_multicast(i, true);
  });
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
