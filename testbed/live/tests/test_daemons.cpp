// The gRPC control plane from C++, against a real ifec-switchd: the rank-side GrpcControl reserves and releases
// groups, reads slots, counters and FARE weights, gets errors that name the switch and the reason, and a stopped
// daemon is an error naming it within the deadline, never a hang. The switch runs in this process (its own loop
// thread) on veths in namespaces this test makes and removes.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "ifec/common/checks.h"
#include "ifec/live/af_packet_port.h"
#include "ifec/live/daemons.h"
#include "ifec/live/grpc_clients.h"
#include "ifec/live/netns.h"
#include "ifec/live/node_runtime.h"

using namespace ifec;

namespace {

// Runs the loop until `done` or 10 s; false on timeout.
bool run_until(live::EpollLoop& loop, const std::function<bool()>& done) {
  const common::TimeNs deadline = loop.now() + 10'000'000'000ULL;
  while (!done() && loop.now() < deadline) {
    loop.schedule(loop.now() + 1'000'000, [] {});
    loop.serve(loop.now() + 1'000'000);
  }
  return done();
}

class SwitchdTest : public testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = live::netns_unavailable(); !why.empty()) {
      GTEST_SKIP() << why;
    }
    topo_ = routing::make_superpod(2, 1, 400, 1);
    file_ = "/tmp/ifec-test-topo-" + std::to_string(getpid()) + ".yaml";
    std::ofstream(file_) << routing::to_yaml(topo_);
    const std::string tag = "ifec-d" + std::to_string(getpid());
    sw_ns_ = std::make_unique<live::ScopedNetns>(tag + "-sw");
    for (int g = 0; g < 2; ++g) {
      gpu_ns_.push_back(std::make_unique<live::ScopedNetns>(tag + "-g" + std::to_string(g)));
    }
    for (const routing::Link& l : topo_.links) {
      live::make_veth(*gpu_ns_[topo_.nodes[l.a].gpu_index], live::fabric_ifname(l.a_port), *sw_ns_,
                      live::fabric_ifname(l.b_port));
    }
    opts_.topology_file = file_;
    opts_.node = "p0-sw";
    opts_.netns = sw_ns_->name();
    opts_.mgmt_loopback = true;
    opts_.insecure = true;  // plaintext here; mutual TLS and roles: bindings/tests/test_live_security.py
    daemon_ = std::make_unique<live::SwitchDaemon>(opts_);
    thread_ = std::thread([this] { daemon_->run(); });
    control_ = std::make_unique<live::GrpcControl>(
        loop_, topo_, [this](int node) { return live::daemon_address(opts_, node); }, 1'000'000'000);
  }
  void TearDown() override {
    stop_daemon();
    control_.reset();
    gpu_ns_.clear();
    sw_ns_.reset();
    std::remove(file_.c_str());
  }
  void stop_daemon() {
    if (daemon_) {
      daemon_->stop();
      thread_.join();
      daemon_.reset();
    }
  }
  template <typename T>
  common::ControlReply<T> wait(const std::function<void(std::function<void(const common::ControlReply<T>&)>)>& call) {
    std::optional<common::ControlReply<T>> got;
    call([&](const common::ControlReply<T>& r) { got = r; });
    EXPECT_FALSE(got.has_value()) << "answers come as events on the loop, never inside the call";
    EXPECT_TRUE(run_until(loop_, [&] { return got.has_value(); })) << "no answer within 10 s";
    return got.value_or(common::ControlReply<T>{});
  }
  common::ControlStatus status(const std::function<void(common::ControlPlane::Done)>& call) {
    std::optional<common::ControlStatus> got;
    call([&](const common::ControlStatus& s) { got = s; });
    EXPECT_TRUE(run_until(loop_, [&] { return got.has_value(); })) << "no answer within 10 s";
    return got.value_or(common::ControlError{"?", "no answer"});
  }

  routing::Topology topo_;
  std::string file_;
  std::unique_ptr<live::ScopedNetns> sw_ns_;
  std::vector<std::unique_ptr<live::ScopedNetns>> gpu_ns_;
  live::DaemonOptions opts_;
  std::unique_ptr<live::SwitchDaemon> daemon_;
  std::thread thread_;
  live::EpollLoop loop_;
  std::unique_ptr<live::GrpcControl> control_;
};

// A TCP relay on an ephemeral loopback port that holds each connection `delay` before it connects on to
// 127.0.0.1:`target` and relays both ways: a daemon whose host has not scheduled it for a while, as seen from a client.
class SlowProxy {
 public:
  SlowProxy(int target, std::chrono::milliseconds delay) : target_(target), delay_(delay) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    IFEC_CHECK(listen_fd_ >= 0 && bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), len) == 0 &&
                   listen(listen_fd_, 16) == 0 && getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0,
               "SlowProxy: no loopback listener");
    port_ = ntohs(a.sin_port);
    accept_thread_ = std::thread([this] { accept_loop(); });
  }
  ~SlowProxy() {
    stop_ = true;
    accept_thread_.join();  // then nothing adds to relays_
    for (std::thread& t : relays_) {
      t.join();
    }
    close(listen_fd_);
  }
  int port() const { return port_; }
  int connections() const { return connections_; }

 private:
  void accept_loop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 50) == 1) {
        const int fd = accept(listen_fd_, nullptr, nullptr);
        ++connections_;
        relays_.emplace_back([this, fd] { relay(fd); });
      }
    }
  }
  void relay(int client) {
    std::this_thread::sleep_for(delay_);
    const int server = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(target_));
    if (connect(server, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      char buf[16384];
      while (!stop_) {
        if (poll(p, 2, 50) <= 0) {
          continue;
        }
        const int from = (p[0].revents != 0) ? 0 : 1;
        const ssize_t n = read(p[from].fd, buf, sizeof buf);
        if (n <= 0 || write(p[1 - from].fd, buf, static_cast<size_t>(n)) != n) {
          break;
        }
      }
    }
    close(server);
    close(client);
  }

  int target_;
  std::chrono::milliseconds delay_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread accept_thread_;
  std::vector<std::thread> relays_;
};

common::GroupReservation group(uint16_t id, uint32_t slots) {
  common::GroupReservation r;
  r.group = id;
  r.slots = slots;
  r.members = {{true, 0x0A000001, 0, 1, true}, {true, 0x0A000002, 0, 2, true}};
  return r;
}

}  // namespace

TEST_F(SwitchdTest, ReserveReleaseSlotsCountersAndWeightsOverGrpc) {
  const auto slots = wait<uint32_t>([&](auto done) { control_->free_slots("p0-sw", done); });
  ASSERT_TRUE(slots.ok()) << slots.error->message();
  EXPECT_EQ(slots.value, topo_.params.ifec.slot_pool);
  EXPECT_FALSE(status([&](auto done) { control_->reserve("p0-sw", group(7, 64), done); }).has_value());
  const auto after = wait<uint32_t>([&](auto done) { control_->free_slots("p0-sw", done); });
  EXPECT_EQ(after.value, slots.value - 64);
  const auto counters = wait<common::IfecCounters>([&](auto done) { control_->counters("p0-sw", done); });
  ASSERT_TRUE(counters.ok());
  EXPECT_EQ(counters.value.reservations, 1u);
  // More slots than the switch has: refused, naming the switch.
  const common::ControlStatus big =
      status([&](auto done) { control_->reserve("p0-sw", group(8, slots.value * 2), done); });
  ASSERT_TRUE(big.has_value());
  EXPECT_EQ(big->target, "p0-sw");
  EXPECT_NE(big->message().find("p0-sw"), std::string::npos) << big->message();
  EXPECT_FALSE(status([&](auto done) { control_->release("p0-sw", 1, 7, done); }).has_value());
  EXPECT_EQ(wait<uint32_t>([&](auto done) { control_->free_slots("p0-sw", done); }).value, slots.value);
  // FARE: the GPUs' daemons are not running, so the switch has no route toward them (an empty group, not an error).
  const auto w = wait<std::vector<common::PortWeight>>([&](auto done) { control_->fare_weights("p0-sw", 1, done); });
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(w.value.empty());
  const auto bad = wait<std::vector<common::PortWeight>>([&](auto done) { control_->fare_weights("p0-sw", 9, done); });
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error->message().find("destination GPU 9 outside 0..1"), std::string::npos) << bad.error->message();
  const auto nobody = wait<uint32_t>([&](auto done) { control_->free_slots("p9-sw", done); });
  ASSERT_FALSE(nobody.ok());
  EXPECT_NE(nobody.error->message().find("p9-sw: no such switch"), std::string::npos) << nobody.error->message();
}

TEST_F(SwitchdTest, AStoppedDaemonIsAnErrorNamingItWithinTheDeadline) {
  ASSERT_TRUE(wait<uint32_t>([&](auto done) { control_->free_slots("p0-sw", done); }).ok());
  stop_daemon();
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = wait<uint32_t>([&](auto done) { control_->free_slots("p0-sw", done); });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error->target, "p0-sw");
  EXPECT_NE(r.error->message().find("p0-sw (127.0.0.1:"), std::string::npos) << r.error->message();
  EXPECT_LT(s, 3.0) << "the 1 s deadline bounds the wait";
}

// A daemon slow to answer a new connection (its host had other work: a loaded CI machine, many containers) is waited
// for: gRPC bounds one connection attempt by its minimum reconnect back-off, which was 100 ms here and failed such
// calls at once as unreachable ("timed out before receiving SETTINGS frame").
TEST_F(SwitchdTest, ADaemonSlowToAcceptAConnectionIsWaitedFor) {
  const std::string addr = live::daemon_address(opts_, topo_.find_node("p0-sw"));
  SlowProxy proxy(std::stoi(addr.substr(addr.rfind(':') + 1)), std::chrono::milliseconds(400));
  // The fixture's control plane (it outlives the call until TearDown, as the daemons' does), through the relay.
  const int port = proxy.port();
  control_ = std::make_unique<live::GrpcControl>(
      loop_, topo_, [port](int) { return "127.0.0.1:" + std::to_string(port); }, 3'000'000'000ULL);
  const auto slots = wait<uint32_t>([&](auto done) { control_->free_slots("p0-sw", done); });
  ASSERT_TRUE(slots.ok()) << slots.error->message();
  EXPECT_EQ(slots.value, topo_.params.ifec.slot_pool);
  EXPECT_EQ(proxy.connections(), 1) << "one attempt that lasted its 400 ms, not tries cut short";
}

// A switch whose name does not resolve (a container platform's DNS that misses a name for a moment: Docker swarm's
// just after a stack came up) is asked once more when its channel resolves again (about a second later), and the
// answer then names the switch: nothing was sent, so the call is safe to make again.
TEST(GrpcControlNames, AnUnresolvedSwitchIsAskedOnceMoreAfterItsNameMayResolveAgain) {
  live::EpollLoop loop;
  const routing::Topology topo = routing::make_superpod(2, 1, 400, 1);
  live::GrpcControl control(
      loop, topo, [](int) { return std::string("ifec-no-such-switch.invalid:50051"); }, 5'000'000'000ULL);
  std::optional<common::ControlReply<uint32_t>> got;
  const auto t0 = std::chrono::steady_clock::now();
  control.free_slots("p0-sw", [&](const common::ControlReply<uint32_t>& r) { got = r; });
  ASSERT_TRUE(run_until(loop, [&] { return got.has_value(); })) << "no answer within 10 s";
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(got->ok());
  const std::string why = got->error->message();
  EXPECT_NE(why.find("p0-sw (ifec-no-such-switch.invalid:50051): unreachable"), std::string::npos) << why;
  EXPECT_NE(why.find("resolution failed"), std::string::npos) << why;
  EXPECT_GE(s, 1.2) << "answered without asking again once the name could resolve again: " << why;
  EXPECT_LT(s, 4.0) << "asked more than once more";
}

// Threads of this process with this name.
int threads_named(const std::string& name) {
  int n = 0;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task")) {
    std::string comm;
    std::getline(std::ifstream(t.path() / "comm"), comm);
    n += comm == name ? 1 : 0;
  }
  return n;
}

// gRPC's process-wide queue for callback-API calls (and its polling threads) outlives every channel the project
// makes: torn down with the last channel, right after a call a stopped daemon had refused, it once aborted a test.
TEST(GrpcCallbackQueue, OutlivesEveryChannelTheProcessMade) {
  const routing::Topology topo = routing::make_superpod(2, 1, 400, 1);
  {
    live::EpollLoop loop;
    live::GrpcControl control(
        loop, topo, [](int) { return std::string("127.0.0.1:1"); }, 2'000'000'000ULL);
    std::optional<common::ControlReply<uint32_t>> got;
    control.free_slots("p0-sw", [&](const common::ControlReply<uint32_t>& r) { got = r; });
    ASSERT_TRUE(run_until(loop, [&] { return got.has_value(); })) << "no answer within 10 s";
    EXPECT_FALSE(got->ok()) << "nothing listens on 127.0.0.1:1";
    if (threads_named("nexting_thread") == 0) {
      GTEST_SKIP() << "this gRPC gives each channel its own callback queue: nothing process-wide to keep";
    }
  }
  EXPECT_GT(threads_named("nexting_thread"), 0) << "the callback queue went with the last channel";
}

// A reconnect whose peer hostd is gone: every try is refused at once (nothing listens on the loopback port), the
// tries are 200 ms apart, and the answer names the daemon and its address: the QP's waiting work then fails with
// that, not a hang.
TEST(ResetPeerResponder, ADeadPeerIsNamedAfterItsTries) {
  live::EpollLoop loop;
  auto alive = std::make_shared<bool>(true);
  std::optional<std::string> error;
  const auto t0 = std::chrono::steady_clock::now();
  live::reset_peer_responder(loop, alive, "gpu1", "127.0.0.1:1", 0, 0, 77, 500'000'000, 3,
                             [&](const std::string& e) { error = e; });
  ASSERT_TRUE(run_until(loop, [&] { return error.has_value(); })) << "no answer within 10 s";
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(error->find("gpu1 (127.0.0.1:1): unreachable"), std::string::npos) << *error;
  EXPECT_GE(s, 0.4) << "3 tries, 200 ms apart";
  EXPECT_LT(s, 3.0);
}

// A daemon started for a node of the other kind, or for no node, says so before it opens anything.
TEST(DaemonNode, TheWrongKindOfNodeIsNamedWithTheDaemonThatRunsIt) {
  setenv("IFEC_TEST_TOPO", routing::to_yaml(routing::make_superpod(2, 1, 800, 1)).c_str(), 1);
  auto error_of = [](auto make, const std::string& node) -> std::string {
    live::DaemonOptions o;
    o.topology_file = "env:IFEC_TEST_TOPO";
    o.node = node;
    o.insecure = true;
    try {
      make(o);
    } catch (const common::Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  auto switchd = [](live::DaemonOptions o) { live::SwitchDaemon d(std::move(o)); };
  auto hostd = [](live::DaemonOptions o) { live::HostDaemon d(std::move(o)); };
  EXPECT_NE(error_of(switchd, "gpu0").find("node gpu0 is a GPU: run ifec-hostd for it, not ifec-switchd"),
            std::string::npos)
      << error_of(switchd, "gpu0");
  EXPECT_NE(error_of(hostd, "p0-sw").find("node p0-sw is a switch: run ifec-switchd for it, not ifec-hostd"),
            std::string::npos)
      << error_of(hostd, "p0-sw");
  EXPECT_NE(error_of(hostd, "gpu9").find("no node 'gpu9'"), std::string::npos) << error_of(hostd, "gpu9");
  unsetenv("IFEC_TEST_TOPO");
}

// Containers: Docker names a container's interfaces; the daemons find their end of link L by its address in the
// compose file's /29 for L (ifec.containers), whatever the interface is called.
TEST(InterfacesBySubnet, EachLinksInterfaceIsFoundByItsAddress) {
  if (const std::string why = live::netns_unavailable(); !why.empty()) {
    GTEST_SKIP() << why;
  }
  const routing::Topology topo = routing::make_superpod(2, 1, 800, 2);  // gpu0: two sub-links to p0-sw
  const int gpu0 = topo.find_node("gpu0");
  const std::vector<int> links = topo.links_of(gpu0);
  ASSERT_EQ(links.size(), 2u);
  const std::string tag = "ifec-c" + std::to_string(getpid());
  live::ScopedNetns a(tag + "-a"), b(tag + "-b");
  live::make_veth(a, "eth7", b, "x0");
  live::make_veth(a, "eth3", b, "x1");
  const uint32_t base = 0x0A400000;  // 10.64.0.0
  auto addr_in = [&](int link, int host) {
    const uint32_t ip = base + 8 * static_cast<uint32_t>(link) + static_cast<uint32_t>(host);
    return std::to_string(ip >> 24) + "." + std::to_string((ip >> 16) & 255) + "." + std::to_string((ip >> 8) & 255) +
           "." + std::to_string(ip & 255) + "/29";
  };
  // The second link on the interface Docker happened to call eth3, the first on eth7.
  a.ip({"addr", "add", addr_in(links[1], 2), "dev", "eth3"});
  a.ip({"addr", "add", addr_in(links[0], 3), "dev", "eth7"});
  auto port_of = [&](int link) {
    const routing::Link& l = topo.links[link];
    return l.a == gpu0 ? l.a_port : l.b_port;
  };
  {
    live::NetnsGuard in(a.name());
    const std::map<int, std::string> m = live::interfaces_by_subnet(topo, gpu0, base);
    EXPECT_EQ(m.size(), 2u);
    EXPECT_EQ(m.at(port_of(links[0])), "eth7");
    EXPECT_EQ(m.at(port_of(links[1])), "eth3");
  }
  a.ip({"addr", "flush", "dev", "eth3"});
  live::NetnsGuard in(a.name());
  try {
    live::interfaces_by_subnet(topo, gpu0, base);
    FAIL() << "a link without an interface must be an error";
  } catch (const common::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no interface in link " + std::to_string(links[1]) + "'s network"),
              std::string::npos)
        << e.what();
  }
}
