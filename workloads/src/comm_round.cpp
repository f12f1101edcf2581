// What every in-fabric round is built from: spec fields, lanes, spreading pieces over planes.
#include "comm_round.h"

namespace ifec::workloads {

double my_plane_gbps(Communicator& c, int plane) {
  double w = 0;
  endpoint::Endpoint& ep = c.endpoint();
  for (int p = 0; p < ep.num_ports(); ++p) {
    if (ep.port_info(p).plane == plane && ep.port_info(p).port->link_up()) {
      w += ep.port_info(p).port->rate_bps() / 1e9;
    }
  }
  return w;
}

uint32_t loopback_of_switch(Communicator& c, int plane) {
  const int node = c.switch_node_of(c.rank(), plane);
  return node < 0 ? 0 : c.topology().nodes[node].loopback;
}

endpoint::EchReduceSpec reduce_spec(Communicator& c, const GroupOp& what, uint16_t source_window) {
  endpoint::EchReduceSpec s;
  s.job = c.options().ifec.job;
  s.op = what.op;
  s.dtype = what.dtype;
  s.redop = what.redop;
  s.source_window = source_window;
  s.result_window = what.window;
  s.timing = c.options().ifec.timing;
  return s;
}

uint32_t Lanes::lane(int plane, uint16_t group, uint32_t window) {
  const auto [it, added] = index_.emplace(std::make_pair(plane, group), static_cast<uint32_t>(spec_.lanes.size()));
  if (added) {
    endpoint::EchLane l;
    l.plane = plane;
    l.switch_ip = loopback_of_switch(comm_, plane);
    l.group = group;
    l.window = window;
    l.contributor = member_index(comm_, comm_.rank(), plane);
    spec_.lanes.push_back(l);
  }
  return it->second;
}

size_t LoadSpreader::place(double bytes) {
  size_t best = 0;
  for (size_t q = 1; q < gbps_.size(); ++q) {
    if ((load_[q] + bytes) / gbps_[q] < (load_[best] + bytes) / gbps_[best]) {
      best = q;
    }
  }
  load_[best] += bytes;
  return best;
}

std::vector<int> all_planes(const Communicator& c) {
  std::vector<int> planes;
  for (int p = 0; p < c.topology().num_planes; ++p) {
    planes.push_back(p);
  }
  return planes;
}

}  // namespace ifec::workloads
