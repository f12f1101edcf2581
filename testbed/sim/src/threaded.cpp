// The wall-clock, multi-threaded driver: bridge ports between rank threads and the fabric's thread.
#include "ifec/testbed/threaded.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <optional>

#include "ifec/common/checks.h"

namespace ifec::testbed {

using common::TimeNs;

namespace {

Poster post_to(common::RealtimeLoop& loop) {
  common::RealtimeLoop* l = &loop;
  return [l](std::function<void()> fn) { l->schedule(l->now(), std::move(fn)); };
}

}  // namespace

// A GPU port seen from the rank's thread. send() posts the frame to the fabric's thread, where it waits in a queue
// for the link end (a common::LinkPort on the fabric's loop); frames the link delivers are posted back to the
// rank's loop. busy() while 32 frames wait, so the endpoint's own queues and pacing still apply.
class ThreadedCluster::BridgePort : public common::Port {
 public:
  static constexpr int kDepth = 32;

  BridgePort(common::LinkPort* io, common::RealtimeLoop& rank_loop, common::RealtimeLoop& fabric_loop)
      : io_(io), rank_(rank_loop), fabric_(fabric_loop), up_(io->link_up()), rate_(io->rate_bps()) {
    io_->set_tx_ready([this] { drain(); });  // fabric thread
  }

  bool send(std::vector<uint8_t>&& frame) override {
    // Only this (the rank's) thread adds, so the check cannot go stale upward; the fabric's thread only takes away.
    if (queued_.load() >= kDepth) {
      return false;
    }
    queued_.fetch_add(1);
    auto f = std::make_shared<std::vector<uint8_t>>(std::move(frame));
    fabric_.schedule(fabric_.now(), [this, f] {
      waiting_.push_back(std::move(*f));
      drain();
    });
    return true;
  }
  bool busy() const override { return queued_.load() >= kDepth; }
  bool link_up() const override { return up_; }  // no link events in this driver (yet)
  uint64_t rate_bps() const override { return rate_; }
  void set_receiver(Receiver rx) override {
    rx_ = std::move(rx);
    io_->set_receiver([this](std::vector<uint8_t>&& frame) {  // fabric thread
      auto f = std::make_shared<std::vector<uint8_t>>(std::move(frame));
      rank_.schedule(rank_.now(), [this, f] { rx_(std::move(*f)); });
    });
  }
  void set_tx_ready(TxReady ready) override { ready_ = std::move(ready); }

 private:
  // Fabric thread: hands waiting frames to the link while it takes them.
  void drain() {
    while (!waiting_.empty() && !io_->busy()) {
      io_->send(std::move(waiting_.front()));
      waiting_.pop_front();
      if (queued_.fetch_sub(1) == kDepth) {
        rank_.schedule(rank_.now(), [this] {
          if (ready_) {
            ready_();
          }
        });
      }
    }
  }

  common::LinkPort* io_;
  common::RealtimeLoop& rank_;
  common::RealtimeLoop& fabric_;
  const bool up_;
  const uint64_t rate_;
  std::atomic<int> queued_{0};
  std::deque<std::vector<uint8_t>> waiting_;  // fabric thread only
  Receiver rx_;
  TxReady ready_;
};

ThreadedCluster::ThreadedCluster(const routing::Topology& topo, ClusterOptions opts, workloads::CommOptions comm)
    : start_(std::chrono::steady_clock::now()), topo_(topo), fabric_loop_(start_), boot_(topo.num_gpus()) {
  if (opts.ifec) {
    topo_.params.ifec = *opts.ifec;
  }
  fabric_ = std::make_unique<Fabric>(fabric_loop_, topo_, opts.fabric);
  const int n = fabric_->num_gpus();
  std::vector<uint32_t> ips;
  for (int g = 0; g < n; ++g) {
    ips.push_back(fabric_->gpu_ip(g));
  }
  std::map<std::string, switchemu::Switch*> switches;
  for (int i = 0; i < fabric_->num_switches(); ++i) {
    switches[topo_.nodes.at(fabric_->switch_node(i)).name] = &fabric_->switch_at(i);
  }
  ranks_.resize(n);
  for (int g = 0; g < n; ++g) {
    Rank& r = ranks_[g];
    r.loop = std::make_unique<common::RealtimeLoop>(start_);
    std::vector<endpoint::EndpointPort> ports;
    for (const GpuPort& gp : fabric_->gpu_ports(g)) {
      r.ports.push_back(std::make_unique<BridgePort>(gp.io, *r.loop, fabric_loop_));
      ports.push_back({r.ports.back().get(), gp.plane, gp.mac, gp.peer_mac});
    }
    endpoint::EndpointConfig c = opts.endpoint;
    c.index = g;
    c.ip = ips[g];
    c.mtu = std::min<uint32_t>(c.mtu, topo_.params.mtu);
    c.lossless_priority = topo_.params.pfc.lossless_priority;
    r.ep = std::make_unique<endpoint::Endpoint>(*r.loop, c, std::move(ports), ips);
    // FARE's weights toward every peer, read once here (no link events in this driver): no rank thread reads the
    // fabric's state.
    std::vector<std::vector<double>> weights(n);
    for (int peer = 0; peer < n; ++peer) {
      weights[peer].assign(fabric_->gpu_ports(g).size(), 0.0);
      for (const routing::NextHop& h : peer == g ? std::vector<routing::NextHop>{} : fabric_->gpu_next_hops(g, peer)) {
        for (size_t i = 0; i < fabric_->gpu_ports(g).size(); ++i) {
          weights[peer][i] += fabric_->gpu_ports(g)[i].port == h.port ? h.weight : 0.0;
        }
      }
    }
    r.ep->set_weight_source([weights](int peer, std::vector<double>* w) { *w = weights.at(peer); });
    r.ep->routes_changed();
    r.control = std::make_unique<InProcessControl>(
        topo_, switches, [this](int link, bool up) { fabric_->schedule_link_state(link, up, fabric_loop_.now()); },
        post_to(fabric_loop_), post_to(*r.loop));
    r.comm = std::make_unique<workloads::Communicator>(*r.ep, boot_.rank(g, post_to(*r.loop)), *r.control, topo_, comm);
  }
  for (int g = 0; g < n; ++g) {
    ranks_[g].ep->set_connection_manager(
        [this, g](int peer, int q, uint32_t psn, const endpoint::Endpoint::ResetDone& done) {
          // The peer's responder is reset on the peer's thread; the answer comes back on this rank's.
          Rank& p = ranks_.at(peer);
          common::RealtimeLoop* mine = ranks_.at(g).loop.get();
          p.loop->schedule(p.loop->now(), [&p, mine, g, q, psn, done] {
            p.ep->reset_responder(g, q, psn);
            mine->schedule(mine->now(), [done] { done(""); });
          });
        });
  }
  fabric_thread_ = std::thread([this] { fabric_loop_.serve(common::kForever); });
  for (Rank& r : ranks_) {
    common::RealtimeLoop* loop = r.loop.get();
    r.thread = std::thread([loop] { loop->serve(common::kForever); });
  }
  const auto init = run(
      [](int, workloads::Communicator& c, workloads::Communicator::Done done) {
        c.init([done](const std::string& err) {
          workloads::CollectiveResult r;
          r.ok = err.empty();
          r.error = err;
          done(r);
        });
      },
      std::chrono::milliseconds(5000));
  for (size_t g = 0; g < init.size(); ++g) {
    IFEC_CHECK(init[g].ok, "threaded cluster: rank " << g << " did not initialise: " << init[g].error);
  }
}

ThreadedCluster::~ThreadedCluster() {
  for (Rank& r : ranks_) {
    r.loop->stop();
    if (r.thread.joinable()) {
      r.thread.join();
    }
  }
  fabric_loop_.stop();
  if (fabric_thread_.joinable()) {
    fabric_thread_.join();
  }
}

std::vector<workloads::CollectiveResult> ThreadedCluster::run(const RankFn& fn, std::chrono::milliseconds limit) {
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::optional<workloads::CollectiveResult>> got;
    int left = 0;
  };
  auto st = std::make_shared<State>();
  st->got.resize(ranks_.size());
  st->left = size();
  for (int r = 0; r < size(); ++r) {
    Rank& rk = ranks_[r];
    workloads::Communicator* comm = rk.comm.get();
    rk.loop->schedule(rk.loop->now(), [st, fn, r, comm] {
      fn(r, *comm, [st, r](workloads::CollectiveResult res) {
        std::lock_guard<std::mutex> lock(st->mu);
        if (!st->got[r]) {
          st->got[r] = std::move(res);
          --st->left;
          st->cv.notify_all();
        }
      });
    });
  }
  std::unique_lock<std::mutex> lock(st->mu);
  st->cv.wait_for(lock, limit, [&] { return st->left == 0; });
  std::vector<workloads::CollectiveResult> out;
  for (int r = 0; r < size(); ++r) {
    if (st->got[r]) {
      out.push_back(*st->got[r]);
    } else {
      workloads::CollectiveResult res;
      res.error = "rank " + std::to_string(r) + " did not finish within " + std::to_string(limit.count()) +
                  " ms of wall-clock time";
      out.push_back(res);
    }
  }
  return out;
}

void ThreadedCluster::on_rank(int r, const std::function<void(endpoint::Endpoint&)>& fn) {
  Rank& rk = ranks_.at(r);
  std::promise<void> done;
  endpoint::Endpoint* ep = rk.ep.get();
  rk.loop->schedule(rk.loop->now(), [&done, &fn, ep] {
    try {
      fn(*ep);
      done.set_value();
    } catch (...) {
      done.set_exception(std::current_exception());
    }
  });
  done.get_future().get();  // rethrows what fn threw
}

}  // namespace ifec::testbed
