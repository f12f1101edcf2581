// AF_PACKET port: recvmmsg() with kernel timestamps, a classic BPF filter for fabric traffic, send() transmission.
#include "ifec/live/af_packet_port.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "ifec/common/checks.h"
#include "ifec/common/ech.h"
#include "ifec/live/netns.h"

#ifndef PACKET_IGNORE_OUTGOING
#define PACKET_IGNORE_OUTGOING 23
#endif

namespace ifec::live {

namespace {

// The socket's receive buffer: a burst through a software switch is thousands of frames; what it cannot hold the
// kernel drops (counted: rx_dropped). 16 MiB of buffer space holds about 2,000 frames of 4 KiB.
constexpr int kReceiveBufferBytes = 16 << 20;
constexpr common::TimeNs kBusyRetryNs = 20'000;

// ethertype PFC: accept; IPv4 UDP (not a fragment) to 4791 (RoCEv2) or 4793 (ECH): accept; else drop (ARP and
// BGP's TCP are the kernel's).
std::vector<sock_filter> fabric_filter() {
  return {
      BPF_STMT(BPF_LD | BPF_H | BPF_ABS, 12),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x8808, 10, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x0800, 0, 8),
      BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 23),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 17, 0, 6),
      BPF_STMT(BPF_LD | BPF_H | BPF_ABS, 20),
      BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, 0x1fff, 4, 0),
      BPF_STMT(BPF_LDX | BPF_B | BPF_MSH, 14),
      BPF_STMT(BPF_LD | BPF_H | BPF_IND, 16),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 4791, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, common::kEchUdpPort, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, 0),
      BPF_STMT(BPF_RET | BPF_K, 0x40000),
  };
}

// The kernel's receive timestamp of a frame (SO_TIMESTAMPNS: CLOCK_REALTIME), 0 when it gave none.
common::TimeNs timestamp_of(const msghdr& h) {
  for (cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr; c = CMSG_NXTHDR(const_cast<msghdr*>(&h), c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
      timespec ts{};
      std::memcpy(&ts, CMSG_DATA(c), sizeof ts);
      return static_cast<common::TimeNs>(ts.tv_sec) * 1'000'000'000ULL + static_cast<common::TimeNs>(ts.tv_nsec);
    }
  }
  return 0;
}

}  // namespace

std::string fabric_ifname(int port) { return "f" + std::to_string(port); }

AfPacketPort::AfPacketPort(EpollLoop& loop, const std::string& ifname, uint64_t rate_bps, const std::string& netns,
                           size_t max_frame)
    : loop_(loop),
      ifname_(ifname),
      rate_bps_(rate_bps),
      max_frame_(max_frame),
      gate_(loop, rate_bps),
      wire_(loop, [this](std::vector<uint8_t>&& f) {  // its serialization over: to the kernel
        if (::send(fd_, f.data(), f.size(), MSG_DONTWAIT) != static_cast<ssize_t>(f.size())) {
          counters_.tx_errors++;
        }
      }) {
  IFEC_CHECK(!ifname.empty() && ifname.size() < IFNAMSIZ,
             "interface name '" << ifname << "' is not 1.." << IFNAMSIZ - 1 << " characters");
  {
    NetnsGuard in(netns);
    open_socket();
  }
  refresh_link();
  loop_.watch(fd_, [this] { drain(); });
}

AfPacketPort::~AfPacketPort() {
  if (fd_ >= 0) {
    loop_.unwatch(fd_);
    close(fd_);
  }
}

void AfPacketPort::open_socket() {
  auto fail = [this](const char* what) {
    const int err = errno;
    if (fd_ >= 0) {
      close(fd_);
      fd_ = -1;
    }
    IFEC_FAIL("interface " << ifname_ << ": " << what << ": " << std::strerror(err)
                           << (err == EPERM ? " (raw sockets need CAP_NET_RAW)" : ""));
  };
  fd_ = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, htons(ETH_P_ALL));
  if (fd_ < 0) {
    fail("AF_PACKET socket");
  }
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, ifname_.c_str(), IFNAMSIZ - 1);
  if (ioctl(fd_, SIOCGIFINDEX, &ifr) != 0) {
    fail("no such interface");
  }
  ifindex_ = ifr.ifr_ifindex;
  if (ioctl(fd_, SIOCGIFHWADDR, &ifr) != 0) {
    fail("reading its MAC address");
  }
  std::memcpy(mac_, ifr.ifr_hwaddr.sa_data, 6);
  const std::vector<sock_filter> code = fabric_filter();
  sock_fprog prog{static_cast<unsigned short>(code.size()), const_cast<sock_filter*>(code.data())};
  if (setsockopt(fd_, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog) != 0) {
    fail("attaching the fabric filter");
  }
  const int one = 1;
  setsockopt(fd_, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one);  // best effort (Linux >= 4.20)
  if (setsockopt(fd_, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one) != 0) {
    fail("receive timestamps (SO_TIMESTAMPNS)");
  }
  // Past the system's rmem_max where the process may (CAP_NET_ADMIN), else as far as it allows.
  if (setsockopt(fd_, SOL_SOCKET, SO_RCVBUFFORCE, &kReceiveBufferBytes, sizeof kReceiveBufferBytes) != 0) {
    setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &kReceiveBufferBytes, sizeof kReceiveBufferBytes);
  }
  rx_.buffers.assign(kRxBatch * (max_frame_ + 1), 0);  // one byte more: a longer frame shows as truncated
  sockaddr_ll sll{};
  sll.sll_family = AF_PACKET;
  sll.sll_protocol = htons(ETH_P_ALL);
  sll.sll_ifindex = ifindex_;
  if (bind(fd_, reinterpret_cast<sockaddr*>(&sll), sizeof sll) != 0) {
    fail("bind");
  }
}

bool AfPacketPort::refresh_link() {
  const bool up = interface_usable(fd_, ifname_);
  const bool changed = up != up_;
  up_ = up;
  return changed;
}

// Up to kRxBatch frames a call into the port's own buffers (reused: the kernel copies each frame once, into memory
// the cache and TLB already hold), each with the kernel's receive timestamp, until the socket is empty.
void AfPacketPort::drain() {
  const size_t slot = max_frame_ + 1;
  for (;;) {
    for (size_t i = 0; i < kRxBatch; ++i) {
      rx_.iov[i] = {rx_.buffers.data() + i * slot, slot};
      msghdr& h = rx_.msgs[i].msg_hdr;
      h = msghdr{};
      h.msg_iov = &rx_.iov[i];
      h.msg_iovlen = 1;
      h.msg_control = rx_.control[i];
      h.msg_controllen = sizeof rx_.control[i];
    }
    const int n = recvmmsg(fd_, rx_.msgs, kRxBatch, MSG_DONTWAIT, nullptr);
    if (n <= 0) {
      return;
    }
    for (int i = 0; i < n; ++i) {
      const msghdr& h = rx_.msgs[i].msg_hdr;
      if ((h.msg_flags & MSG_TRUNC) != 0 || rx_.msgs[i].msg_len > max_frame_) {
        counters_.rx_truncated++;
        continue;
      }
      const uint8_t* data = rx_.buffers.data() + i * slot;
      std::vector<uint8_t> frame(data, data + rx_.msgs[i].msg_len);
      counters_.rx_frames++;
      counters_.rx_bytes += frame.size();
      if (up_ && rx_fn_) {
        rx_timestamp_ns_ = timestamp_of(h);
        rx_fn_(std::move(frame));
      }
    }
    if (n < static_cast<int>(kRxBatch)) {
      return;
    }
  }
}

bool AfPacketPort::send(std::vector<uint8_t>&& frame) {
  if (!up_ || gate_.busy()) {
    counters_.tx_refused++;
    return false;
  }
  const size_t bytes = frame.size();
  const common::TimeNs now = loop_.now();
  if (wire_.hold(gate_.last_bit(now, bytes), frame, now)) {
    took(bytes, now);
    return true;
  }
  const ssize_t n = ::send(fd_, frame.data(), frame.size(), MSG_DONTWAIT);
  if (n == static_cast<ssize_t>(frame.size())) {
    took(frame.size(), now);
    return true;
  }
  if (n < 0 && (errno == EAGAIN || errno == ENOBUFS)) {
    // The qdisc (tbf pacing) is full: keep this frame and try again shortly; the owner waits for tx_ready.
    pending_ = std::move(frame);
    gate_.set_busy(true);
    loop_.schedule(now + kBusyRetryNs, [this] { writable(); });
    return true;
  }
  counters_.tx_errors++;
  return false;
}

void AfPacketPort::writable() {
  const ssize_t n = ::send(fd_, pending_.data(), pending_.size(), MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == ENOBUFS)) {
    loop_.schedule(loop_.now() + kBusyRetryNs, [this] { writable(); });
    return;
  }
  const size_t bytes = pending_.size();
  pending_.clear();
  gate_.set_busy(false);
  if (n == static_cast<ssize_t>(bytes)) {
    took(bytes, loop_.now());
  } else {
    counters_.tx_errors++;
    gate_.ready_soon();
  }
}

common::TimeNs LinkPacer::sent(common::TimeNs now, size_t frame_bytes, common::TimeNs catch_up) {
  if (rate_bps_ > 0) {
    next_free_ns_ = last_bit(now, frame_bytes, catch_up);
  }
  return next_free_ns_ > now + kSlackNs ? next_free_ns_ - kSlackNs : 0;
}

bool TxGate::took(size_t frame_bytes, common::TimeNs now) {
  const common::TimeNs resume = pacer_.sent(now, frame_bytes, catch_up(now));
  if (resume == 0) {
    ready_soon();
    return false;
  }
  busy_ = true;
  std::weak_ptr<bool> alive = alive_;
  loop_.schedule(resume, [this, alive] {
    if (!alive.expired()) {
      busy_ = false;
      ready_soon();
    }
  });
  return true;
}

// The Port contract: tx_ready after every transmission (the owner sends one frame per call), as its own event.
void TxGate::ready_soon() {
  if (ready_pending_ || !ready_) {
    return;
  }
  ready_pending_ = true;
  std::weak_ptr<bool> alive = alive_;
  loop_.schedule(0, [this, alive] {
    if (alive.expired()) {
      return;
    }
    ready_pending_ = false;
    if (!busy_ && ready_) {
      in_ready_ = true;  // what the owner sends now was waiting for the port
      ready_();
      in_ready_ = false;
    }
  });
}

common::TimeNs TxGate::catch_up(common::TimeNs now) const {
  if (in_ready_) {
    return LinkPacer::kMaxCatchUpNs;
  }
  const common::TimeNs arrived = loop_.arrival_ns();
  if (arrived == 0 || arrived >= now) {
    return LinkPacer::kCatchUpNs;
  }
  return std::clamp(now - arrived, LinkPacer::kCatchUpNs, LinkPacer::kMaxCatchUpNs);
}

common::TimeNs LinkPacer::last_bit(common::TimeNs now, size_t frame_bytes, common::TimeNs catch_up) const {
  if (rate_bps_ == 0) {
    return now;
  }
  const auto cost = static_cast<common::TimeNs>((frame_bytes + kWireOverheadBytes) * 8e9 / rate_bps_);
  // A late wake-up (the loop had other work) is made up for, up to `catch_up`: the long-run rate is the link's,
  // not the link's minus the scheduler's latency.
  return std::max(next_free_ns_, now - std::min(now, catch_up)) + cost;
}

bool WireDelay::hold(common::TimeNs last_bit, std::vector<uint8_t>& frame, common::TimeNs now) {
  if (held_.empty() && last_bit <= now + kHoldNs) {
    return false;
  }
  if (held_.empty()) {
    release_at(last_bit);
  }
  held_.emplace_back(last_bit, std::move(frame));
  return true;
}

void WakeLead::woke(common::TimeNs armed_for, common::TimeNs ran) {
  const auto late = static_cast<int64_t>(std::min(ran - std::min(ran, armed_for), kMaxLeadNs));
  lead_ += (late - lead_) / kWindow;
}

void WireDelay::release() {
  const common::TimeNs now = loop_.now();
  // What its timer would have been armed for by now goes (the same test as release_at's, so it never re-arms for
  // the past).
  while (!held_.empty() && held_.front().first <= now + kHoldNs + lead_.lead()) {
    std::vector<uint8_t> f = std::move(held_.front().second);
    held_.pop_front();
    put_(std::move(f));
  }
  if (!held_.empty()) {
    release_at(held_.front().first);
  }
}

void WireDelay::release_at(common::TimeNs at) {
  armed_for_ = std::max(at - std::min(at, lead_.lead()), loop_.now());
  std::weak_ptr<bool> alive = alive_;
  loop_.schedule(armed_for_, [this, alive] {
    if (!alive.expired()) {
      lead_.woke(armed_for_, loop_.now());
      release();
    }
  });
}

void AfPacketPort::took(size_t frame_bytes, common::TimeNs now) {
  counters_.tx_frames++;
  counters_.tx_bytes += frame_bytes;
  counters_.paced += gate_.took(frame_bytes, now);
}

AfPacketCounters AfPacketPort::counters() const {
  tpacket_stats st{};
  socklen_t len = sizeof st;
  if (getsockopt(fd_, SOL_PACKET, PACKET_STATISTICS, &st, &len) == 0) {
    counters_.rx_dropped += st.tp_drops;  // the kernel resets its counts on every read
  }
  return counters_;
}

}  // namespace ifec::live
