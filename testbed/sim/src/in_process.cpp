// In-process bootstrap hub and control plane.
#include "ifec/testbed/in_process.h"

#include "ifec/common/checks.h"

namespace ifec::testbed {

Poster poster_of(common::EventLoop& loop) {
  common::EventLoop* l = &loop;
  return [l](std::function<void()> fn) { l->schedule(l->now(), std::move(fn)); };
}

// ----------------------------------------------------------------------------------------------- bootstrap --

class InProcessBootstrap::RankView : public workloads::Bootstrap {
 public:
  RankView(InProcessBootstrap& hub, int r, Poster post) : hub_(hub), rank_(r), post_(std::move(post)) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_.size_; }
  void allgather(std::vector<uint8_t> mine, std::function<void(workloads::Gathered)> done) override {
    Poster post = post_;
    hub_.contribute(rank_, std::move(mine), [post, done](const Shared& g) { post([done, g] { done(*g); }); });
  }

 private:
  InProcessBootstrap& hub_;
  int rank_;
  Poster post_;
};

InProcessBootstrap::InProcessBootstrap(int size) : size_(size), ranks_(size), calls_(size, 0) {
  IFEC_CHECK(size >= 1, "bootstrap: " << size << " ranks");
}

InProcessBootstrap::~InProcessBootstrap() = default;

workloads::Bootstrap& InProcessBootstrap::rank(int r, Poster post) {
  IFEC_CHECK(r >= 0 && r < size_, "bootstrap: rank " << r << " outside 0.." << size_ - 1);
  std::lock_guard<std::mutex> lock(mu_);
  ranks_[r] = std::make_unique<RankView>(*this, r, std::move(post));
  return *ranks_[r];
}

void InProcessBootstrap::contribute(int r, std::vector<uint8_t> mine, std::function<void(Shared)> done) {
  std::vector<std::function<void(Shared)>> ready;
  auto g = std::make_shared<workloads::Gathered>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    Round& round = rounds_[calls_[r]++];
    if (round.parts.empty()) {
      round.parts.resize(size_);
      round.done.resize(size_);
    }
    round.parts[r] = std::move(mine);
    round.done[r] = std::move(done);
    if (++round.arrived < size_) {
      return;
    }
    g->parts = std::move(round.parts);
    ready = std::move(round.done);
    rounds_.erase(calls_[r] - 1);
  }
  for (auto& fn : ready) {
    fn(g);
  }
}

// ------------------------------------------------------------------------------------------- control plane --

InProcessControl::InProcessControl(const routing::Topology& topo, std::map<std::string, switchemu::Switch*> switches,
                                   std::function<void(int, bool)> set_link, Poster at_switch, Poster reply)
    : topo_(topo),
      switches_(std::move(switches)),
      set_link_(std::move(set_link)),
      at_switch_(std::move(at_switch)),
      reply_(std::move(reply)) {}

void InProcessControl::at(const std::string& sw, std::function<void(switchemu::IfecEngine&)> fn,
                          std::function<void(const common::ControlError&)> error) {
  auto it = switches_.find(sw);
  if (it == switches_.end() || it->second->ifec() == nullptr) {
    const common::ControlError e{sw, it == switches_.end() ? "no such switch" : "runs no IFEC engine"};
    reply_([error, e] { error(e); });
    return;
  }
  switchemu::Switch* s = it->second;
  at_switch_([s, fn] { fn(*s->ifec()); });
}

void InProcessControl::reserve(const std::string& sw, const common::GroupReservation& r, Done done) {
  Poster reply = reply_;
  at(
      sw,
      [sw, r, done, reply](switchemu::IfecEngine& e) {
        std::string why;
        common::ControlStatus st;
        if (!e.reserve(r, &why)) {
          st = common::ControlError{sw, why};
        }
        reply([done, st] { done(st); });
      },
      [done](const common::ControlError& e) { done(e); });
}

void InProcessControl::release(const std::string& sw, uint32_t job, uint16_t group, Done done) {
  Poster reply = reply_;
  at(
      sw,
      [job, group, done, reply](switchemu::IfecEngine& e) {
        e.release(job, group);
        reply([done] { done(std::nullopt); });
      },
      [done](const common::ControlError& e) { done(e); });
}

void InProcessControl::register_window(const std::string& sw, const common::WindowRegistration& w, Done done) {
  Poster reply = reply_;
  at(
      sw,
      [w, done, reply](switchemu::IfecEngine& e) {
        e.register_window(w);
        reply([done] { done(std::nullopt); });
      },
      [done](const common::ControlError& e) { done(e); });
}

void InProcessControl::free_slots(const std::string& sw,
                                  std::function<void(const common::ControlReply<uint32_t>&)> done) {
  Poster reply = reply_;
  at(
      sw,
      [done, reply](switchemu::IfecEngine& e) {
        common::ControlReply<uint32_t> r;
        r.value = e.free_slots();
        reply([done, r] { done(r); });
      },
      [done](const common::ControlError& e) {
        common::ControlReply<uint32_t> r;
        r.error = e;
        done(r);
      });
}

void InProcessControl::counters(const std::string& sw,
                                std::function<void(const common::ControlReply<common::IfecCounters>&)> done) {
  Poster reply = reply_;
  at(
      sw,
      [done, reply](switchemu::IfecEngine& e) {
        common::ControlReply<common::IfecCounters> r;
        r.value = e.counters();
        reply([done, r] { done(r); });
      },
      [done](const common::ControlError& e) {
        common::ControlReply<common::IfecCounters> r;
        r.error = e;
        done(r);
      });
}

void InProcessControl::set_link_state(int link, bool up, Done done) {
  Poster reply = reply_;
  auto set = set_link_;
  at_switch_([set, link, up, done, reply] {
    common::ControlStatus st;
    try {
      set(link, up);
    } catch (const std::exception& e) {
      st = common::ControlError{"link " + std::to_string(link), e.what()};
    }
    reply([done, st] { done(st); });
  });
}

void InProcessControl::fare_weights(
    const std::string& sw, int dest_gpu,
    std::function<void(const common::ControlReply<std::vector<common::PortWeight>>&)> done) {
  using Reply = common::ControlReply<std::vector<common::PortWeight>>;
  Poster reply = reply_;
  auto it = switches_.find(sw);
  if (it == switches_.end() || dest_gpu < 0 || dest_gpu >= topo_.num_gpus()) {
    Reply r;
    r.error =
        common::ControlError{sw, it == switches_.end() ? "no such switch"
                                                       : "destination GPU " + std::to_string(dest_gpu) +
                                                             " outside 0.." + std::to_string(topo_.num_gpus() - 1)};
    reply([done, r] { done(r); });
    return;
  }
  switchemu::Switch* s = it->second;
  const uint32_t ip = topo_.nodes.at(topo_.gpu_node(dest_gpu)).loopback;
  at_switch_([s, ip, done, reply] {
    Reply r;
    if (const auto* group = s->route(ip)) {
      for (const switchemu::NextHopPort& h : *group) {
        r.value.push_back({h.port, h.weight});
      }
    }
    reply([done, r] { done(r); });
  });
}

}  // namespace ifec::testbed
