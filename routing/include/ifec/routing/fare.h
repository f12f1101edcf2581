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
// The same from a node's links as adjacency() lists them (no scan of every link).
std::vector<FareBundle> fare_bundles(const Topology& topo, int node, const std::vector<int>& links);
// 64-bit words of a path set (one bit per topology node).
int fare_path_words(const Topology& topo);

// What a node advertises toward one destination GPU: path bandwidth (0: unreachable), shortest hop count (-1:
// unreachable) and the set of nodes on its chosen paths (loop prevention; null: a set that holds nobody this
// decision could be, e.g. the destination's own).
struct FareAdvert {
  double gbps = 0;
  int hops = -1;
  const uint64_t* path = nullptr;
};

// The space of the path sets a decision reads and writes: `words` 64-bit words, the deciding node at bit `self`
// (-1: the node is outside the space, so no set can hold it). The live speakers put every topology node in it
// (fare_path_bits); the simulator's RIB only the switches (GPUs never transit, so no path holds one).
struct FarePathBits {
  size_t words = 0;
  int self = -1;
};
FarePathBits fare_path_bits(const Topology& topo, int node);

// FARE's decision at `node` toward the GPU at node `dest`, from its bundles' live bandwidth (`bundle_gbps`, per
// bundle), its links' state (`link_up`, by link id) and each bundle peer's latest advertisement toward `dest`
// (`advert(i)` for bundles[i]): writes the node's own path set to `path` and its WECMP group to `group`, and
// returns its own advertisement's (gbps, hops). The one computation the simulator's synchronous rounds (FareRib)
// and the live daemons' speakers share.
std::pair<double, int> fare_decide(const Topology& topo, int node, int dest, const std::vector<FareBundle>& bundles,
                                   const std::vector<double>& bundle_gbps, const std::vector<char>& link_up,
                                   const std::function<FareAdvert(size_t bundle)>& advert, FarePathBits bits,
                                   uint64_t* path, std::vector<NextHop>* group);

// The simulator's RIB: every node's advertisement and WECMP group toward every GPU, round by synchronous round.
//
// State grows with the fabric, not with GPUs x GPUs: GPUs attached alike (the same switches, over bundles of the
// same sub-link rates and states: a destination class) are routed alike by every switch but those they hang from,
// and a GPU's own routes depend only on its attachment, so rows are kept per (switch, class) and per (class,
// class) and a GPU's are derived from its class's on demand (its links in place of the class representative's).
// The rounds are the per-GPU rounds exactly: every row is recomputed from the previous round's rows (a GPU's from
// its switches' previous rows), so a change still reaches nodes k hops away after k rounds. A link event that
// changes a GPU's attachment moves it into a class of its own that starts from its old class's state.
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
  std::vector<NextHop> next_hops(int node, int dest_gpu) const;
  // For a GPU source: the path bandwidth toward `dest_gpu` through each plane (size num_planes), Gb/s.
  std::vector<double> plane_gbps(int src_gpu, int dest_gpu) const;

  // Destination classes, for drivers that install one route per class where they can (a switch a class does not
  // hang from sends all of its members the same way: class_hops).
  int num_classes() const { return static_cast<int>(classes_.size()); }
  int class_of(int gpu) const { return class_of_.at(gpu); }
  const std::vector<int>& class_members(int cls) const { return classes_.at(cls).members; }
  // Whether switch node `node` has a bundle to the class's GPUs (then each member has its own direct route).
  bool attached(int node, int cls) const;
  // The group at switch node `node` toward every member of class `cls` (a switch it is not attached to).
  const std::vector<NextHop>& class_hops(int node, int cls) const;
  // Bytes the RIB holds (rows, path sets, groups), for the benches.
  size_t memory_bytes() const;

  const Topology& topology() const { return topo_; }

 private:
  struct Class {
    std::vector<int> members;  // GPU indices, ascending
    int rep = -1;              // the member whose links the class's rows name
    std::vector<char> signature;
  };
  // A GPU source's state toward one class, in its class representative's links.
  struct GpuRow {
    double adv = 0;
    int hops = -1;
    std::vector<NextHop> group;
    std::vector<uint64_t> path;  // the switches on its paths: read by nobody (GPUs never transit), but a change
                                 // is a change of the round, as it was when every node's set was kept
  };

  std::vector<char> signature(int gpu) const;  // the GPU's attachment: bundles (peer, sub-link rates and states)
  void build_classes();
  void split_off(int gpu);  // gives a GPU whose attachment changed a class of its own, from its old class's state
  void rename_rep(int cls, int to_gpu);  // the rows of `cls` named in another member's links
  size_t row(int sw, int cls) const { return static_cast<size_t>(cls) * switches_.size() + sw; }
  FareAdvert advert_from(int peer_node, int dest_node, int cls) const;
  int dest_node_for(int src_cls, int dst_cls) const;  // a member of dst_cls other than src_cls's representative
  bool step_gpu_rows();
  bool step_switch_rows();
  // `group` (links of node `owner`) as the same bundles' links of node `to` (attached alike).
  std::vector<NextHop> owner_renamed(const std::vector<NextHop>& group, int owner, int to) const;
  // `group` (links of switch `node` toward GPU node `peer`) as its links toward GPU node `to` (attached alike).
  std::vector<NextHop> peer_renamed(const std::vector<NextHop>& group, int node, int peer, int to) const;
  void check_node(int node) const;
  void check_gpu(int gpu) const;

  const Topology& topo_;
  std::vector<char> link_up_;
  std::vector<std::vector<FareBundle>> bundles_;  // [node]
  std::vector<int> gpu_node_;                     // [gpu] -> node index
  std::vector<int> switches_;                     // switch index -> node
  std::vector<int> switch_index_;                 // node -> switch index or -1
  size_t words_ = 0;                              // path sets: one bit per switch

  std::vector<Class> classes_;
  std::vector<int> class_of_;  // [gpu]
  // Switch rows, [class][switch] flattened (row()); path sets words_ each.
  std::vector<double> adv_;
  std::vector<int> hops_;
  std::vector<uint64_t> paths_;
  std::vector<std::vector<NextHop>> groups_;
  std::vector<std::vector<GpuRow>> gpu_rows_;  // [source class][destination class]
  // Next-round buffers (a round reads only the previous round's rows).
  std::vector<double> next_adv_;
  std::vector<int> next_hops_;
  std::vector<uint64_t> next_paths_;
  std::vector<NextHop> scratch_;
  std::vector<uint64_t> scratch_path_;
};

}  // namespace ifec::routing
