// Private to ifec-hostd: this rank's part of one MoE layer (RunRequest what = "moe"), built when LibTorch is
// (IFEC_HAVE_MOE).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ifec/live/epoll_loop.h"
#include "ifec/routing/topology.h"
#include "ifec/v1/control.pb.h"
#include "ifec/workloads/communicator.h"

namespace ifec::live {

struct MoeRunContext {
  workloads::Communicator& comm;
  const routing::Topology& topo;
  uint16_t first_window;                               // the layer uses four window ids from here
  std::function<std::vector<uint64_t>()> plane_tx;     // frame bytes this GPU's interfaces sent so far, per plane
  common::TimeNs epoch_ns = 0;                         // the loop clock's zero on the machine's monotonic clock
  std::function<common::TimeNs()> take_worst_late_ns;  // the loop's latest timer since the last call (EpollLoop)
  LoopWorker& worker;                                  // where LibTorch computes, off the loop
};

// Runs this rank's part of the layer `q` asks for (every rank is asked at once) and replies with its row (the sim's
// MoE row keys, driver "live"): gate its own tokens, exchange routing tables, dispatch, experts, combine, and the
// check of its own outputs against the single-process reference. Throws ifec::common::Error on a bad request.
void run_moe(MoeRunContext ctx, const v1::RunRequest& q, std::function<void(v1::RunReply)> reply);

}  // namespace ifec::live
