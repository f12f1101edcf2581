// The live daemons: ifec-switchd (one switch of the topology: the Switch pipeline and IFEC engine on its
// interfaces, FARE routes, the gRPC Switch service) and ifec-hostd (one GPU: its Endpoint, its rank's
// Communicator over the gRPC bootstrap and control plane, the gRPC Host service). Each runs its switch or
// endpoint on one EpollLoop thread; gRPC handlers post into it and wait for the answer.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ifec/common/interfaces.h"
#include "ifec/routing/topology.h"

namespace ifec::live {

struct DaemonOptions {
  std::string topology_file;  // a path, or env:NAME for YAML text in environment variable NAME (containers)
  std::string node;
  std::string listen;          // gRPC address; default: this node's management address
  std::string netns;           // open interfaces in this namespace (tests); "" = the daemon's own
  bool mgmt_loopback = false;  // tests: every daemon on 127.0.0.1 at port 50051 + node index
  bool mgmt_names = false;     // containers: every daemon at its node name (DNS), ports 50051 and 9400
  uint32_t links_base = 0;     // containers: find link L's interface by its address in base + 8 L /29 (0: f<port>)
  // hostd only: the GPU is an external RDMA peer (a Soft-RoCE guest) whose NIC shares this node's interface; hostd
  // speaks FARE for it under this MAC and runs no endpoint of its own ("" = none).
  std::string guest_mac;
  // hostd only: GPUs that are external RDMA peers (Soft-RoCE guests), not ranks: the bootstrap leaves them out and
  // AttachPeer pairs a QP with them.
  std::vector<std::string> external_peers;
  std::vector<std::string> node_names;  // the topology's, by node index (the daemons fill it: mgmt_names uses it)
  common::TimeNs rpc_deadline_ns = 5'000'000'000ULL;
  // The control plane's certificates (ifec/live/tls.h): a folder with ca.pem and NODE.pem / NODE.key, or insecure
  // (plaintext, no roles; said loudly at start). One of them is required.
  std::string tls_dir;
  bool insecure = false;
  std::string fabric_driver = "af_packet";  // the fabric ports' sockets: af_packet | af_xdp | auto
};

// Where a daemon of `node` is reached under `o` (the management plan, loopback ports for tests, or its node name
// in containers): gRPC, and the Prometheus metrics (HTTP GET /metrics, port 9400); and where a daemon listens.
std::string daemon_address(const DaemonOptions& o, int node);
std::string metrics_address(const DaemonOptions& o, int node);
std::string listen_address(const DaemonOptions& o, int node);
// The topology `o` names (a file, or env:NAME); throws common::Error naming it and what is wrong.
routing::Topology load_daemon_topology(const DaemonOptions& o);
// The node runtime's options under `o` (namespace, and the interfaces when found by address).
struct RuntimeOptions;
RuntimeOptions runtime_options(const DaemonOptions& o, const routing::Topology& topo);
// What both daemons do first: load the topology `o` names into `topo`, note its node names in `o`, and start
// o.node's runtime, which must be a node of `kind` (else the error names the daemon that runs it). Before any
// interface is opened, the certificates are read and `check` (if any) sees the topology: either throws naming what
// is wrong.
class NodeRuntime;
std::unique_ptr<NodeRuntime> start_node(DaemonOptions& o, routing::Topology& topo, routing::NodeKind kind,
                                        const std::function<void(const routing::Topology&)>& check = {});

// Runs a daemon until SIGTERM/SIGINT (or stop()); throws common::Error naming what is wrong before it serves.
class SwitchDaemon {
 public:
  explicit SwitchDaemon(DaemonOptions o);
  ~SwitchDaemon();
  void run();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class HostDaemon {
 public:
  explicit HostDaemon(DaemonOptions o);
  ~HostDaemon();
  void run();
  void stop();
  struct Impl;  // (its gRPC service reaches into it)

 private:
  std::unique_ptr<Impl> impl_;
};

// main() of both programs: parses argv, runs, prints one clear line per problem; returns the exit status.
int switchd_main(int argc, char** argv);
int hostd_main(int argc, char** argv);

}  // namespace ifec::live
