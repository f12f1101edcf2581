// Cluster: endpoints over a simulated Fabric, FARE-driven weights, window exchange, wait and barrier.
#include "ifec/testbed/cluster.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>

#include "ifec/common/checks.h"

namespace ifec::testbed {

using common::TimeNs;

namespace {

std::string gpu_range(int first, int last) {
  return last > first ? std::to_string(first) + "-" + std::to_string(last) : std::to_string(first);
}

}  // namespace

void Cluster::check_options(const routing::Topology& topo, const ClusterOptions& opts) {
  IFEC_CHECK(!topo.single_plane_gpus(),
             "topology '" << topo.name << "' has GPUs on one plane each (in-node NVLink forwarding, DeepSeek-V3's "
                          << "fabric): the endpoint runtime (collectives, MoE) needs every GPU on every plane; raw "
                          << "traffic (ifec sim --traffic) runs on it");
  IFEC_CHECK(opts.threads >= 0, "cluster: threads " << opts.threads << " (0: one loop, N >= 1: partitioned)");
  const bool spread = opts.processes != nullptr && opts.processes->size > 1;
  IFEC_CHECK(!spread || opts.threads >= 1, "cluster over processes: threads " << opts.threads << ", expected >= 1");
  IFEC_CHECK(opts.fabric.leaf_groups >= 0,
             "leaf groups " << opts.fabric.leaf_groups << ": expected 0 (the switches by plane) or more");
  IFEC_CHECK(
      opts.fabric.leaf_groups == 0 || opts.threads >= 1,
      "leaf groups (" << opts.fabric.leaf_groups << ") on one event loop: they partition a run (--threads >= 1)");
  IFEC_CHECK(opts.gpu_groups == 0 || opts.threads >= 1,  // one event loop took any count and ran no groups
             "cluster: GPU groups " << opts.gpu_groups << " on one event loop: they partition a run (--threads >= 1)");
  IFEC_CHECK(opts.planes >= 0 && opts.planes <= topo.num_planes,
             "cluster: planes " << opts.planes << " outside 0.." << topo.num_planes << " (0: every plane)");
  if (opts.threads == 0) {
    return;
  }
  if (opts.fabric.leaf_groups > 0) {  // a count the planes' leaves cannot give, named
    leaf_group_partitions(topo, opts.fabric.leaf_groups, false);
  }
  const int n = topo.num_gpus();
  const int groups = opts.gpu_groups == 0 ? std::min(opts.threads, n) : opts.gpu_groups;
  IFEC_CHECK(opts.gpu_groups >= 0 && groups >= 1 && groups <= n,
             "cluster: GPU groups " << opts.gpu_groups << " outside 1.." << n
                                    << " (--gpu-groups: one per GPU at most; 0: one per thread)");
}

Cluster::Cluster(const routing::Topology& topo, ClusterOptions opts) : topo_(topo), opts_(opts) {
  check_options(topo_, opts_);
  if (opts_.ifec) {
    topo_.params.ifec = *opts_.ifec;
  }
  const bool spread = opts_.processes != nullptr && opts_.processes->size > 1;
  if (opts_.threads == 0) {
    fabric_ = std::make_unique<testbed::Fabric>(loop_, topo_, opts_.fabric);
    gpu_loops_.assign(fabric_->num_gpus(), &loop_);
  } else {
    make_partitions(spread);
  }
  const int n = fabric_->num_gpus();
  std::vector<uint32_t> ips;
  for (int g = 0; g < n; ++g) {
    ips.push_back(fabric_->gpu_ip(g));
  }
  const int planes = opts_.planes > 0 ? opts_.planes : topo_.num_planes;
  used_ports_.resize(n);
  for (int g = 0; g < n; ++g) {
    std::vector<endpoint::EndpointPort> ports;
    const auto& gp = fabric_->gpu_ports(g);
    for (size_t i = 0; i < gp.size(); ++i) {
      if (gp[i].plane < planes) {
        ports.push_back({gp[i].io, gp[i].plane, gp[i].mac, gp[i].peer_mac});
        used_ports_[g].push_back(static_cast<int>(i));
      }
    }
    endpoint::EndpointConfig c = opts_.endpoint;
    c.index = g;
    c.ip = ips[g];
    c.mtu = std::min<uint32_t>(c.mtu, topo_.params.mtu);
    c.lossless_priority = topo_.params.pfc.lossless_priority;
    c.elided_payloads = opts_.fabric.elided_payloads;  // one mode for the whole run
    endpoints_.push_back(std::make_unique<endpoint::Endpoint>(*gpu_loops_[g], c, std::move(ports), ips));
  }
  for (int g = 0; g < n; ++g) {
    endpoint::Endpoint& e = *endpoints_[g];
    e.set_connection_manager([this, g](int peer, int q, uint32_t psn, const endpoint::Endpoint::ResetDone& done) {
      later(g, [this, g, peer, q, psn, done] {  // the peer's responder is reset at once (partitioned: after the window)
        endpoints_[peer]->reset_responder(g, q, psn);
        done("");
      });
    });
    // FARE's WECMP group at this GPU toward `peer`, as a weight per endpoint port.
    e.set_weight_source([this, g](int peer, std::vector<double>* w) {
      const auto& ports = used_ports_[g];
      w->assign(ports.size(), 0.0);
      if (peer == g) {
        return;
      }
      const auto& gp = fabric_->gpu_ports(g);
      for (const routing::NextHop& h : fabric_->gpu_next_hops(g, peer)) {
        for (size_t i = 0; i < ports.size(); ++i) {
          if (gp[ports[i]].port == h.port) {
            (*w)[i] += h.weight;
          }
        }
      }
    });
  }
  fabric_->on_routes_changed([this](TimeNs) {
    for (auto& e : endpoints_) {
      e->routes_changed();
    }
  });
  allocate_window(kBarrierWindow, 64 * 8);
  std::map<std::string, switchemu::Switch*> switches;
  for (int i = 0; i < fabric_->num_switches(); ++i) {
    const routing::Node& n = topo_.nodes.at(fabric_->switch_node(i));
    switches[n.name] = &fabric_->switch_at(i);
    switch_partitions_[n.name] = fabric_->switch_partition(fabric_->switch_node(i));
  }
  make_control(std::move(switches));
}

void Cluster::make_control(std::map<std::string, switchemu::Switch*> switches) {
  auto set_link = [this](int link, bool up) { fabric_->schedule_link_state(link, up, fabric_->clock().now()); };
  if (!parts_) {
    control_ =
        std::make_unique<InProcessControl>(topo_, std::move(switches), set_link, poster_of(loop_), poster_of(loop_));
    return;
  }
  // Partitioned, a call to a switch is a message the control loop runs at the end of the window it was made in,
  // where the switch runs; its answer comes back as one. Each GPU's communicators have a client of their own
  // (its messages are posted after the window, in later()'s order), the driver one more (source: the GPU count).
  Poster now = [](std::function<void()> fn) { fn(); };
  switch_control_ = std::make_unique<InProcessControl>(topo_, std::move(switches), set_link, now, now);
  const int n = size();
  for (int g = 0; g < n; ++g) {
    gpu_control_.push_back(std::make_unique<MessageControlClient>([this, g](std::vector<uint8_t> m) {
      auto msg = std::make_shared<std::vector<uint8_t>>(std::move(m));
      later(g, [this, g, msg] { parts_->post_message(static_cast<uint32_t>(g), std::move(*msg)); });
    }));
  }
  auto driver = std::make_unique<MessageControlClient>(
      [this, n](std::vector<uint8_t> m) { parts_->post_message(static_cast<uint32_t>(n), std::move(m)); });
  parts_->on_message([this](const std::vector<uint8_t>& m) { serve_message(m); });
  parts_->on_reply([this, n, c = driver.get()](uint32_t source, std::vector<uint8_t> m) {
    IFEC_CHECK(source <= static_cast<uint32_t>(n), "control answer for source " << source << " of 0.." << n);
    if (source == static_cast<uint32_t>(n)) {
      c->on_reply(m);  // the driver's, between steps
      return;
    }
    MessageControlClient* gc = gpu_control_[source].get();
    common::EventLoop* loop = gpu_loops_[source];
    loop->schedule(loop->now(), [gc, m = std::move(m)] { gc->on_reply(m); });
  });
  control_ = std::move(driver);
}

void Cluster::make_partitions(bool spread) {
  // The switches' partitions: one per plane, or per plane and leaf group (counts check_options took).
  const int planes = std::max(topo_.num_planes, 1) * std::max(opts_.fabric.leaf_groups, 1);
  const int n = topo_.num_gpus();
  const int groups = opts_.gpu_groups == 0 ? std::min(opts_.threads, n) : opts_.gpu_groups;
  const Processes solo;
  const Processes& procs = spread ? *opts_.processes : solo;
  int threads = opts_.threads;
  if (spread) {  // rank 0 runs the GPUs' groups, ranks 1.. the planes: at most one thread per partition there
    const int mine = procs.rank == 0 ? groups : (planes - (procs.rank - 1) + procs.size - 2) / (procs.size - 1);
    threads = std::min(threads, std::max(mine, 1));
  }
  parts_ = std::make_unique<PlanePartitions>(planes, threads, procs.rank, procs.size, groups,
                                             spread ? opts_.processes : nullptr);
  std::vector<int> group_of(n);
  for (int k = 0; k <= groups; ++k) {
    group_first_.push_back(static_cast<int>(static_cast<int64_t>(n) * k / groups));
  }
  for (int k = 0; k < groups; ++k) {
    for (int g = group_first_[k]; g < group_first_[k + 1]; ++g) {
      group_of[g] = k;
      gpu_loops_.push_back(&parts_->gpu_loop(k));
    }
  }
  later_.resize(n);
  std::vector<std::string> names;
  for (int k = 0; k < groups; ++k) {
    names.push_back("GPUs " + gpu_range(group_first_[k], group_first_[k + 1] - 1));
  }
  parts_->set_gpu_group_names(std::move(names));
  if (opts_.fabric.leaf_groups > 0) {
    parts_->set_partition_names(leaf_group_names(topo_, opts_.fabric.leaf_groups));
  }
  fabric_ = std::make_unique<testbed::Fabric>(
      parts_->control(), parts_->plane_clocks(), topo_, opts_.fabric,
      [this](int from, int to, int source) { return parts_->mailbox(from, to, source); },
      [this, group_of](int g) -> Fabric::GpuPartition {
        return {parts_->gpu_partition(group_of[g]), &parts_->gpu_loop(group_of[g])};
      });
  parts_->set_lookahead(fabric_->cross_partition_delay());
  parts_->on_window_end([this] { run_later(); });
  if (!spread) {
    return;
  }
  connect_processes(*fabric_, *parts_);
}

void Cluster::later(int gpu, std::function<void()> fn) {
  if (parts_ && parts_->in_window()) {
    later_[gpu].push_back({gpu_loops_[gpu]->now(), std::move(fn)});
  } else {
    fn();
  }
}

void Cluster::run_later() {
  std::vector<Later> order;  // by time; GPU, then the order asked, at equal times (a stable sort)
  for (auto& asked : later_) {
    std::move(asked.begin(), asked.end(), std::back_inserter(order));
    asked.clear();  // taken before any runs: one that throws leaves none behind to run twice
  }
  std::stable_sort(order.begin(), order.end(), [](const Later& a, const Later& b) { return a.at < b.at; });
  for (Later& l : order) {
    l.fn();  // not in a window: what it asks runs at once
  }
}

common::ControlPlane& Cluster::control_of(int gpu) { return parts_ ? *gpu_control_.at(gpu) : *control_; }

common::EventLoop& Cluster::loop() {
  IFEC_CHECK(!parts_, "Cluster::loop: a partitioned cluster has no one loop (gpu_loop(gpu), now(), at())");
  return loop_;
}

TimeNs Cluster::now() const { return parts_ ? std::max(parts_->time(), parts_->now()) : loop_.now(); }

void Cluster::at(TimeNs t, std::function<void()> fn) {
  if (!parts_) {
    loop_.schedule(t, std::move(fn));
    return;
  }
  // On GPU 0's loop, then after its window (not a control event: every process runs the control loop alike, and
  // only rank 0 runs the driver).
  gpu_loops_[0]->schedule(t, [this, fn = std::move(fn)] { later(0, fn); });
}

// A rank's bootstrap on a partitioned cluster: its allgathers reach the hub after the window (later()), in one order
// whatever the grouping, and their answers come as events on the rank's loop.
class Cluster::LaterBootstrap : public workloads::Bootstrap {
 public:
  LaterBootstrap(Cluster& c, int gpu, workloads::Bootstrap& hub) : c_(c), gpu_(gpu), hub_(hub) {}
  int rank() const override { return hub_.rank(); }
  int size() const override { return hub_.size(); }
  void allgather(std::vector<uint8_t> mine, std::function<void(workloads::Gathered)> done) override {
    auto m = std::make_shared<std::vector<uint8_t>>(std::move(mine));
    c_.later(gpu_, [this, m, done = std::move(done)] { hub_.allgather(std::move(*m), done); });
  }

 private:
  Cluster& c_;
  int gpu_;
  workloads::Bootstrap& hub_;
};

// A control message on this process's control loop: run where its switch runs (a link state change everywhere),
// answered by that process (by the GPUs' for a change of link state or a switch nobody has).
void Cluster::serve_message(const std::vector<uint8_t>& m) {
  const ControlRequestInfo info = peek_control_request(m);
  int answers = parts_->process_of(parts_->gpu_partition());  // every group's is rank 0
  if (auto it = switch_partitions_.find(info.sw); it != switch_partitions_.end()) {
    answers = parts_->process_of(it->second);
  }
  const bool here = answers == parts_->rank();
  if (here || info.sw.empty()) {
    serve_control_request(m, *switch_control_, [this, here](std::vector<uint8_t> a) {
      if (here) parts_->reply(std::move(a));
    });
  }
}

std::vector<workloads::Communicator*> Cluster::communicators(const std::vector<int>& gpus,
                                                             const workloads::CommOptions& opts, int stream) {
  for (int g : gpus) {
    IFEC_CHECK(g >= 0 && g < size(), "communicator: GPU " << g << " outside 0.." << size() - 1);
  }
  // Every rank starts in the same event here: no store can be early for the next operation.
  workloads::CommOptions o = opts;
  o.keep_early_arrivals = false;
  const auto key = std::make_pair(gpus, stream);
  RankSet& set = rank_sets_[key];
  std::vector<workloads::Communicator*> out;
  if (set.comms.empty()) {
    const int n = static_cast<int>(gpus.size());
    set.boot = std::make_unique<InProcessBootstrap>(n);
    auto inits = std::make_shared<std::vector<std::string>>(n, "?");
    for (int r = 0; r < n; ++r) {
      const int g = gpus[r];
      common::EventLoop* loop = gpu_loops_[g];
      const TimeNs skew = opts_.bootstrap_skew_ns * r;
      Poster post = [loop, skew](std::function<void()> fn) { loop->schedule(loop->now() + skew, std::move(fn)); };
      workloads::Bootstrap* boot = &set.boot->rank(r, std::move(post));
      if (parts_) {
        set.views.push_back(std::make_unique<LaterBootstrap>(*this, g, *boot));
        boot = set.views.back().get();
      }
      set.comms.push_back(std::make_unique<workloads::Communicator>(ep(g), *boot, control_of(g), topo_, o));
      if (parts_) {  // an operation's end after the window, where drivers may touch every rank
        set.comms.back()->set_handover([this, g, loop](std::function<void()> fn) {
          loop->schedule(loop->now(), [this, g, fn = std::move(fn)] { later(g, fn); });
        });
      }
      set.comms.back()->init([inits, r](const std::string& err) { (*inits)[r] = err; });
    }
    run_until([&] { return std::count(inits->begin(), inits->end(), "?") == 0; }, now() + 1'000'000);
    for (int r = 0; r < n; ++r) {
      if ((*inits)[r] != "") {
        rank_sets_.erase(key);
        IFEC_FAIL("communicator of rank " << r << " (GPU " << gpus[r] << ") did not initialise: "
                                          << ((*inits)[r] == "?" ? "no answer from the bootstrap" : (*inits)[r]));
      }
    }
  }
  for (auto& c : set.comms) {
    c->set_options(o);
    out.push_back(c.get());
  }
  return out;
}

std::vector<workloads::CollectiveResult> Cluster::run_ranks(int ranks, const RankStart& start, TimeNs limit) {
  // Shared: a rank that finishes after this returns (an interrupted run) writes into the orphaned copy.
  auto got = std::make_shared<std::vector<std::optional<workloads::CollectiveResult>>>(ranks);
  for (int r = 0; r < ranks; ++r) {
    start(r, [got, r](workloads::CollectiveResult res) { (*got)[r] = std::move(res); });
  }
  const TimeNs begin = now();
  const TimeNs deadline = limit > common::kForever - begin ? common::kForever : begin + limit;
  run_until([&] { return std::all_of(got->begin(), got->end(), [](auto& x) { return x.has_value(); }); }, deadline);
  std::vector<workloads::CollectiveResult> out;
  for (int r = 0; r < ranks; ++r) {
    if ((*got)[r]) {
      out.push_back(std::move(*(*got)[r]));
      continue;
    }
    workloads::CollectiveResult res;
    res.start_ns = begin;
    res.end_ns = now();
    res.error = "rank " + std::to_string(r) + " did not finish within " + std::to_string(limit / 1000) +
                " us of simulated time" + (idle() ? " (the simulation went idle)" : "");
    out.push_back(std::move(res));
  }
  return out;
}

Cluster::~Cluster() {
  try {
    stop_serving();  // the other processes leave serve()
  } catch (...) {
  }
}

bool Cluster::idle() const { return parts_ ? parts_->idle() : loop_.idle(); }

TimeNs Cluster::next_event_time() const { return parts_ ? parts_->next_event_time() : loop_.next_event_time(); }

uint64_t Cluster::events_run() const { return parts_ ? parts_->events_run() : loop_.events_run(); }

bool Cluster::step(TimeNs until) {
  if (parts_) {
    return parts_->step(until);
  }
  const TimeNs t = loop_.next_event_time();
  if (t == common::kForever || t > until) {
    return false;
  }
  loop_.run(t);
  return true;
}

bool Cluster::run_until(const std::function<bool()>& done, TimeNs deadline) {
  IFEC_CHECK(runs_gpus(), "run_until on a process that does not run the GPUs (it serves: Cluster::serve)");
  for (;;) {
    // Partitioned, every process takes this turn: the GPUs' process says whether it is done, and its deadline.
    const bool finished = parts_ ? parts_->sync({done(), deadline, false}).done : done();
    if (finished) {
      return true;
    }
    if (idle() || next_event_time() > deadline) {
      return false;
    }
    step(deadline);
  }
}

void Cluster::serve() {
  IFEC_CHECK(!runs_gpus(), "serve() on the process that runs the GPUs");
  for (;;) {
    const PlanePartitions::Turn t = parts_->sync({});
    if (t.stop) {
      return;
    }
    if (!t.done && !idle() && next_event_time() <= t.deadline) {
      step(t.deadline);
    }
  }
}

void Cluster::stop_serving() {
  if (parts_ && parts_->spread() && runs_gpus() && !stopped_) {
    stopped_ = true;
    parts_->sync({false, 0, true});
  }
}

bool Cluster::runs_gpus() const { return !parts_ || parts_->owns(parts_->gpu_partition()); }

void Cluster::run(TimeNs until) {
  if (parts_) {
    parts_->run(until);
  } else {
    loop_.run(until);
  }
}

void Cluster::allocate_window(uint16_t id, uint64_t bytes, uint32_t job, bool shared) {
  free_window(id);  // re-allocation: a fresh zeroed window under the same id
  if (shared) {
    // Untouched pages cost nothing (MAP_NORESERVE): an IFEC receive window of an EP 256 layer spans 7.7 GB of
    // [source rank][token] rows and is written only where rows land (with elided payloads nowhere).
    IFEC_CHECK(bytes > 0 && bytes <= (uint64_t{1} << endpoint::kWindowVaShift),
               "shared window " << id << " size " << bytes << " outside 1.." << (1 << (endpoint::kWindowVaShift - 30))
                                << " GiB");
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    IFEC_CHECK(p != MAP_FAILED, "shared window " << id << " of " << bytes << " bytes: " << std::strerror(errno));
    auto& mem = shared_windows_[id] = std::unique_ptr<uint8_t, Unmap>(static_cast<uint8_t*>(p), Unmap{bytes});
    for (auto& e : endpoints_) {
      e->memory().register_window(id, mem.get(), bytes, job);
    }
  } else {
    for (auto& e : endpoints_) {
      e->memory().allocate_window(id, bytes, job);
    }
  }
  for (auto& e : endpoints_) {
    for (auto& peer : endpoints_) {
      if (peer != e) {
        e->set_remote_window(peer->index(), *peer->memory().window(id));
      }
    }
  }
}

void Cluster::free_window(uint16_t id) {
  for (auto& e : endpoints_) {
    if (e->memory().window(id) != nullptr) {
      e->memory().free_window(id);
    }
  }
  shared_windows_.erase(id);  // after every endpoint let go of it
}

void Cluster::Unmap::operator()(uint8_t* p) const { munmap(p, size); }

std::string Cluster::wait_ok(const std::vector<endpoint::OpHandle>& handles, TimeNs limit, const std::string& what) {
  if (!wait(handles, limit)) {
    return what + " did not finish in " + std::to_string(limit / 1000) + " us of simulated time";
  }
  for (const auto& h : handles) {
    if (!h->ok()) {
      return what + " failed: " + h->error;
    }
  }
  return "";
}

uint8_t* Cluster::window_data(int gpu, uint16_t id) {
  const endpoint::WindowInfo* w = ep(gpu).memory().window(id);
  IFEC_CHECK(w != nullptr, "GPU " << gpu << " has no window " << id);
  return w->data;
}

bool Cluster::wait(const std::vector<endpoint::OpHandle>& handles, TimeNs limit) {
  size_t i = 0;  // handles before it are done
  return run_until(
      [&] {
        while (i < handles.size() && handles[i]->done()) ++i;
        return i == handles.size();
      },
      now() + limit);
}

bool Cluster::barrier(TimeNs limit) {
  const TimeNs deadline = now() + limit;
  std::vector<endpoint::OpHandle> quiets;
  for (auto& e : endpoints_) {
    quiets.push_back(e->quiet());
  }
  if (!wait(quiets, limit)) {
    return false;
  }
  const uint64_t epoch = ++barrier_epoch_;
  const int n = size();
  // Dissemination: in round r, endpoint i signals i + 2^r and waits for the signal of i - 2^r.
  for (int r = 0, dist = 1; dist < n; ++r, dist *= 2) {
    std::vector<endpoint::OpHandle> hs;
    for (int i = 0; i < n; ++i) {
      hs.push_back(endpoints_[i]->store((i + dist) % n, kBarrierWindow, static_cast<uint64_t>(r) * 8, &epoch, 8));
    }
    if (!wait(hs, deadline - now())) {
      return false;
    }
    for (auto& h : hs) {
      if (!h->ok()) {
        return false;
      }
    }
    for (int i = 0; i < n; ++i) {
      uint64_t v;
      std::memcpy(&v, window_data(i, kBarrierWindow) + static_cast<size_t>(r) * 8, 8);
      IFEC_CHECK(v == epoch, "barrier round " << r << ": GPU " << i << " saw epoch " << v << ", expected " << epoch);
    }
  }
  return true;
}

}  // namespace ifec::testbed
