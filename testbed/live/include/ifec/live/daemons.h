// The live daemons: ifec-switchd (one switch of the topology: the Switch pipeline and IFEC engine on its
// interfaces, FARE routes, the gRPC Switch service) and ifec-hostd (one GPU: its Endpoint, its rank's
// Communicator over the gRPC bootstrap and control plane, the gRPC Host service). Each runs its switch or
// endpoint on one EpollLoop thread; gRPC handlers post into it and wait for the answer.
#pragma once

#include <memory>
#include <string>

#include "ifec/common/interfaces.h"
#include "ifec/routing/topology.h"

namespace ifec::live {

struct DaemonOptions {
  std::string topology_file;
  std::string node;
  std::string listen;          // gRPC address; default: this node's management address
  std::string netns;           // open interfaces in this namespace (tests); "" = the daemon's own
  bool mgmt_loopback = false;  // tests: every daemon on 127.0.0.1 at port 50051 + node index
  common::TimeNs rpc_deadline_ns = 5'000'000'000ULL;
};

// Where a daemon of `node` listens under `o` (the management plan, or loopback ports for tests): gRPC, and the
// Prometheus metrics (HTTP GET /metrics, port 9400 on the management address).
std::string daemon_address(const DaemonOptions& o, int node);
std::string metrics_address(const DaemonOptions& o, int node);

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
