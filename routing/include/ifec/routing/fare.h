// FARE: path bandwidth per (node, destination GPU) propagated hop by hop like BGP's path-bandwidth attribute,
// and the WECMP next-hop weights that follow from it (draft-xu-rtgwg-fare-in-sun, draft-xu-idr-fare).
//
// Model (docs in routing/README.md):
//  - Parallel links between the same two nodes (Y-cable sub-links, LAG members) form a bundle whose bandwidth
//    is the sum of its up sub-links.
//  - The destination GPU advertises its loopback with unlimited bandwidth; each node X computes, for each
//    neighbor n on a shortest (hop count) path to d, pb(X,n,d) = min(bundle_bw(X,n), adv(n,d)) and advertises
//    adv(X,d) = sum of pb over those neighbors. GPUs do not transit traffic (they advertise only themselves).
//  - WECMP weights at X toward d: each shortest-path neighbor gets pb(X,n,d), split over the bundle's up
//    sub-links in proportion to their rates. A neighbor with pb 0 gets nothing.
//  - step() runs one synchronous advertisement round (every node recomputes from its neighbors' previous
//    advertisements): a change reaches nodes k hops away after k rounds, so a driver that applies round i at
//    t_event + i * control_plane_delay models hop-by-hop propagation.
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "ifec/routing/topology.h"

namespace ifec::routing {

struct NextHop {
  int link = 0;       // link id (a specific sub-link)
  int port = 0;       // local port of that link at this node
  double weight = 0;  // Gb/s of path bandwidth assigned to this sub-link; weights need not sum to 1
};

// Parallel links between a node and one neighbour (Y-cable sub-links, LAG members), from the node's side, in link
// id order.
struct FareBundle {
  int peer = 0;
  std::vector<int> links;
  std::vector<int> ports;  // local port of each link
};
std::vector<FareBundle> fare_bundles(const Topology& topo, int node);
// 64-bit words of a path set (one bit per topology node).
int fare_path_words(const Topology& topo);

// What a node advertises toward one destination GPU: path bandwidth (0: unreachable), shortest hop count (-1:
// unreachable) and the set of nodes on its chosen paths (fare_path_words() words; loop prevention).
struct FareAdvert {
  double gbps = 0;
  int hops = -1;
  const uint64_t* path = nullptr;
};

// FARE's decision at `node` toward the GPU at node `dest`, from its bundles' live bandwidth (`bundle_gbps`, per
// bundle), its links' state (`link_up`, by link id) and each bundle peer's latest advertisement toward `dest`
// (`advert(i)` for bundles[i]): writes the node's own path set to `path` and its WECMP group to `group`, and
// returns its own advertisement's (gbps, hops). The one computation the simulator's synchronous rounds (FareRib)
// and the live daemons' speakers share.
std::pair<double, int> fare_decide(const Topology& topo, int node, int dest, const std::vector<FareBundle>& bundles,
                                   const std::vector<double>& bundle_gbps, const std::vector<char>& link_up,
                                   const std::function<FareAdvert(size_t bundle)>& advert, uint64_t* path,
                                   std::vector<NextHop>* group);

class FareRib {
 public:
  explicit FareRib(const Topology& topo);

  // Marks a link up or down (both directions). Takes effect on the next step()/converge().
  void set_link_up(int link, bool up);
  bool link_up(int link) const;

  // One synchronous advertisement round; returns true if any advertisement or next-hop set changed.
  bool step();
  // Rounds until nothing changes; returns the number of rounds that changed something.
  int converge();

  // Advertised path bandwidth of node `node` toward GPU `dest_gpu` (Gb/s; 0 = unreachable).
  double advertised_gbps(int node, int dest_gpu) const;
  // WECMP group at `node` toward `dest_gpu` (empty when unreachable or node is that GPU).
  const std::vector<NextHop>& next_hops(int node, int dest_gpu) const;
  // For a GPU source: the path bandwidth toward `dest_gpu` through each plane (size num_planes), Gb/s.
  std::vector<double> plane_gbps(int src_gpu, int dest_gpu) const;

  const Topology& topology() const { return topo_; }

 private:
  const Topology& topo_;
  std::vector<char> link_up_;
  std::vector<std::vector<double>> adv_;                   // [node][dest_gpu]
  std::vector<std::vector<std::vector<NextHop>>> groups_;  // [node][dest_gpu]
  std::vector<std::vector<int>> hops_;                     // [node][dest_gpu], shortest hop count (-1 unreachable)

  std::vector<std::vector<FareBundle>> bundles_;  // [node]
  std::vector<int> gpu_node_;                     // [dest_gpu] -> node index
  // Loop prevention like BGP's AS_PATH: the set of nodes on node X's chosen paths toward d (union over its ECMP
  // next hops), a bitset of words_ words at [(X * num_gpus + d) * words_]. X ignores a neighbor whose set holds X.
  int words_ = 0;
  std::vector<uint64_t> paths_;
  // Next-round buffers (a round reads only the previous round's advertisements).
  std::vector<std::vector<double>> next_adv_;
  std::vector<std::vector<int>> next_hops_count_;
  std::vector<uint64_t> next_paths_;
  std::vector<NextHop> scratch_;
};

}  // namespace ifec::routing
