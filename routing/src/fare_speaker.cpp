// A live node's FARE decisions from its neighbours' advertisements (fed by BgpSpeaker).
#include "ifec/routing/fare_speaker.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ifec/common/byte_order.h"
#include "ifec/common/checks.h"

namespace ifec::routing {

FareSpeaker::FareSpeaker(const Topology& topo, int node)
    : topo_(topo), node_(node), words_(fare_path_words(topo)), gpus_(topo.num_gpus()) {
  IFEC_CHECK(node >= 0 && node < static_cast<int>(topo.nodes.size()),
             "FARE speaker: node " << node << " outside 0.." << topo.nodes.size() - 1);
  bundles_ = fare_bundles(topo_, node_);
  link_up_.assign(topo_.links.size(), 0);
  heard_.resize(bundles_.size());
  adv_.assign(gpus_, 0.0);
  hops_.assign(gpus_, -1);
  paths_.assign(static_cast<size_t>(gpus_) * words_, 0);
  groups_.resize(gpus_);
  recompute();
}

int FareSpeaker::bundle_of_port(int port) const {
  for (size_t i = 0; i < bundles_.size(); ++i) {
    for (int p : bundles_[i].ports) {
      if (p == port) {
        return static_cast<int>(i);
      }
    }
  }
  return -1;
}

void FareSpeaker::set_port_up(int port, bool up) {
  const int b = bundle_of_port(port);
  IFEC_CHECK(b >= 0, "FARE speaker of " << topo_.nodes[node_].name << ": no port " << port);
  const auto& bd = bundles_[b];
  for (size_t k = 0; k < bd.ports.size(); ++k) {
    if (bd.ports[k] == port) {
      link_up_[bd.links[k]] = up ? 1 : 0;
    }
  }
}

bool FareSpeaker::port_up(int port) const {
  const int b = bundle_of_port(port);
  IFEC_CHECK(b >= 0, "FARE speaker of " << topo_.nodes[node_].name << ": no port " << port);
  for (size_t k = 0; k < bundles_[b].ports.size(); ++k) {
    if (bundles_[b].ports[k] == port) {
      return link_up_[bundles_[b].links[k]] != 0;
    }
  }
  return false;
}

FareSpeaker::Neighbour& FareSpeaker::neighbour(int bundle) {
  Neighbour& nb = heard_.at(bundle);
  if (!nb.known) {
    nb.gbps.assign(gpus_, 0.0);
    nb.hops.assign(gpus_, -1);
    nb.paths.assign(static_cast<size_t>(gpus_) * words_, 0);
    nb.known = true;
  }
  return nb;
}

void FareSpeaker::set_advert(int bundle, int dest_gpu, double gbps, int hops, const uint64_t* path) {
  IFEC_CHECK(dest_gpu >= 0 && dest_gpu < gpus_,
             "FARE advertisement toward GPU " << dest_gpu << " outside 0.." << gpus_ - 1);
  Neighbour& nb = neighbour(bundle);
  nb.gbps[dest_gpu] = gbps;
  nb.hops[dest_gpu] = static_cast<int16_t>(hops);
  std::copy(path, path + words_, nb.paths.begin() + static_cast<size_t>(dest_gpu) * words_);
}

void FareSpeaker::forget(int bundle) { heard_.at(bundle) = Neighbour{}; }

double FareSpeaker::bundle_gbps(int bundle) const {
  double bw = 0;
  for (int l : bundles_.at(bundle).links) {
    bw += link_up_[l] ? topo_.links[l].rate_gbps : 0.0;
  }
  return bw;
}

bool FareSpeaker::recompute() {
  std::vector<double> bw(bundles_.size(), 0.0);
  for (size_t i = 0; i < bundles_.size(); ++i) {
    bw[i] = bundle_gbps(static_cast<int>(i));
  }
  bool changed = false;
  std::vector<uint64_t> path(words_);
  std::vector<NextHop> group;
  for (int d = 0; d < gpus_; ++d) {
    const auto [gbps, hops] = fare_decide(
        topo_, node_, topo_.gpu_node(d), bundles_, bw, link_up_,
        [&](size_t i) {
          const Neighbour& nb = heard_[i];
          return nb.known ? FareAdvert{nb.gbps[d], nb.hops[d], &nb.paths[static_cast<size_t>(d) * words_]}
                          : FareAdvert{};
        },
        fare_path_bits(topo_, node_), path.data(), &group);
    changed = changed || gbps != adv_[d] || hops != hops_[d] ||
              !std::equal(path.begin(), path.end(), paths_.begin() + static_cast<size_t>(d) * words_);
    const bool same_group =
        std::equal(group.begin(), group.end(), groups_[d].begin(), groups_[d].end(),
                   [](const NextHop& a, const NextHop& b) { return a.link == b.link && a.weight == b.weight; });
    changed = changed || !same_group;
    adv_[d] = gbps;
    hops_[d] = hops;
    std::copy(path.begin(), path.end(), paths_.begin() + static_cast<size_t>(d) * words_);
    groups_[d] = group;
  }
  return changed;
}

std::vector<double> FareSpeaker::plane_gbps(int dest_gpu) const {
  std::vector<double> out(topo_.num_planes, 0.0);
  for (const NextHop& h : next_hops(dest_gpu)) {
    out[topo_.links[h.link].plane] += h.weight;
  }
  return out;
}

}  // namespace ifec::routing
