// The in-fabric reduction's chunks and the leader's plan of a round (one-tier and two-tier planes).
#include "comm_ifec_plan.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

namespace ifec::workloads {

namespace {

bool any_two_tier(const Communicator& c) {
  for (int p = 0; p < c.topology().num_planes; ++p) {
    std::set<int> leaves;
    for (int r = 0; r < c.size(); ++r) {
      leaves.insert(c.switch_node_of(r, p));
    }
    if (leaves.size() > 1) {
      return true;
    }
  }
  return false;
}

uint16_t group_id(Communicator& c) {
  // Unique enough per switch and job: the leader's GPU in the high bits, a counter in the low ones; bit 15 marks
  // the spine groups of two-tier planes.
  return static_cast<uint16_t>(((c.gpu(0) & 0x3F) << 8) | (c.next_group() & 0xFF));
}

// How the ranks meet plane p: each rank's switch there (its leaf), the plane's weight (the smallest path bandwidth
// from this rank to another on it), and why the plane cannot be used ("" when it can).
struct PlaneReach {
  std::vector<int> leaf;
  double weight = -1;
  std::string problem;
};

PlaneReach reach(Communicator& c, int p) {
  PlaneReach pr;
  pr.leaf.resize(c.size());
  for (int r = 0; r < c.size(); ++r) {
    pr.leaf[r] = c.switch_node_of(r, p);
    if (r != c.rank()) {
      const double pw = c.endpoint().plane_weight(c.gpu(r), p);
      pr.weight = pr.weight < 0 ? pw : std::min(pr.weight, pw);
    }
  }
  pr.problem = c.plane_problem(p);
  if (std::count(pr.leaf.begin(), pr.leaf.end(), -1) > 0) {
    pr.problem = "a rank has no link on it";
  }
  if (pr.problem.empty() && pr.weight <= 0) {
    pr.problem = "no path bandwidth";
  }
  return pr;
}

// A spine of `plane` linked to every one of `leaves` (the group id picks one of several), or -1.
int pick_spine(const routing::Topology& topo, int plane, const std::vector<int>& leaves, uint16_t group) {
  std::vector<int> common_spines;
  for (size_t s = 0; s < topo.nodes.size(); ++s) {
    const routing::Node& nd = topo.nodes[s];
    if (nd.kind != routing::NodeKind::kSwitch || nd.plane != plane ||
        std::count(leaves.begin(), leaves.end(), static_cast<int>(s))) {
      continue;
    }
    std::vector<int> peers;  // links_of scans every link of the fabric: once per switch, not once per leaf
    for (int link : topo.links_of(static_cast<int>(s))) {
      peers.push_back(topo.peer(link, static_cast<int>(s)).first);
    }
    std::sort(peers.begin(), peers.end());
    bool all = true;
    for (int l : leaves) {
      all = all && std::binary_search(peers.begin(), peers.end(), l);
    }
    if (all) {
      common_spines.push_back(static_cast<int>(s));
    }
  }
  return common_spines.empty() ? -1 : common_spines[group % common_spines.size()];
}

// The spine's group: the leaves are its members (result VA 0: a leaf reads the chunk offset from the RETH), each a
// destination when a rank below it needs the result.
common::GroupReservation spine_group(Communicator& c, const CollArgs& a, const IfecChunks& ch,
                                     const std::vector<int>& leaf, const std::vector<int>& leaves, uint16_t group) {
  const routing::Topology& topo = c.topology();
  common::GroupReservation r = group_reservation(c, ifec_group_op(a), group, c.options().ifec.slots_per_plane);
  if (topo.params.ifec.upstream_fp32 && a.dtype != common::EchDtype::kInt32) {
    r.dtype = common::EchDtype::kFp32;  // partials and the spine's result stay in fp32 until the leaves
  }
  for (int l : leaves) {
    common::GroupMember gm;
    gm.ip = topo.nodes[l].loopback;
    for (int rk = 0; rk < c.size(); ++rk) {
      gm.destination = gm.destination || (leaf[rk] == l && ch.needs_result(rk));
    }
    r.members.push_back(gm);
  }
  return r;
}

// The groups plane p needs, or why it cannot have them: on two tier the spine's group first, then one per leaf
// listing the ranks that hang from it in rank order (each rank's member_index); a group holds at most the fabric's
// params.ifec.max_group_members members, so a leaf with more ranks than that, or a spine under more leaves, is
// refused.
struct PlaneGroups {
  std::vector<SwitchReservation> groups;
  std::string problem;
};

PlaneGroups plane_groups(Communicator& c, const CollArgs& a, const IfecChunks& ch, const std::vector<int>& leaf, int p,
                         uint16_t group) {
  const routing::Topology& topo = c.topology();
  std::vector<int> leaves = leaf;
  std::sort(leaves.begin(), leaves.end());
  leaves.erase(std::unique(leaves.begin(), leaves.end()), leaves.end());
  std::vector<std::vector<int>> local(leaves.size());  // [leaf] its ranks, in rank order
  for (int rk = 0; rk < c.size(); ++rk) {
    local[std::lower_bound(leaves.begin(), leaves.end(), leaf[rk]) - leaves.begin()].push_back(rk);
  }
  const size_t most = topo.params.ifec.max_group_members;
  for (size_t li = 0; li < leaves.size(); ++li) {
    if (local[li].size() > most) {
      return {{},
              topo.nodes[leaves[li]].name + " has " + std::to_string(local[li].size()) +
                  " of the communicator's ranks, more than a group's " + std::to_string(most) + " members"};
    }
  }
  PlaneGroups out;
  const uint16_t spine_id = static_cast<uint16_t>(group | 0x8000);
  int spine = -1;
  if (leaves.size() > 1) {
    spine = pick_spine(topo, p, leaves, group);
    if (spine < 0) {
      return {{}, "no spine reaches every rank's leaf"};
    }
    if (leaves.size() > most) {
      return {{},
              topo.nodes[spine].name + " would have " + std::to_string(leaves.size()) +
                  " leaves as members, more than a group's " + std::to_string(most)};
    }
    out.groups.push_back({topo.nodes[spine].name, spine_group(c, a, ch, leaf, leaves, spine_id)});
  }
  for (size_t li = 0; li < leaves.size(); ++li) {
    common::GroupReservation r = group_reservation(c, ifec_group_op(a), group, c.options().ifec.slots_per_plane);
    for (int rk : local[li]) {
      common::GroupMember m = group_member(c, rk, a.window, a.offset);
      m.destination = ch.needs_result(rk);
      r.members.push_back(m);
    }
    if (spine >= 0) {
      r.upstream_ip = topo.nodes[spine].loopback;
      r.upstream_group = spine_id;
      r.upstream_contributor = static_cast<uint16_t>(li);
      r.upstream_fp32 = topo.params.ifec.upstream_fp32;
    }
    out.groups.push_back({topo.nodes[leaves[li]].name, r});
  }
  return out;
}

}  // namespace

common::EchOp ech_op(Collective c) {
  switch (c) {
    case Collective::kReduce:
      return common::EchOp::kReduce;
    case Collective::kBarrier:
      return common::EchOp::kBarrier;
    case Collective::kMulticast:
      return common::EchOp::kMulticast;
    default:
      return common::EchOp::kAllReduce;
  }
}

GroupOp ifec_group_op(const CollArgs& a) { return {ech_op(a.kind), a.dtype, a.op, a.window}; }

IfecChunks::IfecChunks(const Communicator& c, const CollArgs& a) : kind_(a.kind), root_(a.root), elements_(a.count) {
  const routing::Topology& topo = c.topology();
  const bool barrier = a.kind == Collective::kBarrier;
  esize_ = barrier ? 4 : element_size(a.dtype);
  const uint32_t chunk_bytes = std::min<uint32_t>({topo.params.mtu, topo.params.ifec.slot_bytes, 4096});
  // fp32 partials of a two-tier plane must fit one packet: then every chunk holds chunk_bytes / 4 elements, so a
  // chunk means the same bytes on every plane and in every round.
  const bool fp32 = topo.params.ifec.upstream_fp32 && a.dtype != common::EchDtype::kInt32 && any_two_tier(c);
  epc_ = barrier ? 1 : std::max<size_t>(1, chunk_bytes / (fp32 ? 4 : esize_));
  count_ = barrier ? 1 : static_cast<uint32_t>((a.count + epc_ - 1) / epc_);
}

uint16_t IfecChunks::elements(uint32_t k) const {
  return kind_ == Collective::kBarrier ? 0 : static_cast<uint16_t>(std::min<uint64_t>(epc_, elements_ - k * epc_));
}

void plan_ifec_round(Communicator& c, const CollArgs& a, const IfecChunks& chunks, PlanBuilder::Then then) {
  std::shared_ptr<PlanBuilder> b = PlanBuilder::open(c, group_id(c), std::move(then));
  for (int p = 0; p < c.topology().num_planes; ++p) {
    const PlaneReach pr = reach(c, p);
    if (!pr.problem.empty()) {
      b->skip(p, pr.problem);
      continue;
    }
    const PlaneGroups pg = plane_groups(c, a, chunks, pr.leaf, p, b->group());
    if (!pg.problem.empty()) {
      b->skip(p, pg.problem);
      continue;
    }
    b->reserve({p, pr.weight, c.options().ifec.slots_per_plane}, pg.groups);
  }
  b->close();
}

}  // namespace ifec::workloads
