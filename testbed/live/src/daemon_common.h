// Private to the live daemons: running work on the daemon's loop from a gRPC thread, status and events.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "ifec/common/checks.h"
#include "ifec/common/ipv4.h"
#include "ifec/live/daemons.h"
#include "ifec/live/node_runtime.h"
#include "ifec/live/tls.h"
#include "ifec/v1/control.grpc.pb.h"

namespace ifec::live {

// Runs fn() (returning grpc::Status) on the loop's thread and waits for it (an error if the loop does not get to it
// within `wait`: a daemon stuck in a long operation answers that, rather than hanging its caller).
template <typename F>
grpc::Status on_loop(EpollLoop& loop, const std::string& node, F fn,
                     std::chrono::milliseconds wait = std::chrono::seconds(5)) {
  auto p = std::make_shared<std::promise<grpc::Status>>();
  auto f = p->get_future();
  loop.schedule(0, [p, fn]() mutable {
    try {
      p->set_value(fn());
    } catch (const std::exception& e) {
      p->set_value(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, e.what()));
    }
  });
  if (f.wait_for(wait) != std::future_status::ready) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, node + ": busy (its event loop did not answer in time)");
  }
  return f.get();
}

inline std::string mac_text(const uint8_t* m) {
  char b[18];
  std::snprintf(b, sizeof b, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
  return b;
}

// The node's status (loop thread): ready when the daemon says so and its routes have converged.
inline void fill_status(NodeRuntime& rt, v1::NodeStatus* s, bool ready) {
  const routing::Topology& topo = rt.topology();
  s->set_node(rt.info().name);
  s->set_kind(routing::node_kind_name(rt.info().kind));
  s->set_gpu(rt.info().gpu_index);
  s->set_uptime_ns(rt.loop().now());
  s->set_fare_changes(rt.fare_changes());
  s->set_fare_last_change_ns(rt.fare_last_change());
  std::set<std::string> drivers;  // the fabric ports' (one, unless some fell back from AF_XDP), with the reason
  for (const auto& p : rt.ports()) {
    drivers.insert(p->description());
  }
  std::string driver;
  for (const std::string& d : drivers) {
    driver += (driver.empty() ? "" : "; ") + d;
  }
  s->set_driver(driver);
  s->set_ready(ready && rt.routes_complete());
  (*s->mutable_loop()->mutable_values())["stalls"] = rt.loop().stalls();
  (*s->mutable_loop()->mutable_values())["stalled_us"] = static_cast<uint64_t>(rt.loop().stalled_ns() / 1000);
  for (const auto& p : rt.ports()) {
    v1::PortStatus* ps = s->add_ports();
    ps->set_port(p->port());
    ps->set_ifname(p->device().name());
    const auto [peer, peer_port] = rt.peer_of(p->port());
    ps->set_peer(topo.nodes[peer].name);
    ps->set_peer_port(peer_port);
    ps->set_carrier(p->link_up());
    ps->set_admin_up(rt.admin_up(p->port()));
    ps->set_fare_heard(rt.heard(p->port()));
    ps->set_mac(mac_text(p->device().mac()));
    auto& v = *ps->mutable_counters()->mutable_values();
    for (const auto& [name, value] : p->device().counter_map()) {
      v[name] = value;
    }
    v["injected_drops"] = p->injected_drops();
  }
}

// The largest gRPC message a daemon takes or sends: a hostd's carries a collective's input or output on the caller's
// data (a torch.distributed bucket); a switchd's only control requests (a group's reservation of up to 256 members
// is a few KiB). Larger requests are refused by gRPC (RESOURCE_EXHAUSTED) before any handler runs.
constexpr int kMaxMessageBytes = 1 << 30;
constexpr int kSwitchMaxMessageBytes = 4 << 20;

// The largest window a hostd's operation may ask for (SymmetricMemory::allocate_window's limit). Sizes are checked
// against it before any window is allocated: an operation allocates its later windows in callbacks, where an error
// thrown would reach no reply (the caller would wait out its deadline).
constexpr uint64_t kMaxWindowBytes = uint64_t{1} << 32;

// Starts a gRPC server for `service` on `listen` with the daemon's credentials (mutual TLS and roles, or plaintext,
// said on stderr), and makes them this process's client credentials too; throws Error naming the node and address
// when it cannot.
// Threads gRPC's synchronous server keeps once it has made them. With its default (2) every thread beyond two that
// a burst of calls needed exits afterwards: rank 0's hostd, whose hub holds every rank's allgather on a thread of its
// own, made and ended them in every operation, and each new thread's stack and arena were fresh pages (15-19 us
// each on this project's VMs): about 400 per 1 MiB AllReduce on superpod-8x2, none with threads kept. Idle ones
// wait on the completion queue, waking once a second.
inline constexpr int kSyncServerPollers = 64;

inline std::unique_ptr<grpc::Server> start_server(const DaemonOptions& o, const std::string& listen,
                                                  grpc::Service* service, int max_message_bytes) {
  IFEC_CHECK(!o.tls_dir.empty() || o.insecure,
             "node " << o.node << ": no certificates (tls_dir) and not insecure: refusing to serve " << listen);
  const TlsConfig tls{o.tls_dir, o.node, o.insecure};
  if (o.insecure) {
    std::fprintf(stderr,
                 "%s: WARNING: --insecure: gRPC on %s is PLAINTEXT with no client certificates and no roles: anyone "
                 "who reaches it can fail links, inject loss, read GPU memory and run collectives\n",
                 o.node.c_str(), listen.c_str());
  }
  set_process_tls(tls);
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort(listen, server_credentials(tls), &port);
  b.RegisterService(service);
  b.SetMaxReceiveMessageSize(max_message_bytes);
  b.SetMaxSendMessageSize(max_message_bytes);
  b.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, kSyncServerPollers);
  std::unique_ptr<grpc::Server> s = b.BuildAndStart();
  const std::string certs = o.insecure ? ""
                                       : "; or gRPC refused the certificates in " + o.tls_dir + ": is " + o.node +
                                             ".key the key of " + o.node + ".pem?";
  IFEC_CHECK(s != nullptr && port != 0, "node " << o.node << ": cannot listen on " << listen
                                                << " (address in use, or not on this host?" << certs << ")");
  return s;
}

// The node's BGP sessions and RIB (loop thread).
inline grpc::Status bgp_rib(NodeRuntime& rt, v1::BgpRibReply* out) {
  const routing::BgpSpeaker& bgp = rt.bgp();
  const routing::Topology& topo = rt.topology();
  out->set_local_as(bgp.as());
  out->set_router_id(common::ipv4_to_string(rt.info().loopback));
  for (int p = 0; p < bgp.ports(); ++p) {
    const routing::BgpSession& s = bgp.session(p);
    v1::BgpSessionInfo* si = out->add_sessions();
    si->set_port(p);
    si->set_peer(topo.nodes[rt.peer_of(p).first].name);
    si->set_peer_as(s.config().peer_as);
    si->set_state(routing::bgp_state_name(s.state()));
    si->set_hold_time_s(s.hold_time());
    si->set_connect_retries(s.connect_retry_count());
  }
  for (const routing::BgpRibRow& r : bgp.rib()) {
    v1::BgpRibRoute* o = out->add_routes();
    o->set_prefix(routing::bgp_prefix_str(r.prefix));
    o->set_port(r.port);
    o->set_peer(r.peer);
    for (uint32_t as : r.as_path) o->add_as_path(as);
    o->set_path_gbps(r.gbps);
    o->set_selected(r.selected);
    o->set_weight_gbps(r.weight);
    o->set_dest_gpu(r.dest_gpu);
    o->set_next_hop(common::ipv4_to_string(r.next_hop));
  }
  return grpc::Status::OK;
}

// The handlers both daemons serve alike (loop thread): FARE's group toward a GPU (and, for a GPU, its path
// bandwidth per plane), and a port's admin state.
inline grpc::Status fare_weights(NodeRuntime& rt, const v1::FareWeightsRequest* q, v1::FareWeightsReply* out) {
  const int n = rt.topology().num_gpus();
  if (q->dest_gpu() < 0 || q->dest_gpu() >= n) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        rt.info().name + ": destination GPU " + std::to_string(q->dest_gpu()) + " outside 0.." + std::to_string(n - 1));
  }
  for (const routing::NextHop& h : rt.fare().next_hops(q->dest_gpu())) {
    v1::PortWeight* w = out->add_weights();
    w->set_port(h.port);
    w->set_gbps(h.weight);
  }
  if (rt.info().kind == routing::NodeKind::kGpu) {
    for (double g : rt.fare().plane_gbps(q->dest_gpu())) {
      out->add_plane_gbps(g);
    }
  }
  return grpc::Status::OK;
}

inline grpc::Status set_link(NodeRuntime& rt, const v1::SetLinkRequest* q) {
  rt.set_admin(q->port(), q->up());
  return grpc::Status::OK;
}

// Streams the runtime's events from `since` until the client goes away.
inline grpc::Status stream_events(NodeRuntime& rt, grpc::ServerContext* ctx, const v1::EventsRequest* req,
                                  grpc::ServerWriter<v1::Event>* out) {
  common::TimeNs since = req->since_uptime_ns();
  while (!ctx->IsCancelled()) {
    for (const RuntimeEvent& e : rt.events_since(since)) {
      v1::Event ev;
      ev.set_uptime_ns(e.at);
      ev.set_node(rt.info().name);
      ev.set_kind(e.kind);
      ev.set_detail(e.detail);
      if (!out->Write(ev)) {
        return grpc::Status::OK;
      }
      since = e.at + 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return grpc::Status::OK;
}

}  // namespace ifec::live
