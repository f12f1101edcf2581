// One BGP-4 peer connection's state machine (RFC 4271 §8) with no sockets, threads or clock of its own: the caller
// feeds it the transport's events, the bytes that arrived and the time, and drains the bytes to write and the
// events to act on.
//
//   daemon                              BgpSession                             daemon
//   start/stop(now) -------------->  Idle -> Connect/Active -> OpenSent  --> take_output(): bytes for the socket
//   connected/connect_failed/closed ->      -> OpenConfirm -> Established --> take_events(): kConnect (open a TCP
//   receive(bytes, now) ----------->  frames, decodes (bgp.h), answers         connection), kDisconnect (close it
//   tick(now) at next_timer() ----->  ConnectRetry, Hold, Keepalive timers     after writing the output), state
//   send_update(update, now) ------>  UPDATEs out once Established             changes, routes, NOTIFICATIONs
//
// Timers: ConnectRetry (120 s by default), Hold (the smaller of both OPENs' hold times, 4 minutes while the peer's
// OPEN is awaited; 0 disables it and keepalives), Keepalive at a third of the negotiated hold time. An error or a
// hold-timer expiry sends the NOTIFICATION RFC 4271 prescribes and goes to Idle; with auto_restart the session
// starts again after idle_hold. No timer jitter is applied (RFC 4271 §10 leaves it optional): the caller may add
// its own to the times it passes.
//
// Connection collisions (RFC 4271 §6.8) involve two connections to one peer, so two BgpSession objects: the daemon
// keeps the one bgp_collision_winner() names and calls close_for_collision() on the other.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ifec/common/interfaces.h"
#include "ifec/routing/bgp.h"

namespace ifec::routing {

enum class BgpState : uint8_t { kIdle, kConnect, kActive, kOpenSent, kOpenConfirm, kEstablished };
const char* bgp_state_name(BgpState s);

inline constexpr common::TimeNs kSecondNs = 1'000'000'000;

struct BgpSessionConfig {
  uint32_t local_as = 0;
  uint32_t peer_as = 0;
  uint32_t bgp_id = 0;      // this speaker's identifier (host order), non-zero
  uint16_t hold_time = 90;  // seconds offered in OPEN (RFC 4271 §10 suggests 90); 0 or at least 3
  common::TimeNs connect_retry = 120 * kSecondNs;
  common::TimeNs open_hold = 240 * kSecondNs;  // HoldTimer while waiting for the peer's OPEN ("4 minutes")
  bool passive = false;                        // wait for the peer to connect (never emit kConnect)
  bool auto_restart = true;                    // AutomaticStart after an error, idle_hold later
  common::TimeNs idle_hold = 5 * kSecondNs;
  bool check_first_as = true;  // an external peer's routes must start their AS_PATH with its AS (RFC 4271 §6.3)
};

struct BgpSessionEvent {
  enum class Kind : uint8_t {
    kConnect,               // open a TCP connection to the peer
    kDisconnect,            // close the TCP connection once take_output()'s bytes are written
    kStateChanged,          // from -> to
    kRoutes,                // an UPDATE: withdrawn, and announced with attrs (classic fields and IPv4 unicast
                            // MP_REACH_NLRI / MP_UNREACH_NLRI alike) and mp_reach's with the same attributes but
                            // their own next hop; text "End-of-RIB" for that marker
    kRouteRefresh,          // the peer asks for our routes again
    kNotificationSent,      // notification
    kNotificationReceived,  // notification
    kProblem,               // a received message was handled per RFC 7606 without a reset, or ignored: text
  };
  Kind kind = Kind::kProblem;
  BgpState from = BgpState::kIdle;
  BgpState to = BgpState::kIdle;
  std::vector<BgpPrefix> withdrawn;    // kRoutes (a treat-as-withdraw puts the UPDATE's NLRI here, mp_reach's too)
  std::vector<BgpPrefix> announced;    // kRoutes: next hop attrs.next_hop
  BgpPathAttributes attrs;             // kRoutes: the announced routes' attributes
  std::optional<BgpMpReach> mp_reach;  // kRoutes: routes announced with attrs but another next hop (BgpUpdate)
  BgpNotification notification;        // kNotification*
  BgpRouteRefresh refresh;             // kRouteRefresh
  std::string text;                    // why: errors name the bad value
};

class BgpSession {
 public:
  // Throws common::Error for a configuration RFC 4271 forbids (AS 0, identifier 0, hold time 1 or 2).
  explicit BgpSession(const BgpSessionConfig& config);

  // ManualStart / ManualStop (Cease, Administrative Shutdown, when an OPEN was sent).
  void start(common::TimeNs now);
  void stop(common::TimeNs now);
  // The transport: the TCP connection is up (either direction), could not be made, or went down.
  void connected(common::TimeNs now);
  void connect_failed(common::TimeNs now);
  void closed(common::TimeNs now);
  // Bytes read from the TCP connection, in order, split anywhere.
  void receive(const uint8_t* data, size_t len, common::TimeNs now);
  // Runs the timers due by `now`; call it at next_timer().
  void tick(common::TimeNs now);
  // The earliest time tick() has work (kForever when no timer runs).
  common::TimeNs next_timer() const;

  // Once Established: queues the update (split over messages as needed; throws common::Error when it cannot be
  // encoded) and restarts the KeepaliveTimer. False, with nothing sent, in any other state or without IPv4 unicast.
  bool send_update(const BgpUpdate& update, common::TimeNs now);
  // Asks the peer to send its routes again (RFC 2918); false unless Established and the peer offered it.
  bool send_route_refresh(common::TimeNs now);
  // The connection lost a collision (RFC 4271 §6.8): Cease / Connection Collision Resolution, then Idle for good.
  void close_for_collision(common::TimeNs now);

  std::vector<uint8_t> take_output();
  std::vector<BgpSessionEvent> take_events();

  BgpState state() const { return state_; }
  const BgpSessionConfig& config() const { return config_; }
  // The peer's OPEN, once received and accepted.
  const std::optional<BgpOpen>& peer_open() const { return peer_open_; }
  // Negotiated in OpenConfirm: the hold time (s), and what both ends offered.
  uint16_t hold_time() const { return hold_time_; }
  bool four_octet_as() const { return as4_; }
  bool ipv4_unicast() const { return ipv4_unicast_; }
  bool peer_route_refresh() const { return peer_open_ && peer_open_->route_refresh; }
  uint32_t connect_retry_count() const { return connect_retry_count_; }

 private:
  void set_state(BgpState s);
  void begin(common::TimeNs now);  // ManualStart / AutomaticStart from Idle
  // Sends `n` (when the connection carries one), drops the connection and goes Idle.
  void fail(const std::optional<BgpNotification>& n, const std::string& why, common::TimeNs now);
  void send(const std::vector<uint8_t>& bytes);
  void send_notification(const BgpNotification& n);
  void event(BgpSessionEvent::Kind kind, std::string text = {});
  void handle(const uint8_t* msg, size_t len, common::TimeNs now);
  void handle_open(const BgpMessage& m, common::TimeNs now);
  void handle_update(const BgpMessage& m);
  void handle_in_established(const BgpMessage& m, common::TimeNs now);
  void restart_hold(common::TimeNs now);
  void restart_keepalive(common::TimeNs now);

  BgpSessionConfig config_;
  BgpState state_ = BgpState::kIdle;
  bool started_ = false;  // ManualStart given and no ManualStop since: AutomaticStart may follow errors
  std::vector<uint8_t> in_;
  std::vector<uint8_t> out_;
  std::vector<BgpSessionEvent> events_;
  std::optional<BgpOpen> peer_open_;
  uint16_t hold_time_ = 0;
  bool as4_ = false;
  bool ipv4_unicast_ = false;
  uint32_t connect_retry_count_ = 0;
  common::TimeNs connect_retry_at_ = common::kForever;
  common::TimeNs hold_at_ = common::kForever;
  common::TimeNs keepalive_at_ = common::kForever;
  common::TimeNs idle_hold_at_ = common::kForever;
};

// RFC 4271 §6.8 with RFC 6286 §2.3: of two connections to one peer, the one to keep. `outgoing` is the connection
// this speaker opened, `incoming` the one the peer opened. No collision (kNone) unless both have at least sent an
// OPEN (OpenSent, OpenConfirm or Established); an Established one is kept; otherwise the connection opened by the
// speaker with the higher BGP identifier (equal identifiers: the higher AS) is kept.
enum class BgpCollision : uint8_t { kNone, kKeepOutgoing, kKeepIncoming };
BgpCollision bgp_collision_winner(BgpState outgoing, BgpState incoming, uint32_t local_id, uint32_t remote_id,
                                  uint32_t local_as, uint32_t remote_as);

}  // namespace ifec::routing
