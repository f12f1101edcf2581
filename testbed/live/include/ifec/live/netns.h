// Network namespaces and veth pairs for tests and benches that build their own small wiring (the bring-up of whole
// topologies is Mininet's, from Python). Everything made here is removed by the destructor, failure or not.
#pragma once

#include <string>
#include <vector>

namespace ifec::live {

// The management (control-plane) address of topology node `node`: 172.31.0.0/16, node i at host i + 2
// (the bridge is .1), gRPC on `grpc_port`.
std::string mgmt_ip(int node);
std::string mgmt_address(int node, int grpc_port = 50051);

// Runs a command (argv, no shell); returns its exit status and puts its stdout+stderr into *out when given.
int run_command(const std::vector<std::string>& argv, std::string* out = nullptr);

// Whether interface `ifname` can carry frames now, asked through `fd` (a socket made in the interface's namespace):
// up, running (its operational state: the kernel has activated its transmit queue) and with carrier. A veth's
// carrier goes at once when its peer goes down, while the operational state can follow a second later (the kernel's
// link watcher batches its events): frames sent in between vanish. A driver that does not report its carrier
// (ETHTOOL_GLINK) is taken by its flags alone.
bool interface_usable(int fd, const std::string& ifname);

// Why this process cannot make namespaces and veths here ("" when it can): tests skip with this reason.
std::string netns_unavailable();

// Enters network namespace `name` (under /var/run/netns) on this thread for its lifetime, then returns to the one
// it came from; "" enters nothing. Sockets made meanwhile stay in `name`. Throws Error naming it.
class NetnsGuard {
 public:
  explicit NetnsGuard(const std::string& name);
  ~NetnsGuard();
  NetnsGuard(const NetnsGuard&) = delete;
  NetnsGuard& operator=(const NetnsGuard&) = delete;

 private:
  int self_ = -1;
};

class ScopedNetns {
 public:
  // Creates /var/run/netns/<name> (a name unique to this process is the caller's job); throws Error naming it.
  explicit ScopedNetns(std::string name);
  ~ScopedNetns();  // deletes the namespace, and with it every interface inside
  ScopedNetns(const ScopedNetns&) = delete;
  ScopedNetns& operator=(const ScopedNetns&) = delete;
  const std::string& name() const { return name_; }
  // Runs `ip <args>` inside the namespace; throws Error with ip's message when it fails.
  void ip(const std::vector<std::string>& args) const;

 private:
  std::string name_;
};

// A veth pair between two namespaces: `a_if` in `a`, `b_if` in `b`, both up with the given MTU.
void make_veth(const ScopedNetns& a, const std::string& a_if, const ScopedNetns& b, const std::string& b_if,
               int mtu = 9216);

}  // namespace ifec::live
