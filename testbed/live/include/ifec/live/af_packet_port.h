// A common::Port on a Linux network interface: AF_PACKET, frames received with recvmmsg() into the port's own
// buffers, each with the kernel's receive timestamp (SO_TIMESTAMPNS), and send() for transmission. (A memory-mapped
// TPACKET_V2 ring cost more here: handing each slot back was a store to a page the kernel had just written, which
// on this project's 2-core VM took tens of microseconds, a quarter of a switch daemon's time; the kernel's copy into
// a buffer the port reuses does not. TPACKET_V3's block retire timer would add latency at low load.) A classic BPF
// filter in the kernel passes only fabric traffic: RoCEv2 (UDP 4791), ECH (UDP 4793) and PFC (MAC control 0x8808); the
// kernel's own traffic (ARP, IPv6 ND, the control plane's TCP) never reaches the daemon. Frames this socket sends are
// not looped back to it.
//
// Link state is the interface's carrier (IFF_RUNNING), read with refresh_link() (the daemon polls it and reacts to
// changes). The port paces itself at the link's rate (a NIC's or switch port's serialization), so frames queue in
// their owner (the switch's egress queues with their PFC and ECN thresholds, the endpoint's QPs) rather than in
// the kernel; the bring-up's tc tbf qdisc is a second limit at the same rate. A full qdisc (ENOBUFS/EAGAIN) makes
// the port busy until the socket is writable again.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ifec/common/counters.h"
#include "ifec/common/interfaces.h"
#include "ifec/live/epoll_loop.h"

namespace ifec::live {

// clang-format off
#define IFEC_AF_PACKET_COUNTERS(X)                                                      \
  X(rx_frames, "")                                                                      \
  X(rx_bytes, "")                                                                       \
  X(tx_frames, "")                                                                      \
  X(tx_bytes, "")                                                                       \
  X(tx_refused, "send() while down or busy")                                            \
  X(tx_errors, "sendto() failed for another reason")                                    \
  X(rx_dropped, "the kernel dropped frames for want of buffer space (PACKET_STATISTICS)") \
  X(rx_truncated, "frames longer than the port's max_frame")                              \
  X(paced, "times the port held its owner back to keep to the link's rate")
// clang-format on

struct AfPacketCounters {
  IFEC_COUNTER_SET(AfPacketCounters, IFEC_AF_PACKET_COUNTERS)
};

// The link's rate, as a NIC or a switch port serializes: each frame (plus preamble, FCS and gap) takes its time at
// the rate, and the port holds its owner back while it is more than kSlackNs ahead of the wall clock, so frames
// wait in their owner's queues (where PFC, ECN and the retransmission timers see them), not in the kernel's. The
// AF_PACKET and AF_XDP ports share it, so both drivers pace alike.
class LinkPacer {
 public:
  static constexpr common::TimeNs kSlackNs = 50'000;  // a port may run this far ahead of its rate (a small burst)
  // A frame may start up to `catch_up` before now where the link was free then: the time a late loop lost. By
  // default kCatchUpNs (an idle or late loop); the port passes more where it knows the frame was due earlier
  // (TxGate::catch_up: it waited for the port, or it answers a frame that arrived earlier), up to kMaxCatchUpNs: a
  // wake-up the host made late (a loaded machine: milliseconds) does not slow the link. Beyond it the host, not
  // the link, set the pace (and a live run says so: its timers' lateness is reported).
  static constexpr common::TimeNs kCatchUpNs = 200'000;
  static constexpr common::TimeNs kMaxCatchUpNs = 20'000'000;
  static constexpr size_t kWireOverheadBytes = 24;  // preamble + SFD, FCS, inter-frame gap

  explicit LinkPacer(uint64_t rate_bps) : rate_bps_(rate_bps) {}
  // Accounts a frame of `frame_bytes` sent at `now` (0 bits/s: no limit); returns 0 when the owner may send the
  // next one at once, else the time until which the port is busy.
  common::TimeNs sent(common::TimeNs now, size_t frame_bytes, common::TimeNs catch_up = kCatchUpNs);
  // When the last bit of a frame of `frame_bytes` sent at `now` would leave (now, with no limit); accounts nothing.
  common::TimeNs last_bit(common::TimeNs now, size_t frame_bytes, common::TimeNs catch_up = kCatchUpNs) const;

 private:
  uint64_t rate_bps_;
  common::TimeNs next_free_ns_ = 0;  // when the link has serialized everything sent so far
};

// How late a loop runs the timers it arms (timer slack, a busy or descheduled CPU): a moving average over about the
// last kWindow wake-ups, each counted up to kMaxLeadNs (a stall of the whole host is not the usual wake-up). Timers
// armed that much early fire, on average, on time.
class WakeLead {
 public:
  static constexpr common::TimeNs kMaxLeadNs = 1'000'000;
  static constexpr int64_t kWindow = 8;

  // A timer armed for `armed_for` ran at `ran`.
  void woke(common::TimeNs armed_for, common::TimeNs ran);
  common::TimeNs lead() const { return static_cast<common::TimeNs>(lead_); }

 private:
  int64_t lead_ = 0;
};

// A frame reaches the far end when its last bit has left, not its first: a port of a paced link hands a frame to the
// kernel (where a veth delivers it at once) only when its serialization at the link's rate ends. Without it every
// hop of a slow link would deliver a whole frame time early and a latency-bound exchange (a ring's steps) would run
// faster live than on the wire it emulates. Frames whose serialization ends within kHoldNs go at once (fast links:
// a 4 KiB frame takes 82 ns at 400 Gb/s); the port accounts a held frame as sent. The release timer is armed early
// by the loop's usual lateness (WakeLead): else every hop of a slow link would deliver a wake-up late (on this
// project's 2-core VM 0.2-0.3 ms a hop, +10% on the cross-check's 64 KiB ring).
class WireDelay {
 public:
  static constexpr common::TimeNs kHoldNs = 20'000;
  using Put = std::function<void(std::vector<uint8_t>&&)>;  // the port's own transmission to the kernel

  WireDelay(EpollLoop& loop, Put put) : loop_(loop), put_(std::move(put)) {}
  // True when it took `frame` (to `put` at `last_bit`, after what it holds already), false when it may go now (the
  // loop's clock read `now`).
  bool hold(common::TimeNs last_bit, std::vector<uint8_t>& frame, common::TimeNs now);
  common::TimeNs lead() const { return lead_.lead(); }

 private:
  void release();
  void release_at(common::TimeNs at);

  EpollLoop& loop_;
  Put put_;
  std::deque<std::pair<common::TimeNs, std::vector<uint8_t>>> held_;
  WakeLead lead_;
  common::TimeNs armed_for_ = 0;                                // when the pending release timer is due
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // its scheduled release checks it
};

// Busy, pacing and tx-ready as both fabric ports keep them (the common::Port contract): after a frame leaves, the port
// is busy while its pacer is ahead of the wall clock, and the owner hears tx_ready, as its own event, once it may send
// again. Scheduled callbacks check a liveness token: none outlives the port.
class TxGate {
 public:
  TxGate(EpollLoop& loop, uint64_t rate_bps) : loop_(loop), pacer_(rate_bps) {}
  // A frame of `frame_bytes` left at `now` (the loop's clock, read once per frame sent: on a VM a read costs about
  // 25 ns, and a forwarded frame took eight); true when that holds the port back to keep to the link's rate.
  bool took(size_t frame_bytes, common::TimeNs now);
  // tx_ready as its own event (once, however often asked before it runs), if the port is not busy by then.
  void ready_soon();
  bool busy() const { return busy_; }
  void set_busy(bool busy) { busy_ = busy; }
  void set_ready(common::Port::TxReady ready) { ready_ = std::move(ready); }
  common::TimeNs last_bit(common::TimeNs now, size_t frame_bytes) const {
    return pacer_.last_bit(now, frame_bytes, catch_up(now));
  }
  // How much lost time a frame sent now may make up (LinkPacer): up to kMaxCatchUpNs where it was waiting for the
  // port (the owner answering tx-ready) or answers a frame that arrived earlier (the loop's arrival_ns: a reply, a
  // switch forwarding it), else kCatchUpNs.
  common::TimeNs catch_up(common::TimeNs now) const;

 private:
  EpollLoop& loop_;
  LinkPacer pacer_;
  bool busy_ = false;
  bool ready_pending_ = false;
  bool in_ready_ = false;  // the owner is answering tx-ready
  common::Port::TxReady ready_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

class AfPacketPort : public common::Port {
 public:
  // Opens `ifname` in the calling thread's network namespace, or in `netns` (a name under /var/run/netns) when
  // given; frames up to `max_frame` bytes are received (longer ones are counted as truncated). Throws
  // common::Error naming the interface and the reason (no such interface, no permission, ...).
  AfPacketPort(EpollLoop& loop, const std::string& ifname, uint64_t rate_bps, const std::string& netns = "",
               size_t max_frame = 9216);
  ~AfPacketPort() override;
  AfPacketPort(const AfPacketPort&) = delete;
  AfPacketPort& operator=(const AfPacketPort&) = delete;

  bool send(std::vector<uint8_t>&& frame) override;
  bool busy() const override { return gate_.busy(); }
  bool link_up() const override { return up_; }
  uint64_t rate_bps() const override { return rate_bps_; }
  void set_receiver(Receiver rx) override { rx_fn_ = std::move(rx); }
  void set_tx_ready(TxReady ready) override { gate_.set_ready(std::move(ready)); }

  // Re-reads the carrier; true when it changed.
  bool refresh_link();
  // During the receiver's call: when the kernel received that frame (ns, CLOCK_REALTIME).
  common::TimeNs rx_timestamp_ns() const { return rx_timestamp_ns_; }
  const std::string& name() const { return ifname_; }
  const uint8_t* mac() const { return mac_; }
  int ifindex() const { return ifindex_; }
  AfPacketCounters counters() const;

 private:
  void open_socket();
  void drain();
  void writable();
  // Counts a frame of `frame_bytes` as sent at `now` and keeps to the link's rate (busy while ahead of it).
  void took(size_t frame_bytes, common::TimeNs now);

  EpollLoop& loop_;
  std::string ifname_;
  uint64_t rate_bps_;
  size_t max_frame_;
  int fd_ = -1;
  int ifindex_ = 0;
  uint8_t mac_[6] = {};
  // What drain() receives into: kRxBatch buffers of max_frame + 1 bytes, their iovecs, headers and control space.
  static constexpr size_t kRxBatch = 16;
  struct RxBatch {
    std::vector<uint8_t> buffers;
    iovec iov[kRxBatch];
    mmsghdr msgs[kRxBatch];
    alignas(cmsghdr) char control[kRxBatch][64];
  };
  RxBatch rx_{};
  bool up_ = false;
  TxGate gate_;
  WireDelay wire_;
  std::vector<uint8_t> pending_;  // a frame the full qdisc refused, sent when it has room
  Receiver rx_fn_;
  common::TimeNs rx_timestamp_ns_ = 0;
  mutable AfPacketCounters counters_;
};

// The names of the fabric interface for topology port `port` of a node (inside the node's own namespace).
std::string fabric_ifname(int port);

}  // namespace ifec::live
