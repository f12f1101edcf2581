// FARE over BGP-4: sessions per link, routes in as FARE advertisements, decisions out as UPDATEs.
#include "ifec/routing/bgp_speaker.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ifec/common/checks.h"

namespace ifec::routing {

using common::TimeNs;
using Kind = BgpSessionEvent::Kind;

uint32_t bgp_as_of(int node) { return kBgpAsBase + static_cast<uint32_t>(node); }

int bgp_node_of_as(const Topology& topo, uint32_t as) {
  return as >= kBgpAsBase && as - kBgpAsBase < topo.nodes.size() ? static_cast<int>(as - kBgpAsBase) : -1;
}

uint32_t bgp_link_address(const Topology& topo, int link, int node) {
  IFEC_CHECK(link >= 0 && link < static_cast<int>(topo.links.size()),
             "link " << link << " outside 0.." << topo.links.size() - 1);
  const Link& l = topo.links[link];
  IFEC_CHECK(l.a == node || l.b == node, "link " << link << " does not end at node " << node);
  return kBgpLinksBase + 8 * static_cast<uint32_t>(link) + (l.a == node ? 2 : 3);
}

struct BgpSpeaker::Conn {
  Conn(int p, bool out, const BgpSessionConfig& cfg) : port(p), outgoing(out), session(cfg) {}
  int port;
  bool outgoing;  // this speaker opened the TCP connection
  bool retired = false;
  BgpSession session;
  std::map<BgpPrefix, Route> in;  // Adj-RIB-In (kept on a second connection too: it may win the collision)
};

struct BgpSpeaker::Port {
  int link = -1;
  int peer = -1;
  int bundle = -1;
  uint32_t local_addr = 0;
  uint32_t peer_addr = 0;
  BgpSessionConfig config;
  bool carrier = false;
  int primary = -1;                // connection id of the session that speaks for the link
  int secondary = -1;              // a second connection from the peer while a collision is resolved
  bool up = false;                 // primary Established
  std::map<BgpPrefix, Route> out;  // Adj-RIB-Out: what the peer has from us
};

namespace {

bool opened(BgpState s) {
  return s == BgpState::kOpenSent || s == BgpState::kOpenConfirm || s == BgpState::kEstablished;
}

bool same_route(const std::vector<BgpAsPathSegment>& a, double ga, const std::vector<BgpAsPathSegment>& b, double gb) {
  return a == b && ga == gb;
}

}  // namespace

BgpSpeaker::BgpSpeaker(const Topology& topo, int node, BgpSpeakerOptions options)
    : topo_(topo), node_(node), opt_(options), fare_(topo, node) {
  for (int d = 0; d < topo_.num_gpus(); ++d) {
    gpu_of_loopback_[topo_.nodes[topo_.gpu_node(d)].loopback] = d;
  }
  int max_port = -1;
  for (int l : topo_.links_of(node_)) {
    const Link& link = topo_.links[l];
    max_port = std::max(max_port, link.a == node_ ? link.a_port : link.b_port);
  }
  ports_.resize(max_port + 1);
  for (int l : topo_.links_of(node_)) {
    const Link& link = topo_.links[l];
    const int p = link.a == node_ ? link.a_port : link.b_port;
    auto port = std::make_unique<Port>();
    port->link = l;
    port->peer = link.a == node_ ? link.b : link.a;
    port->bundle = fare_.bundle_of_port(p);
    port->local_addr = bgp_link_address(topo_, l, node_);
    port->peer_addr = bgp_link_address(topo_, l, port->peer);
    port->config.local_as = bgp_as_of(node_);
    port->config.peer_as = bgp_as_of(port->peer);
    port->config.bgp_id = topo_.nodes[node_].loopback;
    port->config.hold_time = opt_.hold_time;
    port->config.connect_retry = opt_.connect_retry;
    port->config.idle_hold = opt_.idle_hold;
    ports_[p] = std::move(port);
  }
  for (size_t p = 0; p < ports_.size(); ++p) {
    IFEC_CHECK(ports_[p] != nullptr, topo_.nodes[node_].name << ": port " << p << " has no link in the topology");
    ports_[p]->primary = new_conn(static_cast<int>(p), true);
  }
}

BgpSpeaker::~BgpSpeaker() = default;

BgpSpeaker::Conn* BgpSpeaker::conn(int id) {
  return id >= 0 && id < static_cast<int>(conns_.size()) ? conns_[id].get() : nullptr;
}

int BgpSpeaker::new_conn(int port, bool outgoing) {
  auto c = std::make_unique<Conn>(port, outgoing, ports_[port]->config);
  for (size_t i = 0; i < conns_.size(); ++i) {
    if (!conns_[i]) {
      conns_[i] = std::move(c);
      return static_cast<int>(i);
    }
  }
  conns_.push_back(std::move(c));
  return static_cast<int>(conns_.size() - 1);
}

const BgpSession& BgpSpeaker::session(int port) const {
  IFEC_CHECK(port >= 0 && port < ports(), topo_.nodes[node_].name << ": no port " << port);
  return conns_[ports_[port]->primary]->session;
}

bool BgpSpeaker::established(int port) const { return ports_.at(port)->up; }

void BgpSpeaker::log(int port, std::string text) { log_.push_back({port, std::move(text)}); }

std::vector<BgpLogLine> BgpSpeaker::take_log() { return std::exchange(log_, {}); }

std::vector<BgpTransportRequest> BgpSpeaker::take_requests() { return std::exchange(requests_, {}); }

std::vector<uint8_t> BgpSpeaker::take_output(int id) {
  Conn* c = conn(id);
  return c ? c->session.take_output() : std::vector<uint8_t>{};
}

std::vector<int> BgpSpeaker::connections() const {
  std::vector<int> out;
  for (size_t i = 0; i < conns_.size(); ++i) {
    if (conns_[i]) out.push_back(static_cast<int>(i));
  }
  return out;
}

// ------------------------------------------------------------------------------------------- the transport --

void BgpSpeaker::set_local_address(int port, uint32_t local) {
  IFEC_CHECK(port >= 0 && port < ports(), topo_.nodes[node_].name << ": no port " << port);
  ports_[port]->local_addr = local;
}

void BgpSpeaker::start(TimeNs now) {
  for (auto& p : ports_) {
    if (p->carrier) conns_[p->primary]->session.start(now);
  }
}

void BgpSpeaker::set_port_up(int port, bool up, TimeNs now) {
  IFEC_CHECK(port >= 0 && port < ports(), topo_.nodes[node_].name << ": no port " << port);
  Port& p = *ports_[port];
  if (p.carrier == up) return;
  p.carrier = up;
  BgpSession& s = conns_[p.primary]->session;
  if (up) {
    s.start(now);
    return;
  }
  s.stop(now);  // RFC 4271 §6.7 Cease / Administrative Shutdown when an OPEN went out; the link is gone anyway
  if (Conn* sec = conn(p.secondary)) {
    sec->retired = true;
    sec->session.stop(now);
  }
}

int BgpSpeaker::accepted(int port, TimeNs now) {
  if (port < 0 || port >= ports() || !ports_[port]->carrier) return -1;
  Port& p = *ports_[port];
  Conn& prim = *conns_[p.primary];
  switch (prim.session.state()) {
    case BgpState::kConnect:
    case BgpState::kActive:  // the session takes whichever connection comes up first
      prim.outgoing = false;
      prim.session.connected(now);
      return p.primary;
    case BgpState::kOpenSent:
    case BgpState::kOpenConfirm: {  // a collision: both run until one has the peer's OPEN (resolve_collision)
      if (p.secondary >= 0) return -1;
      p.secondary = new_conn(port, false);
      BgpSession& s = conns_[p.secondary]->session;
      s.start(now);
      s.take_events();  // its kConnect: this one already has its connection
      s.connected(now);
      return p.secondary;
    }
    default:  // Idle refuses connections; an Established session keeps its own (RFC 4271 §6.8)
      return -1;
  }
}

void BgpSpeaker::connected(int id, TimeNs now) {
  if (Conn* c = conn(id)) c->session.connected(now);
}

void BgpSpeaker::connect_failed(int id, TimeNs now) {
  if (Conn* c = conn(id)) c->session.connect_failed(now);
}

void BgpSpeaker::closed(int id, TimeNs now) {
  if (Conn* c = conn(id)) c->session.closed(now);
}

void BgpSpeaker::received(int id, const uint8_t* data, size_t len, TimeNs now) {
  if (Conn* c = conn(id)) c->session.receive(data, len, now);
}

void BgpSpeaker::tick(TimeNs now) {
  for (auto& c : conns_) {
    if (c && c->session.next_timer() <= now) c->session.tick(now);
  }
}

TimeNs BgpSpeaker::next_timer() const {
  TimeNs t = common::kForever;
  for (const auto& c : conns_) {
    if (c) t = std::min(t, c->session.next_timer());
  }
  return t;
}

// --------------------------------------------------------------------------------------------- processing --

bool BgpSpeaker::process(TimeNs now) {
  for (size_t id = 0; id < conns_.size(); ++id) {
    if (conns_[id]) drain(static_cast<int>(id), now);
  }
  for (size_t p = 0; p < ports_.size(); ++p) {
    resolve_collision(static_cast<int>(p), now);
  }
  for (size_t id = 0; id < conns_.size(); ++id) {  // what the collisions' losers said last
    if (conns_[id]) drain(static_cast<int>(id), now);
  }
  if (!dirty_) return false;
  dirty_ = false;
  const bool changed = fare_.recompute();
  // Sent whether or not a decision changed: a GPU's own route carries its bundle's live bandwidth, which a
  // session coming up or going down changes by itself. export_to sends only what differs.
  for (size_t p = 0; p < ports_.size(); ++p) {
    if (ports_[p]->up) export_to(static_cast<int>(p), false, now);
  }
  return changed;
}

void BgpSpeaker::drain(int id, TimeNs now) {
  Conn& c = *conns_[id];
  Port& p = *ports_[c.port];
  const bool primary = p.primary == id;
  for (BgpSessionEvent& e : c.session.take_events()) {
    switch (e.kind) {
      case Kind::kConnect:
        if (primary && p.carrier) {
          c.outgoing = true;
          requests_.push_back({BgpTransportRequest::Kind::kConnect, id, c.port, p.local_addr, p.peer_addr, {}});
        }
        break;
      case Kind::kDisconnect:
        requests_.push_back({BgpTransportRequest::Kind::kClose, id, c.port, 0, 0, c.session.take_output()});
        break;
      case Kind::kStateChanged:
        log(c.port,
            std::string(primary ? "" : "second connection: ") + bgp_state_name(e.from) + " -> " + bgp_state_name(e.to));
        if (e.from == BgpState::kEstablished) c.in.clear();
        if (primary && e.to == BgpState::kEstablished) session_changed(c.port, true, now);
        if (primary && e.from == BgpState::kEstablished) session_changed(c.port, false, now);
        break;
      case Kind::kRoutes:
        if (!c.retired) learn(id, e);
        if (!e.text.empty()) log(c.port, e.text);
        break;
      case Kind::kRouteRefresh:
        if (primary && p.up) export_to(c.port, true, now);
        break;
      case Kind::kNotificationSent:
        log(c.port, "NOTIFICATION sent: " + e.text);
        break;
      case Kind::kNotificationReceived:
        log(c.port, "NOTIFICATION received: " + e.text);
        break;
      case Kind::kProblem:
        log(c.port, e.text);
        break;
    }
  }
  if (c.retired && c.session.state() == BgpState::kIdle) {
    if (p.secondary == id) p.secondary = -1;
    conns_[id].reset();
  }
}

void BgpSpeaker::resolve_collision(int port, TimeNs now) {
  Port& p = *ports_[port];
  Conn* sec = conn(p.secondary);
  if (sec == nullptr) return;
  Conn& prim = *conns_[p.primary];
  auto promote = [&] {
    prim.retired = true;
    if (prim.session.state() == BgpState::kConnect) {  // its connect attempt is abandoned
      requests_.push_back({BgpTransportRequest::Kind::kClose, p.primary, port, 0, 0, {}});
    }
    prim.session.close_for_collision(now);
    if (p.up) session_changed(port, false, now);
    p.primary = p.secondary;
    p.secondary = -1;
    if (sec->session.state() == BgpState::kEstablished) session_changed(port, true, now);
  };
  if (sec->session.state() == BgpState::kIdle) {
    sec->retired = true;
    return;
  }
  if (!opened(prim.session.state())) return promote();
  const auto& remote = prim.session.peer_open() ? prim.session.peer_open() : sec->session.peer_open();
  if (!remote) return;  // neither has the peer's OPEN yet
  const bool prim_out = prim.outgoing;
  if (prim_out == sec->outgoing) {  // two connections the same way: keep the first
    sec->retired = true;
    sec->session.close_for_collision(now);
    return;
  }
  const BgpCollision w = bgp_collision_winner(prim_out ? prim.session.state() : sec->session.state(),
                                              prim_out ? sec->session.state() : prim.session.state(), p.config.bgp_id,
                                              remote->bgp_id, p.config.local_as, p.config.peer_as);
  if (w == BgpCollision::kNone) return;
  const bool keep_primary = (w == BgpCollision::kKeepOutgoing) == prim_out;
  log(port, std::string("connection collision: kept the ") + (keep_primary == prim_out ? "outgoing" : "incoming") +
                " connection (RFC 4271 §6.8)");
  if (keep_primary) {
    sec->retired = true;
    sec->session.close_for_collision(now);
  } else {
    promote();
  }
}

// The port's session came up (everything we have goes out) or went down: the sub-link counts for FARE only while
// it is up, and its bundle's neighbour is read again.
void BgpSpeaker::session_changed(int port, bool up, TimeNs now) {
  Port& p = *ports_[port];
  p.up = up;
  p.out.clear();
  fare_.set_port_up(port, up);
  refeed(p.bundle);
  dirty_ = true;
  if (up) export_to(port, true, now);
}

void BgpSpeaker::learn(int id, const BgpSessionEvent& e) {
  Conn& c = *conns_[id];
  for (const BgpPrefix& w : e.withdrawn) c.in.erase(w);
  Route r;
  r.as_path = e.attrs.as_path.value_or(std::vector<BgpAsPathSegment>{});
  r.gbps = bgp_path_bandwidth_gbps(e.attrs, opt_.units).value_or(-1.0);
  r.next_hop = e.attrs.next_hop.value_or(0);
  for (const BgpPrefix& a : e.announced) c.in[a] = r;
  if (e.mp_reach) {  // the same attributes, MP_REACH_NLRI's next hop (RFC 4760 §3)
    r.next_hop = e.mp_reach->next_hop;
    for (const BgpPrefix& a : e.mp_reach->nlri) c.in[a] = r;
  }
  Port& p = *ports_[c.port];
  if (p.primary == id && p.up) {
    refeed(p.bundle);
    dirty_ = true;
  }
}

const std::map<BgpPrefix, BgpSpeaker::Route>& BgpSpeaker::routes_in(int port) const {
  return conns_[ports_[port]->primary]->in;
}

void BgpSpeaker::refeed(int bundle) {
  fare_.forget(bundle);
  const int from = bundle_source(bundle);
  if (from < 0) return;
  const auto& in = routes_in(from);
  for (int d = 0; d < topo_.num_gpus(); ++d) {
    auto it = in.find(BgpPrefix{topo_.nodes[topo_.gpu_node(d)].loopback, 32});
    feed(bundle, d, it == in.end() ? nullptr : &it->second);
  }
}

int BgpSpeaker::bundle_source(int bundle) const {
  for (int port : fare_.bundles()[bundle].ports) {
    if (ports_[port]->up) return port;
  }
  return -1;
}

void BgpSpeaker::feed(int bundle, int d, const Route* r) {
  std::vector<uint64_t> path(static_cast<size_t>(fare_path_words(topo_)), 0);
  // A path of no bandwidth (0, or a negative or NaN one, read as 0) carries nothing: unreachable, as a withdrawn
  // one, so a longer path with bandwidth is taken instead (its hop count must not stand as the shortest).
  if (r == nullptr || r->as_path.empty() || r->gbps == 0) {
    fare_.set_advert(bundle, d, 0, -1, path.data());
    return;
  }
  for (const BgpAsPathSegment& seg : r->as_path) {
    for (uint32_t as : seg.asns) {
      const int n = bgp_node_of_as(topo_, as);
      if (n >= 0) path[n / 64] |= uint64_t{1} << (n % 64);
    }
  }
  // No bandwidth carried (a peer that does not speak FARE): the bundle's own bandwidth bounds the path.
  const double gbps = r->gbps < 0 ? std::numeric_limits<double>::infinity() : r->gbps;
  fare_.set_advert(bundle, d, gbps, static_cast<int>(bgp_as_path_length(r->as_path)) - 1, path.data());
}

// ---------------------------------------------------------------------------------------------- exporting --

std::map<BgpPrefix, BgpSpeaker::Route> BgpSpeaker::wanted_out(int port) const {
  std::map<BgpPrefix, Route> out;
  const Port& p = *ports_[port];
  const uint32_t me = bgp_as_of(node_);
  const Node& self = topo_.nodes[node_];
  if (self.kind == NodeKind::kGpu) {  // a stub: its own loopback, with this session's bundle's live bandwidth
    out[BgpPrefix{self.loopback, 32}] = Route{{BgpAsPathSegment{kAsSequence, {me}}}, fare_.bundle_gbps(p.bundle)};
    return out;
  }
  for (int d = 0; d < topo_.num_gpus(); ++d) {
    const double gbps = fare_.advertised_gbps(d);
    const std::vector<NextHop>& hops = fare_.next_hops(d);
    if (!(gbps > 0) || !std::isfinite(gbps) || hops.empty()) continue;
    // The chosen path: the next hop on the lowest link, as its bundle's routes say.
    const int from = bundle_source(ports_[hops.front().port]->bundle);
    if (from < 0) continue;
    const BgpPrefix prefix{topo_.nodes[topo_.gpu_node(d)].loopback, 32};
    auto it = routes_in(from).find(prefix);
    if (it == routes_in(from).end()) continue;
    std::vector<BgpAsPathSegment> path = it->second.as_path;
    if (bgp_as_path_contains(path, p.config.peer_as)) continue;  // the peer would drop it as a loop
    if (!path.empty() && path.front().type == kAsSequence && path.front().asns.size() < 255) {
      path.front().asns.insert(path.front().asns.begin(), me);
    } else {
      path.insert(path.begin(), BgpAsPathSegment{kAsSequence, {me}});
    }
    out[prefix] = Route{std::move(path), gbps};
  }
  return out;
}

void BgpSpeaker::export_to(int port, bool full, TimeNs now) {
  Port& p = *ports_[port];
  if (full) p.out.clear();
  std::map<BgpPrefix, Route> want = wanted_out(port);
  BgpUpdate withdraw;
  for (const auto& [prefix, r] : p.out) {
    if (!want.count(prefix)) withdraw.withdrawn.push_back(prefix);
  }
  BgpSession& s = conns_[p.primary]->session;
  if (!withdraw.withdrawn.empty()) s.send_update(withdraw, now);
  // One UPDATE per distinct (AS_PATH, bandwidth): the prefixes that share them ride together.
  std::vector<BgpUpdate> updates;
  for (const auto& entry : want) {  // (not a structured binding: a lambda below reads the route)
    const Route& r = entry.second;
    auto old = p.out.find(entry.first);
    if (old != p.out.end() && same_route(old->second.as_path, old->second.gbps, r.as_path, r.gbps)) continue;
    const BgpExtCommunity bw = encode_path_bandwidth(p.config.local_as, r.gbps, opt_.units);
    auto u = std::find_if(updates.begin(), updates.end(), [&](const BgpUpdate& x) {
      return *x.attrs.as_path == r.as_path && x.attrs.ext_communities.front() == bw;
    });
    if (u == updates.end()) {
      BgpUpdate nu;
      nu.attrs.origin = BgpOrigin::kIgp;
      nu.attrs.as_path = r.as_path;
      nu.attrs.next_hop = p.local_addr;
      nu.attrs.ext_communities = {bw};
      updates.push_back(std::move(nu));
      u = updates.end() - 1;
    }
    u->nlri.push_back(entry.first);
  }
  BgpUpdate unsent;  // routes whose path is too long for one UPDATE: not announced, and withdrawn if they were
  for (const BgpUpdate& u : updates) {
    try {
      s.send_update(u, now);
    } catch (const common::Error& e) {
      for (const BgpPrefix& x : u.nlri) {
        want.erase(x);
        if (p.out.count(x)) unsent.withdrawn.push_back(x);
      }
      log(port, std::string("not announced (") + std::to_string(u.nlri.size()) + " routes): " + e.what());
    }
  }
  if (!unsent.withdrawn.empty()) s.send_update(unsent, now);
  p.out = std::move(want);
}

// -------------------------------------------------------------------------------------------------- views --

std::vector<BgpRibRow> BgpSpeaker::rib() const {
  std::vector<BgpRibRow> rows;
  for (size_t port = 0; port < ports_.size(); ++port) {
    const Port& p = *ports_[port];
    for (const auto& [prefix, r] : routes_in(static_cast<int>(port))) {
      BgpRibRow row;
      row.prefix = prefix;
      row.port = static_cast<int>(port);
      row.peer = topo_.nodes[p.peer].name;
      for (const BgpAsPathSegment& seg : r.as_path)
        row.as_path.insert(row.as_path.end(), seg.asns.begin(), seg.asns.end());
      row.next_hop = r.next_hop;
      row.gbps = r.gbps;
      auto g = gpu_of_loopback_.find(prefix.addr);
      if (prefix.len == 32 && g != gpu_of_loopback_.end()) {
        row.dest_gpu = g->second;
        for (const NextHop& h : fare_.next_hops(g->second)) {
          if (h.port == static_cast<int>(port)) {
            row.selected = true;
            row.weight = h.weight;
          }
        }
      }
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

}  // namespace ifec::routing
