// BGP-4 session state machine (RFC 4271 §8) driven by the caller's transport events, bytes and time.
#include "ifec/routing/bgp_session.h"

#include <algorithm>
#include <sstream>
#include <utility>

#include "ifec/common/checks.h"

namespace ifec::routing {

using common::kForever;
using common::TimeNs;
using Kind = BgpSessionEvent::Kind;

const char* bgp_state_name(BgpState s) {
  switch (s) {
    case BgpState::kIdle:
      return "Idle";
    case BgpState::kConnect:
      return "Connect";
    case BgpState::kActive:
      return "Active";
    case BgpState::kOpenSent:
      return "OpenSent";
    case BgpState::kOpenConfirm:
      return "OpenConfirm";
    case BgpState::kEstablished:
      return "Established";
  }
  return "?";
}

BgpSession::BgpSession(const BgpSessionConfig& config) : config_(config) {
  IFEC_CHECK(config.local_as != 0, "BGP local AS 0 (RFC 7607: AS 0 is never valid)");
  IFEC_CHECK(config.peer_as != 0, "BGP peer AS 0 (RFC 7607: AS 0 is never valid)");
  IFEC_CHECK(config.bgp_id != 0, "BGP identifier 0.0.0.0 (expected non-zero)");
  IFEC_CHECK(config.hold_time != 1 && config.hold_time != 2,
             "BGP hold time " << config.hold_time << " s (RFC 4271: 0 or at least 3)");
}

// ---------------------------------------------------------------------------------------------------------------
// Plumbing
// ---------------------------------------------------------------------------------------------------------------

void BgpSession::set_state(BgpState s) {
  if (s == state_) return;
  BgpSessionEvent e;
  e.kind = Kind::kStateChanged;
  e.from = state_;
  e.to = s;
  state_ = s;
  events_.push_back(std::move(e));
}

void BgpSession::event(Kind kind, std::string text) {
  BgpSessionEvent e;
  e.kind = kind;
  e.from = e.to = state_;
  e.text = std::move(text);
  events_.push_back(std::move(e));
}

void BgpSession::send(const std::vector<uint8_t>& bytes) { out_.insert(out_.end(), bytes.begin(), bytes.end()); }

void BgpSession::send_notification(const BgpNotification& n) {
  send(encode_bgp_notification(n));
  BgpSessionEvent e;
  e.kind = Kind::kNotificationSent;
  e.from = e.to = state_;
  e.notification = n;
  e.text = bgp_notification_name(n.code, n.subcode);
  events_.push_back(std::move(e));
}

std::vector<uint8_t> BgpSession::take_output() { return std::exchange(out_, {}); }
std::vector<BgpSessionEvent> BgpSession::take_events() { return std::exchange(events_, {}); }

TimeNs BgpSession::next_timer() const { return std::min({connect_retry_at_, hold_at_, keepalive_at_, idle_hold_at_}); }

void BgpSession::restart_hold(TimeNs now) { hold_at_ = hold_time_ > 0 ? now + hold_time_ * kSecondNs : kForever; }

void BgpSession::restart_keepalive(TimeNs now) {
  keepalive_at_ = hold_time_ > 0 ? now + hold_time_ * kSecondNs / 3 : kForever;
}

// ---------------------------------------------------------------------------------------------------------------
// Administrative and transport events
// ---------------------------------------------------------------------------------------------------------------

void BgpSession::start(TimeNs now) {
  if (state_ != BgpState::kIdle) return;  // RFC 4271 §8.2.2: ManualStart is ignored outside Idle
  started_ = true;
  connect_retry_count_ = 0;
  begin(now);
}

void BgpSession::begin(TimeNs now) {
  idle_hold_at_ = kForever;
  in_.clear();
  peer_open_.reset();
  hold_time_ = 0;
  as4_ = ipv4_unicast_ = false;
  if (config_.passive) {
    connect_retry_at_ = kForever;  // a passive speaker only listens
    set_state(BgpState::kActive);
    return;
  }
  connect_retry_at_ = now + config_.connect_retry;
  set_state(BgpState::kConnect);
  event(Kind::kConnect);
}

void BgpSession::stop(TimeNs now) {
  started_ = false;
  if (state_ == BgpState::kIdle) {
    idle_hold_at_ = kForever;
    return;
  }
  fail(BgpNotification{kErrCease, kCeaseAdminShutdown, {}}, "stopped", now);
  connect_retry_count_ = 0;
}

void BgpSession::connected(TimeNs now) {
  if (state_ != BgpState::kConnect && state_ != BgpState::kActive) {
    event(Kind::kProblem, std::string("TCP connection reported up in state ") + bgp_state_name(state_) + ": ignored");
    return;
  }
  connect_retry_at_ = kForever;
  send(encode_bgp_open(make_bgp_open(config_.local_as, config_.hold_time, config_.bgp_id)));
  hold_at_ = now + config_.open_hold;
  set_state(BgpState::kOpenSent);
}

// A refused or failed connect leaves the session listening (Active) until ConnectRetry connects again, as RFC
// 1771 had it and FRR does; RFC 4271 §8.2.2 would go Idle, refusing the peer's own connections during the idle
// hold, so two speakers retrying in step could keep missing each other.
void BgpSession::connect_failed(TimeNs now) {
  if (state_ != BgpState::kConnect) return closed(now);
  connect_retry_at_ = now + config_.connect_retry;
  set_state(BgpState::kActive);
  event(Kind::kDisconnect, "TCP connection failed: listening until ConnectRetry");
}

void BgpSession::closed(TimeNs now) {
  switch (state_) {
    case BgpState::kIdle:
      return;
    case BgpState::kOpenSent:  // RFC 4271 §8.2.2: back to listening, ConnectRetryTimer restarted
      hold_at_ = keepalive_at_ = kForever;
      connect_retry_at_ = config_.passive ? kForever : now + config_.connect_retry;
      in_.clear();
      set_state(BgpState::kActive);
      event(Kind::kDisconnect, "TCP connection lost in OpenSent");
      return;
    case BgpState::kConnect:
      fail(std::nullopt, "TCP connection failed", now);
      return;
    default:
      fail(std::nullopt, std::string("TCP connection lost in ") + bgp_state_name(state_), now);
      return;
  }
}

void BgpSession::close_for_collision(TimeNs now) {
  started_ = false;
  if (state_ != BgpState::kIdle) fail(BgpNotification{kErrCease, kCeaseCollision, {}}, "lost a collision", now);
}

void BgpSession::fail(const std::optional<BgpNotification>& n, const std::string& why, TimeNs now) {
  const bool open_sent =
      state_ == BgpState::kOpenSent || state_ == BgpState::kOpenConfirm || state_ == BgpState::kEstablished;
  if (n && open_sent) send_notification(*n);
  connect_retry_at_ = hold_at_ = keepalive_at_ = kForever;
  if (state_ != BgpState::kConnect) ++connect_retry_count_;  // RFC 4271 §8.2.2 counts from Active on
  in_.clear();
  std::string text = std::string("left ") + bgp_state_name(state_) + ": " + why;
  set_state(BgpState::kIdle);
  event(Kind::kDisconnect, std::move(text));
  idle_hold_at_ = started_ && config_.auto_restart ? now + config_.idle_hold : kForever;
}

void BgpSession::tick(TimeNs now) {
  if (idle_hold_at_ <= now && state_ == BgpState::kIdle) begin(now);  // AutomaticStart
  if (connect_retry_at_ <= now) {
    if (state_ == BgpState::kConnect) event(Kind::kDisconnect, "ConnectRetryTimer expired: connecting again");
    connect_retry_at_ = now + config_.connect_retry;
    set_state(BgpState::kConnect);
    event(Kind::kConnect);
  }
  if (hold_at_ <= now) {
    std::ostringstream os;
    os << "HoldTimer expired (" << (state_ == BgpState::kOpenSent ? "no OPEN" : "nothing") << " from the peer)";
    fail(BgpNotification{kErrHoldTimerExpired, 0, {}}, os.str(), now);
    return;
  }
  if (keepalive_at_ <= now) {
    send(encode_bgp_keepalive());
    restart_keepalive(now);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Received messages
// ---------------------------------------------------------------------------------------------------------------

void BgpSession::receive(const uint8_t* data, size_t len, TimeNs now) {
  if (len == 0) return;
  if (state_ != BgpState::kOpenSent && state_ != BgpState::kOpenConfirm && state_ != BgpState::kEstablished) {
    event(Kind::kProblem, std::to_string(len) + " bytes in state " + bgp_state_name(state_) + ": ignored");
    return;
  }
  in_.insert(in_.end(), data, data + len);
  size_t pos = 0;
  while (state_ != BgpState::kIdle) {
    BgpError err;
    const size_t n = bgp_frame_length(in_.data() + pos, in_.size() - pos, &err);
    if (err.action != BgpErrorAction::kNone) {
      // RFC 4271 §6.4: an error in a NOTIFICATION is not answered with one (the session just closes).
      const bool notification =
          in_.size() - pos > 18 && in_[pos + 18] == static_cast<uint8_t>(BgpMessageType::kNotification);
      return fail(notification ? std::nullopt : std::optional<BgpNotification>(err.notification),
                  (notification ? "malformed NOTIFICATION: " : "") + err.what, now);
    }
    if (n == 0) break;
    const std::vector<uint8_t> msg(in_.begin() + static_cast<long>(pos), in_.begin() + static_cast<long>(pos + n));
    pos += n;
    handle(msg.data(), msg.size(), now);
  }
  if (state_ == BgpState::kIdle) return;  // fail() cleared in_
  in_.erase(in_.begin(), in_.begin() + static_cast<long>(pos));
}

void BgpSession::handle(const uint8_t* msg, size_t len, TimeNs now) {
  BgpDecodeOptions opt;
  opt.as4 = as4_;
  opt.ebgp = config_.local_as != config_.peer_as;
  opt.peer_as = config_.check_first_as ? config_.peer_as : 0;
  const BgpMessage m = decode_bgp(msg, len, opt);
  const auto type = static_cast<BgpMessageType>(m.type);
  if (type == BgpMessageType::kNotification && !m.ok()) {  // RFC 4271 §6.4: not answered with a NOTIFICATION
    return fail(std::nullopt, "malformed NOTIFICATION: " + m.worst()->what, now);
  }
  if (type == BgpMessageType::kNotification && m.ok()) {
    BgpSessionEvent e;
    e.kind = Kind::kNotificationReceived;
    e.from = e.to = state_;
    e.notification = m.notification;
    e.text = bgp_notification_name(m.notification.code, m.notification.subcode);
    events_.push_back(e);
    return fail(std::nullopt, "peer sent " + e.text, now);
  }
  const bool expected = (state_ == BgpState::kOpenSent && type == BgpMessageType::kOpen) ||
                        (state_ == BgpState::kOpenConfirm && type == BgpMessageType::kKeepalive) ||
                        (state_ == BgpState::kEstablished && type != BgpMessageType::kOpen);
  if (!expected && m.type >= 1 && m.type <= 5) {  // RFC 6608 subcodes name the state
    const uint8_t sub = state_ == BgpState::kOpenSent      ? kFsmInOpenSent
                        : state_ == BgpState::kOpenConfirm ? kFsmInOpenConfirm
                                                           : kFsmInEstablished;
    return fail(BgpNotification{kErrFsm, sub, {}},
                std::string("unexpected ") + bgp_message_type_name(m.type) + " in " + bgp_state_name(state_), now);
  }
  if (m.action() == BgpErrorAction::kSessionReset) return fail(m.worst()->notification, m.worst()->what, now);
  if (state_ == BgpState::kOpenSent) return handle_open(m, now);
  if (state_ == BgpState::kOpenConfirm) {  // a KEEPALIVE: the peer accepted our OPEN
    restart_hold(now);
    return set_state(BgpState::kEstablished);
  }
  handle_in_established(m, now);
}

void BgpSession::handle_open(const BgpMessage& m, TimeNs now) {
  const BgpOpen& o = m.open;
  if (o.as() != config_.peer_as) {
    std::ostringstream os;
    os << "peer AS " << o.as() << (o.as4 ? "" : " (no 4-octet AS capability)") << " (expected " << config_.peer_as
       << ")";
    return fail(BgpNotification{kErrOpen, kOpenBadPeerAs, {}}, os.str(), now);
  }
  if (config_.local_as == config_.peer_as && o.bgp_id == config_.bgp_id) {  // RFC 6286 §2.2: unique within an AS
    return fail(
        BgpNotification{kErrOpen,
                        kOpenBadBgpId,
                        {uint8_t(o.bgp_id >> 24), uint8_t(o.bgp_id >> 16), uint8_t(o.bgp_id >> 8), uint8_t(o.bgp_id)}},
        "internal peer has this speaker's BGP identifier", now);
  }
  peer_open_ = o;
  hold_time_ = std::min(config_.hold_time, o.hold_time);
  as4_ = o.as4.has_value();  // this speaker always offers it
  ipv4_unicast_ = o.supports_ipv4_unicast();
  send(encode_bgp_keepalive());
  restart_hold(now);
  restart_keepalive(now);
  set_state(BgpState::kOpenConfirm);
}

void BgpSession::handle_in_established(const BgpMessage& m, TimeNs now) {
  restart_hold(now);
  switch (static_cast<BgpMessageType>(m.type)) {
    case BgpMessageType::kUpdate:
      return handle_update(m);
    case BgpMessageType::kRouteRefresh: {
      const BgpRouteRefresh& r = m.route_refresh;
      if (r.afi != kAfiIpv4 || r.safi != kSafiUnicast || !ipv4_unicast_) {  // RFC 2918 §4: ignored
        std::ostringstream os;
        os << "ROUTE-REFRESH for AFI " << r.afi << " SAFI " << int(r.safi) << ", not negotiated: ignored";
        return event(Kind::kProblem, os.str());
      }
      BgpSessionEvent e;
      e.kind = Kind::kRouteRefresh;
      e.from = e.to = state_;
      e.refresh = r;
      events_.push_back(std::move(e));
      return;
    }
    default:  // KEEPALIVE
      return;
  }
}

void BgpSession::handle_update(const BgpMessage& m) {
  for (const BgpError& e : m.errors) {
    event(Kind::kProblem, std::string(bgp_error_action_name(e.action)) + ": " + e.what + " [" +
                              bgp_notification_name(e.notification.code, e.notification.subcode) + "]");
  }
  for (const auto& [afi, safi] : m.skipped_families) {
    std::ostringstream os;
    os << "multiprotocol routes for AFI " << afi << " SAFI " << int(safi) << ", not negotiated: ignored";
    event(Kind::kProblem, os.str());
  }
  const BgpUpdate& u = m.update;
  if (!ipv4_unicast_ && (!u.nlri.empty() || !u.withdrawn.empty() || u.mp_reach)) {
    return event(Kind::kProblem, "UPDATE with IPv4 unicast routes, which the peer did not negotiate: ignored");
  }
  BgpSessionEvent e;
  e.kind = Kind::kRoutes;
  e.from = e.to = state_;
  e.withdrawn = u.withdrawn;
  if (m.action() == BgpErrorAction::kTreatAsWithdraw) {
    e.withdrawn.insert(e.withdrawn.end(), u.nlri.begin(), u.nlri.end());
    if (u.mp_reach) e.withdrawn.insert(e.withdrawn.end(), u.mp_reach->nlri.begin(), u.mp_reach->nlri.end());
    e.text = "treat-as-withdraw: " + m.worst()->what;
  } else {
    e.announced = u.nlri;
    e.attrs = u.attrs;
    e.mp_reach = u.mp_reach;
    if (m.end_of_rib) e.text = "End-of-RIB";  // the empty UPDATE or its MP_UNREACH_NLRI form (RFC 4724 §2)
  }
  events_.push_back(std::move(e));
}

// ---------------------------------------------------------------------------------------------------------------
// Sending
// ---------------------------------------------------------------------------------------------------------------

bool BgpSession::send_update(const BgpUpdate& update, TimeNs now) {
  if (state_ != BgpState::kEstablished || !ipv4_unicast_) return false;
  for (const std::vector<uint8_t>& msg : encode_bgp_updates(update, as4_)) send(msg);
  restart_keepalive(now);  // RFC 4271 §4.4: an UPDATE counts as a sign of life
  return true;
}

bool BgpSession::send_route_refresh(TimeNs now) {
  (void)now;
  if (state_ != BgpState::kEstablished || !peer_route_refresh()) return false;
  send(encode_bgp_route_refresh(BgpRouteRefresh{}));
  return true;
}

// ---------------------------------------------------------------------------------------------------------------
// Collisions
// ---------------------------------------------------------------------------------------------------------------

BgpCollision bgp_collision_winner(BgpState outgoing, BgpState incoming, uint32_t local_id, uint32_t remote_id,
                                  uint32_t local_as, uint32_t remote_as) {
  const auto opened = [](BgpState s) {
    return s == BgpState::kOpenSent || s == BgpState::kOpenConfirm || s == BgpState::kEstablished;
  };
  if (!opened(outgoing) || !opened(incoming)) return BgpCollision::kNone;
  const bool out_up = outgoing == BgpState::kEstablished;
  const bool in_up = incoming == BgpState::kEstablished;
  if (out_up != in_up) return out_up ? BgpCollision::kKeepOutgoing : BgpCollision::kKeepIncoming;
  // The connection opened by the higher identifier survives (RFC 4271 §6.8); equal ones: the higher AS
  // (RFC 6286 §2.3).
  const bool local_wins = local_id != remote_id ? local_id > remote_id : local_as > remote_as;
  return local_wins ? BgpCollision::kKeepOutgoing : BgpCollision::kKeepIncoming;
}

}  // namespace ifec::routing
