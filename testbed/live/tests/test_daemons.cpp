// The gRPC control plane from C++, against a real ifec-switchd: the rank-side GrpcControl reserves and releases
// groups, reads slots, counters and FARE weights, gets errors that name the switch and the reason, and a stopped
// daemon is an error naming it within the deadline, never a hang. The switch runs in this process (its own loop
// thread) on veths in namespaces this test makes and removes.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <thread>

#include "../src/daemon_serve.h"  // parse_daemon_options: the daemons' command line
#include "ifec/common/checks.h"
#include "ifec/live/af_packet_port.h"
#include "ifec/live/daemons.h"
#include "ifec/live/grpc_clients.h"
#include "ifec/live/host_ring.h"
#include "ifec/live/netns.h"
#include "ifec/live/node_runtime.h"
#include "ifec/v1/control.grpc.pb.h"

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

// Writes `topo` where the daemons read it, a file of this process's (the fixture's TearDown removes it).
std::string topology_file(const routing::Topology& topo, const std::string& stem) {
  const std::string file = "/tmp/" + stem + std::to_string(getpid()) + ".yaml";
  std::ofstream(file) << routing::to_yaml(topo);
  return file;
}

class SwitchdTest : public testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = live::netns_unavailable(); !why.empty()) {
      GTEST_SKIP() << why;
    }
    topo_ = routing::make_superpod(2, 1, 400, 1);
    file_ = topology_file(topo_, "ifec-test-topo-");
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

// ------------------------------------------------------------------------------------- bad requests, bad options --

namespace {

// A request's outcome: the status, and its message.
template <typename Stub, typename Req, typename Rep>
grpc::Status call(Stub& stub, grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Req&, Rep*), const Req& q,
                  Rep* out = nullptr, std::chrono::seconds deadline = std::chrono::seconds(5)) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  Rep ignored;
  return (stub.*rpc)(&ctx, q, out ? out : &ignored);
}

std::string text(const grpc::Status& s) { return std::to_string(s.error_code()) + " " + s.error_message(); }

}  // namespace

// Fields wider than the switch's structs are refused, naming the field and value: narrowed, Release of group 65543
// released group 7, and a reservation of dtype 256 was one of fp32.
TEST_F(SwitchdTest, FieldsOutsideTheirTypesAreRefusedNamingThem) {
  auto stub = v1::Switch::NewStub(
      grpc::CreateChannel(live::daemon_address(opts_, topo_.find_node("p0-sw")), grpc::InsecureChannelCredentials()));
  v1::GroupReservation r;
  r.set_job(1);
  r.set_group(7);
  r.set_op(static_cast<uint32_t>(common::EchOp::kAllReduce));
  r.set_slots(64);
  for (uint32_t ip : {0x0A000001u, 0x0A000002u}) {
    v1::GroupMember* m = r.add_members();
    m->set_local(true);
    m->set_ip(ip);
    m->set_destination(true);
  }
  ASSERT_TRUE(call(*stub, &v1::Switch::Stub::Reserve, r).ok());
  v1::FreeSlotsReply before;
  ASSERT_TRUE(call(*stub, &v1::Switch::Stub::FreeSlots, v1::Empty(), &before).ok());
  v1::ReleaseRequest rel;
  rel.set_job(1);
  rel.set_group(65536 + 7);
  const grpc::Status released = call(*stub, &v1::Switch::Stub::Release, rel);
  EXPECT_EQ(released.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << text(released);
  EXPECT_NE(released.error_message().find("p0-sw: release: group 65543 outside 0..65535"), std::string::npos)
      << text(released);
  v1::FreeSlotsReply after;
  ASSERT_TRUE(call(*stub, &v1::Switch::Stub::FreeSlots, v1::Empty(), &after).ok());
  EXPECT_EQ(after.slots(), before.slots()) << "group 7 was released by another group's number";
  const std::vector<std::pair<std::function<void(v1::GroupReservation&)>, std::string>> bad = {
      {[](auto& q) { q.set_group(70000); }, "group 70000 outside 0..65535"},
      {[](auto& q) { q.set_dtype(256); }, "dtype 256 outside 0..3"},
      {[](auto& q) { q.set_redop(3); }, "redop 3 outside 0..2"},
      {[](auto& q) { q.set_op(0); }, "op 0 outside 1..4"},
      {[](auto& q) { q.set_window(65536); }, "window 65536 outside 0..65535"},
      {[](auto& q) { q.set_upstream_contributor(1u << 20); }, "upstream_contributor 1048576 outside 0..65535"},
  };
  for (const auto& [edit, why] : bad) {
    v1::GroupReservation q = r;
    q.set_group(8);
    edit(q);
    const grpc::Status s = call(*stub, &v1::Switch::Stub::Reserve, q);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << text(s);
    EXPECT_NE(s.error_message().find("p0-sw: reservation: " + why), std::string::npos) << text(s);
  }
  v1::WindowRegistration w;
  w.set_gpu(-1);
  const grpc::Status negative = call(*stub, &v1::Switch::Stub::RegisterWindow, w);
  EXPECT_NE(negative.error_message().find("window registration: gpu -1 outside 0..1"), std::string::npos)
      << text(negative);
  w.set_gpu(1);
  w.set_window(65537);
  const grpc::Status wide = call(*stub, &v1::Switch::Stub::RegisterWindow, w);
  EXPECT_NE(wide.error_message().find("window 65537 outside 0..65535"), std::string::npos) << text(wide);
  ASSERT_TRUE(call(*stub, &v1::Switch::Stub::FreeSlots, v1::Empty(), &after).ok());
  EXPECT_EQ(after.slots(), before.slots()) << "a refused reservation took slots";
}

// Three GPUs under one switch, every daemon in this process (each on its own loop thread) on veths in namespaces this
// test makes and removes; the hostds bootstrapped before each test. Requests go to their gRPC services as any
// client's would.
class HostdTest : public testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = live::netns_unavailable(); !why.empty()) {
      GTEST_SKIP() << why;
    }
    topo_ = routing::make_superpod(3, 1, 400, 1);
    file_ = topology_file(topo_, "ifec-test-hostd-topo-");
    const std::string tag = "ifec-h" + std::to_string(getpid());
    for (size_t i = 0; i < topo_.nodes.size(); ++i) {
      ns_.push_back(std::make_unique<live::ScopedNetns>(tag + "-" + std::to_string(i)));
    }
    for (const routing::Link& l : topo_.links) {
      live::make_veth(*ns_[l.a], live::fabric_ifname(l.a_port), *ns_[l.b], live::fabric_ifname(l.b_port));
    }
    daemons_.resize(topo_.nodes.size());
    for (size_t i = 0; i < topo_.nodes.size(); ++i) {
      start(i);
    }
    ASSERT_TRUE(all_ready()) << "the hostds did not bootstrap within 30 s";
  }
  void TearDown() override {
    for (Daemon& d : daemons_) {
      if (d.thread.joinable()) {
        d.sw ? d.sw->stop() : d.host->stop();
        d.thread.join();
      }
    }
    daemons_.clear();
    ns_.clear();
    std::remove(file_.c_str());
  }
  live::DaemonOptions options(size_t node) const {
    live::DaemonOptions o;
    o.topology_file = file_;
    o.node = topo_.nodes[node].name;
    o.netns = ns_[node]->name();
    o.mgmt_loopback = true;
    o.insecure = true;
    return o;
  }
  void start(size_t node) {
    Daemon& d = daemons_[node];
    if (topo_.nodes[node].kind == routing::NodeKind::kSwitch) {
      d.sw = std::make_unique<live::SwitchDaemon>(options(node));
      d.thread = std::thread([&d] { d.sw->run(); });
    } else {
      d.host = std::make_unique<live::HostDaemon>(options(node));
      d.thread = std::thread([&d] { d.host->run(); });
    }
  }
  bool all_ready() {
    for (int i = 0; i < 300; ++i) {
      int ready = 0;
      for (int g = 0; g < topo_.num_gpus(); ++g) {
        v1::NodeStatus st;
        ready += call(host(g), &v1::Host::Stub::Status, v1::Empty(), &st, std::chrono::seconds(1)).ok() && st.ready();
      }
      if (ready == topo_.num_gpus()) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
  v1::Host::Stub& host(int gpu) {
    auto& stub = stubs_[gpu];
    if (!stub) {
      stub = v1::Host::NewStub(grpc::CreateChannel(live::daemon_address(options(0), topo_.gpu_node(gpu)),
                                                   grpc::InsecureChannelCredentials()));
    }
    return *stub;
  }
  // Run at one rank: its reply (its error says what was refused).
  v1::RunReply run(int gpu, const v1::RunRequest& q) {
    v1::RunReply r;
    const grpc::Status s = call(host(gpu), &v1::Host::Stub::Run, q, &r, std::chrono::seconds(20));
    EXPECT_TRUE(s.ok()) << text(s);
    return r;
  }
  // Run at every rank at once (as a driver asks them): their replies.
  std::vector<v1::RunReply> run_everywhere(const v1::RunRequest& q) {
    std::vector<std::thread> ranks;
    std::vector<v1::RunReply> replies(topo_.num_gpus());
    for (int g = 0; g < topo_.num_gpus(); ++g) {
      ranks.emplace_back([&, g] { replies[g] = run(g, q); });
    }
    for (std::thread& t : ranks) {
      t.join();
    }
    return replies;
  }

  struct Daemon {
    std::unique_ptr<live::SwitchDaemon> sw;
    std::unique_ptr<live::HostDaemon> host;
    std::thread thread;
  };
  routing::Topology topo_;
  std::string file_;
  std::vector<std::unique_ptr<live::ScopedNetns>> ns_;  // [node]
  std::vector<Daemon> daemons_;                         // [node]
  std::map<int, std::unique_ptr<v1::Host::Stub>> stubs_;
};

v1::RunRequest run_request(const std::string& what, uint64_t bytes, const std::string& algo = "") {
  v1::RunRequest q;
  q.set_what(what);
  q.set_bytes(bytes);
  q.set_algo(algo);
  return q;
}

// Sizes no window can hold are refused before anything is allocated, naming them; the ranks then run as before. An
// all-to-all of (2^64 + 194) / 3 B per peer over 3 ranks asked for 194-byte windows (the product wrapped) and wrote
// 2^62 B into them (SIGSEGV); a one-shot AllReduce of 2 GiB allocated its buffer, then threw its 6 GiB scratch
// window's error on the loop, where no reply went out (the caller waited for its deadline).
TEST_F(HostdTest, SizesAWindowCannotHoldAreRefusedNamingThem) {
  v1::RunRequest repeated = run_request("allreduce", 4096);  // and repeats, which hostd ran once without saying so
  repeated.set_iterations(5);
  const std::vector<std::pair<v1::RunRequest, std::string>> bad = {
      {run_request("alltoall", 6148914691236517270ULL),
       "all-to-all: 6148914691236517270 B per peer for 3 ranks is more than a window holds (4 GiB)"},
      {run_request("allreduce", uint64_t{8} << 30), "size 8589934592 B is more than a window holds (4 GiB)"},
      {run_request("allreduce", uint64_t{2} << 30, "oneshot"),
       "allreduce of 2147483648 B over 3 ranks needs a 2147483648 B buffer and a 644245"},  // 6 GiB and a little
      {repeated, "iterations 5: a hostd runs one operation per request (iterations 0 or 1); the driver repeats it"},
  };
  for (const auto& [q, why] : bad) {
    for (const v1::RunReply& r : run_everywhere(q)) {
      EXPECT_FALSE(r.ok());
      EXPECT_NE(r.error().find(why), std::string::npos) << r.error();
    }
  }
  // Splits that add up to the input only by wrapping around.
  v1::RunRequest q = run_request("alltoall", 16);
  q.set_input(std::string(16, 'x'));
  for (uint64_t s : {UINT64_MAX - 7, uint64_t{16}, uint64_t{8}}) {
    q.add_send_splits(s);
  }
  const v1::RunReply wrapped = run(0, q);
  EXPECT_NE(wrapped.error().find("send split 18446744073709551608 B (rank 0) brings the send splits past 16 B"),
            std::string::npos)
      << wrapped.error();
  // Then an operation on every rank runs and checks out.
  for (const v1::RunReply& r : run_everywhere(run_request("allreduce", 4096, "ring"))) {
    EXPECT_TRUE(r.ok()) << r.error();
  }
}

// An operation number past the clock (microseconds since 1970) by more than a day is refused: rank 0's hub took it
// as the newest operation and refused every later one as superseded ("has started since") until hostd restarted.
TEST_F(HostdTest, AnOperationNumberFarPastTheClockIsRefusedAndTheHubKeepsServing) {
  v1::AllgatherRequest q;
  q.set_rank(1);
  q.set_epoch(UINT64_MAX);
  const grpc::Status s =
      call(host(0), &v1::Host::Stub::Allgather, q, static_cast<v1::AllgatherReply*>(nullptr), std::chrono::seconds(5));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << text(s);
  EXPECT_NE(s.error_message().find("of operation 18446744073709551615: operation numbers are at most the "
                                   "microseconds since 1970 plus a day"),
            std::string::npos)
      << text(s);
  v1::RunRequest op = run_request("allreduce", 4096, "ring");
  const auto now_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch());
  op.set_run_id((static_cast<uint64_t>(now_us.count()) / 3 + 1) * 3);  // as ifec.live numbers them
  for (const v1::RunReply& r : run_everywhere(op)) {
    EXPECT_TRUE(r.ok()) << r.error();
  }
}

// A hub holds at most 64 rounds at once (each holds a gRPC thread per waiting part for up to 30 s): a client asking
// for new rounds without end is refused past that, and the next operation supersedes the rounds it left and runs.
TEST_F(HostdTest, AHubHoldsABoundedNumberOfRounds) {
  const auto now_us = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  std::vector<grpc::Status> got(80);
  std::vector<std::thread> callers;
  for (size_t seq = 0; seq < got.size(); ++seq) {
    callers.emplace_back([&, seq] {
      v1::AllgatherRequest q;
      q.set_rank(1);
      q.set_epoch(now_us);
      q.set_seq(seq);
      got[seq] = call(host(0), &v1::Host::Stub::Allgather, q, static_cast<v1::AllgatherReply*>(nullptr),
                      std::chrono::seconds(3));
    });
  }
  for (std::thread& t : callers) {
    t.join();
  }
  size_t refused = 0;
  for (const grpc::Status& s : got) {
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      EXPECT_NE(s.error_message().find("64 allgathers are already waiting at this hub"), std::string::npos) << text(s);
      ++refused;
    } else {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << text(s);  // waiting for ranks 0 and 2
    }
  }
  EXPECT_EQ(refused, got.size() - 64);
  v1::RunRequest op = run_request("allreduce", 4096, "ring");
  op.set_run_id((now_us / 3 + 2) * 3);
  for (const v1::RunReply& r : run_everywhere(op)) {
    EXPECT_TRUE(r.ok()) << r.error();
  }
}

// An all-to-all on the caller's data whose splits two ranks disagree on fails on every rank at once, naming the pair:
// each receiver checked only what was sent to it, so rank 2, which the disagreement did not concern, went on to wait
// for stores that never came until its deadline (and its hostd held the operation for a minute, failing the next
// program's). An all-to-all against another rank's collective is named as such. Then the ranks run on.
TEST_F(HostdTest, AnAlltoallsDisagreeingSplitsFailEveryRankAtOnce) {
  auto alltoall = [](const std::vector<uint64_t>& send, const std::vector<uint64_t>& recv) {
    v1::RunRequest q = run_request("alltoall", 0);
    uint64_t bytes = 0;
    for (size_t i = 0; i < send.size(); ++i) {
      q.add_send_splits(send[i]);
      q.add_recv_splits(recv[i]);
      bytes += send[i];
    }
    q.set_bytes(bytes);
    q.set_input(std::string(bytes, 'x'));
    return q;
  };
  auto run_each = [&](const std::vector<v1::RunRequest>& qs) {
    std::vector<std::thread> ranks;
    std::vector<v1::RunReply> replies(qs.size());
    for (size_t g = 0; g < qs.size(); ++g) {
      ranks.emplace_back([&, g] { replies[g] = run(static_cast<int>(g), qs[g]); });
    }
    for (std::thread& t : ranks) {
      t.join();
    }
    return replies;
  };
  const auto t0 = std::chrono::steady_clock::now();
  // Rank 0 sends rank 1 8 B, which expects 4.
  for (const v1::RunReply& r :
       run_each({alltoall({4, 8, 4}, {4, 4, 4}), alltoall({4, 4, 4}, {4, 4, 4}), alltoall({4, 4, 4}, {4, 4, 4})})) {
    EXPECT_FALSE(r.ok());
    EXPECT_NE(r.error().find("alltoall: rank 0 sends 8 B to rank 1, which expects 4 B (its recv splits)"),
              std::string::npos)
        << r.error();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  const std::vector<v1::RunReply> mixed =
      run_each({alltoall({4, 4, 4}, {4, 4, 4}), alltoall({4, 4, 4}, {4, 4, 4}), run_request("allreduce", 12)});
  for (size_t g = 0; g < mixed.size(); ++g) {
    EXPECT_FALSE(mixed[g].ok());
    EXPECT_NE(
        mixed[g].error().find("rank 2 runs allreduce of 3 fp32 elements, sum, algorithm ifec where " +
                              std::string(g < 2 ? "this rank" : "rank 0") + " runs alltoall of the caller's data"),
        std::string::npos)
        << mixed[g].error();
  }
  for (const v1::RunReply& r :
       run_each({alltoall({4, 4, 4}, {4, 4, 4}), alltoall({4, 4, 4}, {4, 4, 4}), alltoall({4, 4, 4}, {4, 4, 4})})) {
    EXPECT_TRUE(r.ok()) << r.error();
  }
}

// An operation may run at each rank for as long as its caller's deadline allows, less a tenth (at least 1 s), so that
// hostd's error naming what is stuck reaches the caller first. A fixed 60 s limit failed a 1 GiB AllReduce whose
// caller allowed 250 s, and a caller allowing less heard only DEADLINE_EXCEEDED.
TEST_F(HostdTest, AnOperationRunsAsLongAsItsCallerAllows) {
  auto sw = v1::Switch::NewStub(grpc::CreateChannel(live::daemon_address(options(0), topo_.find_node("p0-sw")),
                                                    grpc::InsecureChannelCredentials()));
  auto loss = [&](double probability) {
    for (int port = 0; port < topo_.num_gpus(); ++port) {
      v1::SetLossRequest q;
      q.set_port(port);
      q.set_probability(probability);
      ASSERT_TRUE(call(*sw, &v1::Switch::Stub::SetLoss, q).ok());
    }
  };
  loss(0.9999);  // about every frame the switch forwards is dropped: the AllReduce cannot finish
  std::vector<std::thread> ranks;
  std::vector<grpc::Status> status(topo_.num_gpus());
  std::vector<v1::RunReply> replies(topo_.num_gpus());
  // Numbered as a driver numbers them (run_id): ranks that the failed operation left at different bootstrap rounds
  // then cannot pair the next operation's rounds with them.
  v1::RunRequest q = run_request("allreduce", 1 << 16, "ring");
  q.set_run_id(1);
  for (int g = 0; g < topo_.num_gpus(); ++g) {
    ranks.emplace_back(
        [&, g] { status[g] = call(host(g), &v1::Host::Stub::Run, q, &replies[g], std::chrono::seconds(6)); });
  }
  for (std::thread& t : ranks) {
    t.join();
  }
  for (int g = 0; g < topo_.num_gpus(); ++g) {
    ASSERT_TRUE(status[g].ok()) << "rank " << g << ": " << text(status[g]);  // hostd answered before the deadline
    EXPECT_FALSE(replies[g].ok());
    EXPECT_TRUE(std::regex_search(replies[g].error(), std::regex("did not finish within [1-5][0-9]{6} us")))
        << replies[g].error();
  }
  // The next operation then succeeds, after the fence that follows a failure (comm_schedule.cpp): on two busy cores
  // a rank that left its single barrier first had its first stores dropped by a peer that had not yet heard it end.
  loss(0.0);
  q.set_run_id(2);
  for (const v1::RunReply& r : run_everywhere(q)) {
    EXPECT_TRUE(r.ok()) << r.error();
  }
}

// Point-to-point transfers (what = send, the torch backend's send and recv): each meets its peer's on the channel of
// its direction, a hostd serving several at once (GPU 1 sends to 0 and 2 while it receives from both); the receiver
// gets the sender's bytes; sizes or tags that disagree fail both sides naming each; bad requests are named.
TEST_F(HostdTest, ATransferMeetsItsPeerOnItsChannelWhileOthersRun) {
  auto transfer = [](int from, int to, bool sender, const std::string& data, int64_t tag = 0) {
    v1::RunRequest q = run_request("send", data.size());
    q.add_members(from);
    q.add_members(to);
    q.set_tag(tag);
    q.set_run_id(3);  // the channel's first transfer (a number alike at both ends)
    if (sender) {
      q.set_input(data);
    }
    return q;
  };
  auto bytes = [](int from, int to, size_t n) {
    std::string s(n, 0);
    for (size_t i = 0; i < n; ++i) {
      s[i] = static_cast<char>(from * 37 + to * 11 + i * 7);
    }
    return s;
  };
  std::vector<std::pair<int, v1::RunRequest>> calls;  // (GPU, its request): every transfer both ways round 0-1-2
  for (auto [from, to] : std::vector<std::pair<int, int>>{{0, 1}, {1, 0}, {1, 2}, {2, 1}}) {
    const std::string data = bytes(from, to, 3000 + 1000 * from + to);
    calls.emplace_back(from, transfer(from, to, true, data));
    calls.emplace_back(to, transfer(from, to, false, data));
  }
  std::vector<v1::RunReply> replies(calls.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < calls.size(); ++i) {
    threads.emplace_back([&, i] { replies[i] = run(calls[i].first, calls[i].second); });
  }
  for (std::thread& t : threads) {
    t.join();
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    const v1::RunRequest& q = calls[i].second;
    ASSERT_TRUE(replies[i].ok()) << "GPU " << calls[i].first << ": " << replies[i].error();
    const bool receiver = q.input().empty();
    EXPECT_EQ(replies[i].output(), receiver ? bytes(q.members(0), q.members(1), q.bytes()) : "");
    EXPECT_NE(replies[i].row_json().find("\"collective\":\"send\""), std::string::npos) << replies[i].row_json();
  }
  // A transfer that succeeded leaves no window: channel 0 -> 1's third (number 3 mod 3 = 0) of 26000 + 6 (0 + 1).
  v1::ReadWindowRequest rd;
  rd.set_window(26006);
  rd.set_length(8);
  for (int g : {0, 1}) {
    EXPECT_EQ(call(host(g), &v1::Host::Stub::ReadWindow, rd).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  // Disagreeing tags: both sides fail, naming each side's; the channel's next transfer (its number 4) then runs.
  v1::RunRequest send = transfer(0, 1, true, "abcd", 5), recv = transfer(0, 1, false, "abcd", 6);
  send.set_run_id(4);
  recv.set_run_id(4);
  std::thread peer([&] { replies[1] = run(1, recv); });
  replies[0] = run(0, send);
  peer.join();
  for (int i = 0; i < 2; ++i) {
    EXPECT_NE(
        replies[i].error().find(std::string("GPU 0 to GPU 1: the ") + (i ? "sender runs send of 4 B with tag 5 "
                                                                           "where this receiver runs send of 4 B "
                                                                           "with tag 6"
                                                                         : "receiver runs send of 4 B with tag 6")),
        std::string::npos)
        << replies[i].error();
  }
  send.set_tag(6);
  send.set_run_id(5);
  recv.set_run_id(5);
  peer = std::thread([&] { replies[1] = run(1, recv); });
  replies[0] = run(0, send);
  peer.join();
  EXPECT_TRUE(replies[0].ok() && replies[1].ok()) << replies[0].error() << replies[1].error();
  EXPECT_EQ(replies[1].output(), "abcd");
  // A transfer another group issued than its peer's (the channel is the GPUs', whatever group): both fail.
  send.set_group(3);
  send.set_run_id(6);
  recv.set_run_id(6);
  peer = std::thread([&] { replies[1] = run(1, recv); });
  replies[0] = run(0, send);
  peer.join();
  EXPECT_NE(replies[1].error().find("the sender runs send of 4 B with tag 6 in group 3 where this receiver runs send "
                                    "of 4 B with tag 6: both sides must give the same"),
            std::string::npos)
      << replies[1].error();
  EXPECT_FALSE(replies[0].ok());
  const std::vector<std::pair<std::function<void(v1::RunRequest&)>, std::string>> bad = {
      {[](auto& q) { q.clear_members(); }, "send: 0 GPU(s): a transfer names"},
      {[](auto& q) { q.set_group(uint32_t{1} << 31); }, "send: group 2147483648: groups are numbered below 2^31"},
      {[](auto& q) { q.add_members(2); }, "send: 3 GPU(s): a transfer names its sender's and its receiver's GPU"},
      {[](auto& q) { q.set_members(1, 0); }, "send: GPU 0 to itself"},
      {[](auto& q) {
         q.set_members(0, 2);
         q.set_members(1, 1);
       },
       "send: from GPU 2 to GPU 1 does not concern GPU 0"},
      {[](auto& q) { q.set_bytes(3); }, "send: GPU 0 sends 3 B, and its request carries 4 B of input"},
      {[](auto& q) { q.set_members(1, 7); }, "GPU 7 is not a rank of topology"},
  };
  for (const auto& [change, want] : bad) {
    v1::RunRequest q = transfer(0, 1, true, "abcd");
    change(q);
    const v1::RunReply r = run(0, q);
    EXPECT_FALSE(r.ok());
    EXPECT_NE(r.error().find(want), std::string::npos) << r.error();
  }
  v1::RunRequest high = run_request("allreduce", 64);
  high.set_group(uint32_t{1} << 31);
  EXPECT_NE(run(0, high).error().find("groups are numbered below 2^31"), std::string::npos);
}

// A torch program's groups (numbered program * 4096 + count, as ifec.torch_backend does) are let go when a group of
// another program runs: hostd kept every program's communicators and windows until it exited.
TEST_F(HostdTest, AnEndedProgramsGroupsAreLetGoWhenAnotherProgramsGroupRuns) {
  auto run_group = [&](uint32_t group, std::vector<int> members, uint64_t bytes = 4096) {
    v1::RunRequest q = run_request("allreduce", bytes, "ring");
    q.set_group(group);
    for (int m : members) {
      q.add_members(m);
    }
    std::vector<std::thread> ranks;
    std::vector<v1::RunReply> replies(members.size());
    for (size_t i = 0; i < members.size(); ++i) {
      ranks.emplace_back([&, i] { replies[i] = run(members[i], q); });
    }
    for (std::thread& t : ranks) {
      t.join();
    }
    for (const v1::RunReply& r : replies) {
      EXPECT_TRUE(r.ok()) << r.error();
    }
  };
  auto holds_window = [&](int gpu, uint32_t window, uint64_t bytes = 8) {
    v1::ReadWindowRequest rd;
    rd.set_window(window);
    rd.set_length(bytes);
    return call(host(gpu), &v1::Host::Stub::ReadWindow, rd).ok();
  };
  const uint32_t first = 1 * 4096 + 1, second = 2 * 4096 + 1;
  const uint32_t first_window = 1000 + 6 * ((first - 1) % 4096), second_window = 1000 + 6 * ((second - 1) % 4096);
  run_group(first, {0, 1});
  EXPECT_TRUE(holds_window(0, first_window, 4096));
  run_group(first + 1, {0, 1});  // the same program's next group: the first is kept
  // and its 1,001st, whose windows were the first's (by number mod 1000): its 64-byte buffer replaced the first's
  run_group(first + 1000, {0, 1}, 64);
  EXPECT_TRUE(holds_window(0, first_window, 4096));
  run_group(second, {0, 2});
  EXPECT_TRUE(holds_window(0, second_window));  // which is the first's number in its program: the first's windows
  EXPECT_FALSE(holds_window(0, first_window + 6));
  EXPECT_FALSE(holds_window(0, first_window + 6 * 1000));
  EXPECT_TRUE(holds_window(1, first_window));  // GPU 1 has seen no group of the second program
  run_group(second + 1, {0, 1});               // whose GPU 1 lets go of the first program's groups, and runs with GPU 0
  EXPECT_FALSE(holds_window(1, first_window));
}

// A group's allgather names GPUs the hub checks before it makes a hub that wide: a member that is no rank, one listed
// twice, and other members than the group's hub was made for (a rank would wait among GPUs it does not know).
TEST_F(HostdTest, AGroupsAllgatherWithBadMembersIsRefusedNamingThem) {
  auto gather = [&](std::vector<int> members, std::chrono::seconds deadline = std::chrono::seconds(5)) {
    v1::AllgatherRequest q;
    q.set_group(5);
    q.set_rank(0);
    for (int m : members) {
      q.add_members(m);
    }
    return call(host(0), &v1::Host::Stub::Allgather, q, static_cast<v1::AllgatherReply*>(nullptr), deadline);
  };
  const grpc::Status stranger = gather({0, 7});
  EXPECT_EQ(stranger.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << text(stranger);
  EXPECT_NE(stranger.error_message().find("allgather of group 5: GPU 7 is not a rank of topology"), std::string::npos)
      << text(stranger);
  EXPECT_NE(gather({0, 1, 1}).error_message().find("GPU 1 is listed twice"), std::string::npos);
  EXPECT_NE(gather(std::vector<int>(100000, 0)).error_message().find("100000 GPU(s); a group has 2..3"),
            std::string::npos);
  // The hub of group 5 is made for GPUs 0 and 1 (the call waits for GPU 1 until its deadline) ...
  EXPECT_EQ(gather({0, 1}, std::chrono::seconds(1)).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  const grpc::Status other = gather({0, 2});
  EXPECT_NE(other.error_message().find("its hub was made for GPUs [0, 1], not [0, 2]"), std::string::npos)
      << text(other);
}

// A part the hub held until its wait ran out (AllgatherRequest.wait_ms) is withdrawn with its rank: a rank that comes
// later waits for it again. It was kept, and the latecomer went on alone into an operation the other rank had left,
// one allgather out of step with it from then on (a channel's first transfer, whose peer came after 30 s).
TEST_F(HostdTest, APartWhoseWaitRanOutIsWithdrawnFromItsRound) {
  auto gather = [&](int rank, uint32_t wait_ms) {
    v1::AllgatherRequest q;
    q.set_group(6);
    q.set_rank(rank);
    q.set_epoch(1);
    q.set_wait_ms(wait_ms);
    q.add_members(0);
    q.add_members(1);
    return call(host(0), &v1::Host::Stub::Allgather, q, static_cast<v1::AllgatherReply*>(nullptr),
                std::chrono::seconds(5));
  };
  const auto t0 = std::chrono::steady_clock::now();
  const grpc::Status first = gather(0, 300);
  EXPECT_EQ(first.error_code(), grpc::StatusCode::ABORTED) << text(first);
  EXPECT_NE(first.error_message().find("rank(s) 1 (gpu1) did not arrive in 0.3 s"), std::string::npos) << text(first);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));  // its own wait, not the hub's 30 s
  const grpc::Status late = gather(1, 300);
  EXPECT_NE(late.error_message().find(": rank(s) 0 (gpu0) came and left, their own wait over"), std::string::npos)
      << text(late);
}

// A hub asks the hostds of the ranks it waits for whether they are there (HostdWatch): one that answers is waited for
// as long as the waiting part allows (its program may still be computing), one that has gone is named within
// seconds, instead of after the whole wait (the caller's limit, 108 s by default).
TEST_F(HostdTest, AHubNamesARankWhoseHostdHasGoneWithinSecondsAndWaitsForOneThatAnswers) {
  auto gather = [&](uint32_t group, int peer, uint32_t wait_ms) {
    v1::AllgatherRequest q;
    q.set_group(group);
    q.set_rank(0);
    q.set_epoch(1);
    q.set_wait_ms(wait_ms);
    q.add_members(0);
    q.add_members(peer);
    return call(host(0), &v1::Host::Stub::Allgather, q, static_cast<v1::AllgatherReply*>(nullptr),
                std::chrono::seconds(wait_ms / 1000 + 5));
  };
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  const grpc::Status waited = gather(8, 1, 5000);  // gpu1's hostd answers the hub's questions at 2 and 4 s
  EXPECT_NE(waited.error_message().find("rank(s) 1 (gpu1) did not arrive in 5 s"), std::string::npos) << text(waited);
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(4900));
  Daemon& gone = daemons_[topo_.gpu_node(2)];
  gone.host->stop();
  gone.thread.join();
  t0 = Clock::now();
  const grpc::Status named = gather(9, 2, 30000);
  const auto took = Clock::now() - t0;
  EXPECT_EQ(named.error_code(), grpc::StatusCode::ABORTED) << text(named);
  EXPECT_NE(named.error_message().find("allgather 0 of operation 1: rank 1 (gpu2): its hostd has not answered for "),
            std::string::npos)
      << text(named);
  EXPECT_NE(named.error_message().find("gpu2 (127.0.0.1:"), std::string::npos) << text(named);
  // Asked at 2, 4 and 6 s: silent for 4 s after the third question.
  EXPECT_GE(took, std::chrono::seconds(5));
  EXPECT_LT(took, std::chrono::seconds(10));
}

// Host fields outside what they can mean are refused naming them: a window id wider than 16 bits (ReadWindow read
// window id % 65536), a PSN wider than the BTH's 24 bits, a peer region past the address space, more fetch-and-adds
// than one request may run (each a round trip, run on after the caller gave up).
TEST_F(HostdTest, PeerAndWindowFieldsOutsideTheirRangesAreRefusedNamingThem) {
  v1::ReadWindowRequest rd;
  rd.set_window(65536 + live::kHostRingWindow);  // the ring's window exists on every bootstrapped rank
  rd.set_length(8);
  const grpc::Status wide = call(host(0), &v1::Host::Stub::ReadWindow, rd);
  EXPECT_EQ(wide.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << text(wide);
  EXPECT_NE(wide.error_message().find("window " + std::to_string(65536 + live::kHostRingWindow) + " outside 0..65535"),
            std::string::npos)
      << text(wide);
  rd.set_window(live::kHostRingWindow);
  EXPECT_TRUE(call(host(0), &v1::Host::Stub::ReadWindow, rd).ok());
  v1::AttachPeerRequest at;
  at.set_peer_gpu(1);
  at.set_peer_psn(1u << 24);
  EXPECT_NE(call(host(0), &v1::Host::Stub::AttachPeer, at).error_message().find("PSN 16777216 outside 0..16777215"),
            std::string::npos);
  v1::PeerOpsRequest ops;
  ops.set_peer_gpu(1);
  ops.set_vaddr(UINT64_MAX - 7);
  ops.set_size(16);
  EXPECT_NE(call(host(0), &v1::Host::Stub::PeerOps, ops).error_message().find("runs past the 64-bit address space"),
            std::string::npos);
  ops.set_vaddr(0);
  ops.set_fetch_adds(1u << 20);
  const grpc::Status many = call(host(0), &v1::Host::Stub::PeerOps, ops);
  EXPECT_EQ(many.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << text(many);
  EXPECT_NE(many.error_message().find("1048576 fetch-and-adds (at most 65536 in one request)"), std::string::npos)
      << text(many);
}

// A MoE layer too large for this machine is refused naming its shape (its weights alone: 3 x 2^23 experts of 512 x
// 16, 2.3 TiB in fp32), not met by the OOM killer; and the refusal at one rank leaves it in step with the others (it
// counted the layer among its operations, and picked other windows than theirs for every later one).
TEST_F(HostdTest, AMoeLayerTooLargeForTheMachineIsRefusedNamingItsShape) {
  v1::RunRequest q = run_request("moe", 0);
  q.mutable_moe()->set_experts(3u << 23);
  const v1::RunReply r = run(0, q);
  EXPECT_FALSE(r.ok());
  const bool named = r.error().find("moe: 25165824 experts of hidden 512 / inter 16") != std::string::npos &&
                     r.error().find("GiB; the limit is 3/4 of this machine's") != std::string::npos;
  EXPECT_TRUE(named || r.error().find("built without LibTorch") != std::string::npos) << r.error();
  for (const v1::RunReply& every : run_everywhere(run_request("allreduce", 4096, "ring"))) {
    EXPECT_TRUE(every.ok()) << every.error();
  }
}

// A second hostd of a node (started twice by hand, or a bring-up that lost track of one) is refused naming the
// running one; it unlinked that hostd's descriptor ring, which local programs then could not open.
TEST_F(HostdTest, ASecondHostdOfANodeIsRefusedAndLeavesTheFirstsRing) {
  live::DaemonOptions o = options(topo_.gpu_node(1));
  o.listen = "127.0.0.1:1";  // never reached
  try {
    live::HostDaemon second(o);
    FAIL() << "a second hostd of gpu1 started";
  } catch (const common::Error& e) {
    EXPECT_NE(std::string(e.what()).find("node gpu1's ring belongs to a running ifec-hostd (pid " +
                                         std::to_string(getpid()) + "): one hostd per node"),
              std::string::npos)
        << e.what();
  }
  const auto ring = live::HostRing::open("gpu1");
  EXPECT_TRUE(ring->owner_alive());
  EXPECT_EQ(ring->info().gpu, 1u);
}

namespace {

// parse_daemon_options on these arguments (after the program's name): "" when they parse, else the error.
std::string options_error(std::vector<std::string> args, const char* what = "a GPU") {
  args.insert(args.begin(), "ifec-hostd");
  std::vector<char*> argv;
  for (std::string& a : args) {
    argv.push_back(a.data());
  }
  live::DaemonOptions o;
  try {
    live::parse_daemon_options(static_cast<int>(argv.size()), argv.data(), &o, what);
  } catch (const common::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// Options given twice, empty, malformed or contradicting each other are named: before, the last of a repeated option
// won, --netns '' opened the daemon's own namespace's interfaces, --links-by-subnet 0.0.0.0 was ignored and
// --mgmt-names overrode --loopback-mgmt.
TEST(DaemonOptions, RepeatedEmptyMalformedOrContradictoryOptionsAreNamed) {
  const std::vector<std::string> base = {"--topo", "t.yaml", "--insecure"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), base.begin(), base.end());
    return more;
  };
  EXPECT_EQ(options_error(with({"--node", "gpu0", "--netns", "ns0", "--external-peers", "gpu1,gpu2", "--guest-mac",
                                "02:00:0A:00:00:01", "--links-by-subnet", "10.64.0.0", "--mgmt-names"})),
            "");
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {with({"--node", "gpu0", "--node", "gpu1"}), "--node given twice ('gpu0', then 'gpu1')"},
      {with({"--node", "gpu0", "--netns", ""}), "--netns needs a value, got ''"},
      {with({"--node", "gpu0", "--netns"}), "--netns needs a value"},
      {with({"--node", "gpu0", "--mgmt-names", "--loopback-mgmt"}), "--mgmt-names and --loopback-mgmt exclude"},
      {with({"--node", "gpu0", "--guest-mac", "02:00:0a:00:00"}), "--guest-mac '02:00:0a:00:00' is not a MAC"},
      {with({"--node", "gpu0", "--links-by-subnet", "0.0.0.0"}), "--links-by-subnet '0.0.0.0' is not a nonzero"},
      {with({"--node", "gpu0", "--external-peers", "gpu1,gpu1"}), "--external-peers 'gpu1,gpu1' lists gpu1 twice"},
      {with({"--node", "gpu0", "--tls-dir", "/x"}), "--tls-dir and --insecure exclude each other"},
      {with({"--node", "gpu0", "--frobnicate"}), "unknown option '--frobnicate'"},
  };
  for (const auto& [args, why] : bad) {
    const std::string e = options_error(args);
    EXPECT_NE(e.find(why), std::string::npos) << "'" << e << "' lacks '" << why << "'";
  }
}

// What is wrong with a daemon's options is named before it opens any interface (before, each of these failed as
// "interface f0: no such interface" where there was none, and only got this far where there was).
TEST(DaemonNode, OptionsAreCheckedBeforeAnyInterfaceIsOpened) {
  setenv("IFEC_TEST_TOPO", routing::to_yaml(routing::make_superpod(2, 1, 800, 1)).c_str(), 1);
  auto error_of = [](auto make, const std::function<void(live::DaemonOptions&)>& edit) -> std::string {
    live::DaemonOptions o;
    o.topology_file = "env:IFEC_TEST_TOPO";
    o.insecure = true;
    edit(o);
    try {
      make(o);
    } catch (const common::Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  auto switchd = [](live::DaemonOptions o) { live::SwitchDaemon d(std::move(o)); };
  auto hostd = [](live::DaemonOptions o) { live::HostDaemon d(std::move(o)); };
  const std::string tls = error_of(switchd, [](auto& o) {
    o.node = "p0-sw";
    o.insecure = false;
    o.tls_dir = "/nonexistent-ifec-tls";
  });
  EXPECT_NE(tls.find("cannot read /nonexistent-ifec-tls/ca.pem"), std::string::npos) << tls;
  const std::string peers = error_of(hostd, [](auto& o) {
    o.node = "gpu0";
    o.external_peers = {"gpu1", "gpu9"};
  });
  EXPECT_NE(peers.find("--external-peers: 'gpu9' is not another GPU"), std::string::npos) << peers;
  const std::string subnet = error_of(switchd, [](auto& o) {
    o.node = "p0-sw";
    o.links_base = 0xFFFFFFF8;  // 255.255.255.248: link 1's /29 would wrap around to 0.0.0.0
  });
  EXPECT_NE(subnet.find("link 1's /29 from 255.255.255.248 (--links-by-subnet) is past 255.255.255.255"),
            std::string::npos)
      << subnet;
  const std::string path = error_of(switchd, [](auto& o) {
    o.node = "p0-sw";
    o.netns = "../../etc";
  });
  EXPECT_NE(path.find("network namespace '../../etc': not a namespace name"), std::string::npos) << path;
  const std::string env = error_of(switchd, [](auto& o) {
    o.node = "p0-sw";
    o.topology_file = "env:";
  });
  EXPECT_NE(env.find("--topo env: names no environment variable"), std::string::npos) << env;
  unsetenv("IFEC_TEST_TOPO");
}
