// Topology queries, structural validation and the SuperPoD / multi-plane fat-tree generators.
#include "ifec/routing/topology.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <unordered_map>

#include "ifec/common/checks.h"
#include "ifec/common/control.h"
#include "ifec/common/names.h"
#include "topology_internal.h"

namespace ifec::routing {

namespace {
constexpr common::Name<NodeKind> kNodeKindNames[] = {{NodeKind::kGpu, "gpu"}, {NodeKind::kSwitch, "switch"}};
constexpr common::Vocabulary kNodeKinds("node kind", kNodeKindNames);
}  // namespace

const char* node_kind_name(NodeKind k) { return kNodeKinds.name(k); }

int Topology::num_gpus() const {
  return static_cast<int>(
      std::count_if(nodes.begin(), nodes.end(), [](const Node& n) { return n.kind == NodeKind::kGpu; }));
}

int Topology::gpu_node(int gpu_index) const {
  // validate() guarantees GPU i is node i; the scan keeps hand-built, not yet validated topologies working too.
  if (gpu_index >= 0 && gpu_index < static_cast<int>(nodes.size()) && nodes[gpu_index].kind == NodeKind::kGpu &&
      nodes[gpu_index].gpu_index == gpu_index) {
    return gpu_index;
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].kind == NodeKind::kGpu && nodes[i].gpu_index == gpu_index) return static_cast<int>(i);
  }
  IFEC_FAIL("topology '" << name << "': no GPU with index " << gpu_index << " (it has " << num_gpus() << " GPUs)");
}

int Topology::find_node(const std::string& node_name) const {
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].name == node_name) return static_cast<int>(i);
  }
  return -1;
}

std::vector<int> Topology::links_of(int node) const {
  IFEC_CHECK(node >= 0 && node < static_cast<int>(nodes.size()),
             "topology '" << name << "': node index " << node << " out of range [0, " << nodes.size() << ")");
  std::vector<int> out;
  for (const Link& l : links) {
    if (l.a == node || l.b == node) out.push_back(l.id);
  }
  return out;
}

std::vector<std::vector<int>> adjacency(const Topology& t) {
  std::vector<std::vector<int>> out(t.nodes.size());
  for (const Link& l : t.links) {
    IFEC_CHECK(l.a >= 0 && l.a < static_cast<int>(t.nodes.size()) && l.b >= 0 && l.b < static_cast<int>(t.nodes.size()),
               "topology '" << t.name << "': link " << l.id << " joins nodes " << l.a << " and " << l.b
                            << ", outside 0.." << t.nodes.size() - 1);
    out[l.a].push_back(l.id);
    if (l.b != l.a) out[l.b].push_back(l.id);
  }
  return out;
}

std::pair<int, int> Topology::peer(int link, int node) const {
  IFEC_CHECK(link >= 0 && link < static_cast<int>(links.size()),
             "topology '" << name << "': link id " << link << " out of range [0, " << links.size() << ")");
  const Link& l = links[link];
  if (l.a == node) return {l.b, l.b_port};
  if (l.b == node) return {l.a, l.a_port};
  IFEC_FAIL("topology '" << name << "': link " << link << " does not touch node " << node);
}

double Topology::gpu_access_gbps(int gpu_index) const {
  const int n = gpu_node(gpu_index);
  double sum = 0;
  for (const Link& l : links) {
    if ((l.a == n || l.b == n) && l.plane != kNvlinkPlane) sum += l.rate_gbps;
  }
  return sum;
}

bool Topology::gpu_on_plane(int gpu_index, int plane) const {
  const int p = nodes.at(gpu_node(gpu_index)).plane;
  return p == -1 || p == plane;
}

bool Topology::single_plane_gpus() const {
  return std::any_of(nodes.begin(), nodes.end(),
                     [](const Node& n) { return n.kind == NodeKind::kGpu && n.plane >= 0; });
}

std::vector<std::vector<int>> relay_table(const Topology& t) {
  const int gpus = t.num_gpus();
  std::vector<std::vector<int>> out(gpus, std::vector<int>(std::max(t.num_planes, 0), -1));
  for (int g = 0; g < gpus; ++g) {
    for (int p = 0; p < t.num_planes; ++p) {
      if (t.gpu_on_plane(g, p)) out[g][p] = g;
    }
  }
  for (const Link& l : t.links) {
    if (l.plane != kNvlinkPlane) continue;
    for (auto [x, y] : {std::pair{l.a, l.b}, std::pair{l.b, l.a}}) {
      const int p = t.nodes[y].plane;  // y carries x's traffic on y's own plane
      const int gx = t.nodes[x].gpu_index;
      if (p >= 0 && out[gx][p] < 0) out[gx][p] = t.nodes[y].gpu_index;
    }
  }
  return out;
}

namespace detail {

uint32_t gpu_loopback(int gpu_index) {
  const uint32_t i = static_cast<uint32_t>(gpu_index);
  return (10u << 24) | ((i / 250) << 8) | (i % 250 + 1);
}

uint32_t switch_loopback(int plane, int n) {
  return (10u << 24) | (255u << 16) | (static_cast<uint32_t>(plane) << 8) | static_cast<uint32_t>(n);
}

std::string ipv4_to_string(uint32_t addr) {
  std::ostringstream os;
  os << (addr >> 24) << '.' << ((addr >> 16) & 255) << '.' << ((addr >> 8) & 255) << '.' << (addr & 255);
  return os.str();
}

void assign_derived_fields(Topology& t) {
  for (Node& n : t.nodes) n.num_ports = 0;
  for (const Link& l : t.links) {
    if (l.a >= 0 && l.a < static_cast<int>(t.nodes.size())) {
      t.nodes[l.a].num_ports = std::max(t.nodes[l.a].num_ports, l.a_port + 1);
    }
    if (l.b >= 0 && l.b < static_cast<int>(t.nodes.size())) {
      t.nodes[l.b].num_ports = std::max(t.nodes[l.b].num_ports, l.b_port + 1);
    }
  }
  std::map<int, int> per_plane;
  for (Node& n : t.nodes) {
    if (n.kind == NodeKind::kGpu) {
      n.loopback = gpu_loopback(n.gpu_index);
    } else {
      n.loopback = switch_loopback(n.plane, ++per_plane[n.plane]);
    }
  }
}

std::string format_double(double v) {
  char buf[64];
  // Whole numbers (all rates and thresholds in practice) in plain digits: "%g" would turn 800 into "8e+02".
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

namespace {

std::optional<Problem> params_problem(const Topology& t) {
  const FabricParams& p = t.params;
  auto fail = [](std::string msg, std::vector<std::string> keys) {
    return Problem{std::move(msg), -1, -1, std::move(keys)};
  };
  std::ostringstream os;
  if (t.name.empty()) return fail("topology name is empty", {"name"});
  // The name names files and folders (a compose project's, reports'): one path component of printable characters.
  const auto unprintable = [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; };
  if (t.name == "." || t.name == ".." || t.name.find('/') != std::string::npos ||
      std::any_of(t.name.begin(), t.name.end(), unprintable)) {
    std::string shown;
    for (char c : t.name) shown += unprintable(c) ? '?' : c;
    return fail("topology name '" + shown + "': expected printable characters without '/' (it names folders)",
                {"name"});
  }
  // 256 planes at most: the plane is one octet of the switch loopback 10.255.plane.n.
  if (t.num_planes < 1 || t.num_planes > 256) {
    os << "planes must be in [1, 256], got " << t.num_planes;
    return fail(os.str(), {"planes"});
  }
  if (p.mtu < 256 || p.mtu > 9000) {
    os << "mtu " << p.mtu << " outside [256, 9000]";
    return fail(os.str(), {"params.mtu"});
  }
  // A full-sized frame with every header (Ethernet, IPv4, UDP, ECH, BTH, RETH, ICRC) must fit the shared buffer.
  if (p.buffer_bytes < p.mtu + 256ULL) {
    os << "buffer_bytes " << p.buffer_bytes << " holds no full-sized frame: at least mtu " << p.mtu
       << " + 256 bytes of headers (" << p.mtu + 256ULL << ")";
    return fail(os.str(), {"params.buffer_bytes", "params.mtu"});
  }
  if (p.priorities < 1 || p.priorities > 8) {
    os << "priorities must be in [1, 8], got " << p.priorities;
    return fail(os.str(), {"params.priorities"});
  }
  if (p.ecn.kmin_bytes > p.ecn.kmax_bytes) {
    os << "ecn kmin_bytes " << p.ecn.kmin_bytes << " > kmax_bytes " << p.ecn.kmax_bytes;
    return fail(os.str(), {"params.ecn.kmin_bytes", "params.ecn.kmax_bytes"});
  }
  if (!(p.ecn.pmax >= 0 && p.ecn.pmax <= 1)) {
    os << "ecn pmax " << format_double(p.ecn.pmax) << " outside [0, 1]";
    return fail(os.str(), {"params.ecn.pmax"});
  }
  if (p.pfc.xon_bytes > p.pfc.xoff_bytes) {
    os << "pfc xon_bytes " << p.pfc.xon_bytes << " > xoff_bytes " << p.pfc.xoff_bytes;
    return fail(os.str(), {"params.pfc.xon_bytes", "params.pfc.xoff_bytes"});
  }
  if (p.ifec.slot_pool == 0) return fail("ifec slot_pool must be > 0, got 0", {"params.ifec.slot_pool"});
  if (p.ifec.multicast_entries == 0) {
    return fail("ifec multicast_entries must be > 0, got 0 (no multicast could be held)",
                {"params.ifec.multicast_entries"});
  }
  if (p.ifec.slot_bytes < 64 || p.ifec.slot_bytes > 65536) {
    os << "ifec slot_bytes " << p.ifec.slot_bytes << " outside [64, 65536]";
    return fail(os.str(), {"params.ifec.slot_bytes"});
  }
  if (p.ifec.max_group_members < 2 || p.ifec.max_group_members > common::kMaxGroupMembers) {
    os << "ifec max_group_members " << p.ifec.max_group_members << " outside [2, " << common::kMaxGroupMembers << "]";
    return fail(os.str(), {"params.ifec.max_group_members"});
  }
  if (p.ifec.slot_timeout_ns == 0 || p.ifec.result_retransmit_ns == 0) {
    return fail("ifec timeouts must be > 0", {"params.ifec.slot_timeout_ns", "params.ifec.result_retransmit_ns"});
  }
  if (p.pfc.lossless_priority < 0 || p.pfc.lossless_priority >= p.priorities) {
    os << "pfc lossless_priority " << p.pfc.lossless_priority << " outside [0, " << p.priorities << ")";
    return fail(os.str(), {"params.pfc.lossless_priority", "params.priorities"});
  }
  return std::nullopt;
}

// A node's name names its namespace, container, host and log and key files, and goes into FRR's configuration:
// Docker's rule for container names, at most 63 characters (a host name's limit). "" when it is one.
std::string node_name_problem(const std::string& name) {
  const auto fits = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
  };
  if (name.size() <= 63 && std::isalnum(static_cast<unsigned char>(name[0])) &&
      std::all_of(name.begin(), name.end(), fits)) {
    return "";
  }
  std::string shown;
  for (char c : name.substr(0, 60)) shown += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  return "node name '" + shown + (name.size() > 60 ? "...'" : "'") +
         ": expected up to 63 letters, digits, '_', '.' or '-', the first a letter or digit (it names the node's "
         "namespace, container and files)";
}

std::optional<Problem> nodes_problem(const Topology& t) {
  const int num_nodes = static_cast<int>(t.nodes.size());
  auto fail = [](int node, const std::string& msg) { return Problem{msg, node, -1, {}}; };
  std::unordered_map<std::string, int> names;
  std::map<int, int> per_plane;
  int gpus = 0;
  for (int i = 0; i < num_nodes; ++i) {
    const Node& n = t.nodes[i];
    std::ostringstream os;
    if (n.name.empty()) return fail(i, "node #" + std::to_string(i) + " has an empty name");
    if (const std::string bad = node_name_problem(n.name); !bad.empty()) return fail(i, bad);
    if (!names.emplace(n.name, i).second) return fail(i, "duplicate node name '" + n.name + "'");
    if (n.kind == NodeKind::kGpu) {
      // GPUs first, in index order: node i is GPU i, which keeps gpu_node() trivial and the YAML form canonical.
      if (i != gpus || n.gpu_index != gpus) {
        os << "GPU '" << n.name << "' is node " << i << " with gpu_index " << n.gpu_index << "; GPUs must come first "
           << "in index order (expected node " << gpus << ", gpu_index " << gpus << ")";
        return fail(i, os.str());
      }
      if (n.plane < -1 || n.plane >= t.num_planes) {
        os << "GPU '" << n.name << "' has plane " << n.plane << ", expected -1 (every plane) or 0.."
           << t.num_planes - 1;
        return fail(i, os.str());
      }
      if (n.loopback != gpu_loopback(gpus)) {
        os << "GPU '" << n.name << "' loopback " << ipv4_to_string(n.loopback) << " differs from the scheme's "
           << ipv4_to_string(gpu_loopback(gpus));
        return fail(i, os.str());
      }
      ++gpus;
    } else {
      if (n.plane < 0 || n.plane >= t.num_planes) {
        os << "plane " << n.plane << " out of range [0, " << t.num_planes << ") for switch '" << n.name << "'";
        return fail(i, os.str());
      }
      if (n.gpu_index != -1) {
        return fail(i, "switch '" + n.name + "' has gpu_index " + std::to_string(n.gpu_index) + ", expected -1");
      }
      const int rank = ++per_plane[n.plane];
      if (rank > 254) {
        os << "switch '" << n.name << "' is switch #" << rank << " of plane " << n.plane
           << "; the 10.255.plane.n loopback scheme allows 254 per plane";
        return fail(i, os.str());
      }
      if (n.loopback != switch_loopback(n.plane, rank)) {
        os << "switch '" << n.name << "' loopback " << ipv4_to_string(n.loopback) << " differs from the scheme's "
           << ipv4_to_string(switch_loopback(n.plane, rank));
        return fail(i, os.str());
      }
    }
  }
  if (gpus == 0) return fail(-1, "topology has no GPUs");
  if (gpus > kMaxGpus)
    return fail(gpus - 1, "topology has " + std::to_string(gpus) + " GPUs; the loopback scheme allows " +
                              std::to_string(kMaxGpus));
  return std::nullopt;
}

std::optional<Problem> links_problem(const Topology& t) {
  const int num_nodes = static_cast<int>(t.nodes.size());
  auto fail = [](int link, const std::string& msg) { return Problem{msg, -1, link, {}}; };
  std::map<std::pair<int, int>, int> port_owner;  // (node, port) -> link
  std::vector<int> max_port(num_nodes, -1);
  std::vector<int> used_ports(num_nodes, 0);
  for (size_t li = 0; li < t.links.size(); ++li) {
    const Link& l = t.links[li];
    const int id = static_cast<int>(li);
    std::ostringstream os;
    os << "link " << id << ": ";
    if (l.id != id) return fail(id, os.str() + "id " + std::to_string(l.id) + " differs from its position");
    if (l.a < 0 || l.a >= num_nodes || l.b < 0 || l.b >= num_nodes) {
      os << "node index out of range (a " << l.a << ", b " << l.b << ", " << num_nodes << " nodes)";
      return fail(id, os.str());
    }
    const Node& a = t.nodes[l.a];
    const Node& b = t.nodes[l.b];
    os << "'" << a.name << "' - '" << b.name << "': ";
    if (l.a == l.b) return fail(id, os.str() + "connects a node to itself");
    if (l.plane == kNvlinkPlane && (a.kind != NodeKind::kGpu || b.kind != NodeKind::kGpu)) {
      return fail(id, os.str() + "an NVLink-class link (plane nvlink) joins two GPUs of a server, not a switch");
    }
    for (const Node* g : {&a, &b}) {
      if (l.plane != kNvlinkPlane && g->kind == NodeKind::kGpu && g->plane >= 0 && g->plane != l.plane) {
        os << "link plane " << l.plane << " but GPU '" << g->name << "' sits on plane " << g->plane << " only";
        return fail(id, os.str());
      }
    }
    if (l.plane != kNvlinkPlane && (l.plane < 0 || l.plane >= t.num_planes)) {
      os << "plane " << l.plane << " out of range [0, " << t.num_planes << ")";
      return fail(id, os.str());
    }
    for (const Node* s : {&a, &b}) {
      if (s->kind == NodeKind::kSwitch && s->plane != l.plane) {
        os << "link plane " << l.plane << " does not match switch '" << s->name << "' on plane " << s->plane;
        return fail(id, os.str());
      }
    }
    if (!(l.rate_gbps >= kMinLinkGbps && l.rate_gbps <= kMaxLinkGbps)) {
      return fail(id, os.str() + "rate_gbps " + format_double(l.rate_gbps) + " outside [0.001, 1000000] Gb/s");
    }
    for (auto [node, port] : {std::pair{l.a, l.a_port}, std::pair{l.b, l.b_port}}) {
      if (port < 0 || port >= t.nodes[node].num_ports) {
        os << "port " << port << " of '" << t.nodes[node].name << "' outside [0, " << t.nodes[node].num_ports << ")";
        return fail(id, os.str());
      }
      auto [it, fresh] = port_owner.emplace(std::pair{node, port}, id);
      if (!fresh) {
        os << "duplicate port: node '" << t.nodes[node].name << "' port " << port << " is already used by link "
           << it->second;
        return fail(id, os.str());
      }
      max_port[node] = std::max(max_port[node], port);
      ++used_ports[node];
    }
    // Cable structure: sub-links of one cable are consecutive links with subport 0..k-1 and equal attributes,
    // and cable ids count up from 0. The YAML form writes one entry per cable, so this is what round-trips.
    if (l.subports < 1) return fail(id, os.str() + "subports must be >= 1, got " + std::to_string(l.subports));
    if (l.subport < 0 || l.subport >= l.subports) {
      os << "subport " << l.subport << " outside [0, " << l.subports << ")";
      return fail(id, os.str());
    }
    const Link* prev = li > 0 ? &t.links[li - 1] : nullptr;
    const bool prev_complete = prev == nullptr || prev->subport == prev->subports - 1;
    if (l.subport == 0) {
      const int expected = prev == nullptr ? 0 : prev->cable + 1;
      if (!prev_complete) {
        os << "cable " << prev->cable << " ends after " << prev->subport + 1 << " of its " << prev->subports
           << " sub-links";
        return fail(id - 1, os.str());
      }
      if (l.cable != expected) {
        os << "cable id " << l.cable << ", expected " << expected << " (cable ids count up from 0 in link order)";
        return fail(id, os.str());
      }
    } else {
      const bool same = prev != nullptr && prev->cable == l.cable && prev->subport == l.subport - 1 && prev->a == l.a &&
                        prev->b == l.b && prev->a_port + 1 == l.a_port && prev->b_port + 1 == l.b_port &&
                        prev->plane == l.plane && prev->rate_gbps == l.rate_gbps && prev->delay_ns == l.delay_ns &&
                        prev->subports == l.subports;
      if (!same) {
        os << "sub-link " << l.subport << " of cable " << l.cable << " must follow sub-link " << l.subport - 1
           << " with the same ends, plane, rate, delay and the next ports";
        return fail(id, os.str());
      }
    }
  }
  if (!t.links.empty() && t.links.back().subport != t.links.back().subports - 1) {
    const Link& l = t.links.back();
    std::ostringstream os;
    os << "cable " << l.cable << " ends after " << l.subport + 1 << " of its " << l.subports << " sub-links";
    return fail(l.id, os.str());
  }
  for (int i = 0; i < num_nodes; ++i) {
    if (t.nodes[i].num_ports != max_port[i] + 1) {
      std::ostringstream os;
      os << "node '" << t.nodes[i].name << "' has num_ports " << t.nodes[i].num_ports
         << " but its highest used port is " << max_port[i];
      return Problem{os.str(), i, -1, {}};
    }
    if (used_ports[i] != max_port[i] + 1) {  // the simulator and the daemons run one port per link, 0..highest
      int free = 0;
      while (port_owner.count({i, free}) != 0) ++free;
      std::ostringstream os;
      os << "node '" << t.nodes[i].name << "' has no link on port " << free << " (ports 0.." << max_port[i]
         << " each need one: a_port/b_port may reorder a node's ports, not skip one)";
      return Problem{os.str(), i, -1, {}};
    }
  }
  return std::nullopt;
}

// Every pair of the GPUs on a plane must be joined on it by a path whose interior is switches only (GPUs never
// transit), and a GPU not on the plane needs an NVLink-class peer on it. Per plane: union-find over switch-switch
// links, then two GPUs connect iff they touch a common component.
std::optional<Problem> reachability_problem(const Topology& t) {
  const int num_nodes = static_cast<int>(t.nodes.size());
  const int gpus = t.num_gpus();
  const std::vector<std::vector<int>> relays = relay_table(t);
  std::vector<int> parent(num_nodes);
  auto find = [&](int x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  for (int p = 0; p < t.num_planes; ++p) {
    std::iota(parent.begin(), parent.end(), 0);
    for (const Link& l : t.links) {
      if (l.plane == p && t.nodes[l.a].kind == NodeKind::kSwitch && t.nodes[l.b].kind == NodeKind::kSwitch) {
        parent[find(l.a)] = find(l.b);
      }
    }
    std::vector<std::vector<int>> comps(gpus);  // per GPU: sorted switch components it attaches to on plane p
    for (const Link& l : t.links) {
      if (l.plane != p) continue;
      if (t.nodes[l.a].kind == NodeKind::kGpu) comps[l.a].push_back(find(l.b));
      if (t.nodes[l.b].kind == NodeKind::kGpu) comps[l.b].push_back(find(l.a));
    }
    std::vector<int> on;  // the GPUs with a NIC port on plane p
    for (int g = 0; g < gpus; ++g) {
      std::sort(comps[g].begin(), comps[g].end());
      comps[g].erase(std::unique(comps[g].begin(), comps[g].end()), comps[g].end());
      if (!t.gpu_on_plane(g, p)) {
        if (relays[g][p] < 0) {
          std::ostringstream os;
          os << "GPU '" << t.nodes[g].name << "' (plane " << t.nodes[g].plane << ") has no NVLink-class peer on plane "
             << p << " to reach it through";
          return Problem{os.str(), g, -1, {}};
        }
        continue;
      }
      on.push_back(g);
      if (comps[g].empty()) {
        std::ostringstream os;
        const int other = g == 0 ? (gpus > 1 ? 1 : 0) : 0;
        os << "GPU '" << t.nodes[g].name << "' cannot reach GPU '" << t.nodes[other].name << "' on plane " << p
           << ": it has no link on plane " << p;
        return Problem{os.str(), g, -1, {}};
      }
    }
    std::set<std::pair<int, int>> direct;  // GPU pairs joined by a point-to-point link on this plane
    for (const Link& l : t.links) {
      if (l.plane == p && t.nodes[l.a].kind == NodeKind::kGpu && t.nodes[l.b].kind == NodeKind::kGpu) {
        direct.insert({std::min(l.a, l.b), std::max(l.a, l.b)});
      }
    }
    for (size_t i = 0; i < on.size(); ++i) {
      for (size_t j = i + 1; j < on.size(); ++j) {
        const int x = on[i];
        const int y = on[j];
        if (comps[x] == comps[y] || direct.count({x, y})) continue;  // common case first: skip the set walk
        std::vector<int> common;
        std::set_intersection(comps[x].begin(), comps[x].end(), comps[y].begin(), comps[y].end(),
                              std::back_inserter(common));
        if (common.empty()) {
          std::ostringstream os;
          os << "GPU '" << t.nodes[x].name << "' cannot reach GPU '" << t.nodes[y].name << "' on plane " << p;
          return Problem{os.str(), y, -1, {}};
        }
      }
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<Problem> find_problem(const Topology& t) {
  if (auto p = params_problem(t)) return p;
  if (auto p = nodes_problem(t)) return p;
  if (auto p = links_problem(t)) return p;
  return reachability_problem(t);
}

}  // namespace detail

void validate(const Topology& t) {
  if (auto p = detail::find_problem(t)) {
    const std::string where = t.source.empty() ? t.name : t.source;
    IFEC_FAIL(where << ": " << p->message);
  }
}

namespace {

void add_cable(Topology& t, int a, int b, int plane, double cable_gbps, int subports, uint64_t delay_ns,
               std::vector<int>& next_port, int cable) {
  for (int s = 0; s < subports; ++s) {
    Link l;
    l.id = static_cast<int>(t.links.size());
    l.a = a;
    l.a_port = next_port[a]++;
    l.b = b;
    l.b_port = next_port[b]++;
    l.plane = plane;
    l.rate_gbps = cable_gbps / subports;
    l.delay_ns = delay_ns;
    l.cable = cable;
    l.subport = s;
    l.subports = subports;
    t.links.push_back(l);
  }
}

void add_gpus(Topology& t, int gpus) {
  for (int i = 0; i < gpus; ++i) {
    Node n;
    n.name = "gpu" + std::to_string(i);
    n.kind = NodeKind::kGpu;
    n.gpu_index = i;
    t.nodes.push_back(n);
  }
}

int add_switch(Topology& t, const std::string& name, int plane) {
  Node n;
  n.name = name;
  n.kind = NodeKind::kSwitch;
  n.plane = plane;
  t.nodes.push_back(n);
  return static_cast<int>(t.nodes.size()) - 1;
}

// Each plane's leaves ("pP-leafI") and spines ("pP-spineS"), as node indices [plane][i].
void add_two_tier_switches(Topology& t, int planes, int leaves, int spines, std::vector<std::vector<int>>& leaf,
                           std::vector<std::vector<int>>& spine) {
  leaf.assign(planes, {});
  spine.assign(planes, {});
  for (int p = 0; p < planes; ++p) {
    const std::string prefix = "p" + std::to_string(p) + "-";
    for (int i = 0; i < leaves; ++i) leaf[p].push_back(add_switch(t, prefix + "leaf" + std::to_string(i), p));
    for (int i = 0; i < spines; ++i) spine[p].push_back(add_switch(t, prefix + "spine" + std::to_string(i), p));
  }
}

// Every leaf of a plane to every spine of it, plane by plane.
void add_leaf_spine_mesh(Topology& t, const std::vector<std::vector<int>>& leaf,
                         const std::vector<std::vector<int>>& spine, double gbps, uint64_t delay_ns,
                         std::vector<int>& next_port, int& cable) {
  for (size_t p = 0; p < leaf.size(); ++p) {
    for (int l : leaf[p]) {
      for (int s : spine[p]) add_cable(t, l, s, static_cast<int>(p), gbps, 1, delay_ns, next_port, cable++);
    }
  }
}

// A generator's arguments against the limits a topology file has, and the links it would lay out, before anything is
// built: `links` is computed in floating point by the caller (a product of counts can overflow an int).
struct GeneratorLimits {
  const char* fn;
  void count(const char* what, long long v, long long lo, long long hi) const {
    IFEC_CHECK(v >= lo && v <= hi, fn << ": " << what << " must be " << lo << ".." << hi << ", got " << v);
  }
  void rate(const char* what, double gbps) const {
    IFEC_CHECK(gbps >= kMinLinkGbps && gbps <= kMaxLinkGbps,
               fn << ": " << what << " must be " << kMinLinkGbps << ".." << kMaxLinkGbps << " Gb/s, got " << gbps);
  }
  void delay(const char* what, uint64_t ns) const {
    IFEC_CHECK(ns <= kMaxDelayNs, fn << ": " << what << " must be at most " << kMaxDelayNs << " ns, got " << ns);
  }
  void links(double n) const {
    IFEC_CHECK(n <= static_cast<double>(kMaxGeneratedLinks), fn << ": these arguments lay out " << std::setprecision(4)
                                                                << n << " links; at most " << kMaxGeneratedLinks);
  }
};

}  // namespace

Topology make_superpod(int gpus, int planes, double port_gbps, int subports, uint64_t delay_ns) {
  const GeneratorLimits check{"make_superpod"};
  check.count("gpus", gpus, 1, kMaxGpus);
  check.count("planes", planes, 1, kMaxPlanes);
  check.rate("port_gbps", port_gbps);
  check.count("subports", subports, 1, 8);
  check.delay("delay_ns", delay_ns);
  check.links(static_cast<double>(gpus) * planes * subports);
  Topology t;
  t.name = "superpod-" + std::to_string(gpus) + "x" + std::to_string(planes);
  std::ostringstream src;
  src << "generator:make_superpod(" << gpus << ", " << planes << ", " << detail::format_double(port_gbps) << ", "
      << subports << ", " << delay_ns << ")";
  t.source = src.str();
  t.num_planes = planes;
  add_gpus(t, gpus);
  std::vector<int> sw(planes);
  for (int p = 0; p < planes; ++p) sw[p] = add_switch(t, "p" + std::to_string(p) + "-sw", p);
  std::vector<int> next_port(t.nodes.size(), 0);
  int cable = 0;
  // GPU-major so a GPU's ports run plane by plane (plane p = ports p*k .. p*k+k-1) and switch port g*k+s is GPU g.
  for (int g = 0; g < gpus; ++g) {
    for (int p = 0; p < planes; ++p) add_cable(t, g, sw[p], p, port_gbps, subports, delay_ns, next_port, cable++);
  }
  detail::assign_derived_fields(t);
  validate(t);
  return t;
}

Topology make_paced_superpod() {
  Topology t = make_superpod(4, 2, 0.02, 2);
  t.name = "paced-4x2";
  t.source = "generator:make_paced_superpod() = " + t.source.substr(std::string("generator:").size());
  return t;
}

Topology make_fat_tree(int gpus, int planes, int leaves, int spines, double nic_gbps, double fabric_gbps,
                       uint64_t delay_ns, int nic_subports) {
  const GeneratorLimits check{"make_fat_tree"};
  check.count("gpus", gpus, 1, kMaxGpus);
  check.count("planes", planes, 1, kMaxPlanes);
  IFEC_CHECK(leaves >= 1 && gpus % leaves == 0,
             "make_fat_tree: leaves must be >= 1 and divide gpus (" << gpus << "), got " << leaves);
  check.count("spines", spines, 1, 1 << 16);
  check.rate("nic_gbps", nic_gbps);
  check.rate("fabric_gbps", fabric_gbps);
  check.delay("delay_ns", delay_ns);
  check.count("nic_subports", nic_subports, 1, 8);
  check.links(static_cast<double>(planes) *
              (static_cast<double>(gpus) * nic_subports + static_cast<double>(leaves) * spines));
  Topology t;
  t.name = "fat-tree-" + std::to_string(gpus) + "x" + std::to_string(planes);
  std::ostringstream src;
  src << "generator:make_fat_tree(" << gpus << ", " << planes << ", " << leaves << ", " << spines << ", "
      << detail::format_double(nic_gbps) << ", " << detail::format_double(fabric_gbps) << ", " << delay_ns
      << (nic_subports > 1 ? ", " + std::to_string(nic_subports) : std::string()) << ")";
  t.source = src.str();
  t.num_planes = planes;
  add_gpus(t, gpus);
  std::vector<std::vector<int>> leaf, spine;
  add_two_tier_switches(t, planes, leaves, spines, leaf, spine);
  std::vector<int> next_port(t.nodes.size(), 0);
  int cable = 0;
  const int per_leaf = gpus / leaves;
  // Access links first, so a leaf's ports 0..per_leaf-1 face its GPUs and the uplinks follow.
  for (int g = 0; g < gpus; ++g) {
    for (int p = 0; p < planes; ++p)
      add_cable(t, g, leaf[p][g / per_leaf], p, nic_gbps, nic_subports, delay_ns, next_port, cable++);
  }
  add_leaf_spine_mesh(t, leaf, spine, fabric_gbps, delay_ns, next_port, cable);
  detail::assign_derived_fields(t);
  validate(t);
  return t;
}

Topology make_deepseek_fabric(int nodes, int gpus_per_node, int leaves, int spines, double nic_gbps, double nvlink_gbps,
                              uint64_t delay_ns, uint64_t nvlink_delay_ns) {
  const GeneratorLimits check{"make_deepseek_fabric"};
  check.count("nodes", nodes, 1, kMaxGpus);
  check.count("gpus_per_node (the planes)", gpus_per_node, 1, kMaxPlanes);
  check.count("nodes x gpus_per_node (the GPUs)", static_cast<long long>(nodes) * gpus_per_node, 1, kMaxGpus);
  IFEC_CHECK(leaves >= 1 && nodes % leaves == 0,
             "make_deepseek_fabric: leaves must be >= 1 and divide nodes (" << nodes << "), got " << leaves);
  check.count("spines", spines, 1, 1 << 16);
  check.rate("nic_gbps", nic_gbps);
  check.rate("nvlink_gbps", nvlink_gbps);
  check.delay("delay_ns", delay_ns);
  check.delay("nvlink_delay_ns", nvlink_delay_ns);
  const double g = gpus_per_node;
  check.links(static_cast<double>(nodes) * (g + g * (g - 1) / 2) + g * leaves * static_cast<double>(spines));
  const int planes = gpus_per_node;
  const int gpus = nodes * gpus_per_node;
  Topology t;
  t.name = "deepseek-" + std::to_string(gpus) + "x" + std::to_string(planes);
  std::ostringstream src;
  src << "generator:make_deepseek_fabric(" << nodes << ", " << gpus_per_node << ", " << leaves << ", " << spines << ", "
      << detail::format_double(nic_gbps) << ", " << detail::format_double(nvlink_gbps) << ", " << delay_ns << ", "
      << nvlink_delay_ns << ")";
  t.source = src.str();
  t.num_planes = planes;
  add_gpus(t, gpus);
  for (int g = 0; g < gpus; ++g) t.nodes[g].plane = g % gpus_per_node;
  std::vector<std::vector<int>> leaf, spine;
  add_two_tier_switches(t, planes, leaves, spines, leaf, spine);
  std::vector<int> next_port(t.nodes.size(), 0);
  int cable = 0;
  const int per_leaf = nodes / leaves;
  // Per server: each GPU's NIC (its port 0) to its plane's leaf, then the GPUs' NVLink-class mesh.
  for (int n = 0; n < nodes; ++n) {
    for (int i = 0; i < gpus_per_node; ++i) {
      add_cable(t, n * gpus_per_node + i, leaf[i][n / per_leaf], i, nic_gbps, 1, delay_ns, next_port, cable++);
    }
    for (int i = 0; i < gpus_per_node; ++i) {
      for (int j = i + 1; j < gpus_per_node; ++j) {
        add_cable(t, n * gpus_per_node + i, n * gpus_per_node + j, kNvlinkPlane, nvlink_gbps, 1, nvlink_delay_ns,
                  next_port, cable++);
      }
    }
  }
  add_leaf_spine_mesh(t, leaf, spine, nic_gbps, delay_ns, next_port, cable);
  detail::assign_derived_fields(t);
  validate(t);
  return t;
}

}  // namespace ifec::routing
