// Private to the communicator's sources: what every in-fabric operation plans with. The leader reserves groups
// through the control plane, all of a plane's or none, and hands every rank the plan over the bootstrap.
//
// A new in-fabric operation calls share_plan; on rank 0 its `make` opens a PlanBuilder and, plane by plane, skips
// the plane with the reason or hands it the groups the plane needs (group_reservation, group_member); every rank
// gets the plan, the leader keeps the groups in Reservations and releases them after the round. Rounds build their
// lanes and spread chunks with comm_round.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ifec/common/control.h"
#include "ifec/workloads/communicator.h"

namespace ifec::workloads {

// Joins asynchronous replies: `done` runs once every expected reply came. The issuer expects once for itself before
// it asks and arrives once after, so replies that come back while it still asks cannot finish the join early.
struct Join {
  int outstanding = 0;
  std::function<void()> done;
  void expect() { ++outstanding; }
  void arrived() {
    if (--outstanding == 0 && done) {
      done();
    }
  }
};

// One plane of a plan.
struct PlanePlan {
  int plane = 0;
  double weight = 0;    // Gb/s to the slowest rank as the leader sees it (0: each rank weighs the planes itself)
  uint32_t budget = 0;  // slots of each of the plan's groups on this plane
};

// What the leader reserved, as every rank receives it.
struct Plan {
  uint16_t group = 0;  // the groups' id (or the base the operation derives its groups' ids from)
  std::vector<PlanePlan> planes;
  std::string no_plane;  // why each plane left out was not used ("" when none was)

  void note(int plane, const std::string& why);
  std::vector<int> plane_ids() const;
};

std::vector<uint8_t> encode_plan(const Plan& p);
Plan decode_plan(const std::vector<uint8_t>& bytes, const std::string& what);

// The bootstrap's allgather as an operation runs it (CommOp::gather: the answer comes only while it runs).
using GatherFn = std::function<void(std::vector<uint8_t> mine, std::function<void(Gathered)> done)>;

// A group reserved on a switch, held until the operation releases it.
struct ReservedGroup {
  std::string sw;
  uint16_t group = 0;
};

// The groups the leader holds: released (replies not awaited) once the round that used them is over.
class Reservations {
 public:
  void keep(const std::vector<ReservedGroup>& groups) { held_.insert(held_.end(), groups.begin(), groups.end()); }
  void release(Communicator& c);

 private:
  std::vector<ReservedGroup> held_;
};

// A reservation to make on one switch (by node name).
struct SwitchReservation {
  std::string sw;
  common::GroupReservation r;
};

// The leader's plan in the making. Every plane is either skipped with a reason or reserved: all its groups, or none
// (a refusal releases those made, and the plane's share of the work moves to the others). Planes join the plan in
// the order their last reply comes; `then` gets the plan and the groups held, once every plane is decided.
class PlanBuilder : public std::enable_shared_from_this<PlanBuilder> {
 public:
  using Then = std::function<void(const Plan&, const std::vector<ReservedGroup>& held)>;

  // The builder expects the opener's close() (see Join).
  static std::shared_ptr<PlanBuilder> open(Communicator& c, uint16_t group, Then then);
  uint16_t group() const { return plan_.group; }
  void skip(int plane, const std::string& why) { plan_.note(plane, why); }
  void reserve(const PlanePlan& plane, const std::vector<SwitchReservation>& groups);
  // A question to ask before a plane's reservation (the switch's free slots): the plan waits for its arrived().
  void expect() { join_.expect(); }
  void arrived() { join_.arrived(); }
  // Every plane was handed over.
  void close() { join_.arrived(); }

 private:
  PlanBuilder(Communicator& c, uint16_t group) : comm_(c) { plan_.group = group; }

  Communicator& comm_;
  Plan plan_;
  std::vector<ReservedGroup> held_;
  Join join_;
};

// Every rank learns the leader's plan: rank 0 makes it (`make` hands it to the Then it is given; the groups it holds
// go to `held`), every other rank only waits; `learned` gets the plan on every rank. `what` names it in errors.
// `owner` is the operation that asked (gather and held are its own): when the switches' answers come after it ended
// (its time limit passed), nothing of it is touched and the groups just reserved are released again.
void share_plan(Communicator& c, std::weak_ptr<const void> owner, const GatherFn& gather, Reservations& held,
                const std::function<void(PlanBuilder::Then)>& make, const std::string& what,
                std::function<void(const Plan&)> learned);

// The window `window` of `rank` as this rank knows it (its own, or the key exchanged for a peer's), or null.
const endpoint::WindowInfo* window_of(Communicator& c, int rank, uint16_t window);

// What a group computes, and the window its results land in (every group of an operation alike).
struct GroupOp {
  common::EchOp op = common::EchOp::kAllReduce;
  common::EchDtype dtype = common::EchDtype::kFp32;
  common::EchRedOp redop = common::EchRedOp::kSum;
  uint16_t window = 0;
};

// A reservation of group `group` with `slots` slots for this job, without members.
common::GroupReservation group_reservation(const Communicator& c, const GroupOp& what, uint16_t group, uint32_t slots);
// `rank` as a member whose results land at `offset` of window `window` (VA and rkey 0 where the window is unknown).
common::GroupMember group_member(Communicator& c, int rank, uint16_t window, uint64_t offset);

// How every group numbers its members (ECH contributor ids): a switch's group lists the ranks that hang from that
// switch on the plane, in rank order. One tier: every rank, so the index is the rank; two tier: a leaf's own ranks,
// so a rank's index can differ from plane to plane (the spine's members are the leaves).
uint16_t member_index(const Communicator& c, int rank, int plane);

}  // namespace ifec::workloads
