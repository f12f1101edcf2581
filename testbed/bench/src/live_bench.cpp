// The live forwarding and hop-latency benchmarks (see bench.h).
#include "ifec/testbed/live_bench.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "ifec/common/checks.h"
#include "ifec/common/frame.h"
#include "ifec/common/protocol.h"
#include "ifec/live/af_packet_port.h"
#include "ifec/live/netns.h"
#include "ifec/switchemu/switch.h"

namespace ifec::testbed {

using namespace live;  // the live driver's pieces this bench puts a switch on

namespace {

constexpr uint32_t kIpA = 0x0A000001;
constexpr uint32_t kIpB = 0x0A000002;

common::MacAddress mac_of(const AfPacketPort& p) {
  common::MacAddress m{};
  std::copy(p.mac(), p.mac() + 6, m.begin());
  return m;
}

// A RoCEv2 WRITE ONLY frame of `bytes` on the wire (headers + payload + ICRC), from `src` to `dst` IP.
std::vector<uint8_t> write_frame(size_t bytes, const AfPacketPort& from, const common::MacAddress& to, uint32_t src,
                                 uint32_t dst) {
  common::FrameHeaders h;
  h.eth.src = mac_of(from);
  h.eth.dst = to;
  h.ip.src = src;
  h.ip.dst = dst;
  h.udp.src_port = 0xC001;
  h.bth.opcode = static_cast<uint8_t>(common::Opcode::kWriteOnly);
  h.bth.dest_qp = common::rc_qpn(0, 1);
  const size_t headers = common::header_bytes([&] {
                           common::FrameHeaders x = h;
                           x.reth = common::Reth{};
                           return x;
                         }()) +
                         common::kIcrcSize;
  const size_t payload = bytes > headers ? ((bytes - headers) & ~size_t{3}) : 0;
  h.reth = common::Reth{0x1000, 7, static_cast<uint32_t>(payload)};
  std::vector<uint8_t> data(payload, 0x5A);
  return common::encode_frame(h, data.data(), data.size());
}

struct Wiring {
  std::string tag = "ifec-b" + std::to_string(getpid());
  ScopedNetns a{tag + "-a"}, s{tag + "-s"}, b{tag + "-b"};
  Wiring() {
    make_veth(a, "f0", s, "f0");
    make_veth(s, "f1", b, "f0");
  }
};

double thread_cpu(double* user, double* sys) {
  rusage r{};
  getrusage(RUSAGE_THREAD, &r);
  *user = r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6;
  *sys = r.ru_stime.tv_sec + r.ru_stime.tv_usec / 1e6;
  return *user + *sys;
}

bool wait_up(EpollLoop& loop, std::vector<AfPacketPort*> ports) {
  const common::TimeNs end = loop.now() + 5'000'000'000ULL;
  while (loop.now() < end) {
    bool all = true;
    for (AfPacketPort* p : ports) {
      p->refresh_link();
      all = all && p->link_up();
    }
    if (all) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

}  // namespace

std::vector<ForwardingRow> bench_forwarding(const std::vector<size_t>& sizes, double seconds) {
  IFEC_CHECK(netns_unavailable().empty(), "bench live: " << netns_unavailable());
  Wiring w;
  std::vector<ForwardingRow> rows;
  for (size_t size : sizes) {
    EpollLoop sw_loop, edge_loop;
    AfPacketPort s0(sw_loop, "f0", 400'000'000'000ULL, w.s.name()), s1(sw_loop, "f1", 400'000'000'000ULL, w.s.name());
    AfPacketPort pa(edge_loop, "f0", 400'000'000'000ULL, w.a.name()),
        pb(edge_loop, "f0", 400'000'000'000ULL, w.b.name());
    IFEC_CHECK(wait_up(sw_loop, {&s0, &s1, &pa, &pb}), "bench live: veths did not come up");
    switchemu::SwitchConfig cfg;
    cfg.ifec = false;
    cfg.port_macs = {mac_of(s0), mac_of(s1)};
    cfg.params.pfc.enabled = false;
    switchemu::Switch sw(sw_loop, cfg, {&s0, &s1});
    sw.set_route(kIpB, {{1, 1.0, mac_of(pb)}});
    std::atomic<uint64_t> delivered{0};
    pb.set_receiver([&](std::vector<uint8_t>&&) { delivered.fetch_add(1, std::memory_order_relaxed); });
    const std::vector<uint8_t> frame = write_frame(size, pa, mac_of(s0), kIpA, kIpB);
    ForwardingRow row;
    row.frame_bytes = frame.size();
    std::atomic<bool> stop{false};
    double u0 = 0, s0cpu = 0, u1 = 0, s1cpu = 0;
    std::thread sw_thread([&] {
      thread_cpu(&u0, &s0cpu);
      while (!stop.load()) {
        sw_loop.serve(sw_loop.now() + 10'000'000);
      }
      thread_cpu(&u1, &s1cpu);
    });
    // The sender offers frames as fast as its socket takes them, 64 at a time between drains of the receiver
    // (both on this thread's loop).
    uint64_t sent = 0;
    const auto t0 = std::chrono::steady_clock::now();
    const common::TimeNs end = edge_loop.now() + static_cast<common::TimeNs>(seconds * 1e9);
    uint64_t at_end = 0;
    while (edge_loop.now() < end) {
      for (int i = 0; i < 64 && !pa.busy(); ++i) {
        sent += pa.send(std::vector<uint8_t>(frame)) ? 1 : 0;
      }
      edge_loop.poll();
    }
    at_end = delivered.load();
    row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stop = true;
    sw_thread.join();
    row.sent = sent;
    row.delivered = at_end;
    row.delivered_pps = at_end / row.seconds;
    row.delivered_gbps = row.delivered_pps * row.frame_bytes * 8 / 1e9;
    row.switch_user_s = u1 - u0;
    row.switch_sys_s = s1cpu - s0cpu;
    row.switch_cpu_s = row.switch_user_s + row.switch_sys_s;
    row.pps_per_core = row.switch_cpu_s > 0 ? at_end / row.switch_cpu_s : 0;
    rows.push_back(row);
  }
  return rows;
}

LatencyRow bench_hop_latency(int round_trips) {
  IFEC_CHECK(netns_unavailable().empty(), "bench live: " << netns_unavailable());
  LatencyRow row;
  row.round_trips = round_trips;
  auto median_rtt = [&](EpollLoop& loop, AfPacketPort& a, AfPacketPort& b, const common::MacAddress& a_next,
                        const common::MacAddress& b_next, const std::function<void()>& spin) {
    std::vector<double> rtts;
    bool back = false;
    const std::vector<uint8_t> ab = write_frame(128, a, a_next, kIpA, kIpB);
    const std::vector<uint8_t> ba = write_frame(128, b, b_next, kIpB, kIpA);
    b.set_receiver([&](std::vector<uint8_t>&&) { b.send(std::vector<uint8_t>(ba)); });
    a.set_receiver([&](std::vector<uint8_t>&&) { back = true; });
    for (int i = 0; i < round_trips; ++i) {
      back = false;
      const auto t0 = std::chrono::steady_clock::now();
      a.send(std::vector<uint8_t>(ab));
      const auto limit = t0 + std::chrono::milliseconds(200);
      while (!back && std::chrono::steady_clock::now() < limit) {
        loop.poll();
        spin();
      }
      if (back) {
        rtts.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      }
    }
    IFEC_CHECK(!rtts.empty(), "bench live: no frame came back");
    std::sort(rtts.begin(), rtts.end());
    return rtts[rtts.size() / 2];
  };
  {
    const std::string tag = "ifec-l" + std::to_string(getpid());
    ScopedNetns a(tag + "-a"), b(tag + "-b");
    make_veth(a, "f0", b, "f0");
    EpollLoop loop;
    AfPacketPort pa(loop, "f0", 400'000'000'000ULL, a.name()), pb(loop, "f0", 400'000'000'000ULL, b.name());
    IFEC_CHECK(wait_up(loop, {&pa, &pb}), "bench live: veths did not come up");
    row.direct_rtt_us = median_rtt(loop, pa, pb, mac_of(pb), mac_of(pa), [] {});
  }
  Wiring w;
  EpollLoop loop;
  AfPacketPort s0(loop, "f0", 400'000'000'000ULL, w.s.name()), s1(loop, "f1", 400'000'000'000ULL, w.s.name());
  AfPacketPort pa(loop, "f0", 400'000'000'000ULL, w.a.name()), pb(loop, "f0", 400'000'000'000ULL, w.b.name());
  IFEC_CHECK(wait_up(loop, {&s0, &s1, &pa, &pb}), "bench live: veths did not come up");
  switchemu::SwitchConfig cfg;
  cfg.ifec = false;
  cfg.port_macs = {mac_of(s0), mac_of(s1)};
  switchemu::Switch sw(loop, cfg, {&s0, &s1});
  sw.set_route(kIpB, {{1, 1.0, mac_of(pb)}});
  sw.set_route(kIpA, {{0, 1.0, mac_of(pa)}});
  row.switch_rtt_us = median_rtt(loop, pa, pb, mac_of(s0), mac_of(s1), [] {});
  row.added_per_hop_us = (row.switch_rtt_us - row.direct_rtt_us) / 2;
  return row;
}

}  // namespace ifec::testbed
