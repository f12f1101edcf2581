// The communicator: rank discovery and window exchange over the bootstrap, validation, algorithm choice, and the
// one-operation-at-a-time life cycle of this rank's parts (CommOp).
#include "ifec/workloads/communicator.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "comm_op.h"
#include "comm_schedule.h"
#include "ifec/common/blob.h"
#include "ifec/common/checks.h"
#include "ifec/common/names.h"

namespace ifec::workloads {

namespace {

constexpr uint32_t bit(Collective c) { return 1u << static_cast<unsigned>(c); }

std::shared_ptr<CommOp> make_ifec_op(Communicator& c, const CollArgs& a, Algo, Communicator::Done done) {
  return a.kind == Collective::kMulticast ? make_ifec_broadcast_op(c, a, std::move(done))
                                          : make_ifec_reduce_op(c, a, std::move(done));
}

// The algorithms, one row each: a new algorithm is a row here (and the schedule or operation it makes).
struct Algorithm {
  Algo value;
  const char* name;
  // The collectives it runs itself; the others run the general endpoint schedule (ring reduce, pipelined chain
  // broadcast, dissemination barrier), reported as the ring.
  uint32_t runs;
  std::shared_ptr<CommOp> (*make)(Communicator&, const CollArgs&, Algo, Communicator::Done);  // null: best
  // Whose endpoint schedule's scratch it needs (ifec: the ring's, its fallback; best: the one it chooses).
  Algo scratch;
  // Checked before it starts (the in-fabric operation touches scratch only when it falls back).
  bool scratch_checked;
};

constexpr uint32_t kEveryCollective = ~0u;
constexpr Algorithm kAlgorithms[] = {
    {Algo::kRing, "ring", kEveryCollective, make_schedule_op, Algo::kRing, true},
    {Algo::kTree, "tree", bit(Collective::kAllReduce), make_schedule_op, Algo::kTree, true},
    {Algo::kRd, "rd", bit(Collective::kAllReduce), make_schedule_op, Algo::kRd, true},
    {Algo::kOneShot, "oneshot", bit(Collective::kAllReduce), make_schedule_op, Algo::kOneShot, true},
    {Algo::kBest, "best", 0, nullptr, Algo::kBest, false},
    {Algo::kIfec, "ifec",
     bit(Collective::kAllReduce) | bit(Collective::kReduce) | bit(Collective::kBarrier) | bit(Collective::kMulticast),
     make_ifec_op, Algo::kRing, false},
};
constexpr common::Vocabulary kAlgos("algorithm", kAlgorithms);

const Algorithm& algorithm(Algo a) {
  const Algorithm* row = kAlgos.find(a);
  IFEC_CHECK(row != nullptr, "unknown algorithm " << static_cast<int>(a));
  return *row;
}

}  // namespace

const char* algo_name(Algo a) { return kAlgos.name(a); }
Algo parse_algo(const std::string& name) { return kAlgos.parse(name); }

// ---------------------------------------------------------------------------------------------------- CommOp --

CommOp::CommOp(Communicator& comm, Communicator::Done done) : comm_(comm), done_(std::move(done)) {}

void CommOp::begin() {
  res_.start_ns = now();
  std::weak_ptr<CommOp> w = weak_from_this();
  const common::TimeNs limit = comm_.options().limit_ns;
  comm_.clock().schedule(now() + limit, [w, limit] {
    if (auto op = w.lock(); op && !op->finished_) {
      op->fail("did not finish within " + std::to_string(limit / 1000) + " us: " + op->describe_stuck());
    }
  });
  start();
  if (!fenced_ && !finished_) {
    for (const Communicator::Arrival& a : comm_.take_early_arrivals()) {
      on_remote_write(a.peer, a.window, a.offset, a.len);  // unclaimed now: not for this rank's operations
    }
  }
}

void CommOp::pass_on(int peer_gpu, uint16_t window, uint64_t offset, uint64_t len) {
  comm_.keep_early({peer_gpu, window, offset, len});
}

void CommOp::succeed() {
  if (!finished_) {
    res_.ok = true;
    finish();
  }
}

void CommOp::fail(const std::string& why) {
  if (!finished_) {
    res_.ok = false;
    res_.error = why;
    finish();
  }
}

void CommOp::finish() {
  finished_ = true;
  res_.end_ns = now();
  if (res_.data_end_ns == 0) {  // no control-plane tail: the data path ends with the frame that finished it
    res_.data_end_ns = std::min(event_time(), res_.end_ns);
  }
  // Handed over as its own event: the caller may start the next operation from `done`.
  auto self = shared_from_this();
  comm_.hand_over([self] {
    self->comm_.finished(self.get());
    if (self->done_) {
      self->done_(self->res_);
    }
  });
}

void CommOp::defer(std::function<void()> fn) {
  std::weak_ptr<CommOp> w = weak_from_this();
  comm_.clock().schedule(now(), [w, fn = std::move(fn)] {
    if (auto op = w.lock(); op && !op->finished_) {
      fn();
    }
  });
}

void CommOp::gather(std::vector<uint8_t> mine, std::function<void(Gathered)> fn) {
  std::weak_ptr<CommOp> w = weak_from_this();
  comm_.bootstrap().allgather(std::move(mine), [w, fn = std::move(fn)](Gathered g) {
    if (auto op = w.lock(); op && !op->finished_) {
      if (!g.ok) {
        op->fail("bootstrap: " + g.error);
      } else {
        fn(std::move(g));
      }
    }
  });
}

void CommOp::watch(const endpoint::OpHandle& h, std::function<void(bool ok, const std::string& error)> fn) {
  std::weak_ptr<CommOp> w = weak_from_this();
  Communicator* comm = &comm_;
  auto done = [w, comm, fn](const endpoint::OpState& st) {
    const bool ok = st.ok();
    const std::string error = st.error;
    comm->clock().schedule(comm->clock().now(), [w, fn, ok, error] {
      if (auto op = w.lock(); op && !op->finished_) {
        fn(ok, error);
      }
    });
  };
  if (h->done()) {
    done(*h);  // invalid arguments complete before the call returns
  } else {
    h->on_done = done;
  }
}

// ---------------------------------------------------------------------------------------------- Communicator --

Communicator::Communicator(endpoint::Endpoint& ep, Bootstrap& boot, common::ControlPlane& control,
                           const routing::Topology& topo, CommOptions opts)
    : ep_(ep),
      boot_(boot),
      control_(control),
      topo_(topo),
      opts_(opts),
      next_group_(opts.ifec.first_group),
      subscription_(ep_.subscribe(*this)) {}

Communicator::~Communicator() = default;

void Communicator::on_remote_write(int peer, uint16_t window, uint64_t offset, uint64_t len) {
  if (!op_ || op_->finished() || !op_->on_remote_write(peer, window, offset, len)) {
    keep_early({peer, window, offset, len});  // a peer that started the next operation before this rank
  }
}

void Communicator::on_routes_changed() {
  if (op_ && !op_->finished()) {
    op_->on_routes_changed();
  }
}

void Communicator::init(Ready done) {
  common::BlobWriter w;
  w.put<int32_t>(ep_.index());
  boot_.allgather(w.take(), [this, done](Gathered g) {
    if (!g.ok) {
      done("bootstrap: " + g.error);
      return;
    }
    // A part that is no GPU of the topology (an allgather paired out of step) fails init, saying so; it was taken
    // as a GPU, and a later window exchange threw on the loop.
    std::vector<int> gpus;
    for (size_t r = 0; r < g.parts.size(); ++r) {
      int32_t gpu = -1;
      if (g.parts[r].size() == sizeof(gpu)) {
        std::memcpy(&gpu, g.parts[r].data(), sizeof(gpu));
      }
      if (gpu < 0 || gpu >= topo_.num_gpus()) {
        done("bootstrap: rank " + std::to_string(r) + " sent " + std::to_string(g.parts[r].size()) +
             " B where its GPU's index was due (the ranks' allgathers are out of step)");
        return;
      }
      gpus.push_back(gpu);
    }
    gpus_ = std::move(gpus);
    index_switches();
    done("");
  });
}

int Communicator::rank_of_gpu(int gpu) const {
  auto it = std::find(gpus_.begin(), gpus_.end(), gpu);
  return it == gpus_.end() ? -1 : static_cast<int>(it - gpus_.begin());
}

void Communicator::allocate_window(uint16_t id, uint64_t bytes, Ready done) {
  endpoint::SymmetricMemory& mem = ep_.memory();
  if (mem.window(id) != nullptr) {
    mem.free_window(id);  // re-allocation: a fresh zeroed window under the same id
  }
  const endpoint::WindowInfo& w = mem.allocate_window(id, bytes, opts_.ifec.job);
  common::BlobWriter out;
  out.put(w.id).put(w.va).put(w.size).put(w.rkey).put(w.job);
  boot_.allgather(out.take(), [this, id, done](Gathered g) {
    if (!g.ok) {
      done("bootstrap: " + g.error);
      return;
    }
    // A part that is not a window, or another window's, means the ranks are not in the same allgather (a bootstrap
    // out of step): the operation fails, saying so, and nothing is installed.
    std::vector<endpoint::WindowInfo> infos(g.parts.size());
    try {
      for (size_t r = 0; r < g.parts.size(); ++r) {
        common::BlobReader rd(g.parts[r], "rank " + std::to_string(r) + "'s window");
        endpoint::WindowInfo& info = infos[r];
        info.id = rd.get<uint16_t>();
        info.va = rd.get<uint64_t>();
        info.size = rd.get<uint64_t>();
        info.rkey = rd.get<uint32_t>();
        info.job = rd.get<uint32_t>();
        IFEC_CHECK(info.id == id, "rank " << r << " sent window " << info.id << " for window " << id
                                          << " (the ranks' allgathers are out of step)");
      }
    } catch (const std::exception& e) {
      done(std::string("window exchange: ") + e.what());
      return;
    }
    for (size_t r = 0; r < g.parts.size(); ++r) {
      if (static_cast<int>(r) != rank()) {
        ep_.set_remote_window(gpus_.at(r), infos[r]);
      }
    }
    done("");
  });
}

namespace {

std::string check_args(Communicator& c, const CollArgs& a, const Algorithm& algo) {
  std::ostringstream os;
  const char* kind = collective_name(a.kind);
  const endpoint::SymmetricMemory& mem = c.endpoint().memory();
  if (c.size() < 2) {
    os << kind << ": " << c.size() << " rank(s), need 2 or more";
  } else if (a.root < 0 || a.root >= c.size()) {
    os << kind << ": root rank " << a.root << " outside 0.." << c.size() - 1;
  } else if (a.kind != Collective::kBarrier && mem.window(a.window) == nullptr) {
    os << kind << ": GPU " << c.endpoint().index() << " has no window " << a.window;
  } else if (a.kind != Collective::kBarrier &&
             (a.offset > mem.window(a.window)->size ||
              a.count > (mem.window(a.window)->size - a.offset) / element_size(a.dtype))) {
    os << kind << ": buffer of " << a.count << " x " << element_size(a.dtype) << " B at offset " << a.offset
       << " exceeds window " << a.window << " (" << mem.window(a.window)->size << " B) on GPU " << c.endpoint().index();
  } else if (algo.scratch_checked) {
    const uint64_t need = schedule::scratch_bytes(a, c.size(), algo.scratch);
    const endpoint::WindowInfo* s = mem.window(a.scratch_window);
    if (s == nullptr || s->size < need) {
      os << kind << ": scratch window " << a.scratch_window << " on GPU " << c.endpoint().index() << " has "
         << (s ? s->size : 0) << " B, needs " << need;
    }
  }
  return os.str();
}

}  // namespace

void Communicator::run(const CollArgs& a, Algo algo, Done done) {
  IFEC_CHECK(!gpus_.empty(), "communicator: init() has not completed");
  IFEC_CHECK(!op_ || op_->finished(), "communicator: an operation is already running on rank " << rank());
  if (algo == Algo::kBest) {
    algo = choose_algorithm(a);
  }
  const Algorithm* row = &algorithm(algo);
  if ((row->runs & bit(a.kind)) == 0) {
    row = &algorithm(Algo::kRing);
  }
  // The result names the algorithm that ran (best: the one chosen).
  done = [done = std::move(done), name = row->name](CollectiveResult r) {
    r.algo = name;
    done(std::move(r));
  };
  if (const std::string err = check_args(*this, a, *row); !err.empty()) {
    CollectiveResult r;
    r.error = err;
    r.start_ns = r.end_ns = clock().now();
    hand_over([done, r] { done(r); });
    return;
  }
  start(row->make(*this, a, row->value, std::move(done)));
}

void Communicator::multicast_rows(BatchMulticastArgs a, Done done) {
  IFEC_CHECK(!op_ || op_->finished(), "communicator: an operation is already running on rank " << rank());
  start(make_multicast_rows_op(*this, std::move(a), std::move(done)));
}

void Communicator::reduce_rows(BatchReduceArgs a, Done done) {
  IFEC_CHECK(!op_ || op_->finished(), "communicator: an operation is already running on rank " << rank());
  start(make_reduce_rows_op(*this, std::move(a), std::move(done)));
}

void Communicator::put_rows(BatchPutArgs a, Done done) {
  IFEC_CHECK(!op_ || op_->finished(), "communicator: an operation is already running on rank " << rank());
  start(make_put_rows_op(*this, std::move(a), std::move(done)));
}

void Communicator::set_options(const CommOptions& o) {
  IFEC_CHECK(!op_ || op_->finished(), "communicator: options changed while an operation runs on rank " << rank());
  opts_ = o;
  if (!opts_.keep_early_arrivals) {
    early_.clear();
  }
}

void Communicator::hand_over(std::function<void()> fn) {
  if (handover_) {
    handover_(std::move(fn));
  } else {
    clock().schedule(clock().now(), std::move(fn));
  }
}

void Communicator::start(std::shared_ptr<CommOp> op) {
  op_ = std::move(op);
  op_->begin();
}

void Communicator::finished(CommOp* op) {
  if (op_.get() == op) {
    fence_next_ = fence_next_ || !op->ok();
    op_.reset();
  }
}

std::vector<Communicator::Arrival> Communicator::take_early_arrivals() { return std::exchange(early_, {}); }

void Communicator::keep_early(const Arrival& a) {
  const bool mine = opts_.last_window == 0 || (a.window >= opts_.first_window && a.window <= opts_.last_window);
  if (opts_.keep_early_arrivals && mine && early_.size() < kMaxEarly) {
    early_.push_back(a);
  }
}

bool Communicator::take_fence() { return std::exchange(fence_next_, false); }

uint64_t Communicator::scratch_bytes(const CollArgs& a, int ranks, Algo algo, const routing::Topology* topo,
                                     int first_gpu) {
  if (algo == Algo::kBest && topo != nullptr) {
    algo = choose_algorithm(a, ranks, *topo, first_gpu);
  }
  // What runs: the ring where the algorithm asked for does not run this collective (as run() does).
  const Algorithm& asked = algorithm(algo);
  const Algorithm& row = algo == Algo::kBest || (asked.runs & bit(a.kind)) != 0 ? asked : algorithm(Algo::kRing);
  if (row.scratch != Algo::kBest) {
    return schedule::scratch_bytes(a, ranks, row.scratch);
  }
  uint64_t need = 0;  // whatever the cost model may choose
  for (const Algorithm& r : kAlgorithms) {
    if (r.scratch != Algo::kBest) {
      need = std::max(need, schedule::scratch_bytes(a, ranks, r.scratch));
    }
  }
  return need;
}

// A latency-bandwidth (alpha-beta) model of this fabric: alpha is one hop's one-way time for a small message (two
// link traversals and a switch), beta the GPU's access bandwidth. Ring: 2(n-1) hops and 2(n-1)/n of the bytes;
// tree: 2 log2 n hops and four times the bytes (slices go up, then down to two children each: measured ~4x the
// bytes' time on the simulated fabric, not the 2x of an ideal pipelined tree); recursive doubling: log2 n
// whole-buffer steps; one-shot: one hop and n-1 copies. The crossovers this gives are measured against the
// simulated algorithms by `./ifec bench collectives`.
Algo Communicator::choose_algorithm(const CollArgs& a) const {
  return choose_algorithm(a, size(), topo_, gpus_.empty() ? 0 : gpus_[0]);
}

Algo Communicator::choose_algorithm(const CollArgs& a, int n, const routing::Topology& topo, int first_gpu) {
  if (a.kind != Collective::kAllReduce) {
    return Algo::kRing;
  }
  const double bytes = static_cast<double>(a.count * element_size(a.dtype));
  double delay = 0;
  double rate_bytes_per_ns = 0;
  const int node = topo.gpu_node(first_gpu);
  for (int l : topo.links_of(node)) {
    delay = std::max(delay, static_cast<double>(topo.links[l].delay_ns));
    rate_bytes_per_ns += topo.links[l].rate_gbps / 8;
  }
  const double alpha = 2 * delay + 4096 / std::max(1e-9, rate_bytes_per_ns / topo.links_of(node).size()) + 200;
  const double beta = 1 / std::max(1e-9, rate_bytes_per_ns);
  const double logn = std::ceil(std::log2(std::max(2, n)));
  const double slices = std::max(1.0, std::ceil(bytes / n / 65536));
  const std::pair<Algo, double> cost[] = {
      {Algo::kRing, 2 * (n - 1) * alpha + (slices - 1) * alpha + 2.0 * (n - 1) / n * bytes * beta},
      {Algo::kTree, 2 * logn * alpha + 4 * bytes * beta},
      {Algo::kRd, logn * (alpha + bytes * beta) + (n & (n - 1) ? 2 * (alpha + bytes * beta) : 0)},
      {Algo::kOneShot, alpha + (n - 1) * bytes * beta},
  };
  return std::min_element(std::begin(cost), std::end(cost), [](auto& x, auto& y) { return x.second < y.second; })
      ->first;
}

void Communicator::index_switches() {
  const int planes = topo_.num_planes;
  std::vector<int> first(topo_.nodes.size() * planes, -1);  // [node * planes + plane]: its first link's other end
  for (const routing::Link& l : topo_.links) {              // in links_of's order
    for (const auto& [me, other] : {std::pair{l.a, l.b}, std::pair{l.b, l.a}}) {
      if (l.plane >= 0 && l.plane < planes && first[me * planes + l.plane] < 0) {
        first[me * planes + l.plane] = other;
      }
    }
  }
  switch_of_.assign(gpus_.size() * planes, -1);
  for (size_t r = 0; r < gpus_.size(); ++r) {
    if (gpus_[r] >= 0 && gpus_[r] < topo_.num_gpus()) {  // a bad index throws, naming it, when it is asked about
      const int node = topo_.gpu_node(gpus_[r]);
      std::copy_n(first.begin() + node * planes, planes, switch_of_.begin() + r * planes);
    }
  }
}

int Communicator::switch_node_of(int rank, int plane) const {
  topo_.gpu_node(gpus_.at(rank));  // throws naming a rank or GPU out of range
  return plane >= 0 && plane < topo_.num_planes ? switch_of_.at(rank * topo_.num_planes + plane) : -1;
}

std::string Communicator::plane_problem(int plane) const {
  if (ep_.ech().port_for(plane, 0) < 0) {
    return "GPU " + std::to_string(ep_.index()) + " has no live link on plane " + std::to_string(plane);
  }
  for (int g : gpus_) {
    if (g != ep_.index() && ep_.plane_weight(g, plane) <= 0) {
      return "FARE: no path from GPU " + std::to_string(ep_.index()) + " to GPU " + std::to_string(g) + " on plane " +
             std::to_string(plane);
    }
  }
  return "";
}

}  // namespace ifec::workloads
