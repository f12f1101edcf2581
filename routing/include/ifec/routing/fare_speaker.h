// A live node's FARE decisions: it keeps what each neighbour advertises toward every GPU (set_advert: a BGP
// route's path bandwidth, hop count and AS_PATH, see bgp_speaker.h), decides its own path bandwidth and WECMP
// groups with fare_decide() (the computation the simulator's rounds use), and says when they changed. The
// transport is BgpSpeaker's; this class has no wire format of its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ifec/common/interfaces.h"
#include "ifec/routing/fare.h"

namespace ifec::routing {

class FareSpeaker {
 public:
  // The speaker of topology node `node`; every link starts down until set_port_up().
  FareSpeaker(const Topology& topo, int node);

  // This node's port `port` (its topology port number) up or down.
  void set_port_up(int port, bool up);
  bool port_up(int port) const;
  // What the neighbour on `bundle` advertises toward `dest_gpu` (a BGP route's path bandwidth, hop count and the
  // nodes on its AS_PATH as a path set of fare_path_words() words; gbps 0 / hops -1: unreachable). The neighbour
  // counts as heard from. Call recompute() afterwards.
  void set_advert(int bundle, int dest_gpu, double gbps, int hops, const uint64_t* path);
  // The neighbour on `bundle` forgotten (its session went down): every destination unreachable through it.
  void forget(int bundle);
  // Decides every destination again; true when this node's advertisement or a WECMP group changed.
  bool recompute();

  const std::vector<NextHop>& next_hops(int dest_gpu) const { return groups_.at(dest_gpu); }
  double advertised_gbps(int dest_gpu) const { return adv_.at(dest_gpu); }
  // A GPU node's path bandwidth toward `dest_gpu` through each plane (Gb/s).
  std::vector<double> plane_gbps(int dest_gpu) const;
  int node() const { return node_; }
  const Topology& topology() const { return topo_; }
  // This node's own hop count toward `dest_gpu` (-1: unreachable).
  int hops(int dest_gpu) const { return hops_.at(dest_gpu); }
  const std::vector<FareBundle>& bundles() const { return bundles_; }
  int bundle_of_port(int port) const;  // -1 when the node has no such port
  // The live bandwidth of bundle i (its up sub-links' rates).
  double bundle_gbps(int bundle) const;

 private:
  struct Neighbour {
    bool known = false;
    std::vector<double> gbps;
    std::vector<int16_t> hops;
    std::vector<uint64_t> paths;
  };
  Neighbour& neighbour(int bundle);

  const Topology& topo_;
  int node_;
  int words_;
  int gpus_;
  std::vector<FareBundle> bundles_;
  std::vector<char> link_up_;     // by link id (only this node's links matter)
  std::vector<Neighbour> heard_;  // per bundle
  std::vector<double> adv_;
  std::vector<int> hops_;
  std::vector<uint64_t> paths_;  // words per destination
  std::vector<std::vector<NextHop>> groups_;
};

}  // namespace ifec::routing
