// XdpPort on a veth pair between two namespaces this test makes (and removes, pass or fail):
//
//   namespace A                       namespace B
//   XdpPort f0 (10.99.0.1) <-- veth --> f0 (10.99.0.2): XdpPort or AfPacketPort
//
// fabric frames (RoCEv2, ECH, PFC; a 4 KiB RoCE frame spans UMEM chunks) cross byte for byte in either direction
// and between drivers; everything AfPacketPort's filter refuses goes to the kernel instead (ICMP echo, UDP and TCP
// between the namespaces' addresses work while both ports are open, and no port sees them); a burst arrives in order
// and counted; the port paces at its rate; the destructor detaches the program; open_fabric_port falls back to
// AF_PACKET and says why.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ifec/common/checks.h"
#include "ifec/common/frame.h"
#include "ifec/common/pfc.h"
#include "ifec/live/af_packet_port.h"
#include "ifec/live/epoll_loop.h"
#include "ifec/live/netns.h"
#include "ifec/live/xdp_port.h"
#include "port_frames.h"

using namespace ifec;

namespace {

using live::testing::roce_frame;

constexpr uint64_t kRate = 10'000'000'000ULL;

// Runs the loop until `done` or `limit_ns` of wall time; false on timeout.
bool run_until(live::EpollLoop& loop, const std::function<bool()>& done, common::TimeNs limit_ns = 2'000'000'000ULL) {
  const common::TimeNs deadline = loop.now() + limit_ns;
  while (!done()) {
    if (loop.now() > deadline) {
      return false;
    }
    loop.schedule(loop.now() + 1'000'000, [] {});
    loop.serve(loop.now() + 1'000'000);
  }
  return true;
}

void settle(live::EpollLoop& loop, common::TimeNs ns = 200'000'000) {
  run_until(
      loop, [] { return false; }, ns);
}

// The BTH's PSN (Ethernet 14 + IPv4 20 + UDP 8, then 9 bytes into the BTH): roce_frame's `seq`.
uint32_t seq_of(const std::vector<uint8_t>& f) {
  constexpr size_t kPsn = 14 + 20 + 8 + 9;
  return f.size() < kPsn + 3 ? 0xFFFFFFFF : (f[kPsn] << 16) | (f[kPsn + 1] << 8) | f[kPsn + 2];
}

// Sets a receive (and send) timeout so a lost packet fails the test instead of hanging it.
void set_timeouts(int fd) {
  timeval tv{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

sockaddr_in address(const char* ip, uint16_t port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  inet_pton(AF_INET, ip, &sa.sin_addr);
  return sa;
}

uint16_t inet_checksum(const uint8_t* p, size_t n) {
  uint32_t sum = 0;
  for (size_t i = 0; i + 1 < n; i += 2) {
    sum += (p[i] << 8) | p[i + 1];
  }
  if (n % 2) {
    sum += p[n - 1] << 8;
  }
  while (sum >> 16) {
    sum = (sum & 0xFFFF) + (sum >> 16);
  }
  return static_cast<uint16_t>(~sum);
}

// The kernel's own traffic from A (10.99.0.1) to B (10.99.0.2), as the control plane's would go: ARP, an ICMP echo
// (a raw socket: the image need not have ping), a UDP datagram and a TCP connection (BGP's transport). "" when all
// of it worked, else what did not.
std::string kernel_traffic(const live::ScopedNetns& a, const live::ScopedNetns& b) {
  int udp_b = -1, tcp_b = -1, icmp_a = -1, udp_a = -1, tcp_a = -1;
  {
    live::NetnsGuard in(b.name());
    udp_b = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    tcp_b = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  }
  {
    live::NetnsGuard in(a.name());
    icmp_a = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_ICMP);
    udp_a = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    tcp_a = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  }
  std::string failed;
  auto check = [&](bool ok, const char* what) {
    if (!ok && failed.empty()) {
      failed = std::string(what) + ": " + std::strerror(errno);
    }
  };
  for (int fd : {udp_b, tcp_b, icmp_a, udp_a, tcp_a}) {
    set_timeouts(fd);
  }
  const sockaddr_in udp_at = address("10.99.0.2", 9999), tcp_at = address("10.99.0.2", 9998);
  const sockaddr_in b_ip = address("10.99.0.2", 0);
  check(bind(udp_b, reinterpret_cast<const sockaddr*>(&udp_at), sizeof udp_at) == 0, "UDP bind");
  check(bind(tcp_b, reinterpret_cast<const sockaddr*>(&tcp_at), sizeof tcp_at) == 0, "TCP bind");
  check(listen(tcp_b, 1) == 0, "TCP listen");
  uint8_t echo[16] = {8, 0, 0, 0, 0x12, 0x34, 0, 1, 'i', 'f', 'e', 'c', '-', 'x', 'd', 'p'};
  const uint16_t sum = inet_checksum(echo, sizeof echo);
  echo[2] = sum >> 8;
  echo[3] = sum & 0xFF;
  check(sendto(icmp_a, echo, sizeof echo, 0, reinterpret_cast<const sockaddr*>(&b_ip), sizeof b_ip) > 0, "ICMP send");
  bool replied = false;
  uint8_t buf[256];
  for (int i = 0; i < 4 && !replied; ++i) {  // the raw socket sees the echo reply (and may see other ICMP first)
    const ssize_t n = recv(icmp_a, buf, sizeof buf, 0);
    check(n > 0, "ICMP echo reply");
    replied = n >= 28 && buf[20] == 0 && buf[24] == 0x12 && buf[25] == 0x34;
    if (n <= 0) {
      break;
    }
  }
  check(replied, "ICMP echo reply");
  check(sendto(udp_a, "udp", 3, 0, reinterpret_cast<const sockaddr*>(&udp_at), sizeof udp_at) == 3, "UDP send");
  check(recv(udp_b, buf, sizeof buf, 0) == 3, "UDP receive");
  check(connect(tcp_a, reinterpret_cast<const sockaddr*>(&tcp_at), sizeof tcp_at) == 0, "TCP connect");
  check(send(tcp_a, "tcp", 3, 0) == 3, "TCP send");
  const int conn = accept(tcp_b, nullptr, nullptr);
  check(conn >= 0, "TCP accept");
  if (conn >= 0) {
    set_timeouts(conn);
    check(recv(conn, buf, sizeof buf, 0) == 3, "TCP receive");
    close(conn);
  }
  for (int fd : {udp_b, tcp_b, icmp_a, udp_a, tcp_a}) {
    close(fd);
  }
  return failed;
}

bool kernel_at_least(int major, int minor) {
  utsname u{};
  int ma = 0, mi = 0;
  return uname(&u) == 0 && std::sscanf(u.release, "%d.%d", &ma, &mi) == 2 &&
         (ma > major || (ma == major && mi >= minor));
}

bool xdp_attached(const live::ScopedNetns& ns, const std::string& ifname) {
  std::string out;
  live::run_command({"ip", "-n", ns.name(), "link", "show", "dev", ifname}, &out);
  return out.find("xdp") != std::string::npos;
}

class XdpVeth : public testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = live::netns_unavailable(); !why.empty()) {
      GTEST_SKIP() << why;
    }
    if (const std::string why = live::XdpPort::unavailable(); !why.empty()) {
      GTEST_SKIP() << "AF_XDP unavailable: " << why;
    }
    if (!kernel_at_least(6, 6)) {
      GTEST_SKIP() << "AF_XDP multi-buffer (frames over 3840 bytes on a 9216 MTU) needs Linux >= 6.6";
    }
    const std::string tag = "ifec-x" + std::to_string(getpid());
    a_ = std::make_unique<live::ScopedNetns>(tag + "-a");
    b_ = std::make_unique<live::ScopedNetns>(tag + "-b");
    live::make_veth(*a_, "f0", *b_, "f0");
    a_->ip({"addr", "add", "10.99.0.1/24", "dev", "f0"});
    b_->ip({"addr", "add", "10.99.0.2/24", "dev", "f0"});
  }
  void TearDown() override {
    pa_.reset();
    pb_.reset();
    a_.reset();
    b_.reset();
  }

  // Opens A's port (AF_XDP) and B's (AF_XDP or AF_PACKET), B's frames into got_, and waits for both carriers.
  void open(bool b_xdp, size_t max_frame = 9216) {
    pa_ = std::make_unique<live::XdpPort>(loop_, "f0", kRate, a_->name(), max_frame);
    if (b_xdp) {
      pb_ = std::make_unique<live::XdpPort>(loop_, "f0", kRate, b_->name(), max_frame);
    } else {
      pb_ = std::make_unique<live::AfPacketFabricPort>(loop_, "f0", kRate, b_->name(), max_frame);
    }
    pb_->set_receiver([this](std::vector<uint8_t>&& f) { got_.push_back(std::move(f)); });
    ASSERT_TRUE(run_until(loop_, [&] {
      pa_->refresh_link();
      pb_->refresh_link();
      return pa_->link_up() && pb_->link_up();
    })) << "veth carrier never came up";
  }

  // Sends `frames` from `from` (waiting out busy), then runs the loop until `want` frames are in got_.
  void send_all(live::FabricPort& from, const std::vector<std::vector<uint8_t>>& frames, size_t want) {
    for (const auto& f : frames) {
      ASSERT_TRUE(run_until(loop_, [&] { return !from.busy(); })) << "the port stayed busy";
      ASSERT_TRUE(from.send(std::vector<uint8_t>(f)));
    }
    ASSERT_TRUE(run_until(loop_, [&] { return got_.size() >= want; })) << got_.size() << " of " << want << " arrived";
    settle(loop_);  // anything else that would arrive has time to
  }

  // The frames AfPacketPort's filter takes, and four it refuses (which must reach no port).
  void exchange_fabric_and_other_frames(live::FabricPort& from) {
    const auto roce = roce_frame(from.mac(), pb_->mac(), false, 4096);  // 4.1 KB: more than one UMEM chunk
    const auto small = roce_frame(from.mac(), pb_->mac(), false, 8);    // under 74 bytes
    const auto ech = roce_frame(from.mac(), pb_->mac(), true, 256);
    common::PfcFrame pfc;
    std::copy(from.mac(), from.mac() + 6, pfc.src.begin());
    pfc.class_enable = 1 << 3;
    pfc.quanta[3] = 0xFFFF;
    const std::vector<uint8_t> pause = pfc.encode();
    std::vector<uint8_t> arp(64, 0);
    std::copy(pb_->mac(), pb_->mac() + 6, arp.begin());
    std::copy(from.mac(), from.mac() + 6, arp.begin() + 6);
    arp[12] = 0x08;
    arp[13] = 0x06;
    std::vector<uint8_t> old_fare = arp;  // the retired FARE ethertype 0x88B5
    old_fare[12] = 0x88;
    old_fare[13] = 0xB5;
    std::vector<uint8_t> dns = ech;  // the same frame to UDP port 53
    dns[14 + 20 + 2] = 0;
    dns[14 + 20 + 3] = 53;
    std::vector<uint8_t> later_fragment = roce;  // fragment offset 8: not a whole RoCE frame
    later_fragment[14 + 7] = 1;
    send_all(from, {arp, roce, dns, small, ech, later_fragment, pause, old_fare}, 4);
    ASSERT_EQ(got_.size(), 4u) << "ARP, 0x88B5, UDP 53 and a later fragment must go to the kernel";
    EXPECT_EQ(got_[0], roce);
    EXPECT_EQ(got_[1], small);
    EXPECT_EQ(got_[2], ech);
    EXPECT_EQ(got_[3], pause);
    EXPECT_EQ(pb_->port_counters().rx_frames, 4u);
    EXPECT_EQ(pb_->port_counters().rx_bytes, roce.size() + small.size() + ech.size() + pause.size());
  }

  live::EpollLoop loop_;
  std::unique_ptr<live::ScopedNetns> a_, b_;
  std::unique_ptr<live::FabricPort> pa_, pb_;
  std::vector<std::vector<uint8_t>> got_;
};

}  // namespace

TEST_F(XdpVeth, FabricFramesCrossUnchangedToAnXdpPortAndOthersGoToTheKernel) {
  open(true);
  auto* a = static_cast<live::XdpPort*>(pa_.get());
  EXPECT_TRUE(a->native()) << "veth has native XDP: " << a->driver();
  EXPECT_FALSE(a->zero_copy()) << "veth has no zero-copy AF_XDP: " << a->driver();
  exchange_fabric_and_other_frames(*pa_);
  EXPECT_EQ(a->counters().tx_frames, 8u);
  EXPECT_EQ(a->counters().tx_errors, 0u);
  EXPECT_EQ(static_cast<live::XdpPort*>(pb_.get())->counters().rx_dropped, 0u);
}

TEST_F(XdpVeth, FabricFramesFromAnXdpPortReachAnAfPacketPort) {
  open(false);
  exchange_fabric_and_other_frames(*pa_);
}

TEST_F(XdpVeth, FabricFramesFromAnAfPacketPortReachAnXdpPort) {
  open(true);
  // B's XdpPort goes; an AF_PACKET port sends from B to A's XdpPort.
  pb_ = std::make_unique<live::AfPacketFabricPort>(loop_, "f0", kRate, b_->name());
  ASSERT_TRUE(run_until(loop_, [&] { return pb_->refresh_link(), pb_->link_up(); }));
  std::vector<std::vector<uint8_t>> got_a;
  pa_->set_receiver([&](std::vector<uint8_t>&& f) { got_a.push_back(std::move(f)); });
  const auto roce = roce_frame(pb_->mac(), pa_->mac(), false, 4096);
  const auto ech = roce_frame(pb_->mac(), pa_->mac(), true, 64);
  std::vector<uint8_t> dns = ech;
  dns[14 + 20 + 3] = 53;
  dns[14 + 20 + 2] = 0;
  for (const auto& f : {roce, dns, ech}) {
    ASSERT_TRUE(pb_->send(std::vector<uint8_t>(f)));
    ASSERT_TRUE(run_until(loop_, [&] { return !pb_->busy(); }));
  }
  ASSERT_TRUE(run_until(loop_, [&] { return got_a.size() >= 2; })) << got_a.size() << " of 2 arrived";
  settle(loop_);
  ASSERT_EQ(got_a.size(), 2u);
  EXPECT_EQ(got_a[0], roce);
  EXPECT_EQ(got_a[1], ech);
}

TEST_F(XdpVeth, KernelTrafficWorksWhileBothPortsAreOpenAndNoPortSeesIt) {
  open(true);
  std::vector<std::vector<uint8_t>> got_a;
  pa_->set_receiver([&](std::vector<uint8_t>&& f) { got_a.push_back(std::move(f)); });
  EXPECT_EQ(kernel_traffic(*a_, *b_), "");
  settle(loop_);
  EXPECT_TRUE(got_.empty()) << got_.size() << " kernel frames reached B's port";
  EXPECT_TRUE(got_a.empty()) << got_a.size() << " kernel frames reached A's port";
  EXPECT_EQ(static_cast<live::XdpPort*>(pb_.get())->counters().rx_frames, 0u);
  EXPECT_EQ(static_cast<live::XdpPort*>(pa_.get())->counters().rx_frames, 0u);
}

TEST_F(XdpVeth, ABurstArrivesInOrderWithArrivalTimesAndIsCounted) {
  open(true);
  constexpr uint32_t kFrames = 20000;
  std::vector<uint32_t> seqs;
  seqs.reserve(kFrames);
  std::vector<common::TimeNs> stamps;
  stamps.reserve(kFrames);
  pb_->set_receiver([&](std::vector<uint8_t>&& f) {
    seqs.push_back(seq_of(f));
    stamps.push_back(pb_->rx_timestamp_ns());
  });
  uint32_t sent = 0;
  size_t bytes = 0;
  const common::TimeNs deadline = loop_.now() + 20'000'000'000ULL;
  const common::TimeNs before = live::EpollLoop::clock_ns(CLOCK_REALTIME);
  // Mixed sizes, jumbo frames among them; up to 64 frames a loop turn (they share a kick).
  while (sent < kFrames && loop_.now() < deadline) {
    for (int i = 0; i < 64 && sent < kFrames && !pa_->busy(); ++i, ++sent) {
      const size_t payload = sent % 97 == 0 ? 8192 : (sent % 7 == 0 ? 1024 : 16);
      std::vector<uint8_t> f = roce_frame(pa_->mac(), pb_->mac(), false, payload, sent);
      bytes += f.size();
      ASSERT_TRUE(pa_->send(std::move(f)));
    }
    loop_.poll();
  }
  ASSERT_EQ(sent, kFrames);
  ASSERT_TRUE(run_until(loop_, [&] { return seqs.size() >= kFrames; })) << seqs.size() << " of " << kFrames;
  settle(loop_, 50'000'000);
  ASSERT_EQ(seqs.size(), kFrames);
  const common::TimeNs after = live::EpollLoop::clock_ns(CLOCK_REALTIME);
  for (uint32_t i = 0; i < kFrames; ++i) {
    ASSERT_EQ(seqs[i], i) << "frame " << i << " out of order";
    // Each frame, jumbo ones (several buffers) too, with the XDP program's arrival time, in order.
    ASSERT_GE(stamps[i], i > 0 ? std::max(before, stamps[i - 1]) : before) << "frame " << i;
    ASSERT_LE(stamps[i], after) << "frame " << i;
  }
  const live::XdpCounters ca = static_cast<live::XdpPort*>(pa_.get())->counters();
  const live::XdpCounters cb = static_cast<live::XdpPort*>(pb_.get())->counters();
  EXPECT_EQ(ca.tx_frames, kFrames);
  EXPECT_EQ(ca.tx_bytes, bytes);
  EXPECT_EQ(cb.rx_frames, kFrames);
  EXPECT_EQ(cb.rx_bytes, bytes);
  EXPECT_EQ(cb.rx_dropped, 0u);
  EXPECT_LT(ca.tx_kicks, kFrames / 4) << "frames of one loop turn share a sendto()";
  EXPECT_GT(cb.rx_batches, 0u);
}

// At open each RX chunk takes one warm-up frame (the program run on it as if received), which the port drops: the
// kernel's first write to a chunk is what made a fresh port's first few hundred frames slow. The frame, by hand:
// to the port's MAC from the all-zero MAC, IPv4/UDP to 4791, "ifec warm-up" where a BTH would start.
TEST_F(XdpVeth, EveryRxChunkIsWarmedAtOpenAndOnlyWarmUpFramesAreDropped) {
  open(true);
  const live::XdpCounters fresh = static_cast<live::XdpPort*>(pb_.get())->counters();
  EXPECT_EQ(fresh.warm_up_frames, 256u) << "one per RX chunk";
  EXPECT_EQ(fresh.rx_frames, 0u);
  EXPECT_EQ(fresh.rx_dropped, 0u);
  std::vector<uint8_t> warm(60, 0);
  std::copy(pb_->mac(), pb_->mac() + 6, warm.begin());
  const std::vector<uint8_t> ip_udp = {0x08, 0x00,                                        // IPv4
                                       0x45, 0,    0,    46,   0, 0,  0, 0, 1, 17, 0, 0,  // 46 bytes, TTL 1, UDP
                                       0,    0,    0,    0,    0, 0,  0, 0,               // addresses
                                       0,    0,    0x12, 0xb7, 0, 26, 0, 0};              // to 4791, 26 bytes
  std::copy(ip_udp.begin(), ip_udp.end(), warm.begin() + 12);
  const std::string marker = "ifec warm-up";
  std::copy(marker.begin(), marker.end(), warm.begin() + 42);
  std::vector<uint8_t> from_a = warm;  // the same bytes from a real source: a frame like any other
  std::copy(pa_->mac(), pa_->mac() + 6, from_a.begin() + 6);
  std::vector<uint8_t> other_marker = warm;
  other_marker[50] = 'U';
  send_all(*pa_, {warm, from_a, other_marker}, 2);
  ASSERT_EQ(got_.size(), 2u);
  EXPECT_EQ(got_[0], from_a);
  EXPECT_EQ(got_[1], other_marker);
  const live::XdpCounters after = static_cast<live::XdpPort*>(pb_.get())->counters();
  EXPECT_EQ(after.warm_up_frames, 257u);
  EXPECT_EQ(after.rx_frames, 2u);
  EXPECT_EQ(after.rx_dropped, 0u);
}

TEST_F(XdpVeth, ThePortPacesAtTheLinkRate) {
  open(true);
  pa_.reset();  // one socket per queue: A's port at 10 Gb/s makes room for one at 1 Gb/s
  pa_ = std::make_unique<live::XdpPort>(loop_, "f0", 1'000'000'000ULL, a_->name());
  ASSERT_TRUE(run_until(loop_, [&] { return pa_->refresh_link(), pa_->link_up(); }));
  size_t arrived = 0;
  pb_->set_receiver([&](std::vector<uint8_t>&&) { ++arrived; });
  // 2000 frames of about 1 KB take about 16 ms at 1 Gb/s; the port may run 50 us ahead.
  const auto frame = roce_frame(pa_->mac(), pb_->mac(), false, 950);
  const auto t0 = std::chrono::steady_clock::now();
  const auto give_up = t0 + std::chrono::seconds(5);
  for (int i = 0; i < 2000; ++i) {
    while (pa_->busy() && std::chrono::steady_clock::now() < give_up) {
      loop_.poll();  // spins: serve() would sleep a millisecond at a time
    }
    ASSERT_TRUE(pa_->send(std::vector<uint8_t>(frame)));
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const double want_ms = 1999.0 * (frame.size() + 24) * 8 / 1e9 * 1e3;  // the last one's time is not waited for
  // LinkPacer lets a port run kSlackNs ahead and make up kCatchUpNs a late loop lost (the first frame finds the
  // port idle since the loop began): no more than that early.
  const double early_ms = (live::LinkPacer::kSlackNs + live::LinkPacer::kCatchUpNs) / 1e6;
  EXPECT_GT(ms, want_ms - early_ms) << "2000 frames at 1 Gb/s went out faster than the link";
  // The exact rate is LinkPacer's test's (a clock it drives); here only a gross error, an order of magnitude: on a
  // loaded machine this thread's time, wall or CPU (the peer's receive work runs in its softirqs), reached 3x.
  EXPECT_LT(ms, want_ms * 10) << "pacing held the port back far more than the link's rate";
  EXPECT_GT(static_cast<live::XdpPort*>(pa_.get())->counters().paced, 0u);
  EXPECT_TRUE(run_until(loop_, [&] { return arrived == 2000; })) << arrived;
}

TEST_F(XdpVeth, TheDestructorDetachesTheProgram) {
  EXPECT_FALSE(xdp_attached(*a_, "f0"));
  {
    live::XdpPort p(loop_, "f0", kRate, a_->name());
    EXPECT_TRUE(xdp_attached(*a_, "f0")) << "no XDP program on f0 while the port is open";
  }
  EXPECT_FALSE(xdp_attached(*a_, "f0")) << "the XDP program outlived its port";
  // And again: nothing of the first port is in the way of a second.
  live::XdpPort again(loop_, "f0", kRate, a_->name());
  EXPECT_TRUE(xdp_attached(*a_, "f0"));
}

TEST_F(XdpVeth, ASecondPortOnTheInterfaceFailsAndCleansUp) {
  live::XdpPort first(loop_, "f0", kRate, a_->name());
  try {
    live::XdpPort second(loop_, "f0", kRate, a_->name());
    FAIL() << "two AF_XDP ports on one queue";
  } catch (const common::Error& e) {
    EXPECT_NE(std::string(e.what()).find("interface f0: "), std::string::npos) << e.what();
  }
  EXPECT_TRUE(xdp_attached(*a_, "f0")) << "the failed port took the first one's program with it";
}

TEST_F(XdpVeth, WithoutMultiBufferOnASmallMtu) {
  a_->ip({"link", "set", "f0", "mtu", "1500"});
  b_->ip({"link", "set", "f0", "mtu", "1500"});
  open(true, 1514);
  const auto f = roce_frame(pa_->mac(), pb_->mac(), false, 1400);
  send_all(*pa_, {f}, 1);
  ASSERT_EQ(got_.size(), 1u);
  EXPECT_EQ(got_[0], f);
  EXPECT_FALSE(pa_->send(roce_frame(pa_->mac(), pb_->mac(), false, 1500))) << "a frame over max_frame";
  EXPECT_EQ(static_cast<live::XdpPort*>(pa_.get())->counters().tx_errors, 1u);
}

TEST_F(XdpVeth, CarrierFollowsThePeerAndADownPortRefusesFrames) {
  open(true);
  b_->ip({"link", "set", "f0", "down"});
  EXPECT_TRUE(pa_->refresh_link());  // at the first look: the carrier, not the operational state a second late
  ASSERT_FALSE(pa_->link_up()) << "A still sees a carrier";
  EXPECT_FALSE(pa_->send(roce_frame(pa_->mac(), pb_->mac(), false, 64)));
  EXPECT_EQ(pa_->port_counters().tx_refused, 1u);
  b_->ip({"link", "set", "f0", "up"});
  ASSERT_TRUE(run_until(loop_, [&] {
    pa_->refresh_link();
    pb_->refresh_link();
    return pa_->link_up() && pb_->link_up();
  }));
  const auto f = roce_frame(pa_->mac(), pb_->mac(), false, 64);
  send_all(*pa_, {f}, 1);
  ASSERT_EQ(got_.size(), 1u);
  EXPECT_EQ(got_[0], f);
}

TEST_F(XdpVeth, OpenFabricPortPrefersAfXdpAndFallsBackSayingWhy) {
  auto opened = live::open_fabric_port(loop_, "f0", kRate, a_->name());
  EXPECT_NE(dynamic_cast<live::XdpPort*>(opened.port.get()), nullptr) << opened.description;
  EXPECT_EQ(opened.description.rfind("af_xdp (", 0), 0u) << opened.description;
  opened.port.reset();
  // Two receive queues: the AF_XDP port (queue 0 only) refuses, AF_PACKET takes it, and the reason is given.
  a_->ip({"link", "add", "q0", "numrxqueues", "2", "type", "veth", "peer", "name", "q1", "numrxqueues", "2"});
  auto fallback = live::open_fabric_port(loop_, "q0", kRate, a_->name());
  EXPECT_NE(dynamic_cast<live::AfPacketFabricPort*>(fallback.port.get()), nullptr) << fallback.description;
  EXPECT_NE(fallback.description.find("AF_XDP not used"), std::string::npos) << fallback.description;
  EXPECT_NE(fallback.description.find("2 receive queues"), std::string::npos) << fallback.description;
  EXPECT_FALSE(xdp_attached(*a_, "q0")) << "the failed AF_XDP attempt left its program";
  EXPECT_THROW(live::open_fabric_port(loop_, "q0", kRate, a_->name(), 9216, live::FabricDriver::kAfXdp), common::Error);
  auto plain = live::open_fabric_port(loop_, "f0", kRate, a_->name(), 9216, live::FabricDriver::kAfPacket);
  EXPECT_EQ(plain.description, "af_packet (recvmmsg with kernel timestamps, send)");
}

TEST(XdpPort, ErrorsNameTheInterfaceAndDriversParse) {
  EXPECT_EQ(live::parse_fabric_driver("af_xdp"), live::FabricDriver::kAfXdp);
  EXPECT_EQ(live::parse_fabric_driver("auto"), live::FabricDriver::kAuto);
  EXPECT_STREQ(live::fabric_driver_name(live::FabricDriver::kAfPacket), "af_packet");
  try {
    live::parse_fabric_driver("dpdk");
    FAIL() << "parsed an unknown driver";
  } catch (const common::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'dpdk'"), std::string::npos) << e.what();
  }
  if (const std::string why = live::netns_unavailable(); !why.empty()) {
    GTEST_SKIP() << why;
  }
  live::EpollLoop loop;
  try {
    live::XdpPort p(loop, "nosuchif0", 1'000'000'000);
    FAIL() << "opened an interface that does not exist";
  } catch (const common::Error& e) {
    EXPECT_NE(std::string(e.what()).find("interface nosuchif0: no such interface"), std::string::npos) << e.what();
  }
  EXPECT_THROW(live::XdpPort(loop, "a-name-far-too-long-for-linux", 1), common::Error);
  EXPECT_THROW(live::open_fabric_port(loop, "nosuchif0", 1), common::Error) << "AF_PACKET cannot open it either";
}
