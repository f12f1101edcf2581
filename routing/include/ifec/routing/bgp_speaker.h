// A node's FARE speaker over BGP-4: one eBGP session per fabric link (each Y-cable sub-link its own), the routes
// it learns turned into the neighbours' advertisements fare_decide() reads, and its own decisions sent back out as
// UPDATEs. No sockets, threads or clock: the daemon owns the TCP connections and the time, as with BgpSession.
//
//   daemon (TCP, time)                      BgpSpeaker                                   daemon
//   accepted(port) / connected(conn) ---->  one BgpSession per connection          ---> take_requests(): kConnect
//   received(conn, bytes) / closed(conn)    (a second one while a collision is          (open TCP from this link's
//   tick(now) at next_timer()               resolved, RFC 4271 §6.8)                     address to the peer's :179),
//   set_port_up(port, carrier)              Adj-RIB-In per session                       kClose (write, then close)
//                                  process(now) -> FareSpeaker (fare_decide) ----------> take_output(conn): bytes
//                                                 -> Adj-RIB-Out per session: UPDATEs     changed(): routes to install
//
// Numbering and addresses (see routing/README.md): node n is AS 4200000000 + n (RFC 7938 with RFC 6996's private
// 4-octet range), its loopback is its BGP identifier; link L's /29 is 10.64.0.0 + 8 L, its a-end .2 and its b-end
// .3 (the containers' plan, the namespaces use it too). GPU d's route is its loopback /32.
//
// What a route carries: AS_PATH = this node's AS, then the AS_PATH of the route it chose (the ECMP next hop on the
// lowest link); its path bandwidth in the link-bandwidth extended community (bgp.h, BgpBandwidthUnits). A GPU is
// a stub: it originates its loopback on each session with the live bandwidth of that session's bundle (the
// draft's "aggregate bandwidth of all parallel links toward the advertising node") and re-advertises nothing. A
// switch advertises every GPU it reaches with fare_decide's path bandwidth (minimum along the path, summed over
// the ECMP next hops). A received route becomes the neighbour's FareAdvert: its bandwidth, hops = AS_PATH length
// - 1, path set = the topology nodes on its AS_PATH. A bundle's neighbour is read from its lowest Established
// sub-link's session; a sub-link counts as up for fare_decide only while its carrier is up and its session is
// Established.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ifec/routing/bgp_session.h"
#include "ifec/routing/fare_speaker.h"

namespace ifec::routing {

inline constexpr uint32_t kBgpAsBase = 4200000000u;     // RFC 6996's private 4-octet range
inline constexpr uint32_t kBgpLinksBase = 0x0A400000u;  // 10.64.0.0: link L's /29 at + 8 L
inline constexpr uint16_t kBgpPort = 179;

uint32_t bgp_as_of(int node);
// The topology node whose AS `as` is, -1 when it is none of them.
int bgp_node_of_as(const Topology& topo, uint32_t as);
// `node`'s address on link `link` (host order): the /29's .2 for the a-end, .3 for the b-end.
uint32_t bgp_link_address(const Topology& topo, int link, int node);

struct BgpSpeakerOptions {
  uint16_t hold_time = 3;  // s: data-centre timers (keepalive 1 s); carrier loss ends a session at once anyway
  common::TimeNs connect_retry = kSecondNs;
  common::TimeNs idle_hold = kSecondNs;
  // 1 Gb/s written as 125,000 "bytes/s" by default: FRR 8.4 holds the value in a uint32 (bgp.h), and only ratios
  // set weights. Every speaker of a fabric must use the same units.
  BgpBandwidthUnits units = {125000.0, true, kExtSubtypeLinkBandwidth};
};

// One route of the RIB as `ctl routes` shows it.
struct BgpRibRow {
  BgpPrefix prefix;
  int port = -1;     // the session's link port
  std::string peer;  // the neighbour's node name
  std::vector<uint32_t> as_path;
  uint32_t next_hop = 0;  // as received (host order): NEXT_HOP, or MP_REACH_NLRI's for its routes (RFC 4760 §3)
  double gbps = -1;       // path bandwidth carried (-1: none)
  bool selected = false;  // one of fare_decide's next hops
  double weight = 0;      // that next hop's weight (Gb/s)
  int dest_gpu = -1;      // the GPU whose loopback the prefix is, -1 for another prefix
};

struct BgpTransportRequest {
  enum class Kind : uint8_t { kConnect, kClose } kind = Kind::kConnect;
  int conn = -1;
  int port = -1;
  uint32_t local_addr = 0;          // kConnect: bind to this node's address on the link...
  uint32_t peer_addr = 0;           // ...and connect to the neighbour's, port 179
  std::vector<uint8_t> last_bytes;  // kClose: write these first (a NOTIFICATION), then close
};

// A line for the daemon's log: a state change, a NOTIFICATION, an RFC 7606 problem.
struct BgpLogLine {
  int port = -1;
  std::string text;
};

class BgpSpeaker {
 public:
  BgpSpeaker(const Topology& topo, int node, BgpSpeakerOptions options = {});
  ~BgpSpeaker();
  BgpSpeaker(const BgpSpeaker&) = delete;
  BgpSpeaker& operator=(const BgpSpeaker&) = delete;

  // The link's addresses when they are not the plan's (containers: Docker assigns them within the link's /29):
  // `local` is the NEXT_HOP of the routes sent on `port`.
  void set_local_address(int port, uint32_t local);
  // Starts a session on every port whose carrier is up.
  void start(common::TimeNs now);
  // Carrier on `port`: down ends its session at once (Cease), up starts it.
  void set_port_up(int port, bool up, common::TimeNs now);

  // The transport. accepted(): a TCP connection from the neighbour's address on `port`'s link; returns the
  // connection id to read and write it under, or -1 to close it (no session wants it: RFC 4271 §6.8 for an
  // Established one, or Idle).
  int accepted(int port, common::TimeNs now);
  void connected(int conn, common::TimeNs now);  // a kConnect's connection is up
  void connect_failed(int conn, common::TimeNs now);
  void closed(int conn, common::TimeNs now);  // the connection went down (the peer closed, reset, ...)
  void received(int conn, const uint8_t* data, size_t len, common::TimeNs now);
  void tick(common::TimeNs now);
  common::TimeNs next_timer() const;

  // Acts on what the sessions did: routes in, sessions up and down, collisions; FARE decided again and the
  // changes sent out. True when a WECMP group or an advertisement changed (install routes). Call after any of the
  // above.
  bool process(common::TimeNs now);
  std::vector<BgpTransportRequest> take_requests();
  std::vector<uint8_t> take_output(int conn);
  std::vector<int> connections() const;  // every connection id that may have output
  std::vector<BgpLogLine> take_log();

  const FareSpeaker& fare() const { return fare_; }
  const std::vector<NextHop>& next_hops(int dest_gpu) const { return fare_.next_hops(dest_gpu); }
  std::vector<double> plane_gbps(int dest_gpu) const { return fare_.plane_gbps(dest_gpu); }
  double advertised_gbps(int dest_gpu) const { return fare_.advertised_gbps(dest_gpu); }
  // The session of `port` (its current connection's).
  const BgpSession& session(int port) const;
  bool established(int port) const;
  int ports() const { return static_cast<int>(ports_.size()); }
  // Every route received (Adj-RIB-In), with the ones FARE selected and their weights; then this node's own.
  std::vector<BgpRibRow> rib() const;
  int node() const { return node_; }
  uint32_t as() const { return bgp_as_of(node_); }

 private:
  struct Route {
    std::vector<BgpAsPathSegment> as_path;
    double gbps = -1;
    uint32_t next_hop = 0;  // a received route's, for rib(); FARE forwards by the session's port
  };
  struct Conn;
  struct Port;
  Conn* conn(int id);
  int new_conn(int port, bool outgoing);
  void drain(int id, common::TimeNs now);
  void session_changed(int port, bool up, common::TimeNs now);
  void resolve_collision(int port, common::TimeNs now);
  void learn(int conn, const BgpSessionEvent& e);
  const std::map<BgpPrefix, Route>& routes_in(int port) const;  // the port's current session's Adj-RIB-In
  int bundle_source(int bundle) const;  // the bundle's lowest Established sub-link's port, -1 if none
  void refeed(int bundle);              // the bundle's neighbour from its lowest Established session's routes
  void feed(int bundle, int dest_gpu, const Route* r);
  void export_to(int port, bool full, common::TimeNs now);
  std::map<BgpPrefix, Route> wanted_out(int port) const;
  void log(int port, std::string text);

  const Topology& topo_;
  int node_;
  BgpSpeakerOptions opt_;
  FareSpeaker fare_;
  std::vector<std::unique_ptr<Conn>> conns_;  // by connection id (null: free)
  std::vector<std::unique_ptr<Port>> ports_;  // by topology port
  std::map<uint32_t, int> gpu_of_loopback_;
  std::vector<BgpTransportRequest> requests_;
  std::vector<BgpLogLine> log_;
  bool dirty_ = true;  // recompute due
};

}  // namespace ifec::routing
