// YAML form of a Topology (schema in testbed/topologies/README.md): load_topology, parse_topology and to_yaml.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>

#include "ifec/common/checks.h"
#include "ifec/common/files.h"
#include "ifec/routing/topology.h"
#include "topology_internal.h"

namespace ifec::routing {

namespace {

// The control plane's and the switches' timers at most a minute (as a link's delay at most kMaxDelayNs: beyond
// these a run is nonsense, and their sums would wrap simulated time).
constexpr uint64_t kMaxTimerNs = 60'000'000'000;

// yaml-cpp lines are 0-based; messages are 1-based like every editor. A null mark (no position) becomes line 1.
int line_of(const YAML::Mark& m) { return m.line < 0 ? 1 : m.line + 1; }

// A node as an error shows it: a scalar quoted, cut after 60 characters (a file of one 50 MB line is one scalar).
std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Scalar:
      return n.Scalar().size() <= 60
                 ? "'" + n.Scalar() + "'"
                 : "'" + n.Scalar().substr(0, 60) + "...' (" + std::to_string(n.Scalar().size()) + " characters)";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    default:
      return "nothing";
  }
}

class Parser;

// One YAML mapping with its keys checked against the schema: unknown and repeated keys are errors, because a
// typo would otherwise silently fall back to a default.
class Fields {
 public:
  Fields(const Parser& p, const YAML::Node& map, const std::string& context,
         std::initializer_list<const char*> allowed);
  const YAML::Node* get(const std::string& key) const {
    auto it = values_.find(key);
    return it == values_.end() ? nullptr : &it->second;
  }
  const YAML::Node& require(const std::string& key) const;
  const YAML::Mark& mark() const { return mark_; }

 private:
  const Parser& parser_;
  std::string context_;
  YAML::Mark mark_;
  std::map<std::string, YAML::Node> values_;
};

class Parser {
 public:
  explicit Parser(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const YAML::Mark& mark, const std::string& msg) const { fail_line(line_of(mark), msg); }
  [[noreturn]] void fail_line(int line, const std::string& msg) const {
    IFEC_FAIL(source_ << ":" << line << ": " << msg);
  }

  Topology parse(const std::string& text) {
    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::ParserException& e) {
      fail(e.mark, "YAML syntax error: " + e.msg);
    }
    if (!root.IsMap()) fail(root.Mark(), "expected a mapping at the top level, got " + describe(root));
    Fields top(*this, root, "topology",
               {"name", "planes", "params", "link_defaults", "gpus", "switches", "links", "generator"});
    if (const YAML::Node* gen = top.get("generator")) {
      return parse_generated(top, *gen);
    }
    Topology t;
    t.source = source_;
    t.name = string_value(top.require("name"), "name");
    key_lines_["name"] = line_of(top.require("name").Mark());
    const YAML::Node& planes = top.require("planes");
    t.num_planes = int_value(planes, "planes", 1, 256);
    key_lines_["planes"] = line_of(planes.Mark());
    if (const YAML::Node* params = top.get("params")) parse_params(*params, t.params);
    if (const YAML::Node* defaults = top.get("link_defaults")) parse_link_defaults(*defaults);
    parse_gpus(top.require("gpus"), t);
    parse_switches(top.require("switches"), t);
    parse_links(top.require("links"), t);
    detail::assign_derived_fields(t);
    if (auto problem = detail::find_problem(t)) fail_line(problem_line(*problem, top.mark()), problem->message);
    return t;
  }

  // `generator: {kind: superpod | fat_tree | deepseek, ...}` in place of gpus/switches/links: the generator's topology
  // under the file's name and params, validated the same way.
  Topology parse_generated(const Fields& top, const YAML::Node& gen) {
    for (const char* key : {"planes", "link_defaults", "gpus", "switches", "links"}) {
      if (const YAML::Node* n = top.get(key)) {
        fail(n->Mark(), std::string(key) + " does not go with a generator (it lays out the whole fabric)");
      }
    }
    if (!gen.IsMap()) fail(gen.Mark(), "generator must be a mapping {kind: ..., ...}, got " + describe(gen));
    Topology t;
    try {
      t = generate(gen);
    } catch (const common::Error& e) {
      if (std::string(e.what()).rfind(source_ + ":", 0) == 0) throw;  // a parameter's own error, at its line
      fail(gen.Mark(), std::string("generator: ") + e.what());
    }
    t.name = string_value(top.require("name"), "name");
    t.source = source_ + " (" + t.source + ")";
    if (const YAML::Node* params = top.get("params")) parse_params(*params, t.params);
    if (auto problem = detail::find_problem(t)) fail_line(problem_line(*problem, gen.Mark()), problem->message);
    return t;
  }

  Topology generate(const YAML::Node& gen) {
    const std::string kind = gen["kind"] ? string_value(gen["kind"], "generator kind") : "";
    constexpr double kRequired = -1;
    auto num = [&](const char* key, double dflt, double lo, double hi) {
      const YAML::Node n = gen[key];
      if (!n && dflt == kRequired) fail(gen.Mark(), std::string("generator ") + key + " is required");
      if (!n) return dflt;
      const double v = double_value(n, std::string("generator ") + key);
      if (!(v >= lo && v <= hi)) {
        std::ostringstream os;
        os << std::setprecision(15) << "generator " << key << " " << n.Scalar() << " outside [" << lo << ", " << hi
           << "]";
        fail(n.Mark(), os.str());
      }
      return v;
    };
    auto whole = [&](const char* key, double dflt, double lo, double hi) {
      const double v = num(key, dflt, lo, hi);
      if (v != std::floor(v)) fail(gen[key].Mark(), std::string("generator ") + key + " must be a whole number");
      return static_cast<int>(v);
    };
    if (kind == "superpod") {
      Fields(*this, gen, "generator", {"kind", "gpus", "planes", "port_gbps", "subports", "delay_ns"});
      return make_superpod(whole("gpus", kRequired, 1, kMaxGpus), whole("planes", kRequired, 1, kMaxPlanes),
                           num("port_gbps", 800, 1e-3, 1e6), whole("subports", 2, 1, 8),
                           static_cast<uint64_t>(whole("delay_ns", 500, 0, kMaxDelayNs)));
    }
    if (kind == "fat_tree") {
      Fields(*this, gen, "generator",
             {"kind", "gpus", "planes", "leaves", "spines", "nic_gbps", "fabric_gbps", "delay_ns", "nic_subports"});
      return make_fat_tree(whole("gpus", kRequired, 1, kMaxGpus), whole("planes", kRequired, 1, kMaxPlanes),
                           whole("leaves", kRequired, 1, 1 << 16), whole("spines", kRequired, 1, 1 << 16),
                           num("nic_gbps", 400, 1e-3, 1e6), num("fabric_gbps", 400, 1e-3, 1e6),
                           static_cast<uint64_t>(whole("delay_ns", 500, 0, kMaxDelayNs)),
                           whole("nic_subports", 1, 1, 8));
    }
    if (kind == "deepseek") {
      Fields(*this, gen, "generator",
             {"kind", "nodes", "gpus_per_node", "leaves", "spines", "nic_gbps", "nvlink_gbps", "delay_ns",
              "nvlink_delay_ns"});
      const int nodes = whole("nodes", kRequired, 1, kMaxGpus);
      const int per_node = whole("gpus_per_node", 8, 1, kMaxPlanes);
      if (static_cast<long long>(nodes) * per_node > kMaxGpus) {
        fail(gen["nodes"].Mark(), "generator nodes " + std::to_string(nodes) + " x gpus_per_node " +
                                      std::to_string(per_node) + " = " +
                                      std::to_string(static_cast<long long>(nodes) * per_node) +
                                      " GPUs; the loopback scheme allows " + std::to_string(kMaxGpus));
      }
      return make_deepseek_fabric(nodes, per_node, whole("leaves", kRequired, 1, 1 << 16),
                                  whole("spines", kRequired, 1, 1 << 16), num("nic_gbps", 400, 1e-3, 1e6),
                                  num("nvlink_gbps", 1280, 1e-3, 1e6),
                                  static_cast<uint64_t>(whole("delay_ns", 500, 0, kMaxDelayNs)),
                                  static_cast<uint64_t>(whole("nvlink_delay_ns", 200, 0, kMaxDelayNs)));
    }
    fail(gen.Mark(), "generator kind '" + kind + "': expected superpod, fat_tree or deepseek");
  }

  std::string string_value(const YAML::Node& n, const std::string& what) const {
    if (!n.IsScalar() || n.Scalar().empty()) fail(n.Mark(), what + " must be a non-empty string, got " + describe(n));
    return n.Scalar();
  }

  long long int_value(const YAML::Node& n, const std::string& what, long long lo, long long hi) const {
    long long v = 0;
    if (!n.IsScalar() || !YAML::convert<long long>::decode(n, v)) {
      fail(n.Mark(), what + " must be an integer, got " + describe(n));
    }
    if (v < lo || v > hi) {
      std::ostringstream os;
      os << what << " " << v << " outside [" << lo << ", " << hi << "]";
      fail(n.Mark(), os.str());
    }
    return v;
  }

  uint64_t uint_value(const YAML::Node& n, const std::string& what,
                      uint64_t hi = std::numeric_limits<uint64_t>::max()) const {
    uint64_t v = 0;
    long long negative = 0;
    if (n.IsScalar() && YAML::convert<long long>::decode(n, negative) && negative < 0) {
      fail(n.Mark(), what + " must be >= 0, got " + n.Scalar());
    }
    if (!n.IsScalar() || !YAML::convert<uint64_t>::decode(n, v)) {
      fail(n.Mark(), what + " must be a non-negative integer, got " + describe(n));
    }
    if (v > hi) fail(n.Mark(), what + " " + n.Scalar() + " exceeds " + std::to_string(hi));
    return v;
  }

  double double_value(const YAML::Node& n, const std::string& what) const {
    double v = 0;
    if (!n.IsScalar() || !YAML::convert<double>::decode(n, v) || std::isnan(v)) {
      fail(n.Mark(), what + " must be a number, got " + describe(n));
    }
    return v;
  }

  bool bool_value(const YAML::Node& n, const std::string& what) const {
    bool v = false;
    if (!n.IsScalar() || !YAML::convert<bool>::decode(n, v)) {
      fail(n.Mark(), what + " must be true or false, got " + describe(n));
    }
    return v;
  }

 private:
  void parse_params(const YAML::Node& n, FabricParams& p) {
    if (!n.IsMap()) fail(n.Mark(), "params must be a mapping, got " + describe(n));
    key_lines_["params"] = line_of(n.Mark());
    Fields f(
        *this, n, "params",
        {"mtu", "buffer_bytes", "wire_overhead_bytes", "control_plane_delay_ns", "priorities", "ecn", "pfc", "ifec"});
    const uint64_t u32 = std::numeric_limits<uint32_t>::max();
    if (auto* v = field(f, "params.mtu")) p.mtu = static_cast<uint32_t>(uint_value(*v, "mtu", u32));
    if (auto* v = field(f, "params.buffer_bytes")) p.buffer_bytes = uint_value(*v, "buffer_bytes");
    if (auto* v = field(f, "params.wire_overhead_bytes")) {
      p.wire_overhead_bytes = static_cast<uint32_t>(uint_value(*v, "wire_overhead_bytes", u32));
    }
    if (auto* v = field(f, "params.control_plane_delay_ns")) {
      p.control_plane_delay_ns = uint_value(*v, "control_plane_delay_ns", kMaxTimerNs);
    }
    if (auto* v = field(f, "params.priorities")) p.priorities = static_cast<int>(int_value(*v, "priorities", 1, 8));
    if (auto* ecn = field(f, "params.ecn")) {
      if (!ecn->IsMap()) fail(ecn->Mark(), "ecn must be a mapping, got " + describe(*ecn));
      Fields e(*this, *ecn, "ecn", {"kmin_bytes", "kmax_bytes", "pmax"});
      if (auto* v = field(e, "params.ecn.kmin_bytes")) p.ecn.kmin_bytes = uint_value(*v, "kmin_bytes");
      if (auto* v = field(e, "params.ecn.kmax_bytes")) p.ecn.kmax_bytes = uint_value(*v, "kmax_bytes");
      if (auto* v = field(e, "params.ecn.pmax")) p.ecn.pmax = double_value(*v, "pmax");
    }
    if (auto* pfc = field(f, "params.pfc")) {
      if (!pfc->IsMap()) fail(pfc->Mark(), "pfc must be a mapping, got " + describe(*pfc));
      Fields e(*this, *pfc, "pfc", {"enabled", "xoff_bytes", "xon_bytes", "lossless_priority"});
      if (auto* v = field(e, "params.pfc.enabled")) p.pfc.enabled = bool_value(*v, "enabled");
      if (auto* v = field(e, "params.pfc.xoff_bytes")) p.pfc.xoff_bytes = uint_value(*v, "xoff_bytes");
      if (auto* v = field(e, "params.pfc.xon_bytes")) p.pfc.xon_bytes = uint_value(*v, "xon_bytes");
      if (auto* v = field(e, "params.pfc.lossless_priority")) {
        p.pfc.lossless_priority = static_cast<int>(int_value(*v, "lossless_priority", 0, 7));
      }
    }
    if (auto* ifec = field(f, "params.ifec")) parse_ifec(*ifec, p.ifec);
  }

  void parse_ifec(const YAML::Node& n, IfecParams& p) {
    if (!n.IsMap()) fail(n.Mark(), "ifec must be a mapping, got " + describe(n));
    Fields e(*this, n, "ifec",
             {"slot_pool", "slot_bytes", "slot_timeout_ns", "result_retransmit_ns", "result_retries",
              "multicast_entries", "max_group_members", "upstream_fp32", "reproducible"});
    const uint64_t u32 = std::numeric_limits<uint32_t>::max();
    if (auto* v = field(e, "params.ifec.slot_pool"))
      p.slot_pool = static_cast<uint32_t>(uint_value(*v, "slot_pool", u32));
    if (auto* v = field(e, "params.ifec.slot_bytes"))
      p.slot_bytes = static_cast<uint32_t>(uint_value(*v, "slot_bytes", u32));
    if (auto* v = field(e, "params.ifec.slot_timeout_ns"))
      p.slot_timeout_ns = uint_value(*v, "slot_timeout_ns", kMaxTimerNs);
    if (auto* v = field(e, "params.ifec.result_retransmit_ns")) {
      p.result_retransmit_ns = uint_value(*v, "result_retransmit_ns", kMaxTimerNs);
    }
    if (auto* v = field(e, "params.ifec.result_retries")) {
      p.result_retries = static_cast<uint32_t>(uint_value(*v, "result_retries", 1000));
    }
    if (auto* v = field(e, "params.ifec.multicast_entries")) {
      p.multicast_entries = static_cast<uint32_t>(uint_value(*v, "multicast_entries", u32));
    }
    if (auto* v = field(e, "params.ifec.max_group_members")) {
      p.max_group_members = static_cast<uint32_t>(uint_value(*v, "max_group_members", u32));
    }
    if (auto* v = field(e, "params.ifec.upstream_fp32")) p.upstream_fp32 = bool_value(*v, "upstream_fp32");
    if (auto* v = field(e, "params.ifec.reproducible")) p.reproducible = bool_value(*v, "reproducible");
  }

  // Looks up the last component of a dotted key and remembers its line for validate()'s problems.
  const YAML::Node* field(const Fields& f, const std::string& dotted) {
    const YAML::Node* v = f.get(dotted.substr(dotted.rfind('.') + 1));
    if (v != nullptr) key_lines_[dotted] = line_of(v->Mark());
    return v;
  }

  void parse_link_defaults(const YAML::Node& n) {
    if (!n.IsMap()) fail(n.Mark(), "link_defaults must be a mapping, got " + describe(n));
    Fields f(*this, n, "link_defaults", {"rate_gbps", "subports", "delay_ns"});
    if (auto* v = f.get("rate_gbps")) default_rate_ = rate_value(*v, "rate_gbps");
    if (auto* v = f.get("subports")) default_subports_ = subports_value(*v);
    if (auto* v = f.get("delay_ns")) default_delay_ = uint_value(*v, "delay_ns", kMaxDelayNs);
  }

  // Link rates the link model can time exactly: 1 Mb/s .. 1 Pb/s.
  double rate_value(const YAML::Node& n, const std::string& what) const {
    const double r = double_value(n, what);
    if (!(r >= kMinLinkGbps && r <= kMaxLinkGbps)) {
      fail(n.Mark(), what + " " + n.Scalar() + " outside [0.001, 1000000] Gb/s");
    }
    return r;
  }

  int subports_value(const YAML::Node& n) const {
    long long v = 0;
    if (!n.IsScalar() || !YAML::convert<long long>::decode(n, v)) {
      fail(n.Mark(), "subports must be an integer, got " + describe(n));
    }
    if (v < 1) fail(n.Mark(), "subports must be >= 1, got " + n.Scalar());
    if (v > 1024) fail(n.Mark(), "subports " + n.Scalar() + " exceeds 1024");
    return static_cast<int>(v);
  }

  void add_node(Topology& t, Node node, const YAML::Mark& mark) {
    auto [it, fresh] = node_by_name_.emplace(node.name, static_cast<int>(t.nodes.size()));
    if (!fresh) {
      fail(mark, "duplicate node name '" + node.name + "' (first defined on line " +
                     std::to_string(node_lines_[it->second]) + ")");
    }
    t.nodes.push_back(std::move(node));
    node_lines_.push_back(line_of(mark));
  }

  void parse_gpus(const YAML::Node& n, Topology& t) {
    if (n.IsSequence()) {
      if (n.size() == 0) fail(n.Mark(), "gpus must not be empty");
      for (const YAML::Node& e : n) {
        Node g;
        if (e.IsMap()) {  // {name, plane}: a GPU whose NIC is on that plane only (peers carry the others)
          Fields f(*this, e, "GPU", {"name", "plane"});
          g.name = string_value(f.require("name"), "GPU name");
          g.plane = static_cast<int>(int_value(f.require("plane"), "GPU plane", 0, t.num_planes - 1));
        } else {
          g.name = string_value(e, "GPU name");
        }
        g.kind = NodeKind::kGpu;
        g.gpu_index = static_cast<int>(t.nodes.size());
        add_node(t, g, e.Mark());
      }
      return;
    }
    long long count = 0;
    if (!n.IsScalar() || !YAML::convert<long long>::decode(n, count)) {
      fail(n.Mark(), "gpus must be a count or a list of names, got " + describe(n));
    }
    if (count < 1 || count > 64000) fail(n.Mark(), "gpus " + n.Scalar() + " outside [1, 64000]");
    for (long long i = 0; i < count; ++i) {
      Node g;
      g.name = "gpu" + std::to_string(i);
      g.kind = NodeKind::kGpu;
      g.gpu_index = static_cast<int>(i);
      add_node(t, g, n.Mark());
    }
  }

  void parse_switches(const YAML::Node& n, Topology& t) {
    if (!n.IsSequence()) fail(n.Mark(), "switches must be a list, got " + describe(n));
    for (const YAML::Node& e : n) {
      if (!e.IsMap()) fail(e.Mark(), "a switch must be a mapping {name, plane}, got " + describe(e));
      Fields f(*this, e, "switch", {"name", "plane"});
      Node s;
      s.kind = NodeKind::kSwitch;
      s.name = string_value(f.require("name"), "switch name");
      const YAML::Node& plane = f.require("plane");
      long long p = 0;
      if (!plane.IsScalar() || !YAML::convert<long long>::decode(plane, p)) {
        fail(plane.Mark(), "plane must be an integer, got " + describe(plane));
      }
      if (p < 0 || p >= t.num_planes) {
        std::ostringstream os;
        os << "plane " << p << " out of range [0, " << t.num_planes << ") for switch '" << s.name << "'";
        fail(plane.Mark(), os.str());
      }
      s.plane = static_cast<int>(p);
      add_node(t, s, e.Mark());
    }
  }

  int endpoint(const Fields& f, const char* key, const Topology& t) const {
    const YAML::Node& v = f.require(key);
    const std::string name = string_value(v, key);
    auto it = node_by_name_.find(name);
    if (it == node_by_name_.end()) fail(v.Mark(), std::string("unknown node '") + name + "' as link end " + key);
    return it->second;
  }

  void parse_links(const YAML::Node& n, Topology& t) {
    if (!n.IsSequence()) fail(n.Mark(), "links must be a list, got " + describe(n));
    std::vector<int> next_port(t.nodes.size(), 0);
    std::map<std::pair<int, int>, int> port_line;  // (node, port) -> line of the cable that took it
    int cable = 0;
    for (const YAML::Node& e : n) {
      if (!e.IsMap()) fail(e.Mark(), "a link must be a mapping {a, b, ...}, got " + describe(e));
      Fields f(*this, e, "link",
               {"a", "b", "plane", "rate_gbps", "subport_gbps", "subports", "delay_ns", "a_port", "b_port"});
      const int a = endpoint(f, "a", t);
      const int b = endpoint(f, "b", t);
      const Node& na = t.nodes[a];
      const Node& nb = t.nodes[b];
      if (a == b) fail(e.Mark(), "link connects '" + na.name + "' to itself");
      // A direct GPU-GPU link (a point-to-point test bench) has no switch to take its plane from: it must say.
      const bool direct = na.kind == NodeKind::kGpu && nb.kind == NodeKind::kGpu;
      if (direct && f.get("plane") == nullptr) {
        fail(e.Mark(), "link joins two GPUs '" + na.name + "' and '" + nb.name +
                           "' directly: give its plane (or connect GPUs through switches)");
      }
      if (na.kind == NodeKind::kSwitch && nb.kind == NodeKind::kSwitch && na.plane != nb.plane) {
        std::ostringstream os;
        os << "switch plane mismatch: '" << na.name << "' is on plane " << na.plane << ", '" << nb.name << "' on plane "
           << nb.plane << "; a link stays within one plane";
        fail(e.Mark(), os.str());
      }
      const Node& sw = na.kind == NodeKind::kSwitch ? na : nb;
      int plane = sw.plane;
      const YAML::Node* plane_node = f.get("plane");
      if (plane_node != nullptr && plane_node->IsScalar() && plane_node->Scalar() == "nvlink") {
        if (!direct) fail(plane_node->Mark(), "plane nvlink: an NVLink-class link joins two GPUs, not a switch");
        plane = kNvlinkPlane;
        plane_node = nullptr;
      }
      if (const YAML::Node* v = plane_node) {
        const long long p = int_value(*v, "plane", std::numeric_limits<int>::min(), std::numeric_limits<int>::max());
        if (p < 0 || p >= t.num_planes) {
          std::ostringstream os;
          os << "plane " << p << " out of range [0, " << t.num_planes << ") in link";
          fail(v->Mark(), os.str());
        }
        if (!direct && p != sw.plane) {
          std::ostringstream os;
          os << "switch plane mismatch: link plane " << p << " but switch '" << sw.name << "' is on plane " << sw.plane;
          fail(v->Mark(), os.str());
        }
        plane = static_cast<int>(p);
      }
      const int subports = f.get("subports") != nullptr ? subports_value(*f.get("subports")) : default_subports_;
      double sub_rate = 0;
      const YAML::Node* whole = f.get("rate_gbps");
      const YAML::Node* per_sub = f.get("subport_gbps");
      if (whole != nullptr && per_sub != nullptr) fail(per_sub->Mark(), "link gives both rate_gbps and subport_gbps");
      if (per_sub != nullptr) {
        sub_rate = rate_value(*per_sub, "subport_gbps");
      } else {
        const double cable_rate = whole != nullptr ? rate_value(*whole, "rate_gbps") : default_rate_;
        sub_rate = cable_rate / subports;
      }
      const uint64_t delay =
          f.get("delay_ns") != nullptr ? uint_value(*f.get("delay_ns"), "delay_ns", kMaxDelayNs) : default_delay_;
      const int first_link = static_cast<int>(t.links.size());
      int first_port[2] = {next_port[a], next_port[b]};
      const YAML::Mark port_mark[2] = {f.get("a_port") ? f.get("a_port")->Mark() : e.Mark(),
                                       f.get("b_port") ? f.get("b_port")->Mark() : e.Mark()};
      const int ends[2] = {a, b};
      const char* port_keys[2] = {"a_port", "b_port"};
      for (int side = 0; side < 2; ++side) {
        if (const YAML::Node* v = f.get(port_keys[side])) {
          first_port[side] = static_cast<int>(int_value(*v, port_keys[side], 0, 1 << 20));
        }
        for (int s = 0; s < subports; ++s) {
          const int port = first_port[side] + s;
          auto [it, fresh] = port_line.emplace(std::pair{ends[side], port}, line_of(e.Mark()));
          if (!fresh) {
            std::ostringstream os;
            os << "duplicate port: node '" << t.nodes[ends[side]].name << "' port " << port
               << " is already used by the link on line " << it->second;
            fail(port_mark[side], os.str());
          }
          next_port[ends[side]] = std::max(next_port[ends[side]], port + 1);
        }
      }
      for (int s = 0; s < subports; ++s) {
        Link l;
        l.id = first_link + s;
        l.a = a;
        l.a_port = first_port[0] + s;
        l.b = b;
        l.b_port = first_port[1] + s;
        l.plane = plane;
        l.rate_gbps = sub_rate;
        l.delay_ns = delay;
        l.cable = cable;
        l.subport = s;
        l.subports = subports;
        t.links.push_back(l);
        link_lines_.push_back(line_of(e.Mark()));
      }
      ++cable;
    }
  }

  int problem_line(const detail::Problem& p, const YAML::Mark& top) const {
    if (p.link >= 0 && p.link < static_cast<int>(link_lines_.size())) return link_lines_[p.link];
    if (p.node >= 0 && p.node < static_cast<int>(node_lines_.size())) return node_lines_[p.node];
    // A problem names the keys involved; blame the first one the file wrote, else the closest enclosing mapping
    // ("params.pfc", then "params") of a key that was left to its default.
    for (const std::string& key : p.keys) {
      if (auto it = key_lines_.find(key); it != key_lines_.end()) return it->second;
    }
    for (const std::string& key : p.keys) {
      for (std::string k = key; k.rfind('.') != std::string::npos;) {
        k.resize(k.rfind('.'));
        if (auto it = key_lines_.find(k); it != key_lines_.end()) return it->second;
      }
    }
    return line_of(top);
  }

  std::string source_;
  std::map<std::string, int> key_lines_;
  std::vector<int> node_lines_;
  std::vector<int> link_lines_;
  std::map<std::string, int> node_by_name_;
  // link_defaults, themselves defaulting to Link's member initializers (rate_gbps is per cable here).
  double default_rate_ = Link{}.rate_gbps;
  int default_subports_ = Link{}.subports;
  uint64_t default_delay_ = Link{}.delay_ns;
};

Fields::Fields(const Parser& p, const YAML::Node& map, const std::string& context,
               std::initializer_list<const char*> allowed)
    : parser_(p), context_(context), mark_(map.Mark()) {
  for (const auto& entry : map) {
    const YAML::Node key = entry.first;  // a copy: the iterator hands out a proxy temporary
    if (!key.IsScalar()) p.fail(key.Mark(), "keys in " + context + " must be strings, got " + describe(key));
    const std::string& k = key.Scalar();
    if (std::find_if(allowed.begin(), allowed.end(), [&](const char* a) { return k == a; }) == allowed.end()) {
      std::string keys;
      for (const char* a : allowed) keys += std::string(keys.empty() ? "" : ", ") + a;
      p.fail(key.Mark(), "unknown key '" + k + "' in " + context + " (expected one of: " + keys + ")");
    }
    if (!values_.emplace(k, entry.second).second) p.fail(key.Mark(), "duplicate key '" + k + "' in " + context);
  }
}

const YAML::Node& Fields::require(const std::string& key) const {
  const YAML::Node* v = get(key);
  if (v == nullptr) parser_.fail(mark_, "missing required key '" + key + "' in " + context_);
  return *v;
}

// ---- writer ----

bool plain_safe(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') return false;
  }
  std::string lower;
  for (char c : s) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // YAML 1.1 booleans and null read back as strings through as<std::string>, but quoting keeps them unambiguous.
  for (const char* word : {"true", "false", "yes", "no", "on", "off", "y", "n", "null"}) {
    if (lower == word) return false;
  }
  return true;
}

std::string quote(const std::string& s) {
  if (plain_safe(s)) return s;
  std::ostringstream os;
  os << '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      os << '\\' << c;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      os << buf;
    } else {
      os << c;
    }
  }
  os << '"';
  return os.str();
}

// Whole-cable attributes as a YAML entry states them.
struct CableShape {
  double rate_gbps;  // whole cable
  int subports;
  uint64_t delay_ns;
  bool operator<(const CableShape& o) const {
    return std::tie(rate_gbps, subports, delay_ns) < std::tie(o.rate_gbps, o.subports, o.delay_ns);
  }
};

// The decimal that the loader turns back into exactly `sub_rate` after dividing by `subports`, if there is one.
bool whole_rate_text(double sub_rate, int subports, std::string& text) {
  text = detail::format_double(sub_rate * subports);
  return std::strtod(text.c_str(), nullptr) / subports == sub_rate;
}

}  // namespace

Topology parse_topology(const std::string& yaml_text, const std::string& source_name) {
  return Parser(source_name).parse(yaml_text);
}

Topology load_topology(const std::string& path) {
  return parse_topology(common::read_regular_file(path, "topology file"), path);
}

std::string to_yaml(const Topology& t) {
  validate(t);  // the YAML form assumes the canonical layout validate() enforces (GPUs first, cables contiguous)
  std::ostringstream os;
  const FabricParams& p = t.params;
  os << "# IFEC fabric topology; schema: testbed/topologies/README.md\n";
  os << "name: " << quote(t.name) << "\n";
  os << "planes: " << t.num_planes << "\n";
  os << "params:\n"
     << "  mtu: " << p.mtu << "\n"
     << "  buffer_bytes: " << p.buffer_bytes << "\n"
     << "  wire_overhead_bytes: " << p.wire_overhead_bytes << "\n"
     << "  control_plane_delay_ns: " << p.control_plane_delay_ns << "\n"
     << "  priorities: " << p.priorities << "\n"
     << "  ecn: {kmin_bytes: " << p.ecn.kmin_bytes << ", kmax_bytes: " << p.ecn.kmax_bytes
     << ", pmax: " << detail::format_double(p.ecn.pmax) << "}\n"
     << "  pfc: {enabled: " << (p.pfc.enabled ? "true" : "false") << ", xoff_bytes: " << p.pfc.xoff_bytes
     << ", xon_bytes: " << p.pfc.xon_bytes << ", lossless_priority: " << p.pfc.lossless_priority << "}\n"
     << "  ifec: {slot_pool: " << p.ifec.slot_pool << ", slot_bytes: " << p.ifec.slot_bytes
     << ", slot_timeout_ns: " << p.ifec.slot_timeout_ns << ", result_retransmit_ns: " << p.ifec.result_retransmit_ns
     << ", result_retries: " << p.ifec.result_retries << ", multicast_entries: "
     << p.ifec.multicast_entries
     // Only where it differs from 64: the files of 64-member switches read as before the key existed.
     << (p.ifec.max_group_members != IfecParams{}.max_group_members
             ? ", max_group_members: " + std::to_string(p.ifec.max_group_members)
             : std::string())
     << ", upstream_fp32: " << (p.ifec.upstream_fp32 ? "true" : "false")
     << ", reproducible: " << (p.ifec.reproducible ? "true" : "false") << "}\n";

  // The most common cable shape becomes link_defaults, so regular fabrics list each cable as just {a, b}.
  std::map<CableShape, int> shapes;
  CableShape defaults{Link{}.rate_gbps, Link{}.subports, Link{}.delay_ns};
  int best = 0;
  for (const Link& l : t.links) {
    if (l.subport != 0) continue;
    std::string text;
    if (!whole_rate_text(l.rate_gbps, l.subports, text)) continue;
    const CableShape s{std::strtod(text.c_str(), nullptr), l.subports, l.delay_ns};
    if (++shapes[s] > best) {
      best = shapes[s];
      defaults = s;
    }
  }
  os << "link_defaults: {rate_gbps: " << detail::format_double(defaults.rate_gbps)
     << ", subports: " << defaults.subports << ", delay_ns: " << defaults.delay_ns << "}\n";

  const int gpus = t.num_gpus();
  bool default_names = true;
  for (int g = 0; g < gpus; ++g) {
    default_names = default_names && t.nodes[g].name == "gpu" + std::to_string(g) && t.nodes[g].plane < 0;
  }
  if (default_names) {
    os << "gpus: " << gpus << "\n";
  } else {
    os << "gpus: [";
    for (int g = 0; g < gpus; ++g) {
      os << (g ? ", " : "");
      if (t.nodes[g].plane >= 0) {
        os << "{name: " << quote(t.nodes[g].name) << ", plane: " << t.nodes[g].plane << "}";
      } else {
        os << quote(t.nodes[g].name);
      }
    }
    os << "]\n";
  }
  const bool any_switch =
      std::any_of(t.nodes.begin(), t.nodes.end(), [](const Node& n) { return n.kind == NodeKind::kSwitch; });
  os << (any_switch ? "switches:\n" : "switches: []\n");
  for (const Node& n : t.nodes) {
    if (n.kind == NodeKind::kSwitch) os << "  - {name: " << quote(n.name) << ", plane: " << n.plane << "}\n";
  }
  os << (t.links.empty() ? "links: []\n" : "links:\n");
  std::vector<int> next_port(t.nodes.size(), 0);  // the loader's automatic numbering, to omit ports it would pick
  for (const Link& l : t.links) {
    if (l.subport != 0) continue;
    os << "  - {a: " << quote(t.nodes[l.a].name) << ", b: " << quote(t.nodes[l.b].name);
    if (t.nodes[l.a].kind == NodeKind::kGpu && t.nodes[l.b].kind == NodeKind::kGpu) {
      // a direct link has no switch to take its plane from
      os << ", plane: " << (l.plane == kNvlinkPlane ? std::string("nvlink") : std::to_string(l.plane));
    }
    if (l.subports != defaults.subports) os << ", subports: " << l.subports;
    std::string text;
    if (!whole_rate_text(l.rate_gbps, l.subports, text)) {
      os << ", subport_gbps: " << detail::format_double(l.rate_gbps);
    } else if (defaults.rate_gbps / l.subports != l.rate_gbps) {
      os << ", rate_gbps: " << text;
    }
    if (l.delay_ns != defaults.delay_ns) os << ", delay_ns: " << l.delay_ns;
    if (l.a_port != next_port[l.a]) os << ", a_port: " << l.a_port;
    if (l.b_port != next_port[l.b]) os << ", b_port: " << l.b_port;
    os << "}\n";
    next_port[l.a] = std::max(next_port[l.a], l.a_port + l.subports);
    next_port[l.b] = std::max(next_port[l.b], l.b_port + l.subports);
  }
  return os.str();
}

}  // namespace ifec::routing
