// A live node: its interfaces, FARE over BGP on them (TCP sessions per link), carrier polling, events.
#include "ifec/live/node_runtime.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include "ifec/common/checks.h"
#include "ifec/common/ipv4.h"
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

NodePort::NodePort(NodeRuntime& rt, int port, OpenedFabricPort opened)
    : rt_(rt), port_(port), dev_(std::move(opened.port)), description_(std::move(opened.description)) {
  dev_->set_receiver([this](std::vector<uint8_t>&& f) { rt_.frame_in(port_, std::move(f), dev_->rx_timestamp_ns()); });
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
    : topo_(topo), node_(node_index(topo, node_name)), opts_(opts), bgp_(topo, node_, opts.bgp) {
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
    OpenedFabricPort dev = open_fabric_port(loop_, ifname(p), static_cast<uint64_t>(link.rate_gbps * 1e9), opts_.netns,
                                            topo_.params.mtu + 128, opts_.driver);
    note("port", ifname(p) + ": " + dev.description);
    ports_[p] = std::make_unique<NodePort>(*this, p, std::move(dev));
  }
  for (size_t p = 0; p < ports_.size(); ++p) {
    IFEC_CHECK(ports_[p] != nullptr, "node " << node_name << ": port " << p << " has no link in the topology");
  }
  peer_macs_.assign(ports_.size(), common::MacAddress{});
  admin_.assign(ports_.size(), 1);
  {
    NetnsGuard in(opts_.netns);
    ctl_fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  }
  IFEC_CHECK(ctl_fd_ >= 0, node_name << ": cannot open a socket: " << std::strerror(errno));
  local_addr_.assign(ports_.size(), 0);
  peer_candidates_.resize(ports_.size());
  next_candidate_.assign(ports_.size(), 0);
  peer_addr_.assign(ports_.size(), 0);
  for (size_t p = 0; p < ports_.size(); ++p) {
    ensure_address(static_cast<int>(p));
  }
}

NodeRuntime::~NodeRuntime() {
  for (auto& [conn, t] : tcp_) {
    if (t.fd >= 0) close(t.fd);
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  if (ctl_fd_ >= 0) close(ctl_fd_);
}

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

bool NodeRuntime::heard(int port) const {
  return bgp_.established(port) && peer_macs_.at(port) != common::MacAddress{};
}

bool NodeRuntime::routes_complete() const {
  std::set<int> planes;  // of this node's established sessions
  for (const auto& p : ports_) {
    const int plane = topo_.links[link_of_port_.at(p->port())].plane;
    if (plane != routing::kNvlinkPlane && bgp_.established(p->port())) {
      planes.insert(plane);
    }
  }
  for (const routing::Node& n : topo_.nodes) {
    if (n.kind != routing::NodeKind::kGpu || n.gpu_index == info().gpu_index) {
      continue;
    }
    std::set<int> reached;
    for (const routing::NextHop& h : bgp_.next_hops(n.gpu_index)) {
      reached.insert(topo_.links[link_of_port_.at(h.port)].plane);
    }
    for (int plane : planes) {
      if ((n.plane < 0 || n.plane == plane) && reached.count(plane) == 0) {
        return false;
      }
    }
  }
  return true;
}

bool NodeRuntime::all_heard() const {
  for (const auto& p : ports_) {
    if (p->link_up() && !heard(p->port())) {
      return false;
    }
  }
  return true;
}

void NodeRuntime::frame_in(int port, std::vector<uint8_t>&& frame, common::TimeNs rx_timestamp_ns) {
  if (rx_timestamp_ns == 0 && arrivals_.empty()) {  // a driver without timestamps: as it comes
    if (ports_[port]->rx_) {
      ports_[port]->rx_(std::move(frame));
    }
    return;
  }
  if (arrivals_.empty()) {
    loop_.schedule(0, [this] { deliver_in_arrival_order(); });  // after every port ready in this turn
  }
  arrivals_.push_back({rx_timestamp_ns, port, std::move(frame)});
}

void NodeRuntime::deliver_in_arrival_order() {
  std::vector<Arrival> batch = std::move(arrivals_);
  arrivals_.clear();
  std::stable_sort(batch.begin(), batch.end(), [](const Arrival& a, const Arrival& b) { return a.at < b.at; });
  // The kernel stamps a frame with the real-time clock; the loop's time is the monotonic one since the loop began.
  const int64_t real_minus_loop = static_cast<int64_t>(EpollLoop::clock_ns(CLOCK_REALTIME)) -
                                  static_cast<int64_t>(EpollLoop::clock_ns(CLOCK_MONOTONIC)) +
                                  static_cast<int64_t>(loop_.epoch_ns());
  for (Arrival& a : batch) {
    if (ports_[a.port]->rx_) {
      const int64_t at = static_cast<int64_t>(a.at) - real_minus_loop;
      loop_.set_arrival_ns(a.at != 0 && at > 0 ? static_cast<common::TimeNs>(at) : 0);
      ports_[a.port]->rx_(std::move(a.frame));
    }
  }
  loop_.set_arrival_ns(0);
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
  const std::vector<int> links = topo.links_of(node);
  const uint64_t last = links.empty() ? 0 : static_cast<uint64_t>(*std::max_element(links.begin(), links.end()));
  IFEC_CHECK(base + 8 * last + 7 <= 0xFFFFFFFF, "node " << topo.nodes[node].name << ": link " << last << "'s /29 from "
                                                        << common::ipv4_to_string(base)
                                                        << " (--links-by-subnet) is past 255.255.255.255");
  std::map<int, std::string> out;
  for (int l : links) {
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
  for (auto& fn : fare_listeners_) {
    fn();
  }
}

void NodeRuntime::tick() {
  for (auto& p : ports_) {
    if (p->dev_->refresh_link()) {
      bgp_.set_port_up(p->port(), p->link_up(), loop_.now());
      note("link", ifname(p->port()) + (p->link_up() ? " up" : " down"));
    }
  }
  bgp_.tick(loop_.now());
  pump();
}

void NodeRuntime::start() {
  IFEC_CHECK(!started_, "node runtime started twice");
  started_ = true;
  listen_bgp();
  for (auto& p : ports_) {
    bgp_.set_port_up(p->port(), p->link_up(), loop_.now());
  }
  pump();
  // Carrier polling and BGP's timers (seconds: keepalive, hold, connect retry) on one repeating timer.
  struct Repeat {
    static void every(EpollLoop& loop, common::TimeNs period, std::function<void()> fn) {
      loop.schedule(loop.now() + period, [&loop, period, fn] {
        fn();
        every(loop, period, fn);
      });
    }
  };
  Repeat::every(loop_, opts_.carrier_poll_ns, [this] { tick(); });
}

// ------------------------------------------------------------------------------------------- BGP over TCP --

// The namespaces' interfaces get the plan's address; a container's already has one in the link's /29 (Docker's
// choice), and its neighbour is then any other host address of the /29 (tried in turn).
void NodeRuntime::ensure_address(int port) {
  const int l = link_of_port_[port];
  const uint32_t want = routing::bgp_link_address(topo_, l, node_);
  const uint32_t net = want & ~uint32_t{7};
  uint32_t have = 0;
  {
    NetnsGuard in(opts_.netns);
    ifaddrs* ifs = nullptr;
    IFEC_CHECK(getifaddrs(&ifs) == 0, "getifaddrs: " << std::strerror(errno));
    for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET && ifname(port) == i->ifa_name) {
        const uint32_t a = ntohl(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr);
        if ((a & ~uint32_t{7}) == net) have = a;
      }
    }
    freeifaddrs(ifs);
  }
  const uint32_t peer = routing::bgp_link_address(topo_, l, topo_.peer(l, node_).first);
  if (have != 0) {
    local_addr_[port] = have;
    peer_candidates_[port] = {peer};
    for (uint32_t a = net + 2; a < net + 7; ++a) {
      if (a != have && a != peer) peer_candidates_[port].push_back(a);
    }
    bgp_.set_local_address(port, have);
    return;
  }
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, ifname(port).c_str(), IFNAMSIZ - 1);
  auto* sin = reinterpret_cast<sockaddr_in*>(&ifr.ifr_addr);
  sin->sin_family = AF_INET;
  sin->sin_addr.s_addr = htonl(want);
  bool ok = ioctl(ctl_fd_, SIOCSIFADDR, &ifr) == 0;
  sin->sin_addr.s_addr = htonl(0xFFFFFFF8u);  // /29
  ok = ok && ioctl(ctl_fd_, SIOCSIFNETMASK, &ifr) == 0;
  IFEC_CHECK(ok, info().name << ": cannot give " << ifname(port) << " its link address " << common::ipv4_to_string(want)
                             << "/29 for BGP: " << std::strerror(errno));
  local_addr_[port] = want;
  peer_candidates_[port] = {peer};
}

void NodeRuntime::listen_bgp() {
  {
    NetnsGuard in(opts_.netns);
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  }
  IFEC_CHECK(listen_fd_ >= 0, info().name << ": BGP socket: " << std::strerror(errno));
  const int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(routing::kBgpPort);
  IFEC_CHECK(bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && listen(listen_fd_, 64) == 0,
             info().name << ": cannot listen on TCP port " << routing::kBgpPort << " for BGP: " << std::strerror(errno)
                         << " (another BGP speaker in this namespace?)");
  loop_.watch(listen_fd_, [this] { on_accept(); });
}

void NodeRuntime::on_accept() {
  for (;;) {
    sockaddr_in from{};
    socklen_t len = sizeof from;
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) break;
    const uint32_t peer = ntohl(from.sin_addr.s_addr);
    int port = -1;  // the link whose /29 the peer is in
    for (size_t p = 0; p < ports_.size(); ++p) {
      if ((peer & ~uint32_t{7}) == (local_addr_[p] & ~uint32_t{7}) && peer != local_addr_[p]) {
        port = static_cast<int>(p);
      }
    }
    const int conn = port >= 0 ? bgp_.accepted(port, loop_.now()) : -1;
    if (conn < 0) {
      if (port < 0) note("bgp", "refused a connection from " + common::ipv4_to_string(peer) + ": no link's neighbour");
      close(fd);
      continue;
    }
    peer_addr_[port] = peer;
    bind_tcp(conn, fd, port, peer, false);
  }
  pump();
}

void NodeRuntime::bind_tcp(int conn, int fd, int port, uint32_t peer, bool connecting) {
  drop_tcp(conn);  // an abandoned connect attempt, when the peer's connection came first
  Tcp& t = tcp_[conn];
  t.fd = fd;
  t.port = port;
  t.peer = peer;
  t.connecting = connecting;
  loop_.watch(
      fd, [this, conn] { on_tcp(conn); }, connecting);
}

void NodeRuntime::drop_tcp(int conn) {
  auto it = tcp_.find(conn);
  if (it == tcp_.end()) return;
  if (it->second.fd >= 0) {
    loop_.unwatch(it->second.fd);
    close(it->second.fd);
  }
  tcp_.erase(it);
}

void NodeRuntime::on_tcp(int conn) {
  auto it = tcp_.find(conn);
  if (it == tcp_.end()) return;
  Tcp& t = it->second;
  const common::TimeNs now = loop_.now();
  if (t.connecting) {
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(t.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err == EINPROGRESS || err == EALREADY) return;
    if (err != 0) {
      drop_tcp(conn);
      bgp_.connect_failed(conn, now);
      return pump();
    }
    t.connecting = false;
    peer_addr_[t.port] = t.peer;
    loop_.watch(t.fd, [this, conn] { on_tcp(conn); });
    bgp_.connected(conn, now);
    return pump();
  }
  uint8_t buf[65536];
  for (;;) {
    const ssize_t n = read(t.fd, buf, sizeof buf);
    if (n > 0) {
      bgp_.received(conn, buf, static_cast<size_t>(n), now);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
    drop_tcp(conn);  // closed by the peer, or reset
    bgp_.closed(conn, now);
    break;
  }
  pump();
}

void NodeRuntime::connect_tcp(const routing::BgpTransportRequest& r) {
  int fd;
  {
    NetnsGuard in(opts_.netns);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  }
  sockaddr_in local{};
  local.sin_family = AF_INET;
  local.sin_addr.s_addr = htonl(local_addr_[r.port]);
  const std::vector<uint32_t>& candidates = peer_candidates_[r.port];
  const uint32_t to = candidates[next_candidate_[r.port]++ % candidates.size()];
  sockaddr_in peer{};
  peer.sin_family = AF_INET;
  peer.sin_port = htons(routing::kBgpPort);
  peer.sin_addr.s_addr = htonl(to);
  const bool started = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) == 0 &&
                       (connect(fd, reinterpret_cast<sockaddr*>(&peer), sizeof peer) == 0 || errno == EINPROGRESS);
  if (!started) {
    if (fd >= 0) close(fd);
    bgp_.connect_failed(r.conn, loop_.now());  // retried after the ConnectRetry time
    return;
  }
  bind_tcp(r.conn, fd, r.port, to, true);
}

void NodeRuntime::flush(int conn) {
  auto it = tcp_.find(conn);
  if (it == tcp_.end() || it->second.connecting) return;
  Tcp& t = it->second;
  std::vector<uint8_t> out = bgp_.take_output(conn);
  t.pending.insert(t.pending.end(), out.begin(), out.end());
  size_t done = 0;
  while (done < t.pending.size()) {
    const ssize_t n = send(t.fd, t.pending.data() + done, t.pending.size() - done, MSG_NOSIGNAL);
    if (n <= 0) break;  // full (the rest goes at the next pump) or broken (the read side sees it)
    done += static_cast<size_t>(n);
  }
  t.pending.erase(t.pending.begin(), t.pending.begin() + static_cast<long>(done));
}

void NodeRuntime::pump() {
  for (int round = 0; round < 8; ++round) {
    const bool changed = bgp_.process(loop_.now());
    for (const routing::BgpLogLine& l : bgp_.take_log()) {
      note("bgp", ifname(l.port) + ": " + l.text);
    }
    std::vector<routing::BgpTransportRequest> requests = bgp_.take_requests();
    for (const routing::BgpTransportRequest& r : requests) {
      if (r.kind == routing::BgpTransportRequest::Kind::kConnect) {
        connect_tcp(r);
        continue;
      }
      flush(r.conn);
      auto it = tcp_.find(r.conn);
      if (it != tcp_.end() && !it->second.connecting && !r.last_bytes.empty()) {
        send(it->second.fd, r.last_bytes.data(), r.last_bytes.size(), MSG_NOSIGNAL);  // the NOTIFICATION
      }
      drop_tcp(r.conn);
    }
    for (int conn : bgp_.connections()) {
      flush(conn);
    }
    const bool macs = resolve_macs();
    if (changed || macs) {
      decided();
    }
    if (requests.empty()) break;  // a failed connect made events: once more
  }
}

bool NodeRuntime::resolve_macs() {
  bool learned = false;
  for (size_t p = 0; p < ports_.size(); ++p) {
    if (!bgp_.established(static_cast<int>(p))) {
      if (peer_macs_[p] != common::MacAddress{} && peer_addr_[p] != 0) {
        // The neighbour may come back with other interfaces (a container made again): resolve it afresh.
        arpreq req{};
        auto* sin = reinterpret_cast<sockaddr_in*>(&req.arp_pa);
        sin->sin_family = AF_INET;
        sin->sin_addr.s_addr = htonl(peer_addr_[p]);
        std::strncpy(req.arp_dev, ifname(static_cast<int>(p)).c_str(), sizeof req.arp_dev - 1);
        ioctl(ctl_fd_, SIOCDARP, &req);
      }
      peer_macs_[p] = common::MacAddress{};
      continue;
    }
    if (peer_macs_[p] != common::MacAddress{}) continue;
    arpreq req{};
    auto* sin = reinterpret_cast<sockaddr_in*>(&req.arp_pa);
    sin->sin_family = AF_INET;
    sin->sin_addr.s_addr = htonl(peer_addr_[p]);
    std::strncpy(req.arp_dev, ifname(static_cast<int>(p)).c_str(), sizeof req.arp_dev - 1);
    if (ioctl(ctl_fd_, SIOCGARP, &req) == 0 && (req.arp_flags & ATF_COM) != 0) {
      std::copy(req.arp_ha.sa_data, req.arp_ha.sa_data + 6, peer_macs_[p].begin());
      learned = true;
    }
  }
  return learned;
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
      "# HELP ifec_port_bytes_total Frame bytes through a fabric interface (AF_PACKET or AF_XDP), by direction.\n"
      "# TYPE ifec_port_bytes_total counter\n";
  for (const auto& p : ports_) {
    const AfPacketCounters c = p->dev_->port_counters();
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
  out +=
      "# HELP ifec_bgp_session_established A port's eBGP session is Established (1) or not (0).\n"
      "# TYPE ifec_bgp_session_established gauge\n";
  for (const auto& p : ports_) {
    out += metric("ifec_bgp_session_established", node + ",port=\"" + std::to_string(p->port()) + "\"",
                  bgp_.established(p->port()) ? 1 : 0);
  }
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
