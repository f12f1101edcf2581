// A live node's FARE speaker: it keeps the latest advertisement each neighbour sent, decides its own path bandwidth
// and WECMP groups with fare_decide() (the computation the simulator's rounds use), and says when its own
// advertisement changed so the daemon sends it. Neighbours that fall silent for a hold time count as gone (a dead
// daemon leaves its interfaces up).
//
// Wire format (one Ethernet frame, ethertype 0x88B5, every field big-endian):
//   dst MAC (ff:ff:ff:ff:ff:ff) | src MAC (the sending port's) | 0x88B5
//   "FARE" | version u8 (1) | reserved u8 | node u16 (sender's topology node) | port u16 (its port) |
//   sequence u32 | path words u16 | first destination u16 | count u16 |
//   count x { path bandwidth f64 (Gb/s, IEEE 754; +inf for the destination itself) | hops i16 (-1: unreachable) |
//             path set (words x u64: bit n = topology node n is on the sender's chosen paths) }
// Advertisements that do not fit one 9216-byte frame are split by destination ranges.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ifec/common/interfaces.h"
#include "ifec/routing/fare.h"

namespace ifec::routing {

inline constexpr uint16_t kFareEthertype = 0x88B5;
inline constexpr size_t kFareMaxFrame = 9216;

struct FareMessage {
  uint16_t node = 0;
  uint16_t port = 0;
  uint32_t seq = 0;
  uint16_t words = 0;
  uint16_t first_dest = 0;
  std::vector<double> gbps;     // per destination GPU first_dest + i
  std::vector<int16_t> hops;    // per destination
  std::vector<uint64_t> paths;  // words per destination
};

// The whole Ethernet frame.
std::vector<uint8_t> encode_fare(const FareMessage& m, const uint8_t src_mac[6]);
// "" and *m filled, or why the frame is not a well-formed FARE advertisement (never trusts the buffer).
std::string decode_fare(const uint8_t* frame, size_t len, FareMessage* m);

class FareSpeaker {
 public:
  // The speaker of topology node `node`; every link starts down until set_port_up().
  FareSpeaker(const Topology& topo, int node);

  // This node's port `port` (its topology port number) up or down.
  void set_port_up(int port, bool up);
  bool port_up(int port) const;
  // An advertisement that arrived on `port` at `now`: "" when accepted, else why not (not the neighbour the
  // topology puts on that port, a size that does not match the topology). Call recompute() afterwards.
  std::string receive(int port, const FareMessage& m, common::TimeNs now);
  // What the neighbour on `bundle` advertises toward `dest_gpu` (a BGP route's path bandwidth, hop count and the
  // nodes on its AS_PATH as a path set of fare_path_words() words; gbps 0 / hops -1: unreachable). The neighbour
  // counts as heard from. Call recompute() afterwards.
  void set_advert(int bundle, int dest_gpu, double gbps, int hops, const uint64_t* path);
  // The neighbour on `bundle` forgotten (its session went down): every destination unreachable through it.
  void forget(int bundle);
  // Forgets neighbours silent since before now - hold; true when one was forgotten.
  bool expire(common::TimeNs now, common::TimeNs hold);
  // Decides every destination again; true when this node's advertisement or a WECMP group changed.
  bool recompute();

  // This node's advertisement, as sent on `port` (split to fit frames).
  std::vector<FareMessage> advert(int port);
  const std::vector<NextHop>& next_hops(int dest_gpu) const { return groups_.at(dest_gpu); }
  double advertised_gbps(int dest_gpu) const { return adv_.at(dest_gpu); }
  // A GPU node's path bandwidth toward `dest_gpu` through each plane (Gb/s).
  std::vector<double> plane_gbps(int dest_gpu) const;
  // The neighbour on each bundle has been heard from (and is not expired).
  bool heard(int port) const;
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
    common::TimeNs last = 0;
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
  uint32_t seq_ = 0;
};

}  // namespace ifec::routing
