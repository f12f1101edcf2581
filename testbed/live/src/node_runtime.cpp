// A live node: its interfaces, the FARE speaker on them, carrier polling, events.
#include "ifec/live/node_runtime.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "ifec/common/checks.h"
#include "ifec/live/metrics.h"
#include "ifec/live/netns.h"

namespace ifec::live {

namespace {

int node_index(const routing::Topology& topo, const std::string& name) {
  const int n = topo.find_node(name);
  if (n < 0) {
    std::string known;
    for (const auto& nd : topo.nodes) {
      known += (known.empty() ? "" : ", ") + nd.name;
      if (known.size() > 200) {
        known += ", ...";
        break;
      }
    }
    IFEC_FAIL("topology " << topo.source << " has no node '" << name << "' (nodes: " << known << ")");
  }
  return n;
}

}  // namespace

NodePort::NodePort(NodeRuntime& rt, int port, std::unique_ptr<AfPacketPort> dev)
    : rt_(rt), port_(port), dev_(std::move(dev)) {
  dev_->set_receiver([this](std::vector<uint8_t>&& f) { rt_.frame_in(port_, std::move(f)); });
}

bool NodePort::send(std::vector<uint8_t>&& frame) {
  if (loss_ > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < loss_) {
    ++injected_drops_;
    return true;  // taken, then lost on the wire
  }
  return dev_->send(std::move(frame));
}

void NodePort::set_loss(double p, uint64_t seed) {
  IFEC_CHECK(p >= 0 && p < 1, "loss probability " << p << " outside [0, 1)");
  loss_ = p;
  rng_.seed(seed * 7919 + static_cast<uint64_t>(port_));
}

NodeRuntime::NodeRuntime(const routing::Topology& topo, const std::string& node_name, RuntimeOptions opts)
    : topo_(topo), node_(node_index(topo, node_name)), opts_(opts), speaker_(topo, node_) {
  int max_port = -1;
  for (int l : topo_.links_of(node_)) {
    const routing::Link& link = topo_.links[l];
    max_port = std::max(max_port, link.a == node_ ? link.a_port : link.b_port);
  }
  ports_.resize(max_port + 1);
  link_of_port_.assign(max_port + 1, -1);
  for (int l : topo_.links_of(node_)) {
    const routing::Link& link = topo_.links[l];
    const int p = link.a == node_ ? link.a_port : link.b_port;
    link_of_port_[p] = l;
    // Slots for the largest RoCE/ECH frame of this MTU (headers are under 128 bytes).
    auto dev = std::make_unique<AfPacketPort>(loop_, ifname(p), static_cast<uint64_t>(link.rate_gbps * 1e9),
                                              opts_.netns, topo_.params.mtu + 128);
    ports_[p] = std::make_unique<NodePort>(*this, p, std::move(dev));
  }
  for (size_t p = 0; p < ports_.size(); ++p) {
    IFEC_CHECK(ports_[p] != nullptr, "node " << node_name << ": port " << p << " has no link in the topology");
  }
  peer_macs_.assign(ports_.size(), common::MacAddress{});
  admin_.assign(ports_.size(), 1);
}

NodeRuntime::~NodeRuntime() = default;

std::vector<common::Port*> NodeRuntime::port_ptrs() const {
  std::vector<common::Port*> out;
  for (const auto& p : ports_) {
    out.push_back(p.get());
  }
  return out;
}

common::MacAddress NodeRuntime::mac(int port) const {
  common::MacAddress m{};
  std::copy(ports_.at(port)->dev_->mac(), ports_.at(port)->dev_->mac() + 6, m.begin());
  return m;
}

std::pair<int, int> NodeRuntime::peer_of(int port) const { return topo_.peer(link_of_port_.at(port), node_); }

bool NodeRuntime::all_heard() const {
  for (const auto& p : ports_) {
    if (p->link_up() && !speaker_.heard(p->port())) {
      return false;
    }
  }
  return true;
}

void NodeRuntime::frame_in(int port, std::vector<uint8_t>&& frame) {
  if (frame.size() >= 14 && frame[12] == (routing::kFareEthertype >> 8) &&
      frame[13] == (routing::kFareEthertype & 0xFF)) {
    routing::FareMessage m;
    std::string why = routing::decode_fare(frame.data(), frame.size(), &m);
    if (why.empty()) {
      why = speaker_.receive(port, m, loop_.now());
    }
    if (!why.empty()) {
      note("fare", "port " + std::to_string(port) + ": " + why);
      return;
    }
    const bool new_mac = !std::equal(frame.begin() + 6, frame.begin() + 12, peer_macs_[port].begin());
    std::copy(frame.begin() + 6, frame.begin() + 12, peer_macs_[port].begin());
    if (speaker_.recompute()) {
      decided();
    } else if (new_mac) {
      // The same decision, but a next hop's address is known only now: routes built before it left it out.
      for (auto& fn : fare_listeners_) {
        fn();
      }
    }
    return;
  }
  if (ports_[port]->rx_) {
    ports_[port]->rx_(std::move(frame));
  }
}

void NodeRuntime::advertise(int port) {
  NodePort& p = *ports_[port];
  if (!p.link_up()) {
    return;
  }
  for (const routing::FareMessage& m : speaker_.advert(port)) {
    p.dev_->send_control(routing::encode_fare(m, opts_.fare_mac ? opts_.fare_mac->data() : p.dev_->mac()));
  }
}

void NodeRuntime::advertise_all() {
  for (size_t p = 0; p < ports_.size(); ++p) {
    advertise(static_cast<int>(p));
  }
}

std::string NodeRuntime::ifname(int port) const {
  auto it = opts_.ifnames.find(port);
  return it != opts_.ifnames.end() ? it->second : fabric_ifname(port);
}

std::map<int, std::string> interfaces_by_subnet(const routing::Topology& topo, int node, uint32_t base) {
  std::map<uint32_t, std::string> by_net;  // /29 network -> interface
  ifaddrs* ifs = nullptr;
  IFEC_CHECK(getifaddrs(&ifs) == 0, "getifaddrs: " << std::strerror(errno));
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET) {
      const uint32_t ip = ntohl(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr);
      by_net[ip & ~uint32_t{7}] = i->ifa_name;
    }
  }
  freeifaddrs(ifs);
  std::map<int, std::string> out;
  for (int l : topo.links_of(node)) {
    const routing::Link& link = topo.links[l];
    const uint32_t net = base + 8 * static_cast<uint32_t>(l);
    auto it = by_net.find(net);
    IFEC_CHECK(it != by_net.end(), "node " << topo.nodes[node].name << ": no interface in link " << l << "'s network "
                                           << (net >> 24) << "." << ((net >> 16) & 255) << "." << ((net >> 8) & 255)
                                           << "." << (net & 255) << "/29 (to "
                                           << topo.nodes[link.a == node ? link.b : link.a].name << ")");
    out[link.a == node ? link.a_port : link.b_port] = it->second;
  }
  return out;
}

void NodeRuntime::decided() {
  ++fare_changes_;
  fare_last_change_ = loop_.now();
  advertise_all();  // triggered update
  for (auto& fn : fare_listeners_) {
    fn();
  }
}

void NodeRuntime::tick() {
  bool links = false;
  for (auto& p : ports_) {
    if (p->dev_->refresh_link()) {
      links = true;
      speaker_.set_port_up(p->port(), p->link_up());
      note("link", ifname(p->port()) + (p->link_up() ? " up" : " down"));
    }
  }
  const bool expired = speaker_.expire(loop_.now(), opts_.fare_hold_ns);
  if ((links || expired) && speaker_.recompute()) {
    decided();
  }
}

void NodeRuntime::start() {
  IFEC_CHECK(!started_, "node runtime started twice");
  started_ = true;
  for (auto& p : ports_) {
    speaker_.set_port_up(p->port(), p->link_up());
  }
  if (speaker_.recompute()) {
    decided();
  }
  advertise_all();
  // Periodic advertisements and carrier polling, each as its own repeating timer.
  struct Repeat {
    static void every(EpollLoop& loop, common::TimeNs period, std::function<void()> fn) {
      loop.schedule(loop.now() + period, [&loop, period, fn] {
        fn();
        every(loop, period, fn);
      });
    }
  };
  Repeat::every(loop_, opts_.fare_interval_ns, [this] { advertise_all(); });
  Repeat::every(loop_, opts_.carrier_poll_ns, [this] { tick(); });
}

void NodeRuntime::set_admin(int port, bool up) {
  IFEC_CHECK(port >= 0 && port < static_cast<int>(ports_.size()),
             info().name << ": no port " << port << " (ports 0.." << ports_.size() - 1 << ")");
  int fd;
  {
    NetnsGuard in(opts_.netns);
    fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  }
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, ifname(port).c_str(), IFNAMSIZ - 1);
  bool ok = fd >= 0 && ioctl(fd, SIOCGIFFLAGS, &ifr) == 0;
  if (ok) {
    ifr.ifr_flags = static_cast<short>(up ? (ifr.ifr_flags | IFF_UP) : (ifr.ifr_flags & ~IFF_UP));
    ok = ioctl(fd, SIOCSIFFLAGS, &ifr) == 0;
  }
  const int err = errno;
  if (fd >= 0) {
    close(fd);
  }
  IFEC_CHECK(ok,
             info().name << ": cannot set " << ifname(port) << (up ? " up" : " down") << ": " << std::strerror(err));
  admin_[port] = up ? 1 : 0;
  note("link", ifname(port) + " set " + (up ? "up" : "down") + " through the control plane");
  tick();
}

std::string NodeRuntime::render_metrics(bool ready,
                                        const std::function<std::string(const std::string& labels)>& extra) const {
  const std::string node = "node=\"" + info().name + "\"";
  std::string out =
      "# HELP ifec_port_bytes_total Frame bytes through a fabric interface (AF_PACKET), by direction.\n"
      "# TYPE ifec_port_bytes_total counter\n";
  for (const auto& p : ports_) {
    const AfPacketCounters c = p->dev_->counters();
    const auto [peer, peer_port] = peer_of(p->port());
    const int link = link_of_port_[p->port()];
    const std::string l = node + ",port=\"" + std::to_string(p->port()) + "\",plane=\"" +
                          std::to_string(topo_.links[link].plane) + "\",peer=\"" + topo_.nodes[peer].name + "\"";
    out += metric("ifec_port_bytes_total", l + ",dir=\"tx\"", static_cast<double>(c.tx_bytes));
    out += metric("ifec_port_bytes_total", l + ",dir=\"rx\"", static_cast<double>(c.rx_bytes));
    out += metric("ifec_port_frames_total", l + ",dir=\"tx\"", static_cast<double>(c.tx_frames));
    out += metric("ifec_port_frames_total", l + ",dir=\"rx\"", static_cast<double>(c.rx_frames));
    out += metric("ifec_port_dropped_total", l + ",reason=\"ring\"", static_cast<double>(c.rx_dropped));
    out += metric("ifec_port_dropped_total", l + ",reason=\"tx_error\"", static_cast<double>(c.tx_errors));
    out += metric("ifec_port_up", l, p->link_up() ? 1 : 0);
    out += metric("ifec_port_dropped_total", l + ",reason=\"injected\"", static_cast<double>(p->injected_drops()));
  }
  out += "# TYPE ifec_fare_changes_total counter\n" + metric("ifec_fare_changes_total", node, fare_changes_);
  out += "# TYPE ifec_ready gauge\n" + metric("ifec_ready", node, ready ? 1 : 0);
  out += "# TYPE ifec_uptime_seconds gauge\n" + metric("ifec_uptime_seconds", node, loop_.now() / 1e9);
  return extra ? out + extra(node) : out;
}

void NodeRuntime::note(const std::string& kind, const std::string& detail) {
  std::lock_guard<std::mutex> lock(events_mu_);
  events_.push_back({loop_.now(), kind, detail});
  if (events_.size() > 10000) {
    events_.pop_front();
  }
}

void NodeRuntime::serve() {
  for (;;) {
    try {
      loop_.serve();
      return;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: error on the event loop (going on): %s\n", info().name.c_str(), e.what());
      note("error", e.what());
    }
  }
}

std::vector<RuntimeEvent> NodeRuntime::events_since(common::TimeNs since) const {
  std::lock_guard<std::mutex> lock(events_mu_);
  std::vector<RuntimeEvent> out;
  for (const RuntimeEvent& e : events_) {
    if (e.at >= since) {
      out.push_back(e);
    }
  }
  return out;
}

}  // namespace ifec::live
