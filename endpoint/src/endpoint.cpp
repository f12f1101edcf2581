// Endpoint: transaction API over per-(peer, sub-port) RC QPs, ordering epochs, QP choice by FARE weights,
// path migration, and the NIC's per-port scheduling and receive dispatch.
#include "ifec/endpoint/endpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <sstream>

#include "ifec/common/checks.h"
#include "ifec/common/frame.h"
#include "ifec/common/names.h"
#include "ifec/common/pfc.h"
#include "ifec/common/protocol.h"

namespace ifec::endpoint {

using common::TimeNs;

namespace {

constexpr size_t kTableSize = 64;
constexpr uint64_t kMaxWqeBytes = 1ULL << 30;

std::string describe(const char* what, int peer, uint16_t window, uint64_t offset, uint64_t len) {
  std::ostringstream os;
  os << what << " (peer " << peer << ", window " << window << ", offset " << offset << ", " << len << " bytes)";
  return os.str();
}

constexpr common::Name<Ordering> kOrderingNames[] = {
    {Ordering::kWeak, "weak"},
    {Ordering::kPartial, "partial"},
    {Ordering::kStrong, "strong"},
};
constexpr common::Vocabulary kOrderings("ordering mode", kOrderingNames);

}  // namespace

const char* ordering_name(Ordering o) { return kOrderings.name(o); }
Ordering parse_ordering(const std::string& name) { return kOrderings.parse(name); }

struct Endpoint::Op {
  OpHandle handle;
  uint64_t id = 0;
  int parts = 0;
  std::function<void(uint64_t epoch)> then;  // continuation once every part succeeded (put_signal's signal)
};

Endpoint::Endpoint(common::Clock& clock, EndpointConfig cfg, std::vector<EndpointPort> ports,
                   std::vector<uint32_t> peer_ips)
    : clock_(clock),
      cfg_(cfg),
      ports_(std::move(ports)),
      peer_ips_(std::move(peer_ips)),
      memory_(cfg.index),
      subscribers_(std::make_shared<SubscriberList>()),
      ech_(std::make_unique<EchAgent>(*this)),
      alive_(std::make_shared<bool>(true)) {
  const int n = num_endpoints();
  IFEC_CHECK(!ports_.empty() && ports_.size() <= common::kMaxQpsPerPeer,
             "endpoint " << cfg_.index << ": " << ports_.size() << " ports, expected 1.." << common::kMaxQpsPerPeer);
  IFEC_CHECK(cfg_.index >= 0 && cfg_.index < n, "endpoint index " << cfg_.index << " outside 0.." << n - 1);
  IFEC_CHECK(cfg_.stripe_bytes >= cfg_.mtu && cfg_.stripe_bytes % cfg_.mtu == 0,
             "stripe_bytes " << cfg_.stripe_bytes << " must be a multiple of the MTU " << cfg_.mtu);
  const size_t k = ports_.size();
  peers_.resize(n);  // each made on first use (peer()): GPUs x GPUs x sub-ports of state are too many
  remote_windows_.resize(n);
  port_state_.resize(k);
  for (size_t p = 0; p < k; ++p) {
    const int port = static_cast<int>(p);
    ports_[p].port->set_receiver([this, port](std::vector<uint8_t>&& f) { receive(port, std::move(f)); });
    ports_[p].port->set_tx_ready([this, port] { kick(port); });
  }
}

Endpoint::~Endpoint() { *alive_ = false; }

QueuePair& Endpoint::qp(int peer, int index) {
  IFEC_CHECK(peer >= 0 && peer < num_endpoints() && index >= 0 && index < qps_per_peer(),
             "QP (peer " << peer << ", index " << index << ") outside " << num_endpoints() << " peers x "
                         << qps_per_peer() << " QPs");
  PeerState& ps = peer_state(peer);
  if (!ps.qps[index]) {
    make_qp(peer, index);
  }
  return *ps.qps[index];
}

int Endpoint::qps_made() const {
  int n = 0;
  for (const auto& p : peers_) {
    n += p ? static_cast<int>(std::count_if(p->qps.begin(), p->qps.end(), [](const auto& q) { return q != nullptr; }))
           : 0;
  }
  return n;
}

Endpoint::PeerState& Endpoint::peer_state(int p) {
  std::unique_ptr<PeerState>& ps = peers_[p];
  if (!ps) {
    ps = std::make_unique<PeerState>();
    const size_t k = ports_.size();
    ps->qps.resize(k);
    ps->queued.assign(k, 0);
    ps->qp_port.resize(k);
    for (size_t q = 0; q < k; ++q) {
      ps->qp_port[q] = static_cast<int>(q);
    }
    refresh_peer(p);
  }
  return *ps;
}

std::vector<double> Endpoint::peer_weights(int p) const {
  std::vector<double> w(ports_.size(), 1.0);
  if (weight_source_) {
    weight_source_(p, &w);
    w.resize(ports_.size(), 0.0);
  }
  return w;
}

// A QP starts as it would have at the endpoint's start: its sequence numbers at zero, on the port FARE's weights
// give it now (refresh_peer moves the port of QPs not made yet, as for the others).
void Endpoint::make_qp(int peer, int q) {
  const int id = peer * qps_per_peer() + q;
  PeerState& ps = peer_state(peer);
  QpConfig qc;
  qc.local_qpn = qpn(peer, q);
  qc.remote_qpn = common::rc_qpn(static_cast<uint32_t>(cfg_.index), static_cast<uint32_t>(q));
  qc.pkey = common::pkey_of_job(cfg_.job);
  qc.mtu = cfg_.mtu;
  qc.weak = cfg_.ordering == Ordering::kWeak;
  qc.rto_ns = cfg_.rto_ns;
  qc.rto_max_ns = cfg_.rto_max_ns;
  qc.adaptive_rto = cfg_.adaptive_rto;
  qc.elided_payloads = cfg_.elided_payloads;
  qc.max_retries = cfg_.max_retries;
  qc.max_outstanding = cfg_.max_outstanding;
  qc.ack_every = cfg_.ack_every;
  qc.responder_window = cfg_.responder_window;
  qc.headers = headers_for(peer, q, ps.qp_port[q]);
  ps.qps[q] = std::make_unique<QueuePair>(clock_, qc, memory_, [this, id] { wake_qp(id); });
  ps.qps[q]->on_write([this, peer](uint32_t rkey, uint64_t va, uint64_t len) { remote_written(peer, rkey, va, len); });
  ps.qps[q]->on_reconnect([this, peer, q](uint32_t psn) {
    counters_.reconnects++;
    std::weak_ptr<bool> alive = alive_;
    ResetDone done = [this, alive, peer, q, psn](const std::string& error) {
      const auto a = alive.lock();
      if (!a || !*a) {
        return;  // the endpoint is gone
      }
      counters_.reconnects_refused += error.empty() ? 0 : 1;
      peers_[peer]->qps[q]->peer_reset(psn, error.empty());
    };
    if (cm_) {
      cm_(peer, q, psn, std::move(done));
    } else {
      done("");
    }
  });
}

common::FrameHeaders Endpoint::headers_for(int peer, int qp_index, int port) const {
  common::FrameHeaders h;
  h.eth.src = ports_[port].mac;
  h.eth.dst = ports_[port].peer_mac;
  h.ip.src = cfg_.ip;
  h.ip.dst = peer_ips_[peer];
  h.ip.dscp = cfg_.dscp;
  h.ip.ecn = 2;  // ECT(0)
  // One UDP source port per QP: per-flow ECMP keeps a QP on one path, and different QPs spread.
  h.udp.src_port = static_cast<uint16_t>(0xC000 | ((cfg_.index * 131 + peer * 31 + qp_index * 7) & 0x3FFF));
  return h;
}

void Endpoint::set_remote_window(int peer, const WindowInfo& w) {
  IFEC_CHECK(peer >= 0 && peer < num_endpoints(), "peer " << peer << " outside 0.." << num_endpoints() - 1);
  WindowInfo copy = w;
  copy.data = nullptr;
  std::vector<WindowInfo>& ws = remote_windows_[peer];
  auto it = std::find_if(ws.begin(), ws.end(), [&](const WindowInfo& x) { return x.id == w.id; });
  if (it != ws.end()) {
    *it = copy;
  } else {
    ws.push_back(copy);
  }
}

void Endpoint::set_weight_source(std::function<void(int, std::vector<double>*)> fn) {
  weight_source_ = std::move(fn);
  for (int p = 0; p < num_endpoints(); ++p) {
    if (peers_[p]) {
      refresh_peer(p);
    }
  }
}

namespace {

// Path migration: a QP whose sub-port has no route to the peer (weight 0) moves to the best live port, and back
// once its own has a route again.
int port_for(const std::vector<double>& w, size_t q) {
  if (w[q] > 0) {
    return static_cast<int>(q);
  }
  int best = -1;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] > 0 && (best < 0 || w[i] > w[best])) {
      best = static_cast<int>(i);
    }
  }
  return best < 0 ? static_cast<int>(q) : best;
}

}  // namespace

int Endpoint::qp_port(int peer, int index) const {
  IFEC_CHECK(peer >= 0 && peer < num_endpoints() && index >= 0 && index < qps_per_peer(),
             "QP (peer " << peer << ", index " << index << ") outside " << num_endpoints() << " peers x "
                         << qps_per_peer() << " QPs");
  return peers_[peer] ? peers_[peer]->qp_port[index] : port_for(peer_weights(peer), static_cast<size_t>(index));
}

void Endpoint::refresh_peer(int peer) {
  PeerState& ps = *peers_[peer];
  const size_t k = ports_.size();
  const std::vector<double> w = peer_weights(peer);
  ps.weights = w;
  ps.swrr.reset(w);
  double total = 0;
  for (double x : w) {
    total += x > 0 ? x : 0;
  }
  // Partial mode's address table: granules interleaved over live QPs in proportion to weight.
  if (cfg_.ordering == Ordering::kPartial) {
    ps.table.assign(kTableSize, 0);
  }
  if (total > 0 && cfg_.ordering == Ordering::kPartial) {
    std::vector<double> cur(k, 0.0);
    for (size_t i = 0; i < kTableSize; ++i) {
      size_t best = k;
      for (size_t q = 0; q < k; ++q) {
        if (w[q] <= 0) {
          continue;
        }
        cur[q] += w[q];
        if (best == k || cur[q] > cur[best]) {
          best = q;
        }
      }
      cur[best] -= total;
      ps.table[i] = static_cast<int>(best);
    }
  }
  int strong = -1;
  for (size_t q = 0; q < k; ++q) {
    if (w[q] > 0) {
      strong = static_cast<int>(q);
      break;
    }
  }
  ps.strong_qp = strong >= 0 ? strong : std::max(ps.strong_qp, 0);
  for (size_t q = 0; q < k; ++q) {
    const int want = port_for(w, q);
    if (ps.qp_port[q] != want) {
      ps.qp_port[q] = want;
      if (ps.qps[q]) {  // (one not made yet starts on this port)
        ps.qps[q]->set_headers(headers_for(peer, static_cast<int>(q), want));
        counters_.path_migrations++;
        wake_qp(static_cast<int>(peer * k + q));
      }
    }
  }
}

void Endpoint::routes_changed() {
  for (int peer = 0; peer < num_endpoints(); ++peer) {
    if (!peers_[peer]) {
      continue;  // made later, from the weights of then
    }
    const std::vector<double> before = peers_[peer]->weights;
    refresh_peer(peer);
    if (cfg_.ordering != Ordering::kWeak && before != peers_[peer]->weights) {
      peers_[peer]->epoch++;  // no address may change QP while transactions to it are in flight
    }
  }
  const std::vector<EndpointSubscriber*>& subs = subscribers_->slots;
  for (size_t i = 0; i < subs.size(); ++i) {
    if (subs[i] != nullptr) {
      subs[i]->on_routes_changed();
    }
  }
}

Subscription Endpoint::subscribe(EndpointSubscriber& s) {
  std::vector<EndpointSubscriber*>& slots = subscribers_->slots;
  const size_t slot = std::find(slots.begin(), slots.end(), nullptr) - slots.begin();
  if (slot == slots.size()) {
    slots.push_back(&s);
  } else {
    slots[slot] = &s;
  }
  subscribers_->live++;
  return Subscription(subscribers_, slot);
}

void Subscription::reset() {
  if (const std::shared_ptr<SubscriberList> list = list_.lock()) {
    list->slots[slot_] = nullptr;
    list->live--;
  }
  list_.reset();
}

Subscription& Subscription::operator=(Subscription&& o) noexcept {
  if (this != &o) {
    reset();
    list_ = std::move(o.list_);  // leaves `o` empty
    slot_ = o.slot_;
  }
  return *this;
}

double Endpoint::plane_weight(int peer, int plane) const {
  const std::vector<double> weights = peers_.at(peer) ? peers_[peer]->weights : peer_weights(peer);
  double w = 0;
  for (size_t i = 0; i < ports_.size() && i < weights.size(); ++i) {
    w += ports_[i].plane == plane && weights[i] > 0 ? weights[i] : 0;
  }
  return w;
}

void Endpoint::reset_responder(int peer, int qp_index, uint32_t psn) { qp(peer, qp_index).reset_responder(psn); }

std::pair<uint32_t, uint32_t> Endpoint::attach_external(int peer, int qp_index, uint32_t remote_qpn,
                                                        uint32_t first_request_psn, uint16_t pkey) {
  IFEC_CHECK(peer >= 0 && peer < num_endpoints() && peer != cfg_.index,
             "external peer " << peer << ": not another endpoint (0.." << num_endpoints() - 1 << ")");
  IFEC_CHECK(qp_index >= 0 && qp_index < num_ports(),
             "external peer " << peer << ": QP " << qp_index << " outside 0.." << num_ports() - 1);
  IFEC_CHECK(remote_qpn > 1 && remote_qpn < 0xFFFFFF,
             "external peer " << peer << ": QP number " << remote_qpn << " is reserved or out of range");
  QueuePair& q = qp(peer, qp_index);
  q.attach_external(remote_qpn, first_request_psn, pkey);
  return {q.config().local_qpn, q.next_psn()};
}

void Endpoint::remote_written(int peer, uint32_t rkey, uint64_t va, uint64_t len) {
  // Every RDMA WRITE packet that lands comes here: plain loads and a virtual call per subscriber, nothing locked.
  const SubscriberList& subs = *subscribers_;
  if (subs.live == 0) {
    return;
  }
  const int window = memory_.window_of_rkey(rkey);
  if (window < 0) {
    return;
  }
  const uint64_t offset = va - window_va(static_cast<uint16_t>(window));
  for (size_t i = 0; i < subs.slots.size(); ++i) {
    if (EndpointSubscriber* s = subs.slots[i]) {
      s->on_remote_write(peer, static_cast<uint16_t>(window), offset, len);
    }
  }
}

std::vector<std::pair<std::string, uint64_t>> Endpoint::named_counters() const {
  std::vector<std::pair<std::string, uint64_t>> out;
  const EndpointCounters k = counters();
  k.for_each([&](const char* name, uint64_t v) { out.emplace_back(name, v); });
  k.qp.for_each([&](const char* name, uint64_t v) { out.emplace_back(name, v); });
  ech_->counters().for_each([&](const char* name, uint64_t v) { out.emplace_back(std::string("ech_") + name, v); });
  return out;
}

// ------------------------------------------------------------------------------------------ op bookkeeping --

OpHandle Endpoint::new_op(uint64_t* id) {
  *id = next_op_id_++;
  outstanding_ops_.insert(*id);
  counters_.ops_posted++;
  return std::make_shared<OpState>();
}

void Endpoint::finish_op(uint64_t id, const OpHandle& h) {
  if (h->status == OpStatus::kPending) {
    h->status = OpStatus::kOk;
  }
  if (h->ok()) {
    counters_.ops_ok++;
  } else {
    counters_.ops_failed++;
  }
  outstanding_ops_.erase(id);
  if (h->on_done) {
    auto fn = std::move(h->on_done);
    h->on_done = nullptr;
    fn(*h);
  }
  const uint64_t oldest = outstanding_ops_.empty() ? next_op_id_ : outstanding_ops_.oldest();
  while (!quiet_waiters_.empty() && quiet_waiters_.front().first <= oldest) {
    OpHandle q = quiet_waiters_.front().second;
    quiet_waiters_.pop_front();
    q->status = OpStatus::kOk;
    if (q->on_done) {
      auto fn = std::move(q->on_done);
      q->on_done = nullptr;
      fn(*q);
    }
  }
}

std::shared_ptr<Endpoint::Op> Endpoint::track(uint64_t id, const OpHandle& h) {
  auto op = std::make_shared<Op>();
  op->handle = h;
  op->id = id;
  return op;
}

OpHandle Endpoint::fail_now(OpStatus status, std::string why) {
  counters_.ops_posted++;
  counters_.ops_failed++;
  auto h = std::make_shared<OpState>();
  h->status = status;
  h->error = std::move(why);
  return h;
}

const WindowInfo* Endpoint::remote_window(int peer, uint16_t window) const {
  if (peer == cfg_.index) {
    return memory_.window(window);
  }
  const std::vector<WindowInfo>& ws = remote_windows_[peer];
  auto it = std::find_if(ws.begin(), ws.end(), [&](const WindowInfo& x) { return x.id == window; });
  return it == ws.end() ? nullptr : &*it;
}

std::string Endpoint::check_remote(int peer, uint16_t window, uint64_t offset, uint64_t len, bool atomic,
                                   const WindowInfo** w) const {
  if (peer < 0 || peer >= num_endpoints()) {
    std::ostringstream os;
    os << "peer " << peer << " outside 0.." << num_endpoints() - 1;
    return os.str();
  }
  *w = remote_window(peer, window);
  if (*w == nullptr) {
    return describe("window not registered", peer, window, offset, len);
  }
  if (len > (*w)->size || offset > (*w)->size - len) {
    std::ostringstream os;
    os << describe("out of bounds", peer, window, offset, len) << ": window size " << (*w)->size;
    return os.str();
  }
  if (atomic && (offset & 7) != 0) {
    return describe("atomic not 8-byte aligned", peer, window, offset, len);
  }
  return {};
}

void Endpoint::submit(int peer, std::function<void()> issue) {
  PeerState& ps = peer_state(peer);
  const uint64_t epoch = ps.epoch;
  const bool earlier_inflight = !ps.inflight.empty() && ps.inflight.begin()->first < epoch;
  if (ps.waiting.empty() && !earlier_inflight) {
    issue();
    return;
  }
  ps.waiting.push_back(Pending{epoch, std::move(issue)});
}

void Endpoint::wr_started(int peer, uint64_t epoch) { peer_state(peer).inflight[epoch]++; }

void Endpoint::wr_done(int peer, uint64_t epoch) {
  PeerState& ps = peer_state(peer);
  auto it = ps.inflight.find(epoch);
  if (it != ps.inflight.end() && --it->second == 0) {
    ps.inflight.erase(it);
  }
  drain_waiting(peer);
}

void Endpoint::drain_waiting(int peer) {
  PeerState& ps = peer_state(peer);
  while (!ps.waiting.empty()) {
    const uint64_t e = ps.waiting.front().epoch;
    if (!ps.inflight.empty() && ps.inflight.begin()->first < e) {
      return;
    }
    std::function<void()> issue = std::move(ps.waiting.front().issue);
    ps.waiting.pop_front();
    issue();
  }
}

WqeDone Endpoint::part_done(int peer, uint64_t epoch, const std::shared_ptr<Op>& op) {
  std::weak_ptr<bool> alive = alive_;
  return [this, peer, epoch, op, alive](OpStatus status, uint64_t result) {
    if (auto a = alive.lock(); !a || !*a) {
      return;
    }
    if (status != OpStatus::kOk && op->handle->status == OpStatus::kPending) {
      op->handle->status = status;
      op->handle->error = std::string(op_status_name(status)) + " from peer " + std::to_string(peer);
    }
    op->handle->result = result;
    if (--op->parts == 0) {
      if (op->then && op->handle->status == OpStatus::kPending) {
        auto then = std::move(op->then);
        op->then = nullptr;
        then(epoch);  // posts more parts under the same epoch before this one retires
      } else {
        finish_op(op->id, op->handle);
      }
    }
    wr_done(peer, epoch);
  };
}

// ---------------------------------------------------------------------------------------------- QP choice --

int Endpoint::pick_small(int peer, uint16_t window, uint64_t offset) {
  PeerState& ps = peer_state(peer);
  switch (cfg_.ordering) {
    case Ordering::kStrong:
      return ps.strong_qp;
    case Ordering::kPartial:
      return ps.table[(window * 131u + offset / cfg_.stripe_bytes) % kTableSize];
    case Ordering::kWeak: {
      const int q = ps.swrr.next();
      return q < 0 ? ps.strong_qp : q;
    }
  }
  return 0;
}

uint64_t Endpoint::take_stripe_turns(uint64_t stores, size_t len) {
  const uint64_t first = stripe_rotor_;
  if (cfg_.ordering == Ordering::kWeak && len > cfg_.mtu) {
    stripe_rotor_ += stores;
  }
  return first;
}

void Endpoint::post_store_parts(int peer, uint64_t epoch, uint64_t va, uint32_t rkey, const Payload& data,
                                uint16_t window, uint64_t offset, const std::shared_ptr<Op>& op, uint64_t turn) {
  const uint64_t len = data.size;
  auto post = [&](int q, uint64_t from, uint64_t n) {
    for (uint64_t done = 0; done < n; done += kMaxWqeBytes) {
      const uint64_t part = std::min(kMaxWqeBytes, n - done);
      op->parts++;
      wr_started(peer, epoch);
      qp(peer, q).post_write(va + from + done, rkey, data, from + done, static_cast<uint32_t>(part),
                             part_done(peer, epoch, op));
    }
  };
  PeerState& ps = peer_state(peer);
  if (cfg_.ordering == Ordering::kStrong || len <= cfg_.mtu) {
    post(cfg_.ordering == Ordering::kStrong ? ps.strong_qp : pick_small(peer, window, offset), 0, len);
    return;
  }
  if (cfg_.ordering == Ordering::kPartial) {
    // Granule by granule, merging neighbours that map to the same QP.
    uint64_t from = 0;
    while (from < len) {
      const uint64_t g = (offset + from) / cfg_.stripe_bytes;
      const int q = ps.table[(window * 131u + g) % kTableSize];
      uint64_t to = std::min(len, (g + 1) * cfg_.stripe_bytes - offset);
      while (to < len) {
        const uint64_t g2 = (offset + to) / cfg_.stripe_bytes;
        if (ps.table[(window * 131u + g2) % kTableSize] != q) {
          break;
        }
        to = std::min(len, (g2 + 1) * cfg_.stripe_bytes - offset);
      }
      post(q, from, to - from);
      from = to;
    }
    return;
  }
  // Weak: packets split over live QPs by weight (largest remainder), one contiguous stripe each.
  const uint64_t packets = (len + cfg_.mtu - 1) / cfg_.mtu;
  std::vector<double> w = ps.weights;
  double total = 0;
  for (double& x : w) {
    x = std::max(0.0, x);
    total += x;
  }
  if (total <= 0) {
    post(ps.strong_qp, 0, len);
    return;
  }
  std::vector<uint64_t> share(w.size(), 0);
  uint64_t given = 0;
  std::vector<std::pair<double, size_t>> frac;
  // Ties in the remainders rotate per store, so stores of a few packets spread over every QP instead of always
  // landing on the first ones.
  const size_t rotate = turn == kNextTurn ? stripe_rotor_++ : turn;
  for (size_t i = 0; i < w.size(); ++i) {
    const size_t q = (i + rotate) % w.size();
    const double exact = packets * w[q] / total;
    share[q] = static_cast<uint64_t>(std::floor(exact));
    given += share[q];
    frac.push_back({exact - std::floor(exact), q});
  }
  std::stable_sort(frac.begin(), frac.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; given < packets && i < frac.size(); ++i) {
    if (w[frac[i].second] > 0) {
      share[frac[i].second]++;
      given++;
    }
  }
  // Stripes in the rotated order too: the last stripe holds the short tail packet, and a fixed order would put every
  // store's tail on the highest-numbered QPs (the last plane carried 30% fewer bytes in an MoE dispatch).
  uint64_t pkt = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const size_t q = (i + rotate) % w.size();
    if (share[q] == 0) {
      continue;
    }
    const uint64_t from = pkt * cfg_.mtu;
    const uint64_t to = std::min(len, (pkt + share[q]) * cfg_.mtu);
    post(static_cast<int>(q), from, to - from);
    pkt += share[q];
  }
}

void Endpoint::post_load_parts(int peer, uint64_t epoch, uint8_t* dst, uint64_t va, uint32_t rkey, uint64_t len,
                               uint16_t window, uint64_t offset, const std::shared_ptr<Op>& op) {
  auto post = [&](int q, uint64_t from, uint64_t n) {
    for (uint64_t done = 0; done < n; done += kMaxWqeBytes) {
      const uint64_t part = std::min(kMaxWqeBytes, n - done);
      op->parts++;
      wr_started(peer, epoch);
      qp(peer, q).post_read(va + from + done, rkey, dst + from + done, static_cast<uint32_t>(part),
                            part_done(peer, epoch, op));
    }
  };
  PeerState& ps = peer_state(peer);
  if (cfg_.ordering == Ordering::kStrong || len <= cfg_.mtu) {
    post(cfg_.ordering == Ordering::kStrong ? ps.strong_qp : pick_small(peer, window, offset), 0, len);
    return;
  }
  // Partial and weak: the same granule -> QP map as stores, so a load follows earlier stores to its address.
  uint64_t from = 0;
  while (from < len) {
    const uint64_t g = (offset + from) / cfg_.stripe_bytes;
    const int q = cfg_.ordering == Ordering::kPartial ? ps.table[(window * 131u + g) % kTableSize]
                                                      : pick_small(peer, window, offset + from);
    const uint64_t to = std::min(len, (g + 1) * cfg_.stripe_bytes - offset);
    post(q, from, to - from);
    from = to;
  }
}

// -------------------------------------------------------------------------------------------- transactions --

Payload Endpoint::payload_of(const void* src, size_t len) const {
  // The GPU's store takes its bytes at issue; with payloads elided only their length travels.
  return cfg_.elided_payloads ? Payload{nullptr, nullptr, len} : Payload::copy_of(src, len);
}

OpHandle Endpoint::store(int peer, uint16_t window, uint64_t offset, const void* src, size_t len) {
  if (len == 0 || peer == cfg_.index) {
    return store_payload(peer, window, offset, Payload::view(src, len), "store");
  }
  return store_payload(peer, window, offset, payload_of(src, len), "store");
}

OpHandle Endpoint::store_from_window(int peer, uint16_t window, uint64_t offset, uint16_t src_window,
                                     uint64_t src_offset, size_t len, uint64_t turn) {
  const WindowInfo* src = memory_.window(src_window);
  if (src == nullptr || src_offset > src->size || len > src->size - src_offset) {
    return fail_now(OpStatus::kInvalidArgument, "store from window " + std::to_string(src_window) + ": bytes [" +
                                                    std::to_string(src_offset) + ", +" + std::to_string(len) +
                                                    ") are not in a registered window of this endpoint");
  }
  return store_payload(peer, window, offset, Payload::view(src->data + src_offset, len), "store", turn);
}

OpHandle Endpoint::store_payload(int peer, uint16_t window, uint64_t offset, Payload data, const char* what,
                                 uint64_t turn) {
  const size_t len = data.size;
  const WindowInfo* w = nullptr;
  std::string err = check_remote(peer, window, offset, len, false, &w);
  if (!err.empty()) {
    return fail_now(OpStatus::kInvalidArgument, std::string(what) + ": " + err);
  }
  uint64_t id;
  OpHandle h = new_op(&id);
  if (len == 0 || peer == cfg_.index) {
    if (len > 0) {
      std::memmove(memory_.window(window)->data + offset, data.bytes, len);
    }
    finish_op(id, h);
    return h;
  }
  auto op = track(id, h);
  const uint64_t va = w->va + offset;
  const uint32_t rkey = w->rkey;
  submit(peer, [this, peer, va, rkey, data = std::move(data), window, offset, op, turn] {
    post_store_parts(peer, peer_state(peer).epoch, va, rkey, data, window, offset, op, turn);
  });
  return h;
}

OpHandle Endpoint::load(void* dst, int peer, uint16_t window, uint64_t offset, size_t len) {
  const WindowInfo* w = nullptr;
  std::string err = check_remote(peer, window, offset, len, false, &w);
  if (!err.empty()) {
    return fail_now(OpStatus::kInvalidArgument, "load: " + err);
  }
  uint64_t id;
  OpHandle h = new_op(&id);
  if (len == 0 || peer == cfg_.index) {
    if (len > 0) {
      std::memcpy(dst, memory_.window(window)->data + offset, len);
    }
    finish_op(id, h);
    return h;
  }
  auto op = track(id, h);
  const uint64_t va = w->va + offset;
  const uint32_t rkey = w->rkey;
  auto* d = static_cast<uint8_t*>(dst);
  submit(peer, [this, peer, d, va, rkey, len, window, offset, op] {
    post_load_parts(peer, peer_state(peer).epoch, d, va, rkey, len, window, offset, op);
  });
  return h;
}

OpHandle Endpoint::atomic(const char* what, int peer, uint16_t window, uint64_t offset, bool cas, uint64_t compare,
                          uint64_t swap_or_add) {
  const WindowInfo* w = nullptr;
  std::string err = check_remote(peer, window, offset, 8, true, &w);
  if (!err.empty()) {
    return fail_now(OpStatus::kInvalidArgument, std::string(what) + ": " + err);
  }
  uint64_t id;
  OpHandle h = new_op(&id);
  if (peer == cfg_.index) {
    uint64_t v;
    uint8_t* p = memory_.window(window)->data + offset;
    std::memcpy(&v, p, 8);
    h->result = v;
    if (!cas || v == compare) {
      const uint64_t updated = cas ? swap_or_add : v + swap_or_add;
      std::memcpy(p, &updated, 8);
    }
    finish_op(id, h);
    return h;
  }
  auto op = track(id, h);
  const uint64_t va = w->va + offset;
  const uint32_t rkey = w->rkey;
  submit(peer, [this, peer, va, rkey, cas, compare, swap_or_add, window, offset, op] {
    const uint64_t epoch = peer_state(peer).epoch;
    op->parts++;
    wr_started(peer, epoch);
    qp(peer, pick_small(peer, window, offset))
        .post_atomic(cas, va, rkey, swap_or_add, compare, part_done(peer, epoch, op));
  });
  return h;
}

OpHandle Endpoint::fetch_add(int peer, uint16_t window, uint64_t offset, uint64_t add) {
  return atomic("fetch_add", peer, window, offset, false, 0, add);
}

OpHandle Endpoint::compare_swap(int peer, uint16_t window, uint64_t offset, uint64_t compare, uint64_t swap) {
  return atomic("compare_swap", peer, window, offset, true, compare, swap);
}

OpHandle Endpoint::put_signal(int peer, uint16_t window, uint64_t offset, const void* src, size_t len,
                              uint16_t sig_window, uint64_t sig_offset, uint64_t signal, SignalOp sop) {
  const WindowInfo* w = nullptr;
  const WindowInfo* sw = nullptr;
  std::string err = check_remote(peer, window, offset, len, false, &w);
  if (err.empty()) {
    err = check_remote(peer, sig_window, sig_offset, 8, true, &sw);
  }
  if (!err.empty()) {
    return fail_now(OpStatus::kInvalidArgument, "put_signal: " + err);
  }
  uint64_t id;
  OpHandle h = new_op(&id);
  if (peer == cfg_.index) {
    std::memcpy(memory_.window(window)->data + offset, src, len);
    uint8_t* p = memory_.window(sig_window)->data + sig_offset;
    uint64_t v = signal;
    if (sop == SignalOp::kAdd) {
      std::memcpy(&v, p, 8);
      v += signal;
    }
    std::memcpy(p, &v, 8);
    finish_op(id, h);
    return h;
  }
  auto op = track(id, h);
  const Payload data = payload_of(src, len);
  const uint64_t va = w->va + offset;
  const uint64_t sva = sw->va + sig_offset;
  const uint32_t rkey = w->rkey;
  const uint32_t srkey = sw->rkey;
  auto post_signal = [this, peer, sva, srkey, signal, sop, sig_window, sig_offset, op](uint64_t epoch) {
    op->parts++;
    wr_started(peer, epoch);
    QueuePair& q = qp(peer, cfg_.ordering == Ordering::kStrong ? peer_state(peer).strong_qp
                                                               : pick_small(peer, sig_window, sig_offset));
    if (sop == SignalOp::kAdd) {
      q.post_atomic(false, sva, srkey, signal, 0, part_done(peer, epoch, op));
    } else {
      auto bytes = std::make_shared<const std::vector<uint8_t>>(8);
      std::memcpy(const_cast<uint8_t*>(bytes->data()), &signal, 8);
      q.post_write(sva, srkey, bytes, 0, 8, part_done(peer, epoch, op));
    }
  };
  submit(peer, [this, peer, va, rkey, data, window, offset, op, post_signal] {
    const uint64_t epoch = peer_state(peer).epoch;
    if (cfg_.ordering == Ordering::kStrong) {
      // One in-order stream: the signal cannot overtake the data.
      post_store_parts(peer, epoch, va, rkey, data, window, offset, op);
      post_signal(epoch);
    } else {
      op->then = post_signal;  // after every part of the data is acknowledged
      post_store_parts(peer, epoch, va, rkey, data, window, offset, op);
    }
  });
  return h;
}

void Endpoint::fence(int peer) {
  // -1 is every peer; any other negative was taken for it.
  IFEC_CHECK(peer >= -1 && peer < num_endpoints(),
             "fence: peer " << peer << " outside 0.." << num_endpoints() - 1 << " (-1: every peer)");
  if (cfg_.ordering == Ordering::kStrong) {
    return;  // one in-order stream per peer is already fenced
  }
  if (peer >= 0) {
    peer_state(peer).epoch++;
    return;
  }
  for (auto& ps : peers_) {
    if (ps) {
      ps->epoch++;  // (a peer not talked to yet has nothing in flight to fence)
    }
  }
}

OpHandle Endpoint::quiet() {
  auto h = std::make_shared<OpState>();
  const uint64_t snapshot = next_op_id_;
  if (outstanding_ops_.empty() || outstanding_ops_.oldest() >= snapshot) {
    h->status = OpStatus::kOk;
    return h;
  }
  quiet_waiters_.push_back({snapshot, h});
  return h;
}

OpHandle Endpoint::raw_op(const char* what, int peer, int q, std::function<void(QueuePair&, WqeDone)> post) {
  if (peer < 0 || peer >= num_endpoints() || peer == cfg_.index || q < 0 || q >= qps_per_peer()) {
    return fail_now(OpStatus::kInvalidArgument, std::string(what) + ": peer " + std::to_string(peer) + " / QP " +
                                                    std::to_string(q) + " is not a remote QP");
  }
  uint64_t id;
  OpHandle h = new_op(&id);
  auto op = track(id, h);
  submit(peer, [this, peer, q, post = std::move(post), op] {
    const uint64_t epoch = peer_state(peer).epoch;
    op->parts++;
    wr_started(peer, epoch);
    post(qp(peer, q), part_done(peer, epoch, op));
  });
  return h;
}

OpHandle Endpoint::store_raw(int peer, int q, uint64_t va, uint32_t rkey, const void* src, size_t len) {
  auto data = std::make_shared<const std::vector<uint8_t>>(static_cast<const uint8_t*>(src),
                                                           static_cast<const uint8_t*>(src) + len);
  return raw_op("store_raw", peer, q, [va, rkey, data](QueuePair& qp, WqeDone done) {
    qp.post_write(va, rkey, data, 0, static_cast<uint32_t>(data->size()), std::move(done));
  });
}

OpHandle Endpoint::load_raw(void* dst, int peer, int q, uint64_t va, uint32_t rkey, size_t len) {
  auto* d = static_cast<uint8_t*>(dst);
  return raw_op("load_raw", peer, q, [va, rkey, d, len](QueuePair& qp, WqeDone done) {
    qp.post_read(va, rkey, d, static_cast<uint32_t>(len), std::move(done));
  });
}

OpHandle Endpoint::fetch_add_raw(int peer, int q, uint64_t va, uint32_t rkey, uint64_t add) {
  return raw_op("fetch_add_raw", peer, q, [va, rkey, add](QueuePair& qp, WqeDone done) {
    qp.post_atomic(false, va, rkey, add, 0, std::move(done));
  });
}

bool Endpoint::idle() const {
  if (!outstanding_ops_.empty()) {
    return false;
  }
  for (const auto& p : peers_) {
    for (size_t q = 0; p && q < p->qps.size(); ++q) {
      if (p->qps[q] && !p->qps[q]->idle()) {
        return false;
      }
    }
  }
  return true;
}

EndpointCounters Endpoint::counters() const {
  EndpointCounters c = counters_;
  for (const auto& p : peers_) {
    for (size_t q = 0; p && q < p->qps.size(); ++q) {
      if (p->qps[q]) {
        c.qp += p->qps[q]->counters();
      }
    }
  }
  return c;
}

Endpoint::Resent Endpoint::resent() const {
  const EndpointCounters c = counters();
  const EchCounters& e = ech_->counters();
  return {c.qp.retransmits + e.retransmissions,
          c.qp.retransmit_bytes + c.qp.duplicate_answer_bytes + e.retransmit_bytes + e.duplicate_ack_bytes};
}

// ------------------------------------------------------------------------------------------------- the NIC --

bool Endpoint::send_frame(int port, std::vector<uint8_t>&& frame) {
  if (port < 0 || port >= num_ports()) {
    return false;
  }
  port_state_[port].raw.push_back(std::move(frame));
  kick(port);
  return true;
}

void Endpoint::wake_qp(int id) {
  PeerState& peer = *peers_[id / qps_per_peer()];
  const int q = id % qps_per_peer();
  const int port = peer.qp_port[q];
  if ((peer.queued[q] & (uint64_t{1} << port)) == 0) {
    peer.queued[q] |= uint64_t{1} << port;
    port_state_[port].active.push_back(id);
  }
  kick(port);
}

void Endpoint::kick(int port) {
  PortState& ps = port_state_[port];
  common::Port* p = ports_[port].port;
  if (p->busy() || !p->link_up()) {
    return;  // tx-ready or the link coming back calls us again
  }
  const TimeNs now = clock_.now();
  if (ps.paused_until > now) {
    if (!ps.wakeup_pending) {
      ps.wakeup_pending = true;
      std::weak_ptr<bool> alive = alive_;
      clock_.schedule(ps.paused_until, [this, port, alive] {
        if (auto a = alive.lock(); a && *a) {
          port_state_[port].wakeup_pending = false;
          kick(port);
        }
      });
    }
    return;
  }
  // The ECH agent's frames and the QPs' take turns while both wait: a GPU whose port is slow (a gray failure) and
  // full of ECH resends still acknowledges RC requests (its ACKs behind every queued contribution ran its peers'
  // retries out).
  if (!ps.raw.empty() && (!ps.qp_turn || ps.active.empty())) {
    send_raw(ps, p);
    return;
  }
  while (!ps.active.empty()) {
    const int id = ps.active.front();
    ps.active.pop_front();
    PeerState& peer = *peers_[id / qps_per_peer()];
    const int q = id % qps_per_peer();
    peer.queued[q] &= ~(uint64_t{1} << port);
    if (peer.qp_port[q] != port) {
      wake_qp(id);  // migrated: it belongs to another port's list now
      continue;
    }
    QueuePair& qp = *peer.qps[q];  // (only a QP that exists is ever woken)
    std::vector<uint8_t> f = qp.next_frame();
    if (qp.has_frame()) {
      peer.queued[q] |= uint64_t{1} << port;
      ps.active.push_back(id);
    }
    if (f.empty()) {
      continue;
    }
    counters_.tx_frames++;
    p->send(std::move(f));
    ps.qp_turn = false;
    return;
  }
  if (!ps.raw.empty()) {  // no QP had a frame after all
    send_raw(ps, p);
  }
}

void Endpoint::send_raw(PortState& ps, common::Port* p) {
  std::vector<uint8_t> f = std::move(ps.raw.front());
  ps.raw.pop_front();
  counters_.tx_frames++;
  ech_frames_sent_++;
  ps.qp_turn = true;
  p->send(std::move(f));
}

void Endpoint::receive(int port, std::vector<uint8_t>&& frame) {
  counters_.rx_frames++;
  if (common::is_mac_control(frame.data(), frame.size())) {
    common::PfcFrame pfc;
    if (!common::PfcFrame::decode(frame.data(), frame.size(), &pfc).ok()) {
      counters_.rx_malformed++;
      return;
    }
    const int prio = cfg_.lossless_priority;
    if (pfc.class_enable & (1u << prio)) {
      const uint16_t q = pfc.quanta[prio];
      port_state_[port].paused_until =
          q == 0 ? 0 : clock_.now() + common::pfc_quanta_ns(q, ports_[port].port->rate_bps());
      counters_.pfc_pauses += q != 0;
      kick(port);
    }
    return;
  }
  common::ParsedFrame pf;
  common::ParseOptions opts;
  opts.path_mtu = cfg_.mtu;
  opts.allow_elided = cfg_.elided_payloads;
  if (!common::parse_frame(frame.data(), frame.size(), &pf, opts).ok()) {
    counters_.rx_malformed++;
    return;
  }
  if (pf.h.ip.dst != cfg_.ip) {
    counters_.rx_misaddressed++;
    return;
  }
  if (pf.h.ech) {
    // ECH frames are addressed to the endpoint, not to a QP: the ECH agent owns their protocol.
    ech_->receive(port, pf, frame.data());
    return;
  }
  const std::optional<common::RcQp> rc = common::decode_rc_qpn(pf.h.bth.dest_qp);
  if (!rc || rc->peer >= static_cast<uint32_t>(num_endpoints()) || rc->index >= ports_.size()) {
    counters_.rx_unknown_qp++;
    return;
  }
  const int peer = static_cast<int>(rc->peer);
  const int q = static_cast<int>(rc->index);
  if (peer == cfg_.index || pf.h.ip.src != peer_ips_[peer]) {
    counters_.rx_wrong_source++;
    return;
  }
  const uint8_t opcode = pf.h.bth.opcode;
  if (opcode <= static_cast<uint8_t>(common::Opcode::kSendOnlyImm) ||
      opcode == static_cast<uint8_t>(common::Opcode::kCnp)) {
    counters_.rx_unsupported++;
    if (opcode != static_cast<uint8_t>(common::Opcode::kCnp)) {
      qp(peer, q).reject_unsupported(pf.h.bth.psn);  // a real peer's SEND: NAK Invalid Request, not silence
    }
    return;
  }
  qp(peer, q).receive(pf, frame.data());
}

}  // namespace ifec::endpoint
