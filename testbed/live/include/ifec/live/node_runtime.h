// What every live daemon (switchd, hostd) runs under its switch or endpoint: the topology node it is, its fabric
// interfaces (one AfPacketPort per topology port, named f<port> in its namespace), FARE over BGP-4 on them (a
// routing::BgpSpeaker: one eBGP session per link over TCP port 179 between the link's two addresses, neighbour MACs
// from the kernel's ARP table once a session is up, carrier polling), and a log of events the control plane streams.
//
// Each fabric interface carries its link's address (link L's /29 at 10.64.0.0 + 8 L, .2 at the a-end, .3 at the
// b-end): containers get it from Docker, namespaces from the runtime itself when the interface has none. BGP runs
// in the kernel's TCP stack; the AF_PACKET ports see only the fabric's frames (RoCEv2, ECH, PFC), which go to the
// switch or endpoint that set the port's receiver (NodePort), so those see exactly the Port they see in the
// simulator.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "ifec/common/ethernet.h"
#include "ifec/live/af_packet_port.h"
#include "ifec/live/epoll_loop.h"
#include "ifec/live/netns.h"
#include "ifec/live/xdp_port.h"
#include "ifec/routing/bgp_speaker.h"
#include "ifec/routing/topology.h"
#include "ifec/testbed/live_timing.h"

namespace ifec::live {

struct RuntimeOptions {
  routing::BgpSpeakerOptions bgp;  // hold time (3 s: testbed::kLiveBgpHoldNs), retry timers, bandwidth units
  common::TimeNs carrier_poll_ns = 20'000'000;
  std::string netns;  // open the interfaces in this namespace (tests); "" = the daemon's own
  // Interface of each topology port; ports not in it are f<port> (the namespaces' naming). Containers, whose
  // interfaces Docker names, fill it with interfaces_by_subnet().
  std::map<int, std::string> ifnames;
  // Which socket the fabric ports use: AF_PACKET (the default), AF_XDP, or AF_XDP where it can (auto: falls back,
  // saying why in each port's description).
  FabricDriver driver = FabricDriver::kAfPacket;
};

// The interfaces of `node` found by address: link L's network is the /29 at `base` + 8 L (the compose file's
// plan), so an interface with an IPv4 address there is the node's end of link L. Throws common::Error naming a
// link of the node that has no such interface.
std::map<int, std::string> interfaces_by_subnet(const routing::Topology& topo, int node, uint32_t base);

struct RuntimeEvent {
  common::TimeNs at = 0;
  std::string kind;
  std::string detail;
};

class NodeRuntime;

// One fabric port as the switch or endpoint sees it: an AF_PACKET or AF_XDP port (FabricPort) with fault injection.
class NodePort : public common::Port {
 public:
  NodePort(NodeRuntime& rt, int port, OpenedFabricPort opened);
  bool send(std::vector<uint8_t>&& frame) override;
  bool busy() const override { return dev_->busy(); }
  bool link_up() const override { return dev_->link_up(); }
  uint64_t rate_bps() const override { return dev_->rate_bps(); }
  void set_receiver(Receiver rx) override { rx_ = std::move(rx); }
  void set_tx_ready(TxReady ready) override { dev_->set_tx_ready(std::move(ready)); }
  FabricPort& device() { return *dev_; }
  // The driver in words, and where the default (auto) fell back to AF_PACKET why AF_XDP was not used.
  const std::string& description() const { return description_; }
  int port() const { return port_; }
  // Drops what the owner sends with probability p (fault injection; BGP, in the kernel's TCP, is not affected).
  void set_loss(double p, uint64_t seed);
  uint64_t injected_drops() const { return injected_drops_; }

 private:
  friend class NodeRuntime;
  NodeRuntime& rt_;
  int port_;
  std::unique_ptr<FabricPort> dev_;
  std::string description_;
  Receiver rx_;
  double loss_ = 0;
  std::mt19937_64 rng_;
  uint64_t injected_drops_ = 0;
};

class NodeRuntime {
 public:
  // Opens every fabric interface of `node_name` (throws Error naming the node, or the interface and why).
  NodeRuntime(const routing::Topology& topo, const std::string& node_name, RuntimeOptions opts = {});
  ~NodeRuntime();

  EpollLoop& loop() { return loop_; }
  const routing::Topology& topology() const { return topo_; }
  int node() const { return node_; }
  const routing::Node& info() const { return topo_.nodes[node_]; }
  // Ports by topology port number (every port of the node).
  const std::vector<std::unique_ptr<NodePort>>& ports() const { return ports_; }
  std::vector<common::Port*> port_ptrs() const;
  const routing::FareSpeaker& fare() const { return bgp_.fare(); }
  const routing::BgpSpeaker& bgp() const { return bgp_; }
  // The port's BGP session is Established and the neighbour's MAC known.
  bool heard(int port) const;
  // The MAC of the neighbour on `port`, from the ARP table once its session is up (all zero until then).
  common::MacAddress peer_mac(int port) const { return peer_macs_.at(port); }
  common::MacAddress mac(int port) const;
  // The topology's (node, port) on the other end of `port`.
  std::pair<int, int> peer_of(int port) const;
  bool all_heard() const;  // every port with a carrier has its session up and its neighbour's MAC
  // FARE has a next hop to every other GPU on every plane this node has a session on (that GPU's NIC on it): the
  // routes have converged. Before, frames for a GPU not yet learned are dropped as unroutable.
  bool routes_complete() const;

  // Called on the loop after FARE's decision changed (install routes, reweigh QPs).
  void on_fare_change(std::function<void()> fn) { fare_listeners_.push_back(std::move(fn)); }
  // Brings interface f<port> administratively up or down (its peer loses carrier too); throws Error naming it.
  void set_admin(int port, bool up);
  bool admin_up(int port) const { return admin_.at(port) != 0; }
  // Starts speaking BGP (call once the owner set its receivers).
  void start();
  void note(const std::string& kind, const std::string& detail);  // any thread
  // Serves the loop until stop(). A callback that throws is reported (stderr and an "error" event) and the loop goes
  // on: one operation's failure must not take the daemon, and every other rank's operations, down with it.
  void serve();
  std::vector<RuntimeEvent> events_since(common::TimeNs since) const;
  uint64_t fare_changes() const { return fare_changes_; }
  // Prometheus text for this node's ports, FARE and BGP state, plus what `extra` adds (the switch's or endpoint's
  // own).
  std::string render_metrics(bool ready, const std::function<std::string(const std::string& labels)>& extra) const;
  common::TimeNs fare_last_change() const { return fare_last_change_; }

 private:
  friend class NodePort;
  struct Tcp {
    int fd = -1;
    int port = -1;
    uint32_t peer = 0;
    bool connecting = false;
    std::vector<uint8_t> pending;  // written once the socket takes it
  };
  void frame_in(int port, std::vector<uint8_t>&& frame, common::TimeNs rx_timestamp_ns);
  void deliver_in_arrival_order();
  void tick();
  void decided();
  std::string ifname(int port) const;
  void ensure_address(int port);
  void listen_bgp();
  void on_accept();
  void bind_tcp(int conn, int fd, int port, uint32_t peer, bool connecting);
  void drop_tcp(int conn);
  void on_tcp(int conn);
  void connect_tcp(const routing::BgpTransportRequest& r);
  void flush(int conn);
  void pump();  // the speaker's decisions, requests and bytes, until it has nothing more to do
  bool resolve_macs();

  const routing::Topology& topo_;
  int node_ = -1;
  RuntimeOptions opts_;
  EpollLoop loop_;
  std::vector<std::unique_ptr<NodePort>> ports_;
  // The frames the ports took in one turn of the loop, delivered in the order the kernel received them: the loop
  // serves each port's whole ring in turn, so a frame that reached sub-link 1 after one on sub-link 0 could
  // otherwise reach the endpoint first (an RC receiver takes that for a lost packet: NAK, go-back-N).
  struct Arrival {
    common::TimeNs at;
    int port;
    std::vector<uint8_t> frame;
  };
  std::vector<Arrival> arrivals_;
  std::vector<int> link_of_port_;
  routing::BgpSpeaker bgp_;
  int ctl_fd_ = -1;                                     // a UDP socket in the namespace, for interface and ARP ioctls
  int listen_fd_ = -1;                                  // TCP :179
  std::map<int, Tcp> tcp_;                              // by the speaker's connection id
  std::vector<uint32_t> local_addr_;                    // by port: this node's address on the link
  std::vector<std::vector<uint32_t>> peer_candidates_;  // by port: where the neighbour may be (tried in turn)
  std::vector<size_t> next_candidate_;
  std::vector<uint32_t> peer_addr_;  // by port: the neighbour's address, once a connection reached it
  std::vector<common::MacAddress> peer_macs_;
  std::vector<char> admin_;
  std::vector<std::function<void()>> fare_listeners_;
  uint64_t fare_changes_ = 0;
  common::TimeNs fare_last_change_ = 0;
  mutable std::mutex events_mu_;
  std::deque<RuntimeEvent> events_;
  bool started_ = false;
};

}  // namespace ifec::live
