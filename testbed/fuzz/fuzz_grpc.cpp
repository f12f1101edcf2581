// libFuzzer target: requests into both daemons' gRPC services. An ifec-switchd and two ifec-hostds run in this
// process (each on its own loop thread, on veths in namespaces made at start, gRPC on loopback, plaintext: the
// handlers are what is fuzzed; the role check in front of them is test_tls and test_live_security.py); every input
// is one call through gRPC's generic client, so the bytes go through the server's deserialization and then the
// handler. Whatever arrives, no daemon may crash, read out of bounds (ASan) or stop answering: every call has a
// deadline, and after each input the switch and both hostds must still answer Status.
//
// Input: [service u8][method u8][target u8][flags u8][request bytes]. service % 2: Switch or Host; method: among that
// service's unary rpcs; target % 2: which hostd; flags bit 0: the bytes are parsed as the rpc's request message and
// re-serialized (a well-formed request with fuzzed field values), else sent as they are (malformed, truncated or
// oversized protobuf). Needs root (namespaces); without it the target says why and exits.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ifec/live/af_packet_port.h"
#include "ifec/live/daemons.h"
#include "ifec/live/netns.h"
#include "ifec/routing/topology.h"
#include "ifec/v1/control.grpc.pb.h"

namespace {

using namespace ifec;
namespace pb = google::protobuf;

struct Daemon {
  live::DaemonOptions opts;
  std::unique_ptr<live::SwitchDaemon> sw;
  std::unique_ptr<live::HostDaemon> host;
  std::thread thread;
};

struct Rig {
  routing::Topology topo = routing::make_superpod(2, 1, 400, 1);
  std::string file = "/tmp/ifec-fuzz-grpc-" + std::to_string(getpid()) + ".yaml";
  std::vector<std::unique_ptr<live::ScopedNetns>> ns;    // [node]
  std::vector<Daemon> daemons;                           // [node]: gpu0, gpu1, p0-sw
  std::vector<std::shared_ptr<grpc::Channel>> channels;  // [node]
  std::vector<const pb::MethodDescriptor*> methods[2];   // unary rpcs of Switch, Host

  Rig() {
    std::ofstream(file) << routing::to_yaml(topo);
    const std::string tag = "ifz" + std::to_string(getpid());
    for (const routing::Node& n : topo.nodes) {
      ns.push_back(std::make_unique<live::ScopedNetns>(tag + "-" + n.name));
    }
    for (const routing::Link& l : topo.links) {
      live::make_veth(*ns[l.a], live::fabric_ifname(l.a_port), *ns[l.b], live::fabric_ifname(l.b_port));
    }
    daemons.resize(topo.nodes.size());
    for (size_t i = 0; i < topo.nodes.size(); ++i) {
      Daemon& d = daemons[i];
      d.opts.topology_file = file;
      d.opts.node = topo.nodes[i].name;
      d.opts.netns = ns[i]->name();
      d.opts.mgmt_loopback = true;
      d.opts.insecure = true;
      if (topo.nodes[i].kind == routing::NodeKind::kSwitch) {
        d.sw = std::make_unique<live::SwitchDaemon>(d.opts);
        d.thread = std::thread([&d] { d.sw->run(); });
      } else {
        d.host = std::make_unique<live::HostDaemon>(d.opts);
        d.thread = std::thread([&d] { d.host->run(); });
      }
      channels.push_back(
          grpc::CreateChannel(live::daemon_address(d.opts, static_cast<int>(i)), grpc::InsecureChannelCredentials()));
    }
    const pb::FileDescriptor* f = v1::Empty::descriptor()->file();
    for (int s = 0; s < 2; ++s) {
      const pb::ServiceDescriptor* svc = f->FindServiceByName(s == 0 ? "Switch" : "Host");
      for (int m = 0; m < svc->method_count(); ++m) {
        if (!svc->method(m)->server_streaming()) {
          methods[s].push_back(svc->method(m));
        }
      }
    }
  }
  ~Rig() {
    for (Daemon& d : daemons) {
      d.sw ? d.sw->stop() : d.host->stop();
      d.thread.join();
    }
    std::remove(file.c_str());
  }
  // Every daemon answers Status within `wait` (and the hostds say ready when `ready`).
  bool all_answer(std::chrono::milliseconds wait, bool ready) {
    for (size_t i = 0; i < daemons.size(); ++i) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + wait);
      v1::NodeStatus st;
      const grpc::Status s = daemons[i].sw ? v1::Switch::NewStub(channels[i])->Status(&ctx, v1::Empty(), &st)
                                           : v1::Host::NewStub(channels[i])->Status(&ctx, v1::Empty(), &st);
      if (!s.ok() || (ready && !st.ready())) {
        return false;
      }
    }
    return true;
  }
  int node_of(int service, uint8_t target) const {
    int want = 0;
    for (size_t i = 0; i < topo.nodes.size(); ++i) {
      const bool is_switch = topo.nodes[i].kind == routing::NodeKind::kSwitch;
      if (service == 0 ? is_switch : (!is_switch && want++ == target % 2)) {
        return static_cast<int>(i);
      }
    }
    return 0;
  }
};

Rig* g_rig = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const std::string why = live::netns_unavailable(); !why.empty()) {
    std::fprintf(stderr, "fuzz_grpc: %s\n", why.c_str());
    std::exit(0);
  }
  g_rig = new Rig();  // lives as long as the process: the daemons serve every input
  // libFuzzer ends with exit(): the daemons stop and the namespaces and veths go with the rig then.
  std::atexit([] {
    delete g_rig;
    g_rig = nullptr;
  });
  for (int i = 0; i < 300 && !g_rig->all_answer(std::chrono::milliseconds(200), true); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!g_rig->all_answer(std::chrono::seconds(2), true)) {
    std::fprintf(stderr, "fuzz_grpc: the daemons did not come up within 30 s\n");
    std::abort();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) {
    return 0;
  }
  const int service = data[0] % 2;
  const auto& methods = g_rig->methods[service];
  const pb::MethodDescriptor* m = methods[data[1] % methods.size()];
  const int node = g_rig->node_of(service, data[2]);
  std::string body(reinterpret_cast<const char*>(data + 4), size - 4);
  if (data[3] & 1) {  // well-formed: the fuzzed bytes as the request's fields
    std::unique_ptr<pb::Message> req(pb::MessageFactory::generated_factory()->GetPrototype(m->input_type())->New());
    req->ParsePartialFromString(body);
    body = req->SerializePartialAsString();
  }
  grpc::Slice slice(body);
  grpc::ByteBuffer request(&slice, 1), reply;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  grpc::GenericStub stub(g_rig->channels[node]);
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/" + m->service()->full_name() + "/" + m->name(), grpc::StubOptions(), &request, &reply,
                 [&done](grpc::Status s) { done.set_value(s); });
  done.get_future().wait();
  if (!g_rig->all_answer(std::chrono::seconds(5), false)) {
    std::fprintf(stderr, "fuzz_grpc: a daemon stopped answering after %s\n", m->full_name().c_str());
    std::abort();
  }
  return 0;
}
