// AF_XDP against AF_PACKET on veths between namespaces (run as root): frames/s one port pair moves, at 74 bytes
// and 4 KiB, each driver in turn, every thread pinned to its own core.
//
//   direct:   [A] f0 --veth--> f0 [B]                sender thread (core 0) -> receiver thread (core 1)
//   forward:  [A] f0 --> f0 [S] f1 --> f0 [B]         edge thread (core 0: sends on A, counts on B);
//                                                     forwarder thread (core 1: S.f0 in, S.f1 out)
//
// The forwarder is the switch core's job without the pipeline (no parsing, no queues beyond a small backlog): its
// frames/s per CPU-second is the driver's ceiling for a switch core. build/bin/bench_xdp_port [--seconds 3]
// [--sizes 74,4096] [--drivers af_xdp,af_packet] [--modes direct,forward]
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "ifec/common/checks.h"
#include "ifec/common/frame.h"
#include "ifec/live/epoll_loop.h"
#include "ifec/live/netns.h"
#include "ifec/live/xdp_port.h"
#include "port_frames.h"

using namespace ifec;

namespace {

constexpr uint64_t kRate = 400'000'000'000ULL;  // far above what software moves: no pacing
constexpr size_t kBacklog = 4096;               // frames the forwarder holds while its out port is busy

struct Options {
  double seconds = 3;
  std::vector<size_t> sizes = {74, 4096};
  std::vector<std::string> drivers = {"af_xdp", "af_packet"};
  std::vector<std::string> modes = {"direct", "forward"};
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = s.find(',', pos);
    out.push_back(s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (comma == std::string::npos) {
      break;
    }
    pos = comma + 1;
  }
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    IFEC_CHECK(i + 1 < argc, "option " << a << " needs a value");
    const std::string v = argv[++i];
    if (a == "--seconds") {
      o.seconds = std::stod(v);
    } else if (a == "--sizes") {
      o.sizes.clear();
      for (const std::string& s : split(v)) {
        o.sizes.push_back(std::stoul(s));
      }
    } else if (a == "--drivers") {
      o.drivers = split(v);
    } else if (a == "--modes") {
      o.modes = split(v);
    } else {
      IFEC_FAIL("unknown option " << a << " (--seconds, --sizes, --drivers, --modes)");
    }
  }
  return o;
}

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu % std::max(1u, std::thread::hardware_concurrency()), &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

double thread_cpu_s() {
  rusage r{};
  getrusage(RUSAGE_THREAD, &r);
  return r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec / 1e6;
}

// A RoCEv2 WRITE ONLY frame of `bytes` on the wire (at least its headers).
std::vector<uint8_t> frame_of(size_t bytes, const uint8_t* src, const uint8_t* dst) {
  const size_t headers = live::testing::roce_frame(src, dst, false, 0).size();
  const size_t payload = bytes > headers ? (bytes - headers) & ~size_t{3} : 0;  // RoCE pads to 4 bytes
  return live::testing::roce_frame(src, dst, false, payload);
}

live::FabricDriver driver_of(const std::string& name) { return live::parse_fabric_driver(name); }

void wait_up(live::EpollLoop& loop, const std::vector<live::FabricPort*>& ports) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    bool all = true;
    for (live::FabricPort* p : ports) {
      p->refresh_link();
      all = all && p->link_up();
    }
    if (all) {
      return;
    }
    IFEC_CHECK(std::chrono::steady_clock::now() < give_up, "veths did not come up");
    loop.poll();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

struct Row {
  std::string driver, mode, port_driver;
  size_t bytes = 0;
  double seconds = 0;
  uint64_t sent = 0, delivered = 0, dropped = 0;
  double fwd_cpu_s = 0, rx_cpu_s = 0;
};

// Offers frames from `from` as fast as it takes them, 64 a turn, until `end`; the caller's loop polls between.
uint64_t offer(live::EpollLoop& loop, live::FabricPort& from, const std::vector<uint8_t>& frame) {
  uint64_t n = 0;
  for (int i = 0; i < 64 && !from.busy(); ++i) {
    n += from.send(std::vector<uint8_t>(frame)) ? 1 : 0;
  }
  loop.poll();
  return n;
}

Row run_direct(const std::string& driver, size_t bytes, double seconds) {
  const std::string tag = "ifec-y" + std::to_string(getpid());
  live::ScopedNetns a(tag + "-a"), b(tag + "-b");
  live::make_veth(a, "f0", b, "f0");
  live::EpollLoop tx_loop, rx_loop;
  auto pa = live::open_fabric_port(tx_loop, "f0", kRate, a.name(), 9216, driver_of(driver));
  auto pb = live::open_fabric_port(rx_loop, "f0", kRate, b.name(), 9216, driver_of(driver));
  wait_up(tx_loop, {pa.port.get(), pb.port.get()});
  std::atomic<uint64_t> delivered{0};
  pb.port->set_receiver([&](std::vector<uint8_t>&&) { delivered.fetch_add(1, std::memory_order_relaxed); });
  const std::vector<uint8_t> frame = frame_of(bytes, pa.port->mac(), pb.port->mac());
  Row row{driver, "direct", pa.description, frame.size()};
  std::atomic<bool> stop{false};
  std::thread rx([&] {
    pin(1);
    const double c0 = thread_cpu_s();
    while (!stop.load(std::memory_order_relaxed)) {
      rx_loop.serve(rx_loop.now() + 10'000'000);
    }
    row.rx_cpu_s = thread_cpu_s() - c0;
  });
  pin(0);
  const auto t0 = std::chrono::steady_clock::now();
  const auto end = t0 + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    row.sent += offer(tx_loop, *pa.port, frame);
  }
  row.delivered = delivered.load();
  row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stop = true;
  rx.join();
  row.dropped = pb.port->port_counters().rx_dropped;
  return row;
}

Row run_forward(const std::string& driver, size_t bytes, double seconds) {
  const std::string tag = "ifec-y" + std::to_string(getpid());
  live::ScopedNetns a(tag + "-a"), s(tag + "-s"), b(tag + "-b");
  live::make_veth(a, "f0", s, "f0");
  live::make_veth(s, "f1", b, "f0");
  live::EpollLoop edge, fwd;
  auto pa = live::open_fabric_port(edge, "f0", kRate, a.name(), 9216, driver_of(driver));
  auto pb = live::open_fabric_port(edge, "f0", kRate, b.name(), 9216, driver_of(driver));
  auto s0 = live::open_fabric_port(fwd, "f0", kRate, s.name(), 9216, driver_of(driver));
  auto s1 = live::open_fabric_port(fwd, "f1", kRate, s.name(), 9216, driver_of(driver));
  wait_up(edge, {pa.port.get(), pb.port.get(), s0.port.get(), s1.port.get()});
  uint64_t delivered = 0, backlog_drops = 0;
  pb.port->set_receiver([&](std::vector<uint8_t>&&) { ++delivered; });
  // The forwarder: S.f0 in, S.f1 out, a bounded backlog while S.f1 is busy.
  std::deque<std::vector<uint8_t>> backlog;
  live::FabricPort& out = *s1.port;
  out.set_tx_ready([&] {
    while (!backlog.empty() && !out.busy()) {
      out.send(std::move(backlog.front()));
      backlog.pop_front();
    }
  });
  s0.port->set_receiver([&](std::vector<uint8_t>&& f) {
    if (backlog.empty() && !out.busy()) {
      out.send(std::move(f));
    } else if (backlog.size() < kBacklog) {
      backlog.push_back(std::move(f));
    } else {
      ++backlog_drops;
    }
  });
  const std::vector<uint8_t> frame = frame_of(bytes, pa.port->mac(), s0.port->mac());
  Row row{driver, "forward", pa.description, frame.size()};
  std::atomic<bool> stop{false};
  std::thread fwd_thread([&] {
    pin(1);
    const double c0 = thread_cpu_s();
    while (!stop.load(std::memory_order_relaxed)) {
      fwd.serve(fwd.now() + 10'000'000);
    }
    row.fwd_cpu_s = thread_cpu_s() - c0;
  });
  pin(0);
  const auto t0 = std::chrono::steady_clock::now();
  const auto end = t0 + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    row.sent += offer(edge, *pa.port, frame);
  }
  row.delivered = delivered;
  row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stop = true;
  fwd_thread.join();
  row.dropped = s0.port->port_counters().rx_dropped + backlog_drops + pb.port->port_counters().rx_dropped;
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    if (const std::string why = live::netns_unavailable(); !why.empty()) {
      std::fprintf(stderr, "bench_xdp_port: %s\n", why.c_str());
      return 2;
    }
    std::printf("%-9s %-7s %7s %12s %12s %8s %8s %13s %9s\n", "driver", "mode", "frame_B", "offered/s", "delivered/s",
                "Gb/s", "core_s", "frames/core-s", "dropped");
    for (const std::string& mode : o.modes) {
      for (size_t size : o.sizes) {
        for (const std::string& driver : o.drivers) {
          const Row r = mode == "direct" ? run_direct(driver, size, o.seconds) : run_forward(driver, size, o.seconds);
          const double pps = r.delivered / r.seconds;
          // The receiving (direct) or forwarding core's CPU time: frames it moved per second of it.
          const double core_s = mode == "direct" ? r.rx_cpu_s : r.fwd_cpu_s;
          std::printf("%-9s %-7s %7zu %12.0f %12.0f %8.2f %8.2f %13.0f %9llu\n", r.driver.c_str(), r.mode.c_str(),
                      r.bytes, r.sent / r.seconds, pps, pps * r.bytes * 8 / 1e9, core_s,
                      core_s > 0 ? r.delivered / core_s : 0.0, static_cast<unsigned long long>(r.dropped));
          std::fflush(stdout);
        }
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_xdp_port: %s\n", e.what());
    return 1;
  }
}
