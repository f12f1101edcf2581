// Fabric builder: Topology -> links, switches, GPU ports; FARE install and hop-by-hop reconvergence.
#include "ifec/testbed/fabric.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "ifec/common/checks.h"
#include "ifec/testbed/partitions.h"

namespace ifec::testbed {

using switchemu::NextHopPort;

common::MacAddress node_port_mac(const routing::Topology& topo, int node, int port) {
  const bool gpu = topo.nodes.at(node).kind == routing::NodeKind::kGpu;
  return {0x02,
          static_cast<uint8_t>(gpu ? 0x47 : 0x53),
          static_cast<uint8_t>(node >> 8),
          static_cast<uint8_t>(node),
          static_cast<uint8_t>(port >> 8),
          static_cast<uint8_t>(port)};
}

Fabric::Fabric(common::Clock& clock, const routing::Topology& topo, FabricOptions opts)
    : Fabric(clock,
             std::vector<common::Clock*>(
                 static_cast<size_t>(std::max(topo.num_planes, 1)) * static_cast<size_t>(std::max(opts.leaf_groups, 1)),
                 &clock),
             topo, opts) {}

namespace {

// What a link's two ends run on (Link's constructor): each end's clock, and the clock its frames arrive through.
struct LinkClocks {
  common::Clock* end[2];
  common::Clock* arrivals[2];
  static LinkClocks one(common::Clock& c) { return {{&c, &c}, {&c, &c}}; }
};

// Each plane's switches with a GPU link (its leaves), and its others, by node index.
struct PlaneSwitches {
  std::vector<int> leaves;
  std::vector<int> others;
};

std::vector<PlaneSwitches> plane_switches(const routing::Topology& topo) {
  std::vector<PlaneSwitches> planes(std::max(topo.num_planes, 1));
  std::vector<bool> leaf(topo.nodes.size(), false);
  for (const routing::Link& l : topo.links) {
    const bool gpu_a = topo.nodes[l.a].kind == routing::NodeKind::kGpu;
    const bool gpu_b = topo.nodes[l.b].kind == routing::NodeKind::kGpu;
    if (gpu_a != gpu_b) leaf[gpu_a ? l.b : l.a] = true;
  }
  for (size_t n = 0; n < topo.nodes.size(); ++n) {
    const routing::Node& nd = topo.nodes[n];
    if (nd.kind == routing::NodeKind::kSwitch) {
      PlaneSwitches& p = planes.at(std::max(nd.plane, 0));
      (leaf[n] ? p.leaves : p.others).push_back(static_cast<int>(n));
    }
  }
  return planes;
}

// The partitions of a fabric's nodes: leaf_group_partitions with `groups` >= 1; one per plane with 0.
std::vector<int> node_partitions(const routing::Topology& topo, int groups, bool nics_with_leaves) {
  if (groups > 0) {
    return leaf_group_partitions(topo, groups, nics_with_leaves);
  }
  std::vector<int> part(topo.nodes.size());
  for (size_t n = 0; n < topo.nodes.size(); ++n) {
    part[n] = topo.nodes[n].plane >= 0 ? topo.nodes[n].plane : (topo.nodes[n].kind == routing::NodeKind::kGpu ? -1 : 0);
  }
  return part;
}

}  // namespace

std::vector<int> leaf_group_partitions(const routing::Topology& topo, int groups, bool nics_with_leaves) {
  IFEC_CHECK(groups >= 1, "--leaf-groups " << groups << ": expected at least 1");
  const std::vector<PlaneSwitches> planes = plane_switches(topo);
  std::vector<int> part(topo.nodes.size(), -1);
  for (size_t p = 0; p < planes.size(); ++p) {
    const size_t leaves = planes[p].leaves.size();
    IFEC_CHECK(leaves >= static_cast<size_t>(groups), "--leaf-groups " << groups << ": plane " << p << " of topology '"
                                                                       << topo.name << "' has " << leaves
                                                                       << " leaf switches (each group needs one)");
    for (const std::vector<int>* run : {&planes[p].leaves, &planes[p].others}) {
      for (size_t i = 0; i < run->size(); ++i) {
        part[(*run)[i]] = static_cast<int>(p) * groups + static_cast<int>(i * groups / run->size());
      }
    }
  }
  // A GPU's ports on one plane must hang from one leaf group (its NIC's counters and frames are that partition's);
  // a GPU of one plane runs in it (its in-node ports).
  std::map<std::pair<int, int>, int> group_of;  // (GPU node, plane) -> partition
  for (const routing::Link& l : topo.links) {
    const bool gpu_a = topo.nodes[l.a].kind == routing::NodeKind::kGpu;
    const bool gpu_b = topo.nodes[l.b].kind == routing::NodeKind::kGpu;
    if (gpu_a && gpu_b) {
      IFEC_CHECK(l.plane == routing::kNvlinkPlane, "--leaf-groups " << groups << ": link " << l.id << " joins GPUs '"
                                                                    << topo.nodes[l.a].name << "' and '"
                                                                    << topo.nodes[l.b].name << "' on plane " << l.plane
                                                                    << " (leaf groups take GPUs' links to switches)");
      continue;
    }
    if (gpu_a == gpu_b || !nics_with_leaves) continue;
    const int gpu = gpu_a ? l.a : l.b;
    const int sw = gpu_a ? l.b : l.a;
    const auto [it, fresh] = group_of.emplace(std::pair{gpu, l.plane}, part[sw]);
    IFEC_CHECK(fresh || it->second == part[sw],
               "--leaf-groups " << groups << ": GPU '" << topo.nodes[gpu].name << "' has ports on plane " << l.plane
                                << " under leaves of two groups (its leaf '" << topo.nodes[sw].name
                                << "' and another); fewer groups keep its leaves together");
    if (topo.nodes[gpu].plane >= 0) part[gpu] = part[sw];
  }
  return part;
}

std::vector<std::string> leaf_group_names(const routing::Topology& topo, int groups) {
  const std::vector<PlaneSwitches> planes = plane_switches(topo);
  std::vector<std::string> names;
  for (size_t p = 0; p < planes.size(); ++p) {
    const size_t leaves = planes[p].leaves.size();
    for (int g = 0; g < groups; ++g) {
      // leaf i is in group i * groups / leaves: group g holds ceil(g * leaves / groups) .. ceil((g+1) ...) - 1
      const size_t first = (static_cast<size_t>(g) * leaves + groups - 1) / groups;
      const size_t end = ((static_cast<size_t>(g) + 1) * leaves + groups - 1) / groups;
      names.push_back("p" + std::to_string(p) + " leaves " + std::to_string(first) +
                      (end - first > 1 ? "-" + std::to_string(end - 1) : ""));
    }
  }
  return names;
}

Fabric::Fabric(common::Clock& control, std::vector<common::Clock*> plane_clocks, const routing::Topology& topo,
               FabricOptions opts, MailboxFn mailbox, GpuPartitionFn gpu_partition)
    : clock_(control), plane_clocks_(std::move(plane_clocks)), topo_(topo), opts_(opts) {
  routing::validate(topo_);
  IFEC_CHECK(opts_.leaf_groups >= 0, "leaf groups " << opts_.leaf_groups << ": expected 0 (one partition per plane) "
                                                    << "or more");
  const size_t partitions = static_cast<size_t>(std::max(topo_.num_planes, 1)) * std::max(opts_.leaf_groups, 1);
  IFEC_CHECK(plane_clocks_.size() == partitions, plane_clocks_.size()
                                                     << " partition clocks for " << topo_.num_planes << " planes x "
                                                     << std::max(opts_.leaf_groups, 1) << " leaf groups");
  node_partition_ = node_partitions(topo_, opts_.leaf_groups, gpu_partition == nullptr);
  if (gpu_partition != nullptr) {
    for (int g = 0; g < topo_.num_gpus(); ++g) {
      gpu_partition_.push_back(gpu_partition(g));
    }
  }
  topo_.params.pfc.enabled = topo_.params.pfc.enabled && opts_.pfc;
  const size_t n_nodes = topo_.nodes.size();
  std::vector<std::vector<common::Port*>> node_ports(n_nodes);
  for (size_t n = 0; n < n_nodes; ++n) {
    node_ports[n].assign(topo_.nodes[n].num_ports, nullptr);
  }
  gpu_ports_.resize(topo_.num_gpus());
  nvlink_ports_.resize(topo_.num_gpus());
  for (int g = 0; g < topo_.num_gpus(); ++g) {
    gpu_ips_.push_back(topo_.nodes[topo_.gpu_node(g)].loopback);
  }
  make_links(mailbox);
  for (size_t i = 0; i < topo_.links.size(); ++i) {
    const routing::Link& l = topo_.links[i];
    const bool nvlink = l.plane == routing::kNvlinkPlane;
    common::Link& link = *links_[i];
    const int ends[2][2] = {{l.a, l.a_port}, {l.b, l.b_port}};
    for (int side = 0; side < 2; ++side) {
      const int node = ends[side][0];
      const int port = ends[side][1];
      node_ports[node].at(port) = &link.end(side);
      const routing::Node& nd = topo_.nodes[node];
      if (nd.kind == routing::NodeKind::kGpu) {
        GpuPort gp;
        gp.port = port;
        gp.link = l.id;
        gp.plane = l.plane;
        gp.io = &link.end(side);
        // (-1: an in-node link of GPUs on every plane, on one clock: make_links refuses it partitioned)
        gp.partition = std::max(end_partition(l.id, side).first, 0);
        gp.clock = &end_clock(l.id, side);
        link.end(side).set_read_on_arrival(SIZE_MAX);  // the NIC checks the ICRC: it reads every byte
        gp.mac = node_port_mac(topo_, node, port);
        gp.peer_mac = node_port_mac(topo_, ends[1 - side][0], ends[1 - side][1]);
        if (nvlink) {
          gp.peer_gpu = topo_.nodes[ends[1 - side][0]].gpu_index;
          nvlink_ports_[nd.gpu_index].push_back(gp);
        } else {
          gpu_ports_[nd.gpu_index].push_back(gp);
        }
      }
    }
  }
  for (auto* all : {&gpu_ports_, &nvlink_ports_}) {
    for (auto& ports : *all) {
      std::sort(ports.begin(), ports.end(), [](const GpuPort& a, const GpuPort& b) { return a.port < b.port; });
    }
  }
  relays_ = routing::relay_table(topo_);
  relayed_.assign(topo_.num_gpus(), {});
  for (int g = 0; g < topo_.num_gpus(); ++g) {
    for (int r : relays_[g]) {
      if (r >= 0 && r != g) relayed_[r].push_back(g);
    }
  }
  const bool per_plane_tables = topo_.single_plane_gpus();
  for (int p = 0; p < (per_plane_tables ? topo_.num_planes : 1); ++p) {
    class_tables_.push_back(std::make_shared<switchemu::IpMap>());
  }
  node_switch_.assign(n_nodes, -1);
  for (size_t n = 0; n < n_nodes; ++n) {
    const routing::Node& nd = topo_.nodes[n];
    if (nd.kind != routing::NodeKind::kSwitch) {
      continue;
    }
    for (size_t p = 0; p < node_ports[n].size(); ++p) {
      IFEC_CHECK(node_ports[n][p] != nullptr,
                 topo_.source << ": switch " << nd.name << " port " << p
                              << " has no link (the simulator runs a switch whose every port has one)");
    }
    SwitchConfig cfg;
    cfg.name = nd.name;
    cfg.seed = opts_.seed * 1000003ULL + n;
    cfg.lb = opts_.lb;
    cfg.params = topo_.params;
    cfg.base_mac = node_port_mac(topo_, static_cast<int>(n), 0);
    cfg.ip = nd.loopback;
    cfg.ifec = opts_.ifec;
    cfg.elided_payloads = opts_.elided_payloads;
    node_switch_[n] = static_cast<int>(switches_.size());
    switch_nodes_.push_back(static_cast<int>(n));
    switches_.push_back(std::make_unique<Switch>(*plane_clocks_.at(node_partition_[n]), cfg, node_ports[n]));
    switches_.back()->set_class_table(class_tables_[per_plane_tables ? nd.plane : 0]);
  }
  adj_ = routing::adjacency(topo_);
  rib_ = std::make_unique<routing::FareRib>(topo_);
  rib_->converge();
  install_routes();
}

void Fabric::make_links(const MailboxFn& mailbox) {
  const bool one_clock =
      std::all_of(plane_clocks_.begin(), plane_clocks_.end(), [this](const common::Clock* c) { return c == &clock_; });
  auto clocks_of = [&](const routing::Link& l) -> LinkClocks {
    const bool nvlink = l.plane == routing::kNvlinkPlane;
    has_nvlink_ = has_nvlink_ || nvlink;
    const bool gpus =
        topo_.nodes[l.a].kind == routing::NodeKind::kGpu && topo_.nodes[l.b].kind == routing::NodeKind::kGpu;
    IFEC_CHECK(gpu_partition_.empty() || !gpus,
               "link " << l.id << " joins GPUs '" << topo_.nodes[l.a].name << "' and '" << topo_.nodes[l.b].name
                       << "' (an in-node link): a partitioned endpoint runtime takes none; run it on one event loop "
                          "(--threads 0, no leaf groups)");
    if (one_clock && gpu_partition_.empty()) {
      return LinkClocks::one(clock_);
    }
    const auto [pa, sa] = end_partition(l.id, 0);
    const auto [pb, sb] = end_partition(l.id, 1);
    IFEC_CHECK(pa >= 0 && pb >= 0, "topology '" << topo_.name << "': link " << l.id << " joins GPUs on every plane "
                                                << "over NVLink: it cannot be split between plane partitions");
    const bool switches =
        topo_.nodes[l.a].kind == routing::NodeKind::kSwitch && topo_.nodes[l.b].kind == routing::NodeKind::kSwitch;
    // In leaf groups every switch-to-switch and in-node link goes through mailboxes, within a partition too: which
    // links cross partitions then changes no order of events.
    if (pa == pb && !(opts_.leaf_groups > 0 && (switches || nvlink))) {
      return LinkClocks::one(end_clock(l.id, 0));
    }
    IFEC_CHECK(mailbox != nullptr, "topology '" << topo_.name << "': link " << l.id << " joins partitions " << pa
                                                << " and " << pb << ", and this fabric runs them without mailboxes");
    cross_delay_ = std::min(cross_delay_, l.delay_ns);
    return {{&end_clock(l.id, 0), &end_clock(l.id, 1)}, {mailbox(pa, pb, sa), mailbox(pb, pa, sb)}};
  };
  // Each plane's links in one array of their own (its leaf groups' partitions share it): a plane's partition may run
  // on a thread of its own, and the topology lists a GPU's links to every plane side by side (made one by one,
  // neighbours shared cache lines between the threads: the 64 x 4 all-to-all on two threads ran 1.8x one, on two
  // processes 2.0x).
  std::map<int, std::vector<size_t>> of_plane;
  for (size_t i = 0; i < topo_.links.size(); ++i) {
    of_plane[topo_.links[i].plane].push_back(i);
  }
  links_.resize(topo_.links.size());
  for (const auto& [plane, ids] : of_plane) {
    auto store = std::make_unique<std::optional<common::Link>[]>(ids.size());
    for (size_t k = 0; k < ids.size(); ++k) {
      const routing::Link& l = topo_.links[ids[k]];
      common::LinkConfig cfg;
      cfg.rate_bps = static_cast<uint64_t>(std::llround(l.rate_gbps * 1e9));
      cfg.delay_ns = l.delay_ns;
      cfg.overhead_bytes = topo_.params.wire_overhead_bytes;
      cfg.loss_probability = opts_.loss;
      cfg.loss_seed = opts_.seed * 7919 + static_cast<uint64_t>(l.id);
      cfg.elided_payloads = opts_.elided_payloads;
      const LinkClocks c = clocks_of(l);
      links_[ids[k]] = &store[k].emplace(*c.end[0], *c.end[1], *c.arrivals[0], *c.arrivals[1], cfg);
    }
    link_store_.push_back(std::move(store));
  }
}

Fabric::~Fabric() = default;

std::pair<int, int> Fabric::end_partition(int link, int side) const {
  const routing::Link& l = topo_.links.at(link);
  const int node = side == 0 ? l.a : l.b;
  const int far = side == 0 ? l.b : l.a;
  if (!gpu_partition_.empty() && topo_.nodes[node].kind == routing::NodeKind::kGpu) {  // its GPU group's
    const int g = topo_.nodes[node].gpu_index;
    return {gpu_partition_[g].partition, opts_.leaf_groups > 0 ? node : static_cast<int>(plane_clocks_.size()) + g};
  }
  // A GPU's NIC port runs with its switch; its in-node port with the GPU (its plane's port's switch).
  const bool nic = topo_.nodes[node].kind == routing::NodeKind::kGpu && l.plane != routing::kNvlinkPlane;
  int part = node_partition_[nic ? far : node];
  if (part < 0 && l.plane >= 0) {  // a cable between two GPUs of every plane: its plane's (first group's)
    part = l.plane * std::max(opts_.leaf_groups, 1);
  }
  return {part, opts_.leaf_groups > 0 ? node : part};
}

common::Clock& Fabric::end_clock(int link, int side) const {
  const routing::Link& l = topo_.links.at(link);
  const int node = side == 0 ? l.a : l.b;
  if (!gpu_partition_.empty() && topo_.nodes[node].kind == routing::NodeKind::kGpu) {
    return *gpu_partition_[topo_.nodes[node].gpu_index].clock;
  }
  return *plane_clocks_.at(std::max(end_partition(link, side).first, 0));
}

int Fabric::nvlink_port_to(int gpu, int peer) const {
  const std::vector<GpuPort>& ports = nvlink_ports_.at(gpu);
  for (size_t i = 0; i < ports.size(); ++i) {
    if (ports[i].peer_gpu == peer) return static_cast<int>(i);
  }
  return -1;
}

std::vector<routing::NextHop> Fabric::gpu_next_hops(int src, int dst) const {
  const int in_node = has_nvlink_ ? nvlink_port_to(src, dst) : -1;
  if (in_node >= 0) {
    const GpuPort& p = nvlink_ports_[src][in_node];
    return {routing::NextHop{p.link, p.port, topo_.links[p.link].rate_gbps}};
  }
  if (class_tables_.size() == 1) {
    return rib_->next_hops(topo_.gpu_node(src), dst);
  }
  std::vector<routing::NextHop> out;
  for (int p = 0; p < topo_.num_planes; ++p) {
    const int target = topo_.gpu_on_plane(src, p) ? relays_[dst][p] : -1;
    if (target < 0 || target == src) continue;
    for (const routing::NextHop& h : rib_->next_hops(topo_.gpu_node(src), target)) {
      if (topo_.links[h.link].plane == p) out.push_back(h);
    }
  }
  std::sort(out.begin(), out.end(),
            [](const routing::NextHop& a, const routing::NextHop& b) { return a.link < b.link; });
  return out;
}

void Fabric::install_routes() {
  // Adjacent switches' loopbacks: the IFEC engines of a two-tier plane (leaf partials to a spine, results back)
  // talk to their neighbours directly, over the up links between them.
  for (size_t s = 0; s < switches_.size(); ++s) {
    const int node = switch_nodes_[s];
    std::map<int, std::vector<NextHopPort>> to_neighbour;
    for (int l : adj_[node]) {
      const auto [peer_node, peer_port] = topo_.peer(l, node);
      if (topo_.nodes[peer_node].kind != routing::NodeKind::kSwitch || !rib_->link_up(l)) {
        continue;
      }
      const int my_port = topo_.links[l].a == node ? topo_.links[l].a_port : topo_.links[l].b_port;
      to_neighbour[peer_node].push_back(
          NextHopPort{my_port, topo_.links[l].rate_gbps, node_port_mac(topo_, peer_node, peer_port)});
    }
    for (auto& [peer_node, group] : to_neighbour) {
      switches_[s]->set_route(topo_.nodes[peer_node].loopback, std::move(group));
    }
  }
  install_loopback_routes();
  install_gpu_routes();
}

// Toward the GPUs, class by class (routing::FareRib): a switch a class hangs from reaches each member over its own
// links (a /32 each); any other switch sends every member the same way, one route for the class, found through
// the fabric's one table of GPU address -> class (as a leaf's prefix is, instead of a /32 per GPU per switch).
void Fabric::install_gpu_routes() {
  auto group_of = [this](int node, const std::vector<routing::NextHop>& hops) {
    std::vector<NextHopPort> group;
    for (const routing::NextHop& h : hops) {
      if (h.weight > 0) {
        const auto [peer_node, peer_port] = topo_.peer(h.link, node);
        group.push_back(NextHopPort{h.port, h.weight, node_port_mac(topo_, peer_node, peer_port)});
      }
    }
    return group;
  };
  for (size_t p = 0; p < class_tables_.size(); ++p) {
    for (int g = 0; g < num_gpus(); ++g) {
      const int carrier = class_tables_.size() == 1 ? g : relays_[g][p];
      class_tables_[p]->set(gpu_ip(g), rib_->class_of(carrier));
    }
  }
  for (size_t s = 0; s < switches_.size(); ++s) {
    const int node = switch_nodes_[s];
    for (int c = 0; c < rib_->num_classes(); ++c) {
      const std::vector<int>& members = rib_->class_members(c);
      if (rib_->attached(node, c)) {
        for (int d : members) {
          std::vector<NextHopPort> group = group_of(node, rib_->next_hops(node, d));
          for (int x : relayed_[d]) {  // GPUs of other planes whose frames d forwards inside its node
            switches_[s]->set_route(gpu_ip(x), group);
          }
          switches_[s]->set_route(gpu_ip(d), std::move(group));
        }
      } else if (!members.empty()) {
        switches_[s]->set_class_route(c, group_of(node, rib_->class_hops(node, c)));
      }
    }
  }
}

// Every switch reaches every other switch's loopback over shortest paths of live switch-to-switch links (what the
// fabric's IGP would advertise): ECH replies from GPUs under one leaf reach an engine on another (multicast ACKs).
// Loopbacks a switch reaches over the same ports share one group, as routers share a next-hop group among the
// prefixes that resolve to it: a leaf reaches every other leaf over all its up links, a spine every other spine
// over all its down links, so a plane of L leaves and S spines holds a few groups per switch, not (L + S)^2 of up
// to L members each (about 126 MB of a 2,048-GPU fat tree's 330 MB before).
void Fabric::install_loopback_routes() {
  const int n = static_cast<int>(switches_.size());
  // Per switch: next-hop ports -> (the group, the loopbacks it reaches).
  using Shared = std::map<std::vector<int>, std::pair<std::vector<NextHopPort>, std::vector<uint32_t>>>;
  std::vector<Shared> shared(n);
  for (int t = 0; t < n; ++t) {
    const int target = switch_nodes_[t];
    std::vector<int> dist(topo_.nodes.size(), -1);
    std::vector<int> frontier = {target};
    dist[target] = 0;
    while (!frontier.empty()) {
      std::vector<int> next;
      for (int node : frontier) {
        for (int l : adj_[node]) {
          const int peer = topo_.peer(l, node).first;
          if (topo_.nodes[peer].kind == routing::NodeKind::kSwitch && rib_->link_up(l) && dist[peer] < 0) {
            dist[peer] = dist[node] + 1;
            next.push_back(peer);
          }
        }
      }
      frontier = std::move(next);
    }
    for (int s = 0; s < n; ++s) {
      const int node = switch_nodes_[s];
      if (dist[node] < 2) {
        continue;  // itself, a neighbour (routed above), or unreachable
      }
      std::vector<int> ports;
      std::vector<NextHopPort> group;
      for (int l : adj_[node]) {
        const auto [peer, peer_port] = topo_.peer(l, node);
        if (rib_->link_up(l) && dist[peer] == dist[node] - 1) {
          const int my_port = topo_.links[l].a == node ? topo_.links[l].a_port : topo_.links[l].b_port;
          ports.push_back(my_port);
          group.push_back(NextHopPort{my_port, topo_.links[l].rate_gbps, node_port_mac(topo_, peer, peer_port)});
        }
      }
      auto& [hops, loopbacks] = shared[s][std::move(ports)];
      hops = std::move(group);
      loopbacks.push_back(topo_.nodes[target].loopback);
    }
  }
  for (int s = 0; s < n; ++s) {
    for (auto& [ports, route] : shared[s]) {
      switches_[s]->set_route(route.second, std::move(route.first));
    }
  }
}

void Fabric::schedule_link_state(int link, bool up, common::TimeNs at) {
  IFEC_CHECK(link >= 0 && link < static_cast<int>(links_.size()),
             "link id " << link << " outside 0.." << links_.size() - 1);
  clock_.schedule(at, [this, link, up] {
    links_[link]->set_up(up);
    rib_->set_link_up(link, up);
    const uint64_t gen = ++generation_;
    clock_.schedule(clock_.now() + topo_.params.control_plane_delay_ns, [this, gen] { fare_round(gen); });
  });
}

void Fabric::fare_round(uint64_t generation) {
  // A newer event restarts propagation from its own adjacency; rounds of the older one keep running too,
  // since a synchronous round over the whole RIB is idempotent once converged.
  const bool changed = rib_->step();
  ++rounds_run_;
  if (!changed) {
    if (generation == generation_) {
      converged_ns_ = clock_.now();
    }
    return;
  }
  install_routes();
  for (auto& fn : listeners_) {
    fn(clock_.now());
  }
  clock_.schedule(clock_.now() + topo_.params.control_plane_delay_ns, [this, generation] { fare_round(generation); });
}

int Fabric::switch_of_plane(int gpu, int plane) const {
  for (const GpuPort& p : gpu_ports_.at(gpu)) {
    if (p.plane == plane) {
      const auto [node, port] = topo_.peer(p.link, topo_.gpu_node(gpu));
      return node_switch_[node];
    }
  }
  return -1;
}

size_t Fabric::routing_bytes() const {
  size_t bytes = rib_->memory_bytes();
  for (const auto& t : class_tables_) {
    bytes += t->memory_bytes();
  }
  for (const auto& s : switches_) {
    bytes += s->fib_bytes();
  }
  return bytes;
}

size_t Fabric::link_bytes() const {
  size_t bytes = links_.size() * (sizeof(std::optional<common::Link>) + sizeof(common::Link*));
  for (const auto& s : switches_) {
    bytes += s->port_state_bytes();
  }
  return bytes;
}

void Fabric::merge_counters(const std::function<void(std::vector<uint64_t>&)>& sum) {
  std::vector<uint64_t*> fields;
  for (auto& l : links_) {
    for (int side = 0; side < 2; ++side) {
      l->end(side).visit_counters([&](uint64_t& v) { fields.push_back(&v); });
    }
  }
  for (auto& s : switches_) {
    s->visit_counters([&](uint64_t& v) { fields.push_back(&v); });
  }
  std::vector<uint64_t> values(fields.size());
  for (size_t i = 0; i < fields.size(); ++i) {
    values[i] = *fields[i];
  }
  sum(values);
  for (size_t i = 0; i < fields.size(); ++i) {
    *fields[i] = values[i];
  }
}

SwitchTotals Fabric::switch_totals() const {
  SwitchTotals t;
  for (const auto& s : switches_) {
    SwitchTotals x = s->totals();
    t.rx_frames += x.rx_frames;
    t.tx_frames += x.tx_frames;
    t.drops += x.drops;
    t.buffer_drops += x.buffer_drops;
    t.ecn_marks += x.ecn_marks;
    t.pause_sent += x.pause_sent;
    t.pause_received += x.pause_received;
    t.shared_buffer_high_water = std::max(t.shared_buffer_high_water, x.shared_buffer_high_water);
  }
  return t;
}

void connect_processes(Fabric& fabric, PlanePartitions& parts) {
  for (const routing::Link& l : fabric.topology().links) {
    const std::pair<int, int> p[2] = {fabric.end_partition(l.id, 0), fabric.end_partition(l.id, 1)};
    if (!parts.remote(p[0].first, p[1].first)) {
      continue;
    }
    for (int side = 0; side < 2; ++side) {
      if (parts.owns(p[side].first)) {
        const uint32_t key = static_cast<uint32_t>(l.id) * 2 + static_cast<uint32_t>(1 - side);
        fabric.link(l.id).end(side).set_remote(
            parts.remote_sender(p[side].first, p[1 - side].first, key, p[side].second));
      }
    }
  }
  parts.on_remote_frame([&fabric](uint32_t key, std::vector<uint8_t>&& frame, uint64_t epoch) {
    fabric.link(static_cast<int>(key / 2)).end(static_cast<int>(key % 2)).arrive(std::move(frame), epoch);
  });
}

}  // namespace ifec::testbed
