// ifec-hostd: one GPU of the topology: its Endpoint on its interfaces, its rank's Communicator over the gRPC
// bootstrap (rank 0's hostd is the hub) and control plane, serving the gRPC Host service.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <tuple>

#include "daemon_common.h"
#include "daemon_serve.h"
#include "hostd_moe.h"
#include "ifec/common/blob.h"
#include "ifec/common/json.h"
#include "ifec/endpoint/endpoint.h"
#include "ifec/endpoint/endpoint_sink.h"
#include "ifec/endpoint/proxy.h"
#include "ifec/live/daemons.h"
#include "ifec/live/grpc_clients.h"
#include "ifec/live/host_ring.h"
#include "ifec/live/metrics.h"
#include "ifec/testbed/alltoall_point.h"
#include "ifec/testbed/collective_point.h"
#include "ifec/testbed/live_timing.h"
#include "ifec/workloads/communicator.h"

namespace ifec::live {

namespace {

// The mappings of an operation's freed windows a hostd keeps for the next operation's (SymmetricMemory::
// keep_freed_windows): a window written for the first time faults every page in, 15-19 us each on this project's
// VMs, on the endpoint's thread and inside the operation.
constexpr uint64_t kKeptWindowBytes = uint64_t{128} << 20;

// Consecutive operations use different windows (three in turn): a late duplicate of one operation's bytes (a
// repaired multicast replica, a fallback store of a row the fabric had delivered) cannot be taken for the next
// one's. Stores carry no operation tag yet; see docs/architecture.md.
constexpr uint16_t kWorldWindows = 1;     // every rank's operations: (buffer, scratch) pairs 1-2, 3-4, 5-6 in turn
constexpr uint16_t kGroupWindows = 1000;  // group g's: six from 1000 + 6 ((g - 1) mod 4096) (to 25575), pairs likewise
// A torch program numbers its groups program * 4096 + count (ifec.torch_backend; program 0: a client's own small
// numbers). One program runs on a fabric at a time (its world is every rank), so a group of another program than the
// groups held means theirs has ended: their communicators, windows and hubs are let go then, not kept until exit.
constexpr uint32_t kGroupsPerProgram = 4096;
constexpr uint16_t kMoeWindows = 40;  // MoE layers: four windows each, in turn 40.., 44.., 48..
// Point-to-point channels (RunRequest what = send): the channel from GPU a to GPU b is group kChannelGroups + a *
// 2^15 + b (a torch program's groups are numbered below), its windows three from kChannelWindows + 6 ((a + b) mod
// N) + 3 (a > b) (N: the topology's GPUs), used in turn: for a given a, (a + b) mod N differs for every b, so every
// channel a GPU is on, either way, has windows of its own there, and both ends name them alike.
constexpr uint32_t kChannelGroups = uint32_t{1} << 31;
constexpr uint16_t kChannelWindows = 26000;
constexpr int kMaxChannelGpus = (0xFFF0 - kChannelWindows) / 6;  // below PeerOps' region
// A group's program (see kGroupsPerProgram): 0 for a client's own small numbers, and for a channel, which belongs to
// no program (a pair of GPUs', kept while the hostd runs).
constexpr uint32_t program_of(uint32_t group) { return group >= kChannelGroups ? 0 : group / kGroupsPerProgram; }
constexpr auto kAllgatherWait = std::chrono::seconds(30);
// The longest a part may ask to wait instead (AllgatherRequest.wait_ms: a transfer's receiver waits for its sender
// as long as its caller allows).
constexpr auto kLongestAllgatherWait = std::chrono::hours(24);
// Rounds a hub holds at once. A rank asks for round k + 1 only once round k has every part, so an operation keeps
// two or three; each round holds a gRPC thread per waiting part, up to kAllgatherWait: a client sending new rounds
// without end would hold threads without end.
constexpr size_t kMaxHubRounds = 64;
// The descriptor ring local programs post into (host_ring.h).
constexpr size_t kRingSlots = 4096;
constexpr size_t kRingDataBytes = size_t{16} << 20;
constexpr uint64_t kRingWindowBytes = uint64_t{1} << 20;
constexpr common::TimeNs kRingPollBusyNs = 50'000;     // while descriptors are in flight
constexpr common::TimeNs kRingPollIdleNs = 1'000'000;  // otherwise

// "0.3", "2.5", "108": tenths below 10 s, whole seconds above (a wait from a caller's deadline is 107.996 s).
std::string seconds_text(std::chrono::milliseconds ms) {
  std::ostringstream os;
  const double s = static_cast<double>(ms.count()) / 1000.0;
  os << (s < 10 ? std::round(s * 10) / 10 : std::round(s));
  return os.str();
}

// Whether the hostds of the ranks a hub waits for are still there. A hub waiting for ranks asks those that have not
// come for their status every kProbeEvery (the waiting thread, one at a time per round); a hostd that has answered no
// such question for kSilentFor ends the wait, named, instead of the ranks that did come learning only after their
// whole wait (up to their caller's limit: 108 s by default) that it did not arrive. A hostd that answers is waited
// for as long as the parts allow: its program may still be computing. Armed once this hostd's world bootstrap is
// done, when every rank's hostd had come to rank 0's hub: before that, a hostd that does not answer may not have
// started yet.
class HostdWatch {
 public:
  static constexpr auto kProbeEvery = std::chrono::seconds(2);
  static constexpr auto kSilentFor = std::chrono::seconds(4);
  using Clock = std::chrono::steady_clock;
  // gpu -> (its hostd's node name, gRPC address).
  explicit HostdWatch(std::function<std::pair<std::string, std::string>(int gpu)> where) : where_(std::move(where)) {}
  void arm() { armed_ = true; }
  // "" while `gpu`'s hostd answers (or has failed to for less than kSilentFor, or the watch is not armed); else how
  // long it has not, and the last error. Blocks up to kProbeEvery, asking it.
  std::string silent(int gpu) {
    if (!armed_) {
      return "";
    }
    const auto [name, address] = where_(gpu);
    const std::string error =
        ask_hostd_status(name, address, std::chrono::duration_cast<std::chrono::nanoseconds>(kProbeEvery).count());
    const auto now = Clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    if (error.empty()) {
      failing_.erase(gpu);
      return "";
    }
    auto [it, fresh] = failing_.try_emplace(gpu, Failing{now, now});
    if (!fresh && now - it->second.last > 3 * kProbeEvery) {  // an old failure, not asked since: counts from now
      it->second.since = now;
    }
    it->second.last = now;
    const auto for_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - it->second.since);
    return for_ms < kSilentFor ? "" : "its hostd has not answered for " + seconds_text(for_ms) + " s: " + error;
  }

 private:
  struct Failing {
    Clock::time_point since;  // the first of the failures in a row
    Clock::time_point last;
  };
  std::function<std::pair<std::string, std::string>(int)> where_;
  std::atomic<bool> armed_{false};
  std::mutex mu_;
  std::map<int, Failing> failing_;
};

// Rank 0's hub: the k-th allgather of every rank in an epoch (an operation) meets the others' k-th (waits on gRPC
// threads). A part of a later epoch ends the waits of earlier ones: the ranks that were waiting there are told their
// operation was left by some rank, instead of holding a thread until the timeout. A rank whose hostd has stopped
// answering (HostdWatch) ends the waits of its round too. A group's hub is the same at its first GPU's hostd.
class Hub {
 public:
  // The largest operation number a part may carry: drivers number operations from the real-time clock in
  // microseconds (ifec.live, the torch backend), or count from 0, and a day covers clocks that differ and counts
  // run ahead of the clock.
  static uint64_t latest_epoch() {
    const auto us =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch());
    return static_cast<uint64_t>(us.count()) + 86'400'000'000ULL;
  }
  // Rank k is GPU gpus[k], on node names[k]; gpus[0]'s hostd holds the hub (it is not asked whether it is there).
  Hub(std::vector<int> gpus, std::vector<std::string> names, std::shared_ptr<HostdWatch> watch)
      : n_(static_cast<int>(gpus.size())), gpus_(std::move(gpus)), names_(std::move(names)), watch_(std::move(watch)) {}
  grpc::Status gather(const std::string& node, const v1::AllgatherRequest& q, v1::AllgatherReply* out) {
    const int rank = q.rank();
    if (rank < 0 || rank >= n_) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, node + ": allgather from rank " + std::to_string(rank) +
                                                                  " outside 0.." + std::to_string(n_ - 1));
    }
    const std::string what =
        node + ": allgather " + std::to_string(q.seq()) + " of operation " + std::to_string(q.epoch());
    if (q.epoch() > latest_epoch()) {  // it would shut every later operation out ("has started since") for good
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          what + ": operation numbers are at most the microseconds since 1970 plus a day (" +
                              std::to_string(latest_epoch()) + " now)");
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (q.epoch() < newest_) {
      return grpc::Status(grpc::StatusCode::ABORTED,
                          what + ": operation " + std::to_string(newest_) + " has started since");
    }
    if (q.epoch() > newest_) {
      newest_ = q.epoch();
      for (auto it = rounds_.begin(); it != rounds_.end();) {  // earlier operations' rounds: their waiters leave
        if (it->first.first < newest_) {
          it->second->superseded = true;
          it = rounds_.erase(it);
        } else {
          ++it;
        }
      }
    }
    if (rounds_.size() >= kMaxHubRounds && rounds_.count({q.epoch(), q.seq()}) == 0) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          what + ": " + std::to_string(rounds_.size()) + " allgathers are already waiting at this hub");
    }
    std::shared_ptr<Round>& slot = rounds_[{q.epoch(), q.seq()}];
    if (!slot) {
      slot = std::make_shared<Round>();
      slot->parts.resize(n_);
      slot->in.assign(n_, 0);
      slot->came.assign(n_, 0);
    }
    std::shared_ptr<Round> r = slot;
    r->parts[rank] = q.part();
    r->came[rank] = 1;
    if (!r->in[rank]) {
      r->in[rank] = 1;
      ++r->arrived;
    }
    cv_.notify_all();
    const auto wait = q.wait_ms() == 0 ? std::chrono::milliseconds(kAllgatherWait)
                                       : std::min<std::chrono::milliseconds>(std::chrono::milliseconds(q.wait_ms()),
                                                                             kLongestAllgatherWait);
    if (!wait_for_round(lock, *r, wait) || (!r->silent.empty() && r->arrived < n_ && !stopping_)) {
      const std::string why = r->silent.empty() ? not_arrived(*r, wait) : r->silent;
      // This rank has left: a rank that comes later waits for it again, rather than taking its part and going on
      // alone into an operation this rank no longer runs (its hostd then one allgather out of step for good).
      r->in[rank] = 0;
      --r->arrived;
      // Not DEADLINE_EXCEEDED: the callers would read that as the hub's own silence, and lose who is missing.
      return grpc::Status(grpc::StatusCode::ABORTED, what + ": " + why);
    }
    if (stopping_) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, what + ": " + node + " is stopping");
    }
    if (r->arrived < n_) {
      return grpc::Status(grpc::StatusCode::ABORTED,
                          what + ": operation " + std::to_string(newest_) + " started before every rank arrived");
    }
    for (const std::string& p : r->parts) {
      out->add_parts(p);
    }
    if (++r->served == n_) {
      rounds_.erase({q.epoch(), q.seq()});
    }
    return grpc::Status::OK;
  }
  // Wakes every waiting gather with an error: the server's shutdown waits for its handlers to return.
  void stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }

 private:
  struct Round {
    std::vector<std::string> parts;
    std::vector<char> in;    // waiting here now
    std::vector<char> came;  // came at all (one that left after its wait ran out is not named as missing)
    int arrived = 0;
    int served = 0;
    bool superseded = false;
    bool asking = false;  // a waiting part is asking the missing ranks' hostds whether they are there
    std::string silent;   // "rank 7 (gpu7): its hostd has not answered for ...": the round's waits end
  };
  // Waits until `r` has every part, is superseded or silent, or the hub stops (true), or `wait` has passed (false),
  // asking the missing ranks' hostds every HostdWatch::kProbeEvery meanwhile.
  bool wait_for_round(std::unique_lock<std::mutex>& lock, Round& r, std::chrono::milliseconds wait) {
    const auto ends = [&] { return r.arrived == n_ || r.superseded || stopping_ || !r.silent.empty(); };
    const auto until = HostdWatch::Clock::now() + wait;
    while (!ends()) {
      const auto now = HostdWatch::Clock::now();
      if (now >= until) {
        return false;
      }
      if (!cv_.wait_until(lock, std::min(until, now + HostdWatch::kProbeEvery), ends) && !r.asking && watch_) {
        ask_the_missing(lock, r);
      }
    }
    return true;
  }
  // Asks the hostds of the ranks that have not come to `r` (outside the lock) whether they are there; the first that
  // has been silent for long enough ends the round's waits.
  void ask_the_missing(std::unique_lock<std::mutex>& lock, Round& r) {
    std::vector<int> missing;
    for (int k = 1; k < n_; ++k) {  // rank 0's hostd is this one; a rank that came and left has a hostd
      if (!r.came[k]) {
        missing.push_back(k);
      }
    }
    r.asking = true;
    lock.unlock();
    std::string silent;
    for (size_t i = 0; i < missing.size() && silent.empty(); ++i) {
      if (const std::string why = watch_->silent(gpus_[missing[i]]); !why.empty()) {
        silent = "rank " + std::to_string(missing[i]) + " (" + names_[missing[i]] + "): " + why;
      }
    }
    lock.lock();
    r.asking = false;
    if (!silent.empty() && r.arrived < n_) {
      r.silent = silent;
      cv_.notify_all();
    }
  }
  // "rank(s) 7 (gpu7) did not arrive in 30 s": who `r` still lacks after `wait`.
  std::string not_arrived(const Round& r, std::chrono::milliseconds wait) const {
    std::string missing, left;  // never came; came, and left when their own wait ran out
    for (int k = 0; k < n_; ++k) {
      if (!r.came[k] || !r.in[k]) {
        std::string& to = r.came[k] ? left : missing;
        to += (to.empty() ? "" : ", ") + std::to_string(k) + " (" + names_[k] + ")";
      }
    }
    std::string why = missing.empty() ? "" : "rank(s) " + missing + " did not arrive in " + seconds_text(wait) + " s";
    if (!left.empty()) {
      why += (why.empty() ? "" : "; ") + std::string("rank(s) ") + left + " came and left, their own wait over";
    }
    return why;
  }
  int n_;
  std::vector<int> gpus_;
  std::vector<std::string> names_;  // each rank's node, for the errors
  std::shared_ptr<HostdWatch> watch_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t newest_ = 0;
  bool stopping_ = false;
  std::map<std::pair<uint64_t, uint64_t>, std::shared_ptr<Round>> rounds_;  // (epoch, seq)
};

// "[0, 3, 5]": a group's GPUs, for its errors.
std::string gpu_list(const std::vector<int>& gpus) {
  std::string out;
  for (int g : gpus) {
    out += (out.empty() ? "[" : ", ") + std::to_string(g);
  }
  return out + (gpus.empty() ? "[]" : "]");
}

// How long an operation may take at this rank, from its request's arrival: the caller's gRPC deadline less a tenth (at
// least 1 s), so hostd's own error, naming what is stuck, reaches the caller before its deadline does; 60 s where
// the caller set none. (A fixed 60 s failed a 1 GiB AllReduce given `--timeout 250` after 60 s.)
common::TimeNs operation_limit(const grpc::ServerContext& ctx) {
  constexpr common::TimeNs kDefault = 60'000'000'000ULL;
  constexpr common::TimeNs kDay = 86'400'000'000'000ULL;  // the drivers' longest timeout
  if (ctx.deadline() == std::chrono::system_clock::time_point::max()) {
    return kDefault;
  }
  const auto left = std::min<std::chrono::nanoseconds>(ctx.deadline() - std::chrono::system_clock::now(),
                                                       std::chrono::nanoseconds(kDay));
  const auto ns = left.count();
  const common::TimeNs margin = std::max<common::TimeNs>(1'000'000'000, ns / 10);
  return ns > static_cast<int64_t>(2 * margin) ? static_cast<common::TimeNs>(ns) - margin : margin;
}

}  // namespace

struct HostDaemon::Impl {
  DaemonOptions o;
  routing::Topology topo;
  std::unique_ptr<NodeRuntime> rt;
  std::unique_ptr<endpoint::Endpoint> ep;
  std::unique_ptr<GrpcBootstrap> boot;
  std::unique_ptr<GrpcControl> control;
  std::unique_ptr<workloads::Communicator> comm;
  std::unique_ptr<Hub> hub;
  // Whether the ranks' hostds answer, for the hubs here (armed once the world has bootstrapped).
  std::shared_ptr<HostdWatch> watch = std::make_shared<HostdWatch>([this](int g) {
    const int node = topo.gpu_node(g);
    return std::make_pair(topo.nodes[node].name, daemon_address(o, node));
  });
  std::unique_ptr<v1::Host::Service> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<MetricsServer> metrics;
  std::unique_ptr<HostRing> ring;
  std::unique_ptr<RingDataMemory> ring_mem;
  std::unique_ptr<endpoint::EndpointSink> sink;
  std::unique_ptr<endpoint::Proxy> proxy;
  std::string ready_error = "starting";  // "" once bootstrapped (loop thread)
  int gpu = -1;
  std::vector<int> ranks;      // the GPUs that are ranks (the topology's, less --external-peers), in order
  std::vector<char> external;  // per GPU: an external RDMA peer (testbed/rxe)
  int rank = -1;
  std::shared_ptr<bool> alive = std::make_shared<bool>(true);  // answers that arrive after shutdown are dropped
  // Collectives' inputs drawn and outputs checked off the loop; after rt and ep, so it stops before them.
  std::unique_ptr<LoopWorker> worker;
  // The communicator an operation runs on: every rank's (world), or a torch.distributed group's, made at its first
  // operation. Each has its own bootstrap hub and windows: a store kept early by one communicator is never taken
  // for another's.
  struct Group {
    std::unique_ptr<GrpcBootstrap> own_boot;
    std::unique_ptr<workloads::Communicator> own_comm;
    GrpcBootstrap* boot = nullptr;
    workloads::Communicator* comm = nullptr;
    uint16_t first_window = kWorldWindows;
    bool channel = false;  // a point-to-point channel's: one window per operation, three in turn
    uint64_t runs = 0;     // its operations (every member counts the same)
    std::vector<int> members;
    // Consecutive operations use different windows (three pairs in turn): (buffer, scratch). By the operation's
    // number where the driver gives one (RunRequest.run_id, the same on every rank): a rank that missed an
    // operation (it failed before reaching here, or never came) then picks the others' windows for the next, where
    // counting its own operations left it out of step with them for good.
    std::pair<uint16_t, uint16_t> next_windows(uint64_t run_id) {
      const uint64_t k = run_id != 0 ? run_id : runs;
      ++runs;
      if (channel) {
        const auto w = static_cast<uint16_t>(first_window + k % 3);
        return {w, w};
      }
      const auto buf = static_cast<uint16_t>(first_window + 2 * (k % 3));
      return {buf, static_cast<uint16_t>(buf + 1)};
    }
  };
  Group world;
  std::map<uint32_t, Group> groups;     // loop thread
  workloads::CommOptions comm_options;  // every communicator's
  std::mutex hubs_mu;
  struct GroupHub {
    std::vector<int> members;  // the GPUs its first allgather named, in rank order
    std::shared_ptr<Hub> hub;  // shared with the gathers waiting in it
  };
  std::map<uint32_t, GroupHub> group_hubs;  // the groups this GPU is the first of (gRPC threads)

  void start_endpoint();
  // Per fabric port: (topology link id, frame bytes sent, received) so far.
  std::vector<std::array<uint64_t, 3>> link_bytes() const {
    std::vector<std::array<uint64_t, 3>> out;
    for (const auto& p : rt->ports()) {
      for (int link : topo.links_of(rt->node())) {
        const routing::Link& lk = topo.links[link];
        if ((lk.a == rt->node() ? lk.a_port : lk.b_port) == p->port()) {
          const AfPacketCounters k = p->device().port_counters();
          out.push_back({static_cast<uint64_t>(link), k.tx_bytes, k.rx_bytes});
        }
      }
    }
    return out;
  }
  // Frame bytes this GPU's interfaces sent so far, per plane.
  std::vector<uint64_t> plane_tx_bytes() const {
    std::vector<uint64_t> out(topo.num_planes, 0);
    for (const auto& p : rt->ports()) {
      const auto [peer, peer_port] = rt->peer_of(p->port());
      out[topo.nodes[peer].plane] += p->device().port_counters().tx_bytes;
    }
    return out;
  }
  // `until`: the loop's time by which the operation should have ended (operation_limit).
  void run(const v1::RunRequest& q, common::TimeNs until, std::function<void(v1::RunReply)> reply);
  void run_collective(Group& grp, const v1::RunRequest& q, common::TimeNs until,
                      std::function<void(v1::RunReply)> reply);
  // The operation limit of the communicator the next operation runs on (CommOptions::limit_ns): what is left until
  // `until`, at least 1 s.
  void set_limit(workloads::Communicator& c, common::TimeNs until) const {
    const common::TimeNs now = rt->loop().now();
    const common::TimeNs limit = std::max<common::TimeNs>(1'000'000'000, until > now ? until - now : 0);
    if (c.options().limit_ns != limit) {
      workloads::CommOptions opts = c.options();
      opts.limit_ns = limit;
      c.set_options(opts);
    }
  }
  // How long the hub holds this rank's parts of an operation's allgathers for the other ranks': as long as its
  // caller allows (a rank that arrives late because its program computed longer, as torch's own backends wait, up to
  // the process group's timeout), not the hub's 30 s.
  common::TimeNs wait_for_others(common::TimeNs until) const {
    return std::max<common::TimeNs>(until - rt->loop().now(), 1'000'000);
  }
  // What a collective's row counts from: the byte counters and the state the endpoint and communicator carry from
  // operation to operation (testbed::Turns), at its start.
  struct OpStart {
    std::vector<uint64_t> tx;
    std::vector<std::array<uint64_t, 3>> links;
    testbed::Turns turns;
    endpoint::Endpoint::Resent resent;
    endpoint::EchCounters ech;
    common::TimeNs cpu_ns = 0;
  };
  // Where an operation's counters start; the loop's latest timer is taken (and so starts again) here.
  OpStart op_start(const workloads::Communicator& c) const {
    rt->loop().take_worst_late_ns();
    return {plane_tx_bytes(), link_bytes(),         {c.group_turn(), {ep->stripe_turn()}, {ep->ech().next_psn()}},
            ep->resent(),     ep->ech().counters(), EpollLoop::thread_cpu_ns()};
  }
  // The row's packets sent again, in-fabric retries and the host's part since `at` (add_retries writes them).
  void record_retries(testbed::CollectiveRow& row, const OpStart& at) const {
    const endpoint::Endpoint::Resent again = ep->resent();
    const endpoint::EchCounters& e = ep->ech().counters();
    row.resent = again.frames - at.resent.frames;
    row.resent_bytes = again.bytes - at.resent.bytes;
    row.ifec_retransmissions = e.retransmissions - at.ech.retransmissions;
    row.ifec_busy_naks = e.busy_naks - at.ech.busy_naks;
    row.ifec_duplicate_results = e.duplicate_results - at.ech.duplicate_results;
    row.host_stall_us = rt->loop().take_worst_late_ns() / 1e3;
    row.host_cpu_us = (EpollLoop::thread_cpu_ns() - at.cpu_ns) / 1e3;
  }
  testbed::CollectiveRow collective_row(workloads::Communicator& c, const testbed::CollectivePoint& p,
                                        const workloads::CollArgs& a, const workloads::CollectiveResult& res,
                                        const OpStart& at);
  // The caller's data (RunRequest.input): where its input goes in the window and which part of the window comes
  // back (not checked).
  struct Given {
    uint64_t at = 0;   // the input's offset in the window
    uint64_t out = 0;  // the output's offset
    uint64_t out_bytes = 0;
  };
  void fill_collective(workloads::Communicator* c, const workloads::CollArgs& a, const testbed::CollectivePoint& p,
                       common::TimeNs until, std::function<void(v1::RunReply)> reply,
                       std::shared_ptr<std::string> input, std::shared_ptr<const Given> given);
  void enter_collective(workloads::Communicator* c, const workloads::CollArgs& a, const testbed::CollectivePoint& p,
                        common::TimeNs until, std::function<void(v1::RunReply)> reply,
                        std::shared_ptr<const Given> given);
  grpc::Status attach_peer(const v1::AttachPeerRequest& q, v1::AttachPeerReply* out);
  grpc::Status reset_responder(const v1::ResetResponderRequest& q);
  void peer_ops(const v1::PeerOpsRequest& q, std::shared_ptr<v1::PeerOpsReply> out,
                std::function<void(grpc::Status)> done);
  void start_ring();
  void poll_ring();
  void run_alltoall(const v1::RunRequest& q, std::function<void(v1::RunReply)> reply);
  void run_alltoall_given(Group& grp, const v1::RunRequest& q, std::function<void(v1::RunReply)> reply);
  void run_send(const v1::RunRequest& q, common::TimeNs until, std::function<void(v1::RunReply)> reply);
  void run_transfer(Group& grp, const v1::RunRequest& q, const std::string& mine,
                    std::function<void(v1::RunReply)> reply);
  // Runs `then` on the group the request names (made at its first operation), or replies why it cannot.
  // `wait_ns`: how long its bootstrap's hub holds this rank's parts for the others' (0: the hub's 30 s).
  void with_group(const v1::RunRequest& q, std::function<void(v1::RunReply)> reply, std::function<void(Group&)> then,
                  common::TimeNs wait_ns = 0);
  grpc::Status group_gather(const std::string& node, const v1::AllgatherRequest& q, v1::AllgatherReply* out);
  std::string group_members_problem(const std::vector<int>& members) const;
  // The node names of `gpus`, in order (a hub's, for its errors).
  std::vector<std::string> node_names(const std::vector<int>& gpus) const {
    std::vector<std::string> out;
    for (int g : gpus) {
      out.push_back(topo.nodes[topo.gpu_node(g)].name);
    }
    return out;
  }
  void let_go_of_ended_programs(uint32_t group);
  void stop_hubs();
  v1::RunReply alltoall_reply(const workloads::CollectiveResult& res, uint64_t wrong, uint64_t size, uint64_t sent,
                              const OpStart& at, const char* collective = "alltoall") const;
};

namespace {

class HostService final : public v1::Host::Service {
 public:
  explicit HostService(HostDaemon::Impl& d) : d_(d), name_(d.rt->info().name) {}

  grpc::Status Status(grpc::ServerContext*, const v1::Empty*, v1::NodeStatus* out) override {
    return on_loop(d_.rt->loop(), name_, [&] {
      fill_status(*d_.rt, out, d_.ready_error.empty());
      return grpc::Status::OK;
    });
  }
  grpc::Status ReadWindow(grpc::ServerContext* ctx, const v1::ReadWindowRequest* q, v1::ReadWindowReply* out) override {
    const Identity caller = caller_identity(ctx);
    if (q->window() > 0xFFFF) {  // not folded into another window's id (65537 into 1)
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          name_ + ": window " + std::to_string(q->window()) + " outside 0..65535");
    }
    return on_loop(d_.rt->loop(), name_, [&] {
      const endpoint::WindowInfo* w = d_.ep ? d_.ep->memory().window(static_cast<uint16_t>(q->window())) : nullptr;
      if (w == nullptr) {
        return grpc::Status(grpc::StatusCode::NOT_FOUND, name_ + ": no window " + std::to_string(q->window()));
      }
      // A rank reads its own job's windows (and the default partition's, where external peers' live); insecure,
      // anyone reads any.
      if (caller.role == "rank" && w->job != caller.job && w->job != common::job_of_pkey(0xFFFF)) {
        return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                            name_ + ": a rank of job " + std::to_string(caller.job) + " may not read window " +
                                std::to_string(q->window()) + " of job " + std::to_string(w->job));
      }
      if (q->length() > (1u << 20) || q->offset() > w->size || q->length() > w->size - q->offset()) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            name_ + ": " + std::to_string(q->length()) + " B at offset " + std::to_string(q->offset()) +
                                " of window " + std::to_string(q->window()) + " (" + std::to_string(w->size) +
                                " B; at most 1 MiB per read)");
      }
      out->set_data(w->data + q->offset(), q->length());
      return grpc::Status::OK;
    });
  }
  grpc::Status ResetResponder(grpc::ServerContext*, const v1::ResetResponderRequest* q, v1::Empty*) override {
    return on_loop(d_.rt->loop(), name_, [&] { return d_.reset_responder(*q); });
  }
  grpc::Status AttachPeer(grpc::ServerContext*, const v1::AttachPeerRequest* q, v1::AttachPeerReply* out) override {
    return on_loop(d_.rt->loop(), name_, [&] { return d_.attach_peer(*q, out); });
  }
  grpc::Status PeerOps(grpc::ServerContext* ctx, const v1::PeerOpsRequest* q, v1::PeerOpsReply* out) override {
    auto p = std::make_shared<std::promise<grpc::Status>>();
    auto f = p->get_future();
    const v1::PeerOpsRequest req = *q;
    auto reply = std::make_shared<v1::PeerOpsReply>();
    d_.rt->loop().schedule(0, [this, req, p, reply] {
      try {
        d_.peer_ops(req, reply, [p](grpc::Status st) { p->set_value(st); });
      } catch (const std::exception& e) {
        p->set_value(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, name_ + ": " + e.what()));
      }
    });
    while (f.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
      if (ctx->IsCancelled()) {
        return grpc::Status(grpc::StatusCode::CANCELLED, name_ + ": the caller went away");
      }
    }
    const grpc::Status st = f.get();
    *out = *reply;  // the loop is done with it
    return st;
  }
  grpc::Status Allgather(grpc::ServerContext*, const v1::AllgatherRequest* q, v1::AllgatherReply* out) override {
    if (q->group() != 0) {
      return d_.group_gather(name_, *q, out);
    }
    if (!d_.hub) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, name_ + ": not rank 0, the bootstrap's hub");
    }
    return d_.hub->gather(name_, *q, out);
  }
  grpc::Status Run(grpc::ServerContext* ctx, const v1::RunRequest* q, v1::RunReply* out) override {
    auto p = std::make_shared<std::promise<v1::RunReply>>();
    auto f = p->get_future();
    const v1::RunRequest req = *q;
    const common::TimeNs until = d_.rt->loop().now() + operation_limit(*ctx);
    // Behind the worker's jobs (an earlier operation's check, an MoE layer's experts): a window this operation
    // allocates, or a group it lets go, may be one they still read or write.
    d_.worker->post([] {},
                    [this, req, p, until](const std::string&) {
                      try {
                        d_.run(req, until, [p](v1::RunReply r) { p->set_value(std::move(r)); });
                      } catch (const std::exception& e) {
                        v1::RunReply r;
                        r.set_error(e.what());
                        p->set_value(r);
                      }
                    });
    while (f.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
      if (ctx->IsCancelled()) {
        return grpc::Status(grpc::StatusCode::CANCELLED, name_ + ": the caller went away");
      }
    }
    *out = f.get();
    return grpc::Status::OK;
  }
  grpc::Status Counters(grpc::ServerContext*, const v1::Empty*, v1::CounterSet* out) override {
    return on_loop(d_.rt->loop(), name_, [&] {
      if (d_.ep) {
        for (const auto& [k, v] : d_.ep->named_counters()) {
          (*out->mutable_values())[k] = v;
        }
      }
      return grpc::Status::OK;
    });
  }
  grpc::Status BgpRib(grpc::ServerContext*, const v1::Empty*, v1::BgpRibReply* out) override {
    return on_loop(d_.rt->loop(), name_, [&] { return bgp_rib(*d_.rt, out); });
  }
  grpc::Status FareWeights(grpc::ServerContext*, const v1::FareWeightsRequest* q, v1::FareWeightsReply* out) override {
    return on_loop(d_.rt->loop(), name_, [&] { return fare_weights(*d_.rt, q, out); });
  }
  grpc::Status SetLink(grpc::ServerContext*, const v1::SetLinkRequest* q, v1::Empty*) override {
    return on_loop(d_.rt->loop(), name_, [&] { return set_link(*d_.rt, q); });
  }
  grpc::Status Events(grpc::ServerContext* ctx, const v1::EventsRequest* q,
                      grpc::ServerWriter<v1::Event>* out) override {
    return stream_events(*d_.rt, ctx, q, out);
  }

 private:
  HostDaemon::Impl& d_;
  std::string name_;
};

}  // namespace

// Once every port with a carrier heard its switch (their MACs are known), the endpoint and the rank start.
void HostDaemon::Impl::start_endpoint() {
  const routing::Topology& t = topo;
  endpoint::EndpointConfig ec;
  ec.index = gpu;
  ec.ip = rt->info().loopback;
  ec.ordering = endpoint::Ordering::kWeak;
  ec.mtu = t.params.mtu;
  testbed::apply_live_timing(ec, t);  // wall clock through software switches: milliseconds, not microseconds
  std::vector<endpoint::EndpointPort> ports;
  for (const auto& p : rt->ports()) {
    int plane = 0;
    for (int link : t.links_of(rt->node())) {
      const routing::Link& lk = t.links[link];
      if ((lk.a == rt->node() ? lk.a_port : lk.b_port) == p->port()) {
        plane = lk.plane;
      }
    }
    ports.push_back({p.get(), plane, rt->mac(p->port()), rt->peer_mac(p->port())});
  }
  std::vector<uint32_t> ips;
  for (int g = 0; g < t.num_gpus(); ++g) {
    ips.push_back(t.nodes[t.gpu_node(g)].loopback);
  }
  ep = std::make_unique<endpoint::Endpoint>(rt->loop(), ec, ports, ips);
  ep->memory().keep_freed_windows(kKeptWindowBytes);
  ep->set_weight_source([this](int peer, std::vector<double>* w) {
    w->assign(rt->ports().size(), 0.0);
    if (peer == gpu) {
      return;
    }
    for (const routing::NextHop& h : rt->fare().next_hops(peer)) {
      (*w)[h.port] += h.weight;
    }
  });
  ep->routes_changed();
  rt->on_fare_change([this] {  // a next hop's MAC arrives (or changes) with a session coming up
    for (const auto& p : rt->ports()) {
      if (rt->peer_mac(p->port()) != common::MacAddress{}) ep->set_peer_mac(p->port(), rt->peer_mac(p->port()));
    }
    ep->routes_changed();
  });
  ep->set_connection_manager([this](int peer, int q, uint32_t psn, endpoint::Endpoint::ResetDone done) {
    const std::string what =
        "QP " + std::to_string(q) + " toward GPU " + std::to_string(peer) + " restarts at PSN " + std::to_string(psn);
    if (external[peer]) {  // a real RDMA stack's QP is in error until it is attached again
      rt->note("reconnect", what + ": GPU " + std::to_string(peer) + " is an external peer, attach it again");
      done("GPU " + std::to_string(peer) + " is an external peer: its QP stays in error until attached again");
      return;
    }
    rt->note("reconnect", what + ": asking its hostd to reset its responder");
    const int node = topo.gpu_node(peer);
    reset_peer_responder(rt->loop(), alive, topo.nodes[node].name, daemon_address(o, node), gpu, q, psn,
                         o.rpc_deadline_ns, 3, [this, what, done](const std::string& error) {
                           rt->note("reconnect", what + (error.empty() ? ": reset" : ": not reset: " + error));
                           done(error);
                         });
  });
  AddressOf addr = [this](int node) { return daemon_address(o, node); };
  boot = std::make_unique<GrpcBootstrap>(rt->loop(), t, addr, rank, ranks, o.rpc_deadline_ns * 8);
  control = std::make_unique<GrpcControl>(rt->loop(), t, addr, o.rpc_deadline_ns);
  comm_options.limit_ns = 60'000'000'000ULL;
  testbed::apply_live_timing(comm_options.ifec);
  comm = std::make_unique<workloads::Communicator>(*ep, *boot, *control, t, comm_options);
  world.boot = boot.get();
  world.comm = comm.get();
  comm->init([this](const std::string& err) {
    if (!err.empty()) {
      ready_error = err;
      rt->note("bootstrap", "bootstrap failed: " + err);
      return;
    }
    rt->note("bootstrap", "rank " + std::to_string(gpu) + " of " + std::to_string(topo.num_gpus()) + " bootstrapped");
    watch->arm();  // every rank's hostd came to rank 0's hub: one that stops answering now has gone
    // Every rank keeps the ring's window (a collective: each allocates it and learns the others' keys).
    comm->allocate_window(kHostRingWindow, kRingWindowBytes, [this](const std::string& e) {
      ready_error = e.empty() ? "" : "ring window: " + e;
      if (e.empty()) {
        start_ring();
      }
    });
  });
}

// Local programs' descriptors become this endpoint's operations: the proxy drains the ring on the loop, busy
// polling while descriptors are in flight and every millisecond otherwise.
void HostDaemon::Impl::start_ring() {
  ring_mem = std::make_unique<RingDataMemory>(ring->data(), ring->info().data_bytes);
  sink = std::make_unique<endpoint::EndpointSink>([this](int) -> endpoint::Endpoint& { return *ep; });
  proxy = std::make_unique<endpoint::Proxy>(ring->ring(), *sink, *ring_mem, gpu);
  __atomic_store_n(&ring->info().ready, 1, __ATOMIC_RELEASE);
  rt->note("ring", host_ring_path(o.node) + ": " + std::to_string(kRingSlots) + " descriptor slots, " +
                       std::to_string(kRingDataBytes >> 20) + " MiB of data, window " +
                       std::to_string(kHostRingWindow) + " of " + std::to_string(kRingWindowBytes >> 10) +
                       " KiB on every rank");
  poll_ring();
}

// A peer hostd's requester reconnected after a fatal NAK: this side's responder of that QP expects its new PSN.
grpc::Status HostDaemon::Impl::reset_responder(const v1::ResetResponderRequest& q) {
  const std::string me = rt->info().name + ": reset responder: ";
  if (!ep) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, me + "the endpoint is not started yet");
  }
  const int peer = q.requester_gpu();
  if (peer < 0 || peer >= topo.num_gpus() || peer == gpu || external[peer]) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        me + "GPU " + std::to_string(peer) + " is not another hostd's GPU (0.." +
                            std::to_string(topo.num_gpus() - 1) + ", not " + std::to_string(gpu) + ")");
  }
  if (q.qp() >= static_cast<uint32_t>(ep->num_ports()) || q.psn() > 0xFFFFFF) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, me + "QP " + std::to_string(q.qp()) + " (0.." +
                                                                std::to_string(ep->num_ports() - 1) + ") or PSN " +
                                                                std::to_string(q.psn()) + " (24 bits) out of range");
  }
  ep->reset_responder(peer, static_cast<int>(q.qp()), q.psn());
  rt->note("reconnect", "the responder of QP " + std::to_string(q.qp()) + " toward GPU " + std::to_string(peer) +
                            " expects PSN " + std::to_string(q.psn()));
  return grpc::Status::OK;
}

// ------------------------------------------------------------------------------ external RDMA peers (rxe) --

constexpr uint16_t kFirstPeerWindow = 200;     // AttachPeer's windows: 200 and up (the operations use fewer)
constexpr uint16_t kPeerRegion = 0xFFF0;       // PeerOps: the peer's registered memory, as a window of that peer
constexpr uint64_t kMaxPeerBytes = 64u << 20;  // per window or request
// PeerOps' fetch-and-adds run one after another, each a round trip, and none stops when the caller gives up.
constexpr uint32_t kMaxPeerFetchAdds = 65536;

std::string external_problem(const HostDaemon::Impl& d, int peer) {
  if (!d.ep) {
    return "the endpoint is not started yet";
  }
  if (peer < 0 || peer >= d.topo.num_gpus() || !d.external[peer]) {
    return "GPU " + std::to_string(peer) + " is not an external peer of this hostd (--external-peers)";
  }
  return "";
}

grpc::Status HostDaemon::Impl::attach_peer(const v1::AttachPeerRequest& q, v1::AttachPeerReply* out) {
  const std::string me = rt->info().name + ": attach peer: ";
  if (q.peer_psn() > 0xFFFFFF) {  // a PSN the BTH's 24 bits can carry, or the peer's requests never match it
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        me + "PSN " + std::to_string(q.peer_psn()) + " outside 0..16777215 (24 bits)");
  }
  if (std::string why = external_problem(*this, q.peer_gpu()); !why.empty()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, me + why);
  }
  if (q.window_bytes() > 0 &&
      (q.window() < kFirstPeerWindow || q.window() >= kPeerRegion || q.window_bytes() > kMaxPeerBytes)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        me + "window " + std::to_string(q.window()) + " of " + std::to_string(q.window_bytes()) +
                            " B: the id must be " + std::to_string(kFirstPeerWindow) + ".." +
                            std::to_string(kPeerRegion - 1) + ", the size at most 64 MiB");
  }
  try {
    if (q.window_bytes() > 0) {  // kept when it exists with that size (a later test reads what an earlier wrote)
      const auto id = static_cast<uint16_t>(q.window());
      const endpoint::WindowInfo* had = ep->memory().window(id);
      if (had != nullptr && had->size != q.window_bytes()) {
        ep->memory().free_window(id);
        had = nullptr;
      }
      const endpoint::WindowInfo& w =
          had ? *had : ep->memory().allocate_window(id, q.window_bytes(), common::job_of_pkey(0xFFFF));
      out->set_rkey(w.rkey);
      out->set_vaddr(w.va);
    }
    const auto [qpn, psn] = ep->attach_external(q.peer_gpu(), 0, q.peer_qpn(), q.peer_psn(), 0xFFFF);
    out->set_qpn(qpn);
    out->set_psn(psn);
  } catch (const std::exception& e) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, me + e.what());
  }
  out->set_ip(ep->config().ip);
  out->set_mtu(ep->config().mtu);
  rt->note("peer", "GPU " + std::to_string(q.peer_gpu()) + " is an external peer: its QP " +
                       std::to_string(q.peer_qpn()) + " meets QP " + std::to_string(out->qpn()));
  return grpc::Status::OK;
}

namespace {

void when_done(const endpoint::OpHandle& h, std::function<void(const endpoint::OpState&)> fn) {
  if (h->done()) {
    fn(*h);
  } else {
    h->on_done = std::move(fn);
  }
}

}  // namespace

// Store `write` at the peer's address, read `read` bytes there, then the fetch-and-adds one after another (each
// returns the value the one before left); each step once the last completed.
void HostDaemon::Impl::peer_ops(const v1::PeerOpsRequest& q, std::shared_ptr<v1::PeerOpsReply> out,
                                std::function<void(grpc::Status)> done) {
  const std::string me = rt->info().name + ": peer ops: ";
  const int peer = q.peer_gpu();
  IFEC_CHECK(ep, "the endpoint is not started yet");
  IFEC_CHECK(peer >= 0 && peer < topo.num_gpus() && peer != gpu,
             "GPU " << peer << " is not a peer of this hostd (0.." << topo.num_gpus() - 1 << ", not " << gpu << ")");
  IFEC_CHECK(q.size() <= kMaxPeerBytes && q.write().size() <= q.size() && q.read() <= q.size() &&
                 (q.fetch_adds() == 0 || (q.size() >= 8 && q.vaddr() % 8 == 0)),
             "the peer's region of " << q.size() << " B at " << q.vaddr() << " holds neither a " << q.write().size()
                                     << " B write, a " << q.read() << " B read nor an aligned 8-byte atomic "
                                     << "(at most 64 MiB)");
  IFEC_CHECK(q.vaddr() <= UINT64_MAX - q.size(),
             "the peer's region of " << q.size() << " B at " << q.vaddr() << " runs past the 64-bit address space");
  IFEC_CHECK(q.fetch_adds() <= kMaxPeerFetchAdds,
             q.fetch_adds() << " fetch-and-adds (at most " << kMaxPeerFetchAdds << " in one request)");
  endpoint::WindowInfo w;
  w.id = kPeerRegion;
  w.va = q.vaddr();
  w.size = q.size();
  w.rkey = q.rkey();
  w.job = common::job_of_pkey(0xFFFF);
  ep->set_remote_window(peer, w);
  auto fail = [done, me](const std::string& what, const endpoint::OpState& s) {
    done(grpc::Status(grpc::StatusCode::ABORTED, me + what + ": " + endpoint::op_status_name(s.status) +
                                                     (s.error.empty() ? "" : " (" + s.error + ")")));
  };
  auto adds = std::make_shared<std::function<void(uint32_t)>>();
  std::weak_ptr<std::function<void(uint32_t)>> self = adds;  // the pending operation holds it, not itself
  *adds = [this, q, out, done, fail, peer, self](uint32_t i) {
    if (i == q.fetch_adds()) {
      done(grpc::Status::OK);
      return;
    }
    auto adds = self.lock();
    when_done(ep->fetch_add(peer, kPeerRegion, 0, q.add()), [out, fail, adds, i](const endpoint::OpState& s) {
      if (!s.ok()) {
        fail("fetch-and-add " + std::to_string(i), s);
        return;
      }
      out->add_fetched(s.result);
      (*adds)(i + 1);
    });
  };
  auto read = [this, q, out, fail, adds, peer] {
    if (q.read() == 0) {
      (*adds)(0);
      return;
    }
    auto buf = std::make_shared<std::vector<uint8_t>>(q.read());
    when_done(ep->load(buf->data(), peer, kPeerRegion, 0, buf->size()),
              [out, fail, adds, buf](const endpoint::OpState& r) {
                if (!r.ok()) {
                  fail("read", r);
                  return;
                }
                out->set_read(buf->data(), buf->size());
                (*adds)(0);
              });
  };
  if (q.write().empty()) {
    read();
    return;
  }
  when_done(ep->store(peer, kPeerRegion, 0, q.write().data(), q.write().size()),
            [fail, read](const endpoint::OpState& s) {
              if (!s.ok()) {
                fail("write", s);
                return;
              }
              read();
            });
}

void HostDaemon::Impl::poll_ring() {
  const size_t popped = proxy->poll_once();
  const bool busy = popped > 0 || proxy->outstanding() > 0;
  rt->loop().schedule(rt->loop().now() + (busy ? kRingPollBusyNs : kRingPollIdleNs), [this] { poll_ring(); });
}

// All-to-all: every rank stores `bytes` to every other rank with RC WRITEs (one row per peer), then checks the block
// each peer sent it.
void HostDaemon::Impl::run_alltoall(const v1::RunRequest& q, std::function<void(v1::RunReply)> reply) {
  const uint64_t bytes = q.bytes();
  const uint64_t seed = q.seed() == 0 ? 1 : q.seed();
  IFEC_CHECK(bytes > 0, "all-to-all: size " << bytes << " B per peer must be > 0");
  const int n = comm->size();
  // Checked before bytes * n is taken: a product that wrapped would allocate a small window and overrun it.
  IFEC_CHECK(bytes <= kMaxWindowBytes / static_cast<uint64_t>(n),
             "all-to-all: " << bytes << " B per peer for " << n << " ranks is more than a window holds (4 GiB)");
  const int me = comm->rank();
  const std::pair<uint16_t, uint16_t> w = world.next_windows(q.run_id());
  const uint16_t src = w.first, dst = w.second;  // not a structured binding: lambdas capture them (clang 14)
  comm->allocate_window(src, bytes * n, [=](const std::string& e1) {
    comm->allocate_window(dst, bytes * n, [=](const std::string& e2) {
      if (!e1.empty() || !e2.empty()) {
        v1::RunReply r;
        r.set_error(e1.empty() ? e2 : e1);
        reply(r);
        return;
      }
      workloads::BatchPutArgs a = testbed::alltoall_rows(seed, me, n, bytes, src, dst, ep->memory().window(src)->data);
      // The byte counts and turns start before the entry barrier: no peer's frame of this operation can arrive
      // before this rank entered it.
      comm->bootstrap().barrier([=, at = op_start(*comm)](workloads::Gathered g) mutable {
        comm->put_rows(std::move(a), [=](workloads::CollectiveResult res) {
          const uint64_t wrong =
              res.ok ? testbed::alltoall_wrong(seed, me, n, bytes, ep->memory().window(dst)->data) : 0;
          reply(alltoall_reply(res, wrong, bytes, bytes * (n - 1), at));
        });
      });
    });
  });
}

// An all-to-all's row and reply: `size` B per peer (the caller's data: its whole input), `sent` B to other ranks.
v1::RunReply HostDaemon::Impl::alltoall_reply(const workloads::CollectiveResult& res, uint64_t wrong, uint64_t size,
                                              uint64_t sent, const OpStart& at, const char* collective) const {
  common::JsonObject o;
  const double us = (res.end_ns - res.start_ns) / 1e3;
  o.add("driver", "live").add("topology", topo.name).add("collective", collective).add("algo", "stores");
  o.add("ran", "point-to-point stores").add("size", size).add("count", size).add("ok", res.ok && wrong == 0);
  o.add("time_us", us).add("algbw_gbs", us > 0 ? sent / (us * 1e3) : 0.0).add("wrong", wrong);
  o.add("fallback_chunks", uint64_t{0}).add("fell_back", false).add("faults", res.faults);
  std::vector<uint64_t> planes = plane_tx_bytes();
  for (size_t k = 0; k < planes.size(); ++k) {
    planes[k] -= at.tx[k];
  }
  o.add("plane_tx_bytes", planes);
  // As a collective's row: this rank's links, the data path's times on the machine's clock, where it started.
  std::vector<uint64_t> ids, up, down;
  const std::vector<std::array<uint64_t, 3>> links = link_bytes();
  for (size_t i = 0; i < links.size(); ++i) {
    ids.push_back(links[i][0]);
    up.push_back(links[i][1] - at.links[i][1]);
    down.push_back(links[i][2] - at.links[i][2]);
  }
  o.add("gpu_link_ids", ids).add("gpu_link_up_bytes", up).add("gpu_link_down_bytes", down);
  const common::TimeNs epoch = rt->loop().epoch_ns();
  o.add("data_us", us).add("data_start_ns", res.start_ns + epoch).add("data_end_ns", res.end_ns + epoch);
  common::JsonObject turns;
  turns.add("group", at.turns.group).add("stripe", at.turns.stripe).add("multicast", at.turns.multicast);
  o.add("turns", turns);
  testbed::CollectiveRow retries;
  record_retries(retries, at);
  testbed::add_retries(o, retries);
  v1::RunReply r;
  r.set_ok(res.ok && wrong == 0);
  r.set_error(res.ok ? (wrong ? std::to_string(wrong) + " bytes differ from what their sender wrote" : "") : res.error);
  r.set_wrong(wrong);
  r.set_row_json(o.str());
  return r;
}

namespace {

// An all-to-all's split sizes on the caller's data: `given` (one per rank, summing to `total` where that is known),
// or `total` in n equal blocks; throws naming what does not fit. Each split, and their sum, is at most `limit`
// (checked one by one: a sum of unchecked splits could wrap around to the input's size).
std::vector<uint64_t> splits_of(const google::protobuf::RepeatedField<uint64_t>& given, uint64_t total, int n,
                                const char* what, uint64_t limit) {
  if (given.empty()) {
    IFEC_CHECK(total % n == 0, "alltoall: " << total << " B do not split into " << n << " equal blocks (give the "
                                            << what << " splits)");
    return std::vector<uint64_t>(n, total / n);
  }
  IFEC_CHECK(given.size() == n, "alltoall: " << given.size() << " " << what << " splits for " << n << " ranks");
  uint64_t sum = 0;
  for (int r = 0; r < n; ++r) {
    sum += std::min(given[r], limit + 1);
    IFEC_CHECK(sum <= limit, "alltoall: " << what << " split " << given[r] << " B (rank " << r << ") brings the "
                                          << what << " splits past " << limit << " B");
  }
  return {given.begin(), given.end()};
}

uint64_t total_of(const std::vector<uint64_t>& v) { return std::accumulate(v.begin(), v.end(), uint64_t{0}); }

v1::RunReply error_reply(const std::string& error) {
  v1::RunReply r;
  r.set_error(error);
  return r;
}

// Runs `start` (which hands an operation to the communicator from a callback, after the entry barrier): what it
// throws (an operation still running here) becomes the reply's error, not an exception on the loop, where no reply
// went out and the caller waited for its deadline.
void replying_errors(const std::function<void(v1::RunReply)>& reply, const std::function<void()>& start) {
  try {
    start();
  } catch (const std::exception& e) {
    reply(error_reply(e.what()));
  }
}

// What a rank of an all-to-all on the caller's data gives the split exchange: this text (which an entry barrier's
// mismatch names, as it names a collective's), a NUL, then its send splits and its recv splits (n uint64 each).
constexpr char kAlltoallEntry[] = "alltoall of the caller's data";

// "" when every rank's send splits are what their receivers expect, else the first pair that is not (receiver,
// then sender, in rank order): every rank names the same one (each receiver alone saw only its own column, and the
// ranks it did not concern went on to wait for stores that never came). `parts` is the split exchange.
std::string alltoall_splits_problem(const std::vector<std::vector<uint8_t>>& parts, int n,
                                    std::vector<std::vector<uint64_t>>* send_of) {
  const size_t head = sizeof(kAlltoallEntry);  // the text and its NUL
  const size_t want = head + 2 * n * sizeof(uint64_t);
  std::vector<std::vector<uint64_t>> recv_of(n, std::vector<uint64_t>(n));
  send_of->assign(n, std::vector<uint64_t>(n));
  for (int r = 0; r < n; ++r) {
    const std::vector<uint8_t>& p = parts[r];
    if (p.size() != want || std::memcmp(p.data(), kAlltoallEntry, head) != 0) {
      const auto text_end = std::find(p.begin(), p.end(), uint8_t{0});
      return "rank " + std::to_string(r) + " runs " + std::string(p.begin(), text_end) + " where this rank runs " +
             kAlltoallEntry + ": every rank of a collective must give the same";
    }
    std::memcpy((*send_of)[r].data(), p.data() + head, n * sizeof(uint64_t));
    std::memcpy(recv_of[r].data(), p.data() + head + n * sizeof(uint64_t), n * sizeof(uint64_t));
  }
  for (int d = 0; d < n; ++d) {
    for (int s = 0; s < n; ++s) {
      if ((*send_of)[s][d] != recv_of[d][s]) {
        return "rank " + std::to_string(s) + " sends " + std::to_string((*send_of)[s][d]) + " B to rank " +
               std::to_string(d) + ", which expects " + std::to_string(recv_of[d][s]) + " B (its recv splits)";
      }
    }
  }
  return "";
}

}  // namespace

// All-to-all on the caller's data with split sizes (torch's all_to_all_single): the ranks exchange their send and
// receive splits (every rank checks every pair, so a disagreement fails every rank at once, and a receiver learns
// where each sender's block lands in its output), then every rank stores its blocks, one RC WRITE row per peer of
// that block's length.
void HostDaemon::Impl::run_alltoall_given(Group& grp, const v1::RunRequest& q,
                                          std::function<void(v1::RunReply)> reply) {
  workloads::Communicator* c = grp.comm;
  const int n = c->size();
  const int me = c->rank();
  const std::vector<uint64_t> send = splits_of(q.send_splits(), q.input().size(), n, "send", q.input().size());
  IFEC_CHECK(total_of(send) == q.input().size(), "alltoall: the send splits add up to "
                                                     << total_of(send) << " B, the input is " << q.input().size()
                                                     << " B");
  // What this rank receives comes back in one reply.
  const std::vector<uint64_t> recv = splits_of(q.recv_splits(), q.input().size(), n, "recv", kMaxMessageBytes);
  const std::pair<uint16_t, uint16_t> w = grp.next_windows(q.run_id());
  const uint16_t src = w.first, dst = w.second;
  auto input = std::make_shared<std::string>(q.input());
  c->allocate_window(src, std::max<uint64_t>(64, input->size()), [=](const std::string& e1) {
    c->allocate_window(dst, std::max<uint64_t>(64, total_of(recv)), [=](const std::string& e2) {
      if (!e1.empty() || !e2.empty()) {
        reply(error_reply(e1.empty() ? e2 : e1));
        return;
      }
      std::memcpy(ep->memory().window(src)->data, input->data(), input->size());
      std::vector<uint8_t> mine(sizeof(kAlltoallEntry) + 2 * n * sizeof(uint64_t));
      std::memcpy(mine.data(), kAlltoallEntry, sizeof(kAlltoallEntry));
      std::memcpy(mine.data() + sizeof(kAlltoallEntry), send.data(), n * sizeof(uint64_t));
      std::memcpy(mine.data() + sizeof(kAlltoallEntry) + n * sizeof(uint64_t), recv.data(), n * sizeof(uint64_t));
      // The exchange is also the entry barrier: every rank's windows exist and hold its input.
      c->bootstrap().allgather(std::move(mine), [=](workloads::Gathered g) {
        if (!g.ok) {
          reply(error_reply("alltoall: the split exchange: " + g.error));
          return;
        }
        std::vector<std::vector<uint64_t>> splits;  // [sender][receiver]
        if (const std::string e = alltoall_splits_problem(g.parts, n, &splits); !e.empty()) {
          reply(error_reply("alltoall: " + e));
          return;
        }
        workloads::BatchPutArgs a;
        a.source_window = src;
        a.dest_window = dst;
        uint64_t from = 0;
        uint64_t into = 0;
        for (int d = 0; d < n; ++d) {
          uint64_t at = 0;  // where this rank's block lands in d's output: after those of ranks before it
          for (int s = 0; s < me; ++s) {
            at += splits[s][d];
          }
          if (send[d] > 0) {
            a.rows.push_back({from, d, at, send[d]});
          }
          if (d != me && recv[d] > 0) {
            a.incoming.emplace_back(into, recv[d]);
          }
          from += send[d];
          into += recv[d];
        }
        const OpStart start = op_start(*c);
        const uint64_t sent = total_of(send) - send[me];
        replying_errors(reply, [&] {
          c->put_rows(std::move(a), [=](workloads::CollectiveResult res) {
            v1::RunReply r = alltoall_reply(res, 0, input->size(), sent, start);
            if (res.ok) {
              r.set_output(ep->memory().window(dst)->data, total_of(recv));
            }
            reply(std::move(r));
          });
        });
      });
    });
  });
}

namespace {

// What both sides of a point-to-point transfer give the channel's entry allgather (and must give alike): its
// bytes, tag and the program's group that issued it (a channel's transfers meet in the order each side issued them,
// whichever group issued each).
std::string transfer_text(const v1::RunRequest& q) {
  if (q.op() == "refused") {  // a stand-in (the torch backend's): that rank's caller was told why
    return "a transfer its rank refused";
  }
  return "send of " + std::to_string(q.bytes()) + " B with tag " + std::to_string(q.tag()) +
         (q.group() != 0 ? " in group " + std::to_string(q.group()) : "");
}

}  // namespace

// A point-to-point transfer (torch's send and recv): checks the request, then runs it on its channel, made at the
// channel's first transfer.
void HostDaemon::Impl::run_send(const v1::RunRequest& q, common::TimeNs until,
                                std::function<void(v1::RunReply)> reply) {
  IFEC_CHECK(q.members_size() == 2,
             "send: " << q.members_size() << " GPU(s): a transfer names its sender's and its receiver's GPU");
  IFEC_CHECK(q.group() < kChannelGroups, "send: group " << q.group() << ": groups are numbered below 2^31");
  const int from = q.members(0), to = q.members(1);
  IFEC_CHECK(from != to, "send: GPU " << from << " to itself");
  IFEC_CHECK(from == gpu || to == gpu,
             "send: from GPU " << from << " to GPU " << to << " does not concern GPU " << gpu << " (this hostd's)");
  IFEC_CHECK(topo.num_gpus() <= kMaxChannelGpus, "send: topology " << topo.name << " has " << topo.num_gpus()
                                                                   << " GPUs; transfers run on at most "
                                                                   << kMaxChannelGpus);
  IFEC_CHECK(q.bytes() <= kMaxMessageBytes, "send: " << q.bytes() << " B is more than a reply carries");
  IFEC_CHECK(from == gpu ? q.input().size() == q.bytes() : q.input().empty(),
             "send: GPU " << gpu << (from == gpu ? " sends " : " receives ") << q.bytes() << " B, and its request "
                          << "carries " << q.input().size() << " B of input (the sender's bytes, the receiver none)");
  v1::RunRequest c = q;
  c.set_group(kChannelGroups + (static_cast<uint32_t>(from) << 15) + static_cast<uint32_t>(to));
  // Either side waits for the other as long as its caller allows (a pipeline stage's recv for its sender's compute).
  const common::TimeNs wait = wait_for_others(until);
  with_group(
      c, reply,
      [this, c, reply, until, text = transfer_text(q)](Group& g) {
        set_limit(*g.comm, until);
        run_transfer(g, c, text, reply);
      },
      wait);
}

// One transfer on its channel (group rank 0 sends, 1 receives): each side takes the transfer's window (the
// sender's holds its input, the receiver's what lands) and the two exchange, in one allgather, what they run (bytes
// and tag, which must agree) and that window's key (which the sender stores with); then the sender stores the bytes
// in RC WRITEs and the receiver waits for them. (Communicator::allocate_window would cost a second round trip.)
void HostDaemon::Impl::run_transfer(Group& grp, const v1::RunRequest& q, const std::string& mine,
                                    std::function<void(v1::RunReply)> reply) {
  workloads::Communicator* c = grp.comm;
  const bool sender = c->rank() == 0;
  const uint64_t bytes = q.bytes();
  const uint16_t w = grp.next_windows(q.run_id()).first;
  const std::string pair = "GPU " + std::to_string(grp.members[0]) + " to GPU " + std::to_string(grp.members[1]);
  const int peer = grp.members[sender ? 1 : 0];
  endpoint::SymmetricMemory& mem = ep->memory();
  if (mem.window(w) != nullptr) {
    mem.free_window(w);  // a fresh one: nothing of an earlier transfer's is read as this one's
  }
  const endpoint::WindowInfo& win = mem.allocate_window(w, std::max<uint64_t>(64, bytes), c->options().ifec.job);
  std::memcpy(win.data, q.input().data(), q.input().size());
  common::BlobWriter out;
  out.put_string(mine).put(win.id).put(win.va).put(win.size).put(win.rkey).put(win.job);
  c->bootstrap().allgather(out.take(), [=](workloads::Gathered g) {
    if (!g.ok) {
      reply(error_reply("send: the entry exchange: " + g.error));
      return;
    }
    std::string theirs;
    endpoint::WindowInfo at;
    try {
      common::BlobReader rd(g.parts[sender ? 1 : 0], pair + ": the peer's entry");
      theirs = rd.get_string();
      at.id = rd.get<uint16_t>();
      at.va = rd.get<uint64_t>();
      at.size = rd.get<uint64_t>();
      at.rkey = rd.get<uint32_t>();
      at.job = rd.get<uint32_t>();
    } catch (const std::exception& e) {
      reply(error_reply(std::string("send: ") + e.what()));
      return;
    }
    if (theirs != mine || at.id != w) {
      reply(error_reply(pair + ": the " + (sender ? "receiver" : "sender") + " runs " + theirs + " where this " +
                        (sender ? "sender" : "receiver") + " runs " + mine + ": both sides must give the same"));
      return;
    }
    ep->set_remote_window(peer, at);
    workloads::BatchPutArgs a;
    a.source_window = w;
    a.dest_window = w;
    if (bytes > 0 && sender) {
      a.rows.push_back({0, 1, 0, bytes});
    } else if (bytes > 0) {
      a.incoming.emplace_back(0, bytes);
    }
    const OpStart start = op_start(*c);
    replying_errors(reply, [&] {
      c->put_rows(std::move(a), [=](workloads::CollectiveResult res) {
        v1::RunReply r = alltoall_reply(res, 0, bytes, sender ? bytes : 0, start, "send");
        if (res.ok && !sender) {
          r.set_output(ep->memory().window(w)->data, bytes);
        }
        // Done with on success (every byte landed, every store acknowledged: a resend is a duplicate the QP does not
        // execute): a channel keeps no window between transfers. A failed transfer's stays (late stores land there).
        if (res.ok && ep->memory().window(w) != nullptr) {
          ep->memory().free_window(w);
        }
        reply(std::move(r));
      });
    });
  });
}

void HostDaemon::Impl::run(const v1::RunRequest& q, common::TimeNs until, std::function<void(v1::RunReply)> reply) {
  IFEC_CHECK(o.guest_mac.empty(),
             rt->info().name << ": an external peer (" << o.guest_mac << ") is this GPU: its hostd runs no operations");
  IFEC_CHECK(ready_error.empty(), rt->info().name << ": not bootstrapped: " << ready_error);
  IFEC_CHECK(q.iterations() <= 1, "iterations " << q.iterations()
                                                << ": a hostd runs one operation per request (iterations 0 or 1); "
                                                   "the driver repeats it");
  const bool given = !q.input().empty() || q.send_splits_size() > 0 || q.recv_splits_size() > 0;
  IFEC_CHECK(q.world_size() == 0 || q.world_size() == ranks.size(),
             "the program's world has " << q.world_size() << " rank(s), the fabric " << ranks.size()
                                        << ": every GPU of topology " << topo.name << " is a rank (WORLD_SIZE "
                                        << ranks.size() << ", as ./ifec live torchrun starts them)");
  if (q.what() == "send") {
    run_send(q, until, std::move(reply));
    return;
  }
  IFEC_CHECK(q.group() < kChannelGroups, "group " << q.group()
                                                  << ": groups are numbered below 2^31 (from there up, "
                                                     "point-to-point channels are)");
  if (q.group() != 0) {
    IFEC_CHECK(q.what() != "moe" && (q.what() != "alltoall" || given),
               "group " << q.group() << ": a " << q.what() << " runs among every rank only");
    with_group(
        q, reply,
        [this, q, reply, until](Group& g) {
          set_limit(*g.comm, until);
          q.what() == "alltoall" ? run_alltoall_given(g, q, reply) : run_collective(g, q, until, reply);
        },
        wait_for_others(until));
    return;
  }
  set_limit(*comm, until);
  boot->set_wait(wait_for_others(until));
  if (q.run_id() != 0) {  // the driver numbers operations alike on every rank (see RunRequest.run_id)
    boot->begin_epoch(q.run_id());
  }
  if (q.what() == "alltoall") {
    given ? run_alltoall_given(world, q, std::move(reply)) : run_alltoall(q, std::move(reply));
    return;
  }
  if (q.what() == "moe") {
#ifdef IFEC_HAVE_MOE
    const auto first = static_cast<uint16_t>(kMoeWindows + 4 * (world.runs % 3));
    run_moe({*comm, topo, first, [this] { return plane_tx_bytes(); }, rt->loop().epoch_ns(),
             [this] { return rt->loop().take_worst_late_ns(); }, *worker},
            q, std::move(reply));
    ++world.runs;  // not for a layer refused above: this rank would pick other windows than the others from now on
    return;
#else
    IFEC_FAIL(rt->info().name << ": built without LibTorch: the MoE layer is not available here");
#endif
  }
  run_collective(world, q, until, std::move(reply));
}

void HostDaemon::Impl::with_group(const v1::RunRequest& q, std::function<void(v1::RunReply)> reply,
                                  std::function<void(Group&)> then, common::TimeNs wait_ns) {
  const uint32_t id = q.group();
  const std::vector<int> members(q.members().begin(), q.members().end());
  const std::string name =
      id >= kChannelGroups && members.size() == 2
          ? "the channel from GPU " + std::to_string(members[0]) + " to GPU " + std::to_string(members[1])
          : "group " + std::to_string(id);
  IFEC_CHECK(members.size() >= 2, name << ": " << members.size() << " GPU(s); a group needs two or more");
  std::vector<int> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  IFEC_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(), name << " lists a GPU twice");
  for (int m : members) {
    IFEC_CHECK(m >= 0 && m < topo.num_gpus() && !external[m],
               "group " << id << ": GPU " << m << " is not a rank of topology " << topo.name);
  }
  const auto me = std::find(members.begin(), members.end(), gpu);
  IFEC_CHECK(me != members.end(), name << " does not include GPU " << gpu << " (this hostd's)");
  // Then's errors (a bad request) are the reply's, also when it runs later on the loop.
  auto run = [reply, then](Group& g) {
    try {
      then(g);
    } catch (const std::exception& e) {
      reply(error_reply(e.what()));
    }
  };
  if (auto it = groups.find(id); it != groups.end()) {
    IFEC_CHECK(it->second.members == members, name << " was made of other GPUs");
    IFEC_CHECK(it->second.comm != nullptr, name << " is still being made");
    if (q.run_id() != 0) {
      it->second.boot->begin_epoch(q.run_id());
    }
    it->second.boot->set_wait(wait_ns);
    run(it->second);
    return;
  }
  let_go_of_ended_programs(id);
  Group& g = groups[id];
  g.members = members;
  g.channel = id >= kChannelGroups;
  g.first_window = g.channel
                       ? static_cast<uint16_t>(kChannelWindows + 6 * ((members[0] + members[1]) % topo.num_gpus()) +
                                               3 * (members[0] > members[1]))
                       : static_cast<uint16_t>(kGroupWindows + 6 * ((id - 1) % kGroupsPerProgram));
  AddressOf addr = [this](int node) { return daemon_address(o, node); };
  g.own_boot = std::make_unique<GrpcBootstrap>(rt->loop(), topo, addr, static_cast<int>(me - members.begin()), members,
                                               o.rpc_deadline_ns * 8, id);
  g.boot = g.own_boot.get();
  g.boot->begin_epoch(q.run_id());  // its first operation's allgathers: the communicator's own first
  g.boot->set_wait(wait_ns);
  // The same job (an endpoint's QPs belong to one partition). Its switch groups are numbered by its first GPU and
  // its own counter: a number still held at a switch by another communicator's operation is refused there, and the
  // operation runs at the endpoints instead.
  workloads::CommOptions own = comm_options;
  if (g.channel) {  // its three windows only (one per transfer; a group's operations may store elsewhere too)
    own.first_window = g.first_window;
    own.last_window = static_cast<uint16_t>(g.first_window + 2);
  }
  g.own_comm = std::make_unique<workloads::Communicator>(*ep, *g.own_boot, *control, topo, own);
  g.own_comm->init([this, id, run, reply, name, members](const std::string& err) {
    auto it = groups.find(id);
    // Its ranks must be the GPUs asked for, in that order: an allgather paired out of step (a rank that left its
    // hub) would make a communicator of other GPUs.
    const std::string bad = !err.empty() || it->second.own_comm->gpus() == members
                                ? err
                                : "its bootstrap named GPUs " + gpu_list(it->second.own_comm->gpus());
    if (!bad.empty()) {
      groups.erase(it);
      reply(error_reply(name + ": " + bad));
      return;
    }
    it->second.comm = it->second.own_comm.get();
    run(it->second);
  });
}

// "" when `members` can be a group (as with_group wants them: two or more distinct ranks of the topology), else why.
std::string HostDaemon::Impl::group_members_problem(const std::vector<int>& members) const {
  if (members.size() < 2 || members.size() > ranks.size()) {
    return std::to_string(members.size()) + " GPU(s); a group has 2.." + std::to_string(ranks.size());
  }
  std::vector<char> seen(topo.num_gpus(), 0);
  for (int m : members) {
    if (m < 0 || m >= topo.num_gpus() || external[m]) {
      return "GPU " + std::to_string(m) + " is not a rank of topology " + topo.name;
    }
    if (seen[m]++) {
      return "GPU " + std::to_string(m) + " is listed twice";
    }
  }
  return "";
}

grpc::Status HostDaemon::Impl::group_gather(const std::string& node, const v1::AllgatherRequest& q,
                                            v1::AllgatherReply* out) {
  const std::string what = node + ": allgather of group " + std::to_string(q.group()) + ": ";
  const std::vector<int> members(q.members().begin(), q.members().end());
  if (members.empty() || members[0] != gpu) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        node + ": not the hub of group " + std::to_string(q.group()) + " (its first GPU's hostd is)");
  }
  if (const std::string bad = group_members_problem(members); !bad.empty()) {  // before a hub that many ranks wide
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, what + bad);
  }
  std::shared_ptr<Hub> hub;
  {
    std::lock_guard<std::mutex> lock(hubs_mu);
    GroupHub& slot = group_hubs[q.group()];
    if (!slot.hub) {
      const uint32_t program = program_of(q.group());
      for (auto it = group_hubs.begin(); program != 0 && it != group_hubs.end();) {  // see kGroupsPerProgram
        const uint32_t of = program_of(it->first);
        if (of != 0 && of != program && it->second.hub) {
          it->second.hub->stop();  // a part still waiting there (its program has ended) is told so
          it = group_hubs.erase(it);
        } else {
          ++it;
        }
      }
      slot = {members, std::make_shared<Hub>(members, node_names(members), watch)};
    }
    if (slot.members != members) {  // a rank would wait among GPUs it does not know, or be counted as another
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          what + "its hub was made for GPUs " + gpu_list(slot.members) + ", not " + gpu_list(members));
    }
    hub = slot.hub;
  }
  return hub->gather(node, q, out);
}

// Lets go of the groups of programs other than `group`'s (kGroupsPerProgram): their communicators and windows.
void HostDaemon::Impl::let_go_of_ended_programs(uint32_t group) {
  const uint32_t program = program_of(group);
  for (auto it = groups.begin(); program != 0 && it != groups.end();) {
    const uint32_t of = program_of(it->first);
    if (of == 0 || of == program || it->second.comm == nullptr) {  // one still being made has its init pending
      ++it;
      continue;
    }
    for (uint16_t w = it->second.first_window; w < it->second.first_window + 6; ++w) {  // (never a channel's)
      if (ep->memory().window(w) != nullptr) {
        ep->memory().free_window(w);
      }
    }
    it = groups.erase(it);
  }
}

void HostDaemon::Impl::stop_hubs() {
  if (hub) {
    hub->stop();
  }
  std::lock_guard<std::mutex> lock(hubs_mu);
  for (auto& [id, h] : group_hubs) {
    h.hub->stop();
  }
}

namespace {

// The scenario point a Run request describes (defaults: ifec, fp32, sum, seed 1); throws naming a bad field.
testbed::CollectivePoint point_of(const v1::RunRequest& q) {
  testbed::CollectivePoint p;
  try {
    p.kind = workloads::parse_collective(q.what());
  } catch (const common::Error& e) {
    IFEC_FAIL(e.what() << "; a hostd also runs alltoall and moe");
  }
  p.algo = workloads::parse_algo(q.algo().empty() ? "ifec" : q.algo());
  p.dtype = common::parse_ech_dtype(q.dtype().empty() ? "fp32" : q.dtype());
  p.op = common::parse_ech_redop(q.op().empty() ? "sum" : q.op());
  p.bytes = q.bytes();
  p.seed = q.seed() == 0 ? 1 : q.seed();
  const size_t es = workloads::element_size(p.dtype);
  IFEC_CHECK(p.kind == workloads::Collective::kBarrier || (p.bytes > 0 && p.bytes % es == 0),
             "size " << p.bytes << " B is not a positive whole number of " << es << "-byte elements");
  IFEC_CHECK(p.bytes <= kMaxWindowBytes, "size " << p.bytes << " B is more than a window holds (4 GiB)");
  return p;
}

// What every rank of a collective must give alike: "allreduce of 1024 fp32 elements, sum, algorithm ifec".
std::string operation_text(const workloads::CollArgs& a, workloads::Algo algo) {
  std::ostringstream os;
  os << workloads::collective_name(a.kind) << " of " << a.count << " " << common::ech_dtype_name(a.dtype)
     << " elements";
  if (a.kind == workloads::Collective::kAllReduce || a.kind == workloads::Collective::kReduce ||
      a.kind == workloads::Collective::kReduceScatter) {
    os << ", " << common::ech_redop_name(a.op);
  }
  if (a.kind == workloads::Collective::kReduce || a.kind == workloads::Collective::kMulticast) {
    os << ", root " << a.root;
  }
  os << ", algorithm " << workloads::algo_name(algo);
  return os.str();
}

// An entry's text: up to its NUL (an all-to-all's entry carries its splits after one: kAlltoallEntry).
std::string entry_text(const std::vector<uint8_t>& part) {
  return std::string(part.begin(), std::find(part.begin(), part.end(), uint8_t{0}));
}

// "" when every rank's entry (operation_text) is rank 0's, else the first that is not, with rank 0's.
std::string operation_mismatch(const workloads::Gathered& g) {
  for (size_t r = 1; r < g.parts.size(); ++r) {
    if (g.parts[r] != g.parts[0]) {
      return "rank " + std::to_string(r) + " runs " + entry_text(g.parts[r]) + " where rank 0 runs " +
             entry_text(g.parts[0]) + ": every rank of a collective must give the same";
    }
  }
  return "";
}

}  // namespace

// One collective, this rank's part: its windows (a fresh pair per run, in turn), its input, an entry barrier, then
// the operation.
void HostDaemon::Impl::run_collective(Group& grp, const v1::RunRequest& q, common::TimeNs until,
                                      std::function<void(v1::RunReply)> reply) {
  workloads::Communicator* c = grp.comm;
  testbed::CollectivePoint p = point_of(q);
  const size_t es = workloads::element_size(p.dtype);
  const int n = c->size();
  const auto given = std::make_shared<Given>();
  if (!q.input().empty()) {
    IFEC_CHECK(p.kind != workloads::Collective::kBarrier, "a barrier takes no input");
    IFEC_CHECK(q.input().size() == p.bytes,
               "input of " << q.input().size() << " B for a " << p.bytes << " B " << q.what());
    given->out_bytes = p.bytes;
    if (p.kind == workloads::Collective::kAllGather) {  // this rank's block in, every block out
      given->at = p.bytes * c->rank();
      given->out_bytes = p.bytes * n;
      p.bytes *= n;
    } else if (p.kind == workloads::Collective::kReduceScatter) {  // every block in, this rank's block out
      IFEC_CHECK(p.bytes % (es * n) == 0,
                 "reduce-scatter: " << p.bytes << " B is not " << n << " equal blocks of " << es << "-byte elements");
      given->out_bytes = p.bytes / n;
      given->out = given->out_bytes * c->rank();
    }
  }
  workloads::CollArgs a;
  a.kind = p.kind;
  a.root = q.root();
  a.count = p.kind == workloads::Collective::kBarrier ? 0 : p.bytes / es;
  a.dtype = p.dtype;
  a.op = p.op;
  const uint64_t scratch = std::max<uint64_t>(4096, workloads::Communicator::scratch_bytes(a, n, p.algo, &topo, 0));
  IFEC_CHECK(a.count * es <= kMaxWindowBytes && scratch <= kMaxWindowBytes,
             q.what() << " of " << p.bytes << " B over " << n << " ranks needs a " << a.count * es << " B buffer and a "
                      << scratch << " B scratch window: a window holds at most 4 GiB");
  std::tie(a.window, a.scratch_window) = grp.next_windows(q.run_id());  // once nothing refuses the request
  auto input = std::make_shared<std::string>(q.input());
  c->allocate_window(a.window, std::max<uint64_t>(64, a.count * es),
                     [this, c, a, p, scratch, until, reply, input, given](const std::string& e1) {
                       if (!e1.empty()) {
                         reply(error_reply(e1));
                         return;
                       }
                       c->allocate_window(a.scratch_window, scratch,
                                          [this, c, a, p, until, reply, input, given](const std::string& e2) {
                                            e2.empty() ? fill_collective(c, a, p, until, reply, input, given)
                                                       : reply(error_reply(e2));
                                          });
                     });
}

// This rank's input in its window: drawn from (seed, rank), or the caller's copied. Off the loop (LoopWorker):
// hundreds of MiB take seconds, and the loop keeps BGP alive meanwhile.
void HostDaemon::Impl::fill_collective(workloads::Communicator* c, const workloads::CollArgs& a,
                                       const testbed::CollectivePoint& p, common::TimeNs until,
                                       std::function<void(v1::RunReply)> reply, std::shared_ptr<std::string> input,
                                       std::shared_ptr<const Given> given) {
  uint8_t* data = ep->memory().window(a.window)->data;
  worker->post(
      [p, rank = c->rank(), count = a.count, data, input, given] {
        if (input->empty()) {
          testbed::collective_input(p, rank, count, data);
        } else {
          std::memcpy(data + given->at, input->data(), input->size());
        }
      },
      [this, c, a, p, until, reply, input, given](const std::string& e) {
        if (!e.empty()) {
          reply(error_reply(e));
          return;
        }
        replying_errors(reply, [&] { enter_collective(c, a, p, until, reply, input->empty() ? nullptr : given); });
      });
}

// Every rank holds its input before any rank starts (a peer's first store must not land before this rank's own input
// is written, which would overwrite it). The byte counts start before the barrier: no peer's frame of this operation
// can arrive before this rank entered it. The barrier carries what this rank runs: one that gave another size, type,
// reduction, root or algorithm is named at every rank at once.
void HostDaemon::Impl::enter_collective(workloads::Communicator* c, const workloads::CollArgs& a,
                                        const testbed::CollectivePoint& p, common::TimeNs until,
                                        std::function<void(v1::RunReply)> reply, std::shared_ptr<const Given> given) {
  const std::string mine = operation_text(a, p.algo);
  c->bootstrap().allgather(std::vector<uint8_t>(mine.begin(), mine.end()), [this, c, a, p, until, reply, given,
                                                                            at = op_start(*c)](workloads::Gathered g) {
    if (!g.ok) {
      reply(error_reply("entry barrier: " + g.error));
      return;
    }
    if (const std::string e = operation_mismatch(g); !e.empty()) {
      reply(error_reply(e));
      return;
    }
    replying_errors(reply, [&] {
      set_limit(*c, until);  // counted from here, where the operation's own clock starts
      c->run(a, p.algo, [this, c, a, p, reply, at, given](workloads::CollectiveResult res) {
        // The counters now (the loop's); the check against the reference, or the output's copy, off the loop.
        auto row = std::make_shared<testbed::CollectiveRow>(collective_row(*c, p, a, res, at));
        const bool holds = p.kind != workloads::Collective::kReduce || c->rank() == a.root;
        const bool check = res.ok && holds && !given;
        const uint8_t* data = ep->memory().window(a.window)->data;
        const bool rounds = row->ran != "ifec" || res.fell_back;
        auto r = std::make_shared<v1::RunReply>();
        worker->post(
            [this, row, r, check, rounds, data, given, n = c->size(), root = a.root, rank = c->rank(), ok = res.ok] {
              if (check) {  // broadcast: the reference is the root's input
                testbed::record_check(*row, n, rounds, {data}, root, rank);
              }
              if (given && ok) {
                r->set_output(data + given->out, given->out_bytes);
              }
              r->set_ok(row->ok);
              r->set_error(row->error);
              r->set_wrong(row->wrong);
              r->set_row_json(testbed::row_json(*row, topo.name, "live"));
            },
            [reply, r](const std::string& e) { reply(e.empty() ? std::move(*r) : error_reply(e)); });
      });
    });
  });
}

// This rank's row of a finished collective: its result and its frame bytes per plane and per link since the start
// (its output is checked against the fp64 reference off the loop: enter_collective).
testbed::CollectiveRow HostDaemon::Impl::collective_row(workloads::Communicator& c, const testbed::CollectivePoint& p,
                                                        const workloads::CollArgs& a,
                                                        const workloads::CollectiveResult& res, const OpStart& at) {
  const int n = c.size();
  testbed::CollectiveRow row;
  row.point = p;
  row.count = a.count;
  testbed::record_result(row, res, n);
  row.data_start_ns += rt->loop().epoch_ns();  // the machine's monotonic clock: the ranks' rows compare
  row.data_end_ns += rt->loop().epoch_ns();
  row.error = res.error;
  const std::vector<uint64_t> tx1 = plane_tx_bytes();
  for (size_t k = 0; k < tx1.size(); ++k) {
    row.plane_tx_bytes.push_back(tx1[k] - at.tx[k]);  // this rank's frames, FARE's included
  }
  row.gpu_links = link_bytes();
  for (size_t i = 0; i < row.gpu_links.size(); ++i) {
    row.gpu_links[i][1] -= at.links[i][1];
    row.gpu_links[i][2] -= at.links[i][2];
  }
  row.turns = at.turns;
  record_retries(row, at);
  return row;
}

HostDaemon::HostDaemon(DaemonOptions o) : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.o = std::move(o);
  d.rt = start_node(d.o, d.topo, routing::NodeKind::kGpu, [&d](const routing::Topology& t) {
    for (const std::string& name : d.o.external_peers) {
      const int n = t.find_node(name);
      IFEC_CHECK(n >= 0 && t.nodes[n].kind == routing::NodeKind::kGpu && name != d.o.node,
                 "--external-peers: '" << name << "' is not another GPU of topology " << t.name);
    }
  });
  d.worker = std::make_unique<LoopWorker>(d.rt->loop());
  d.gpu = d.rt->info().gpu_index;
  d.external.assign(d.topo.num_gpus(), 0);
  for (const std::string& name : d.o.external_peers) {
    d.external[d.topo.nodes[d.topo.find_node(name)].gpu_index] = 1;
  }
  for (int g = 0; g < d.topo.num_gpus(); ++g) {
    if (!d.external[g]) {
      d.rank = g == d.gpu ? static_cast<int>(d.ranks.size()) : d.rank;
      d.ranks.push_back(g);
    }
  }
  const bool guest = !d.o.guest_mac.empty();
  if (guest) {  // the switch learns a guest's MAC by ARP: the interface must carry it
    std::string want = d.o.guest_mac;
    std::transform(want.begin(), want.end(), want.begin(), [](unsigned char c) { return std::tolower(c); });
    for (const auto& p : d.rt->ports()) {
      IFEC_CHECK(mac_text(p->device().mac()) == want,
                 d.o.node << ": --guest-mac " << d.o.guest_mac << " but " << p->device().name() << " has MAC "
                          << mac_text(p->device().mac()) << " (give the interface the guest's MAC first)");
    }
  }
  if (d.rank == 0 && !guest) {
    d.hub = std::make_unique<Hub>(d.ranks, d.node_names(d.ranks), d.watch);
  }
  if (!guest) {
    d.ring = HostRing::create(d.o.node, static_cast<uint32_t>(d.gpu), static_cast<uint32_t>(d.topo.num_gpus()),
                              kRingSlots, kRingDataBytes, kRingWindowBytes);
  }
  d.service = std::make_unique<HostService>(d);
  const std::string listen = listen_address(d.o, d.rt->node());
  d.server = start_server(d.o, listen, d.service.get(), kMaxMessageBytes);
  d.metrics = std::make_unique<MetricsServer>(d.rt->loop(), metrics_address(d.o, d.rt->node()), [&d] {
    return d.rt->render_metrics(d.ready_error.empty(), [&d](const std::string& node) {
      if (!d.ep) {
        return std::string();
      }
      std::string out = "# TYPE ifec_endpoint_total counter\n";
      for (const auto& [k, v] : d.ep->named_counters()) {
        out += metric("ifec_endpoint_total", node + ",counter=\"" + k + "\"", static_cast<double>(v));
      }
      return out;
    });
  });
  d.rt->start();
  d.rt->note("start", "hostd " + d.o.node + " (GPU " + std::to_string(d.gpu) + ") serving on " + listen);
  // Wait (on the loop) until every live port heard its switch, at most 10 s, then start the endpoint. The step
  // holds itself weakly (a strong self-reference never freed it: LeakSanitizer under fuzz_grpc); each scheduled
  // next step holds it strongly until it runs.
  auto wait = std::make_shared<std::function<void(int)>>();
  *wait = [&d, self = std::weak_ptr<std::function<void(int)>>(wait), guest](int left) {
    if (guest && d.rt->all_heard()) {  // an external peer: FARE over BGP is all this daemon does for it
      d.ready_error = "";
      d.rt->note("guest", "speaking BGP for the external peer " + d.o.guest_mac + " (no endpoint here)");
      return;
    }
    if (!guest && (d.rt->all_heard() || left == 0)) {
      d.start_endpoint();
      return;
    }
    d.rt->loop().schedule(d.rt->loop().now() + 50'000'000, [next = self.lock(), left] { (*next)(left - 1); });
  };
  d.rt->loop().schedule(0, [wait] { (*wait)(200); });
}

HostDaemon::~HostDaemon() {
  impl_->stop_hubs();
  if (impl_->server) {
    impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
}

void HostDaemon::run() { impl_->rt->serve(); }
void HostDaemon::stop() {
  impl_->stop_hubs();  // any thread: the hubs lock
  impl_->rt->loop().stop();
}

int hostd_main(int argc, char** argv) { return serve<HostDaemon>(argc, argv, "a GPU"); }

}  // namespace ifec::live
