// The pieces every in-fabric operation plans with: the plan and its encoding, the leader's all-or-nothing group
// reservations per plane, and the groups' members.
#include "comm_plan.h"

#include <algorithm>

#include "ifec/common/blob.h"

namespace ifec::workloads {

void Plan::note(int plane, const std::string& why) {
  no_plane += (no_plane.empty() ? "" : "; ") + std::string("plane ") + std::to_string(plane) + ": " + why;
}

std::vector<int> Plan::plane_ids() const {
  std::vector<int> ids;
  for (const PlanePlan& pp : planes) {
    ids.push_back(pp.plane);
  }
  return ids;
}

std::vector<uint8_t> encode_plan(const Plan& p) {
  common::BlobWriter w;
  w.put(p.group).put<uint32_t>(static_cast<uint32_t>(p.planes.size()));
  for (const PlanePlan& pp : p.planes) {
    w.put<int32_t>(pp.plane).put(pp.weight).put(pp.budget);
  }
  w.put_string(p.no_plane);
  return w.take();
}

Plan decode_plan(const std::vector<uint8_t>& bytes, const std::string& what) {
  common::BlobReader r(bytes, what);
  Plan p;
  p.group = r.get<uint16_t>();
  for (uint32_t n = r.get<uint32_t>(); n > 0; --n) {
    PlanePlan pp;
    pp.plane = r.get<int32_t>();
    pp.weight = r.get<double>();
    pp.budget = r.get<uint32_t>();
    p.planes.push_back(pp);
  }
  p.no_plane = r.get_string();
  return p;
}

void Reservations::release(Communicator& c) {
  for (const ReservedGroup& g : held_) {
    c.control().release(g.sw, c.options().ifec.job, g.group, [](const common::ControlStatus&) {});
  }
  held_.clear();
}

std::shared_ptr<PlanBuilder> PlanBuilder::open(Communicator& c, uint16_t group, Then then) {
  std::shared_ptr<PlanBuilder> b(new PlanBuilder(c, group));
  PlanBuilder* self = b.get();  // the join is the builder's: whoever makes it finish holds the builder
  b->join_.done = [self, then = std::move(then)] {
    // In plane order, whichever switch answered first: the chunks' spread over the planes is then a function of
    // the operation alone (the same on every run, live or simulated).
    std::sort(self->plan_.planes.begin(), self->plan_.planes.end(),
              [](const PlanePlan& a, const PlanePlan& b) { return a.plane < b.plane; });
    then(self->plan_, self->held_);
  };
  b->join_.expect();
  return b;
}

void PlanBuilder::reserve(const PlanePlan& plane, const std::vector<SwitchReservation>& groups) {
  // The replies' shared state: how many are still to come, the last refusal's reason, the groups made so far.
  struct Pending {
    size_t left = 0;
    std::string why;
    std::vector<ReservedGroup> made;
  };
  if (groups.empty()) {
    plan_.planes.push_back(plane);  // nothing to reserve there: usable as it is
    return;
  }
  auto pending = std::make_shared<Pending>();
  pending->left = groups.size();
  auto self = shared_from_this();
  join_.expect();
  for (const SwitchReservation& g : groups) {
    comm_.control().reserve(
        g.sw, g.r, [self, plane, pending, made = ReservedGroup{g.sw, g.r.group}](const common::ControlStatus& st) {
          if (st) {
            pending->why = st->message();
          } else {
            pending->made.push_back(made);
          }
          if (--pending->left > 0) {
            return;
          }
          if (!pending->why.empty()) {
            Reservations refused;
            refused.keep(pending->made);
            refused.release(self->comm_);
            self->plan_.note(plane.plane, pending->why);
          } else {
            self->held_.insert(self->held_.end(), pending->made.begin(), pending->made.end());
            self->plan_.planes.push_back(plane);
          }
          self->join_.arrived();
        });
  }
}

void share_plan(Communicator& c, std::weak_ptr<const void> owner, const GatherFn& gather, Reservations& held,
                const std::function<void(PlanBuilder::Then)>& make, const std::string& what,
                std::function<void(const Plan&)> learned) {
  auto share = [gather, what, learned = std::move(learned)](std::vector<uint8_t> mine) {
    gather(std::move(mine), [what, learned](Gathered g) { learned(decode_plan(g.parts.at(0), what)); });
  };
  if (c.rank() != 0) {
    share({});
    return;
  }
  make([&c, owner, &held, share](const Plan& p, const std::vector<ReservedGroup>& groups) {
    if (owner.expired()) {
      Reservations orphaned;
      orphaned.keep(groups);
      orphaned.release(c);
      return;
    }
    held.keep(groups);
    share(encode_plan(p));
  });
}

const endpoint::WindowInfo* window_of(Communicator& c, int rank, uint16_t window) {
  endpoint::Endpoint& ep = c.endpoint();
  return rank == c.rank() ? ep.memory().window(window) : ep.peer_window(c.gpu(rank), window);
}

common::GroupReservation group_reservation(const Communicator& c, const GroupOp& what, uint16_t group, uint32_t slots) {
  common::GroupReservation r;
  r.job = c.options().ifec.job;
  r.group = group;
  r.op = what.op;
  r.dtype = what.dtype;
  r.redop = what.redop;
  r.window = what.window;
  r.slots = slots;
  return r;
}

common::GroupMember group_member(Communicator& c, int rank, uint16_t window, uint64_t offset) {
  const routing::Topology& topo = c.topology();
  const endpoint::WindowInfo* w = window_of(c, rank, window);
  common::GroupMember m;
  m.ip = topo.nodes[topo.gpu_node(c.gpu(rank))].loopback;
  m.result_va = w != nullptr ? w->va + offset : 0;
  m.rkey = w != nullptr ? w->rkey : 0;
  return m;
}

uint16_t member_index(const Communicator& c, int rank, int plane) {
  const int sw = c.switch_node_of(rank, plane);
  uint16_t index = 0;
  for (int r = 0; r < rank; ++r) {
    index += c.switch_node_of(r, plane) == sw;
  }
  return index;
}

}  // namespace ifec::workloads
