// AF_PACKET port: TPACKET_V2 receive ring, a classic BPF filter for fabric traffic, sendto() transmission.
#include "ifec/live/af_packet_port.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
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

// The receive ring: 8 MiB of slots, each a power of two holding the largest frame and the TPACKET_V2 header
// (8 KiB for RoCE's 4096-byte MTU: 1024 frames; 16 KiB for jumbo frames: 512). A full ring drops in the kernel
// (counted: rx_dropped), and a burst through a software switch is thousands of frames.
constexpr uint32_t kBlockSize = 1 << 20;
constexpr uint32_t kBlocks = 8;
uint32_t slot_for(size_t max_frame) { return max_frame + 128 <= 8192 ? 8192 : 16384; }
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
  if (ring_ != nullptr) {
    munmap(ring_, ring_bytes_);
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
  const int v2 = TPACKET_V2;
  if (setsockopt(fd_, SOL_PACKET, PACKET_VERSION, &v2, sizeof v2) != 0) {
    fail("TPACKET_V2");
  }
  const uint32_t slot = slot_for(max_frame_);
  tpacket_req req{kBlockSize, kBlocks, slot, kBlocks * (kBlockSize / slot)};
  if (setsockopt(fd_, SOL_PACKET, PACKET_RX_RING, &req, sizeof req) != 0) {
    fail("receive ring");
  }
  ring_bytes_ = static_cast<size_t>(kBlockSize) * kBlocks;
  void* m = mmap(nullptr, ring_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (m == MAP_FAILED) {
    fail("mapping the receive ring");
  }
  ring_ = static_cast<uint8_t*>(m);
  frame_size_ = slot;
  frames_ = req.tp_frame_nr;
  sockaddr_ll sll{};
  sll.sll_family = AF_PACKET;
  sll.sll_protocol = htons(ETH_P_ALL);
  sll.sll_ifindex = ifindex_;
  if (bind(fd_, reinterpret_cast<sockaddr*>(&sll), sizeof sll) != 0) {
    fail("bind");
  }
}

bool AfPacketPort::refresh_link() {
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, ifname_.c_str(), IFNAMSIZ - 1);
  const bool up = ioctl(fd_, SIOCGIFFLAGS, &ifr) == 0 && (ifr.ifr_flags & IFF_UP) && (ifr.ifr_flags & IFF_RUNNING);
  const bool changed = up != up_;
  up_ = up;
  return changed;
}

void AfPacketPort::drain() {
  for (;;) {
    auto* hdr = reinterpret_cast<tpacket2_hdr*>(ring_ + static_cast<size_t>(next_) * frame_size_);
    if (!(__atomic_load_n(&hdr->tp_status, __ATOMIC_ACQUIRE) & TP_STATUS_USER)) {
      return;
    }
    if (hdr->tp_len > hdr->tp_snaplen) {
      counters_.rx_truncated++;
    } else {
      const uint8_t* data = reinterpret_cast<const uint8_t*>(hdr) + hdr->tp_mac;
      std::vector<uint8_t> frame(data, data + hdr->tp_snaplen);
      counters_.rx_frames++;
      counters_.rx_bytes += frame.size();
      __atomic_store_n(&hdr->tp_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
      next_ = (next_ + 1) % frames_;
      if (up_ && rx_) {
        rx_timestamp_ns_ = static_cast<common::TimeNs>(hdr->tp_sec) * 1'000'000'000ULL + hdr->tp_nsec;
        rx_(std::move(frame));
      }
      continue;
    }
    __atomic_store_n(&hdr->tp_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
    next_ = (next_ + 1) % frames_;
  }
}

bool AfPacketPort::send(std::vector<uint8_t>&& frame) {
  if (!up_ || gate_.busy()) {
    counters_.tx_refused++;
    return false;
  }
  const size_t bytes = frame.size();
  if (wire_.hold(gate_.last_bit(loop_.now(), bytes), frame)) {
    took(bytes);
    return true;
  }
  const ssize_t n = ::send(fd_, frame.data(), frame.size(), MSG_DONTWAIT);
  if (n == static_cast<ssize_t>(frame.size())) {
    took(frame.size());
    return true;
  }
  if (n < 0 && (errno == EAGAIN || errno == ENOBUFS)) {
    // The qdisc (tbf pacing) is full: keep this frame and try again shortly; the owner waits for tx_ready.
    pending_ = std::move(frame);
    gate_.set_busy(true);
    loop_.schedule(loop_.now() + kBusyRetryNs, [this] { writable(); });
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
    took(bytes);
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

bool TxGate::took(size_t frame_bytes) {
  const common::TimeNs resume = pacer_.sent(loop_.now(), frame_bytes, catch_up());
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

common::TimeNs TxGate::catch_up() const {
  if (in_ready_) {
    return LinkPacer::kMaxCatchUpNs;
  }
  const common::TimeNs now = loop_.now();
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

bool WireDelay::hold(common::TimeNs last_bit, std::vector<uint8_t>& frame) {
  if (held_.empty() && last_bit <= loop_.now() + kHoldNs) {
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

void AfPacketPort::took(size_t frame_bytes) {
  counters_.tx_frames++;
  counters_.tx_bytes += frame_bytes;
  counters_.paced += gate_.took(frame_bytes);
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
