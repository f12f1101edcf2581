// ifec-switchd: one switch of the topology on its interfaces, FARE-routed, serving the gRPC Switch service.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include "daemon_common.h"
#include "daemon_serve.h"
#include "ifec/live/daemons.h"
#include "ifec/live/grpc_clients.h"
#include "ifec/live/metrics.h"
#include "ifec/switchemu/switch.h"
#include "ifec/testbed/live_timing.h"
#include "proto_convert.h"

namespace ifec::live {

std::string daemon_address(const DaemonOptions& o, int node) {
  if (o.mgmt_names) {
    IFEC_CHECK(node >= 0 && static_cast<size_t>(node) < o.node_names.size(), "no node " << node << " to address");
    return o.node_names[static_cast<size_t>(node)] + ":50051";
  }
  return o.mgmt_loopback ? "127.0.0.1:" + std::to_string(50051 + node) : mgmt_address(node);
}

std::string metrics_address(const DaemonOptions& o, int node) {
  if (o.mgmt_names) {
    return "0.0.0.0:9400";
  }
  return o.mgmt_loopback ? "127.0.0.1:" + std::to_string(9400 + node) : mgmt_ip(node) + ":9400";
}

std::string listen_address(const DaemonOptions& o, int node) {
  if (!o.listen.empty()) {
    return o.listen;
  }
  return o.mgmt_names ? "0.0.0.0:50051" : daemon_address(o, node);
}

routing::Topology load_daemon_topology(const DaemonOptions& o) {
  const std::string env = "env:";
  routing::Topology t;
  if (o.topology_file.rfind(env, 0) != 0) {
    t = routing::load_topology(o.topology_file);
  } else {
    const std::string var = o.topology_file.substr(env.size());
    IFEC_CHECK(!var.empty(), "--topo env: names no environment variable (env:NAME reads the YAML from NAME)");
    const char* text = std::getenv(var.c_str());
    IFEC_CHECK(text != nullptr && *text != '\0', "--topo " << o.topology_file << ": the environment has no " << var);
    t = routing::parse_topology(text, "$" + var);
  }
  IFEC_CHECK(!t.single_plane_gpus(), "--topo " << o.topology_file << ": its GPUs sit on one plane each (in-node "
                                               << "NVLink forwarding); the live daemons need a port on every plane");
  return t;
}

RuntimeOptions runtime_options(const DaemonOptions& o, const routing::Topology& topo) {
  RuntimeOptions ro;
  ro.netns = o.netns;
  ro.driver = parse_fabric_driver(o.fabric_driver);
  if (o.links_base != 0) {
    const int node = topo.find_node(o.node);
    IFEC_CHECK(node >= 0, "no node '" << o.node << "' in topology " << topo.name);
    ro.ifnames = interfaces_by_subnet(topo, node, o.links_base);
  }
  return ro;
}

std::unique_ptr<NodeRuntime> start_node(DaemonOptions& o, routing::Topology& topo, routing::NodeKind kind,
                                        const std::function<void(const routing::Topology&)>& check) {
  topo = load_daemon_topology(o);
  for (const routing::Node& n : topo.nodes) {
    o.node_names.push_back(n.name);
  }
  const int node = topo.find_node(o.node);
  IFEC_CHECK(node >= 0, "no node '" << o.node << "' in topology " << topo.name);
  const bool gpu = kind == routing::NodeKind::kGpu;
  IFEC_CHECK(topo.nodes[node].kind == kind, "node " << o.node << " is a " << (gpu ? "switch" : "GPU") << ": run "
                                                    << (gpu ? "ifec-switchd" : "ifec-hostd") << " for it, not "
                                                    << (gpu ? "ifec-hostd" : "ifec-switchd"));
  // What is wrong with the options is named before any interface is opened: the certificates (read here as the
  // server will read them), and what the daemon checks against the topology.
  server_credentials({o.tls_dir, o.node, o.insecure});
  if (check) {
    check(topo);
  }
  return std::make_unique<NodeRuntime>(topo, o.node, runtime_options(o, topo));
}

namespace {

grpc::Status error(grpc::StatusCode code, const std::string& node, const std::string& why) {
  return grpc::Status(code, node + ": " + why);
}

// FARE's groups toward every GPU, and routes to the other switches' loopbacks (their IFEC engines talk to each
// other on two-tier planes): neighbours over live links, farther ones along shortest paths of the topology.
void install_routes(NodeRuntime& rt, switchemu::Switch& sw) {
  const routing::Topology& topo = rt.topology();
  for (int d = 0; d < topo.num_gpus(); ++d) {
    std::vector<switchemu::NextHopPort> group;
    for (const routing::NextHop& h : rt.fare().next_hops(d)) {
      const common::MacAddress mac = rt.peer_mac(h.port);
      if (h.weight > 0 && mac != common::MacAddress{}) {
        group.push_back({h.port, h.weight, mac});
      }
    }
    sw.set_route(topo.nodes[topo.gpu_node(d)].loopback, std::move(group));
  }
  // Switch loopbacks: breadth-first over switch-to-switch links from each target.
  const int self = rt.node();
  for (size_t t = 0; t < topo.nodes.size(); ++t) {
    if (topo.nodes[t].kind != routing::NodeKind::kSwitch || static_cast<int>(t) == self) {
      continue;
    }
    std::vector<int> dist(topo.nodes.size(), -1);
    std::vector<int> frontier = {static_cast<int>(t)};
    dist[t] = 0;
    while (!frontier.empty() && dist[self] < 0) {
      std::vector<int> next;
      for (int n : frontier) {
        for (int l : topo.links_of(n)) {
          const int peer = topo.peer(l, n).first;
          if (topo.nodes[peer].kind == routing::NodeKind::kSwitch && dist[peer] < 0) {
            dist[peer] = dist[n] + 1;
            next.push_back(peer);
          }
        }
      }
      frontier = std::move(next);
    }
    std::vector<switchemu::NextHopPort> group;
    for (int l : topo.links_of(self)) {
      const auto [peer, peer_port] = topo.peer(l, self);
      const int port = topo.links[l].a == self ? topo.links[l].a_port : topo.links[l].b_port;
      if (dist[self] > 0 && dist[peer] == dist[self] - 1 && rt.ports()[port]->link_up() &&
          rt.peer_mac(port) != common::MacAddress{}) {
        group.push_back({port, topo.links[l].rate_gbps, rt.peer_mac(port)});
      }
    }
    sw.set_route(topo.nodes[t].loopback, std::move(group));
  }
}

// The switch's port counters: every <reason>_drops counter as ifec_switch_drops_total{reason}, the others as
// ifec_switch_port_total{counter} (each family's lines together, as the exposition format wants).
std::string switch_port_metrics(const std::string& node, const NodeRuntime& rt, const switchemu::Switch& sw) {
  std::string out;
  for (const bool drops : {true, false}) {
    const std::string family = drops ? "ifec_switch_drops_total" : "ifec_switch_port_total";
    out += "# TYPE " + family + " counter\n";
    for (const auto& p : rt.ports()) {
      const std::string port = node + ",port=\"" + std::to_string(p->port()) + "\"";
      sw.counters(p->port()).for_each([&](const std::string& name, uint64_t v) {
        const size_t stem = name.size() - std::min(name.size(), sizeof("_drops") - 1);
        if (drops == (name.compare(stem, std::string::npos, "_drops") == 0)) {
          const std::string label = drops ? ",reason=\"" + name.substr(0, stem) : ",counter=\"" + name;
          out += metric(family, port + label + "\"", static_cast<double>(v));
        }
      });
    }
  }
  return out;
}

class SwitchService final : public v1::Switch::Service {
 public:
  SwitchService(NodeRuntime& rt, switchemu::Switch& sw) : rt_(rt), sw_(sw), name_(rt.info().name) {}

  grpc::Status Status(grpc::ServerContext*, const v1::Empty*, v1::NodeStatus* out) override {
    return on_loop(rt_.loop(), name_, [&] {
      fill_status(rt_, out, rt_.all_heard());
      // Beside the AF_PACKET device's counters: the switch's own, prefixed.
      for (auto& ps : *out->mutable_ports()) {
        auto& v = *ps.mutable_counters()->mutable_values();
        const switchemu::SwitchPortCounters& c = sw_.counters(ps.port());
        c.for_each([&v](const char* name, uint64_t value) { v[std::string("switch_") + name] = value; });
        uint64_t buffer_drops = 0;  // frames its egress queues refused (admission), over every priority
        for (const switchemu::QueueCounters& q : c.queues) {
          buffer_drops += q.drops;
        }
        v["switch_buffer_drops"] = buffer_drops;
      }
      return grpc::Status::OK;
    });
  }
  grpc::Status Reserve(grpc::ServerContext*, const v1::GroupReservation* r, v1::Empty*) override {
    if (const std::string bad = reservation_problem(*r); !bad.empty()) {
      return error(grpc::StatusCode::INVALID_ARGUMENT, name_, "reservation: " + bad);
    }
    return on_loop(rt_.loop(), name_, [&] {
      std::string why;
      return engine()->reserve(from_proto(*r), &why) ? grpc::Status::OK
                                                     : error(grpc::StatusCode::RESOURCE_EXHAUSTED, name_, why);
    });
  }
  grpc::Status Release(grpc::ServerContext*, const v1::ReleaseRequest* r, v1::Empty*) override {
    if (const std::string bad = range_problem({{"group", r->group(), 0, 0xFFFF}}); !bad.empty()) {
      return error(grpc::StatusCode::INVALID_ARGUMENT, name_, "release: " + bad);
    }
    return on_loop(rt_.loop(), name_, [&] {
      engine()->release(r->job(), static_cast<uint16_t>(r->group()));
      return grpc::Status::OK;
    });
  }
  grpc::Status RegisterWindow(grpc::ServerContext*, const v1::WindowRegistration* w, v1::Empty*) override {
    const int gpus = rt_.topology().num_gpus();
    if (const std::string bad = range_problem({{"gpu", w->gpu(), 0, gpus - 1}, {"window", w->window(), 0, 0xFFFF}});
        !bad.empty()) {
      return error(grpc::StatusCode::INVALID_ARGUMENT, name_, "window registration: " + bad);
    }
    return on_loop(rt_.loop(), name_, [&] {
      engine()->register_window(from_proto(*w));
      return grpc::Status::OK;
    });
  }
  grpc::Status FreeSlots(grpc::ServerContext*, const v1::Empty*, v1::FreeSlotsReply* out) override {
    return on_loop(rt_.loop(), name_, [&] {
      out->set_slots(engine()->free_slots());
      return grpc::Status::OK;
    });
  }
  grpc::Status IfecCounters(grpc::ServerContext*, const v1::Empty*, v1::CounterSet* out) override {
    return on_loop(rt_.loop(), name_, [&] {
      for (const auto& [k, v] : counter_map(engine()->counters())) {
        (*out->mutable_values())[k] = v;
      }
      return grpc::Status::OK;
    });
  }
  grpc::Status Groups(grpc::ServerContext*, const v1::Empty*, v1::GroupsReply* out) override {
    return on_loop(rt_.loop(), name_, [&] {
      for (const common::GroupReservation& r : engine()->reservations()) {
        *out->add_groups() = to_proto(r);
      }
      return grpc::Status::OK;
    });
  }
  grpc::Status Routes(grpc::ServerContext*, const v1::Empty*, v1::RoutesReply* out) override {
    return on_loop(rt_.loop(), name_, [&] {
      const routing::Topology& topo = rt_.topology();
      for (const routing::Node& n : topo.nodes) {
        if (const auto* group = sw_.route(n.loopback)) {
          v1::Route* r = out->add_routes();
          r->set_dst_ip(n.loopback);
          for (const switchemu::NextHopPort& h : *group) {
            v1::PortWeight* w = r->add_group();
            w->set_port(h.port);
            w->set_gbps(h.weight);
          }
        }
      }
      return grpc::Status::OK;
    });
  }
  grpc::Status BgpRib(grpc::ServerContext*, const v1::Empty*, v1::BgpRibReply* out) override {
    return on_loop(rt_.loop(), name_, [&] { return bgp_rib(rt_, out); });
  }
  grpc::Status FareWeights(grpc::ServerContext*, const v1::FareWeightsRequest* q, v1::FareWeightsReply* out) override {
    return on_loop(rt_.loop(), name_, [&] { return fare_weights(rt_, q, out); });
  }
  grpc::Status SetLink(grpc::ServerContext*, const v1::SetLinkRequest* q, v1::Empty*) override {
    return on_loop(rt_.loop(), name_, [&] { return set_link(rt_, q); });
  }
  grpc::Status SetLoss(grpc::ServerContext*, const v1::SetLossRequest* q, v1::Empty*) override {
    return on_loop(rt_.loop(), name_, [&] {
      IFEC_CHECK(q->port() >= -1 && q->port() < static_cast<int>(rt_.ports().size()),
                 "port " << q->port() << " outside -1.." << rt_.ports().size() - 1);
      for (const auto& p : rt_.ports()) {
        if (q->port() < 0 || q->port() == p->port()) {
          p->set_loss(q->probability(), q->seed());
        }
      }
      rt_.note("fault", "loss " + std::to_string(q->probability()) + " on " +
                            (q->port() < 0 ? std::string("every port") : "port " + std::to_string(q->port())));
      return grpc::Status::OK;
    });
  }
  grpc::Status Events(grpc::ServerContext* ctx, const v1::EventsRequest* q,
                      grpc::ServerWriter<v1::Event>* out) override {
    return stream_events(rt_, ctx, q, out);
  }

 private:
  switchemu::IfecEngine* engine() {
    IFEC_CHECK(sw_.ifec() != nullptr, name_ << ": runs no IFEC engine");
    return sw_.ifec();
  }
  NodeRuntime& rt_;
  switchemu::Switch& sw_;
  std::string name_;
};

}  // namespace

struct SwitchDaemon::Impl {
  DaemonOptions o;
  routing::Topology topo;
  std::unique_ptr<NodeRuntime> rt;
  std::unique_ptr<switchemu::Switch> sw;
  std::unique_ptr<SwitchService> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<MetricsServer> metrics;
};

SwitchDaemon::SwitchDaemon(DaemonOptions o) : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.o = std::move(o);
  d.rt = start_node(d.o, d.topo, routing::NodeKind::kSwitch);
  switchemu::SwitchConfig cfg;
  cfg.name = d.o.node;
  cfg.ip = d.rt->info().loopback;
  cfg.params = d.topo.params;
  // The topology's timers are for simulated links (microseconds); software switches on the wall clock answer in
  // milliseconds under load, so the engine waits at least these long (stated at start).
  testbed::apply_live_timing(cfg.params.ifec);
  cfg.seed = static_cast<uint64_t>(d.rt->node()) + 1;
  for (size_t p = 0; p < d.rt->ports().size(); ++p) {
    cfg.port_macs.push_back(d.rt->mac(static_cast<int>(p)));
  }
  d.sw = std::make_unique<switchemu::Switch>(d.rt->loop(), cfg, d.rt->port_ptrs());
  d.rt->on_fare_change([&d] { install_routes(*d.rt, *d.sw); });
  d.service = std::make_unique<SwitchService>(*d.rt, *d.sw);
  const std::string listen = listen_address(d.o, d.rt->node());
  d.server = start_server(d.o, listen, d.service.get(), kSwitchMaxMessageBytes);
  d.metrics = std::make_unique<MetricsServer>(d.rt->loop(), metrics_address(d.o, d.rt->node()), [&d] {
    return d.rt->render_metrics(d.rt->all_heard(), [&d](const std::string& node) {
      std::string out = "# TYPE ifec_switch_ifec_total counter\n";
      for (const auto& [k, v] : counter_map(d.sw->ifec()->counters())) {
        out += metric("ifec_switch_ifec_total", node + ",counter=\"" + k + "\"", static_cast<double>(v));
      }
      return out + switch_port_metrics(node, *d.rt, *d.sw);
    });
  });
  d.rt->start();
  d.rt->note("start", "switchd " + d.o.node + " serving on " + listen + "; IFEC slot timeout " +
                          std::to_string(cfg.params.ifec.slot_timeout_ns / 1'000'000) + " ms, result retransmit " +
                          std::to_string(cfg.params.ifec.result_retransmit_ns / 1'000'000) + " ms (wall clock)");
}

SwitchDaemon::~SwitchDaemon() {
  if (impl_->server) {
    impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
}

void SwitchDaemon::run() { impl_->rt->serve(); }
void SwitchDaemon::stop() { impl_->rt->loop().stop(); }

int switchd_main(int argc, char** argv) { return serve<SwitchDaemon>(argc, argv, "a switch"); }

}  // namespace ifec::live
