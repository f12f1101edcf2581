// The live forwarding and hop-latency benchmarks (see live_bench.h).
#include "ifec/testbed/live_bench.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <thread>

#include "ifec/common/checks.h"
#include "ifec/common/frame.h"
#include "ifec/common/protocol.h"
#include "ifec/live/netns.h"
#include "ifec/switchemu/switch.h"

namespace ifec::testbed {

using namespace live;  // the live driver's pieces this bench puts a switch on

namespace {

constexpr uint32_t kIpA = 0x0A000001;
constexpr uint32_t kIpB = 0x0A000002;
constexpr uint64_t kRate = 400'000'000'000ULL;  // far above what software moves: the ports never pace
constexpr size_t kBacklog = 4096;               // frames the bare forwarder holds while its out port is busy

common::MacAddress mac_of(const FabricPort& p) {
  common::MacAddress m{};
  std::copy(p.mac(), p.mac() + 6, m.begin());
  return m;
}

// A RoCEv2 WRITE ONLY frame of `bytes` on the wire (headers + payload + ICRC; at least the headers), from `src` to
// `dst` IP.
std::vector<uint8_t> write_frame(size_t bytes, const FabricPort& from, const common::MacAddress& to, uint32_t src,
                                 uint32_t dst) {
  common::FrameHeaders h;
  h.eth.src = mac_of(from);
  h.eth.dst = to;
  h.ip.src = src;
  h.ip.dst = dst;
  h.udp.src_port = 0xC001;
  h.bth.opcode = static_cast<uint8_t>(common::Opcode::kWriteOnly);
  h.bth.dest_qp = common::rc_qpn(0, 1);
  h.reth = common::Reth{0x1000, 7, 0};
  const size_t headers = common::header_bytes(h) + common::kIcrcSize;
  const size_t payload = bytes > headers ? ((bytes - headers) & ~size_t{3}) : 0;  // RoCE pads to 4 bytes
  h.reth->dma_length = static_cast<uint32_t>(payload);
  std::vector<uint8_t> data(payload, 0x5A);
  return common::encode_frame(h, data.data(), data.size());
}

// Pins the calling thread to one core (of those there are); the destructor gives it back every core it had.
class Pinned {
 public:
  explicit Pinned(int cpu) {
    pthread_getaffinity_np(pthread_self(), sizeof before_, &before_);
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu % std::max(1u, std::thread::hardware_concurrency()), &one);
    pthread_setaffinity_np(pthread_self(), sizeof one, &one);
  }
  ~Pinned() { pthread_setaffinity_np(pthread_self(), sizeof before_, &before_); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;

 private:
  cpu_set_t before_{};
};

void thread_cpu(double* user, double* sys) {
  rusage r{};
  getrusage(RUSAGE_THREAD, &r);
  *user = r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6;
  *sys = r.ru_stime.tv_sec + r.ru_stime.tv_usec / 1e6;
}

void wait_up(EpollLoop& loop, const std::vector<FabricPort*>& ports) {
  const common::TimeNs end = loop.now() + 5'000'000'000ULL;
  while (loop.now() < end) {
    bool all = true;
    for (FabricPort* p : ports) {
      p->refresh_link();
      all = all && p->link_up();
    }
    if (all) {
      return;
    }
    loop.poll();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  IFEC_FAIL("bench live: the veths did not come up within 5 s");
}

// sender (ns a) f0 == f0 [ns s] f1 == f0 receiver (ns b), the ports opened with one driver: the forwarding core's
// two on its loop, the sender's and the receiver's on the edge loop.
struct Rig {
  std::string tag = "ifec-b" + std::to_string(getpid());
  ScopedNetns a{tag + "-a"}, s{tag + "-s"}, b{tag + "-b"};
  EpollLoop core_loop, edge_loop;
  OpenedFabricPort s0, s1, pa, pb;

  Rig(FabricDriver driver, bool same_loop) {
    make_veth(a, "f0", s, "f0");
    make_veth(s, "f1", b, "f0");
    EpollLoop& edge = same_loop ? core_loop : edge_loop;
    s0 = open_fabric_port(core_loop, "f0", kRate, s.name(), 9216, driver);
    s1 = open_fabric_port(core_loop, "f1", kRate, s.name(), 9216, driver);
    pa = open_fabric_port(edge, "f0", kRate, a.name(), 9216, driver);
    pb = open_fabric_port(edge, "f0", kRate, b.name(), 9216, driver);
    wait_up(core_loop, {s0.port.get(), s1.port.get(), pa.port.get(), pb.port.get()});
  }
};

// The bare forwarder: s0 in, s1 out, a bounded backlog while s1 is busy; counts what the backlog could not hold.
void forward_bare(Rig& rig, uint64_t* overflow) {
  auto backlog = std::make_shared<std::deque<std::vector<uint8_t>>>();
  FabricPort& out = *rig.s1.port;
  out.set_tx_ready([&out, backlog] {
    while (!backlog->empty() && !out.busy()) {
      out.send(std::move(backlog->front()));
      backlog->pop_front();
    }
  });
  rig.s0.port->set_receiver([&out, backlog, overflow](std::vector<uint8_t>&& f) {
    if (backlog->empty() && !out.busy()) {
      out.send(std::move(f));
    } else if (backlog->size() < kBacklog) {
      backlog->push_back(std::move(f));
    } else {
      ++*overflow;
    }
  });
}

std::unique_ptr<switchemu::Switch> switch_between(Rig& rig, bool pfc) {
  switchemu::SwitchConfig cfg;
  cfg.ifec = false;
  cfg.port_macs = {mac_of(*rig.s0.port), mac_of(*rig.s1.port)};
  cfg.params.pfc.enabled = pfc;
  auto sw = std::make_unique<switchemu::Switch>(rig.core_loop, cfg,
                                                std::vector<common::Port*>{rig.s0.port.get(), rig.s1.port.get()});
  sw->set_route(kIpB, {{1, 1.0, mac_of(*rig.pb.port)}});
  sw->set_route(kIpA, {{0, 1.0, mac_of(*rig.pa.port)}});
  return sw;
}

ForwardingRow forward_one_size(FabricDriver driver, bool pipeline, size_t size, double seconds) {
  Rig rig(driver, false);
  uint64_t overflow = 0;
  std::unique_ptr<switchemu::Switch> sw;
  if (pipeline) {
    sw = switch_between(rig, false);
  } else {
    forward_bare(rig, &overflow);
  }
  std::atomic<uint64_t> delivered{0};
  rig.pb.port->set_receiver([&](std::vector<uint8_t>&&) { delivered.fetch_add(1, std::memory_order_relaxed); });
  const std::vector<uint8_t> frame = write_frame(size, *rig.pa.port, mac_of(*rig.s0.port), kIpA, kIpB);
  ForwardingRow row;
  row.driver = fabric_driver_name(driver);
  row.ports = rig.s0.description;
  row.pipeline = pipeline;
  row.frame_bytes = frame.size();
  std::atomic<bool> stop{false};
  double u0 = 0, s0 = 0, u1 = 0, s1 = 0;
  std::thread core([&] {
    Pinned on(1);
    thread_cpu(&u0, &s0);
    while (!stop.load(std::memory_order_relaxed)) {
      rig.core_loop.serve(rig.core_loop.now() + 10'000'000);
    }
    thread_cpu(&u1, &s1);
  });
  // The sender offers frames as fast as its port takes them, 64 at a time between drains of the receiver (both on
  // this thread's loop, on the other core).
  Pinned on(0);
  const auto t0 = std::chrono::steady_clock::now();
  const common::TimeNs end = rig.edge_loop.now() + static_cast<common::TimeNs>(seconds * 1e9);
  while (rig.edge_loop.now() < end) {
    for (int i = 0; i < 64 && !rig.pa.port->busy(); ++i) {
      row.sent += rig.pa.port->send(std::vector<uint8_t>(frame)) ? 1 : 0;
    }
    rig.edge_loop.poll();
  }
  row.delivered = delivered.load();
  row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stop = true;
  core.join();
  row.dropped = rig.s0.port->port_counters().rx_dropped + rig.pb.port->port_counters().rx_dropped + overflow;
  row.delivered_pps = row.delivered / row.seconds;
  row.delivered_gbps = row.delivered_pps * row.frame_bytes * 8 / 1e9;
  row.switch_user_s = u1 - u0;
  row.switch_sys_s = s1 - s0;
  row.switch_cpu_s = row.switch_user_s + row.switch_sys_s;
  row.pps_per_core = row.switch_cpu_s > 0 ? row.delivered / row.switch_cpu_s : 0;
  return row;
}

// The median round trip of 128-byte frames a -> b and back, one in flight.
double median_rtt(EpollLoop& loop, FabricPort& a, FabricPort& b, const common::MacAddress& a_next,
                  const common::MacAddress& b_next, int round_trips) {
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
    }
    if (back) {
      rtts.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  IFEC_CHECK(!rtts.empty(), "bench live: no frame came back in " << round_trips << " round trips");
  std::sort(rtts.begin(), rtts.end());
  return rtts[rtts.size() / 2];
}

}  // namespace

std::vector<ForwardingRow> bench_forwarding(FabricDriver driver, bool pipeline, const std::vector<size_t>& sizes,
                                            double seconds) {
  IFEC_CHECK(netns_unavailable().empty(), "bench live: " << netns_unavailable());
  std::vector<ForwardingRow> rows;
  for (size_t size : sizes) {
    rows.push_back(forward_one_size(driver, pipeline, size, seconds));
  }
  return rows;
}

LatencyRow bench_hop_latency(FabricDriver driver, int round_trips) {
  IFEC_CHECK(netns_unavailable().empty(), "bench live: " << netns_unavailable());
  LatencyRow row;
  row.driver = fabric_driver_name(driver);
  row.round_trips = round_trips;
  {
    const std::string tag = "ifec-l" + std::to_string(getpid());
    ScopedNetns a(tag + "-a"), b(tag + "-b");
    make_veth(a, "f0", b, "f0");
    EpollLoop loop;
    OpenedFabricPort pa = open_fabric_port(loop, "f0", kRate, a.name(), 9216, driver);
    OpenedFabricPort pb = open_fabric_port(loop, "f0", kRate, b.name(), 9216, driver);
    wait_up(loop, {pa.port.get(), pb.port.get()});
    row.direct_rtt_us = median_rtt(loop, *pa.port, *pb.port, mac_of(*pb.port), mac_of(*pa.port), round_trips);
  }
  Rig rig(driver, true);
  std::unique_ptr<switchemu::Switch> sw = switch_between(rig, true);
  row.switch_rtt_us =
      median_rtt(rig.core_loop, *rig.pa.port, *rig.pb.port, mac_of(*rig.s0.port), mac_of(*rig.s1.port), round_trips);
  row.added_per_hop_us = (row.switch_rtt_us - row.direct_rtt_us) / 2;
  return row;
}

}  // namespace ifec::testbed
