// The live FARE speaker and its advertisement frames.
#include "ifec/routing/fare_speaker.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ifec/common/byte_order.h"
#include "ifec/common/checks.h"

namespace ifec::routing {

namespace {

constexpr size_t kEth = 14;
constexpr size_t kHeader = 4 + 1 + 1 + 2 + 2 + 4 + 2 + 2 + 2;  // after the Ethernet header
size_t per_dest(size_t words) { return 8 + 2 + 8 * words; }

uint64_t double_bits(double v) {
  uint64_t b;
  std::memcpy(&b, &v, 8);
  return b;
}

double bits_double(uint64_t b) {
  double v;
  std::memcpy(&v, &b, 8);
  return v;
}

}  // namespace

std::vector<uint8_t> encode_fare(const FareMessage& m, const uint8_t src_mac[6]) {
  const size_t n = m.gbps.size();
  IFEC_CHECK(m.hops.size() == n && m.paths.size() == n * m.words, "FARE message: inconsistent sizes");
  std::vector<uint8_t> f(kEth + kHeader + n * per_dest(m.words));
  std::memset(f.data(), 0xFF, 6);
  std::memcpy(f.data() + 6, src_mac, 6);
  common::store_be16(&f[12], kFareEthertype);
  uint8_t* p = &f[kEth];
  std::memcpy(p, "FARE", 4);
  p[4] = 1;
  p[5] = 0;
  common::store_be16(p + 6, m.node);
  common::store_be16(p + 8, m.port);
  common::store_be32(p + 10, m.seq);
  common::store_be16(p + 14, m.words);
  common::store_be16(p + 16, m.first_dest);
  common::store_be16(p + 18, static_cast<uint16_t>(n));
  p += kHeader;
  for (size_t i = 0; i < n; ++i) {
    common::store_be64(p, double_bits(m.gbps[i]));
    common::store_be16(p + 8, static_cast<uint16_t>(m.hops[i]));
    for (size_t w = 0; w < m.words; ++w) {
      common::store_be64(p + 10 + 8 * w, m.paths[i * m.words + w]);
    }
    p += per_dest(m.words);
  }
  return f;
}

std::string decode_fare(const uint8_t* f, size_t len, FareMessage* m) {
  if (len < kEth + kHeader) {
    return "FARE frame of " + std::to_string(len) + " B is shorter than its header";
  }
  if (common::load_be16(f + 12) != kFareEthertype || std::memcmp(f + kEth, "FARE", 4) != 0) {
    return "not a FARE frame";
  }
  const uint8_t* p = f + kEth;
  if (p[4] != 1) {
    return "FARE version " + std::to_string(p[4]) + " (this speaker knows 1)";
  }
  m->node = common::load_be16(p + 6);
  m->port = common::load_be16(p + 8);
  m->seq = common::load_be32(p + 10);
  m->words = common::load_be16(p + 14);
  m->first_dest = common::load_be16(p + 16);
  const size_t n = common::load_be16(p + 18);
  if (len < kEth + kHeader + n * per_dest(m->words)) {
    return "FARE frame of " + std::to_string(len) + " B is too short for " + std::to_string(n) + " destinations";
  }
  m->gbps.resize(n);
  m->hops.resize(n);
  m->paths.resize(n * m->words);
  p += kHeader;
  for (size_t i = 0; i < n; ++i) {
    m->gbps[i] = bits_double(common::load_be64(p));
    m->hops[i] = static_cast<int16_t>(common::load_be16(p + 8));
    for (size_t w = 0; w < m->words; ++w) {
      m->paths[i * m->words + w] = common::load_be64(p + 10 + 8 * w);
    }
    if (std::isnan(m->gbps[i]) || m->gbps[i] < 0) {
      return "FARE destination " + std::to_string(m->first_dest + i) + ": bandwidth is not a number >= 0";
    }
    p += per_dest(m->words);
  }
  return "";
}

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

std::string FareSpeaker::receive(int port, const FareMessage& m, common::TimeNs now) {
  const int b = bundle_of_port(port);
  if (b < 0) {
    return "advertisement on port " + std::to_string(port) + ", which " + topo_.nodes[node_].name + " does not have";
  }
  const int peer = bundles_[b].peer;
  if (m.node != peer) {
    return "port " + std::to_string(port) + " of " + topo_.nodes[node_].name + " heard node " + std::to_string(m.node) +
           " where the topology puts " + topo_.nodes[peer].name + " (miswired?)";
  }
  if (m.words != words_ || m.first_dest + m.gbps.size() > static_cast<size_t>(gpus_)) {
    return "advertisement from " + topo_.nodes[peer].name + " does not match this topology (" +
           std::to_string(m.words) + " path words, destinations " + std::to_string(m.first_dest) + "+" +
           std::to_string(m.gbps.size()) + ")";
  }
  Neighbour& nb = neighbour(b);
  nb.last = now;
  std::copy(m.gbps.begin(), m.gbps.end(), nb.gbps.begin() + m.first_dest);
  std::copy(m.hops.begin(), m.hops.end(), nb.hops.begin() + m.first_dest);
  std::copy(m.paths.begin(), m.paths.end(), nb.paths.begin() + static_cast<size_t>(m.first_dest) * words_);
  return "";
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
  IFEC_CHECK(dest_gpu >= 0 && dest_gpu < gpus_, "FARE advertisement toward GPU " << dest_gpu << " outside 0.."
                                                                                  << gpus_ - 1);
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

bool FareSpeaker::expire(common::TimeNs now, common::TimeNs hold) {
  bool any = false;
  for (Neighbour& nb : heard_) {
    if (nb.known && now > hold && nb.last < now - hold) {
      nb = Neighbour{};
      any = true;
    }
  }
  return any;
}

bool FareSpeaker::heard(int port) const {
  const int b = bundle_of_port(port);
  return b >= 0 && heard_[b].known;
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

std::vector<FareMessage> FareSpeaker::advert(int port) {
  const size_t per = (kFareMaxFrame - kEth - kHeader) / per_dest(words_);
  std::vector<FareMessage> out;
  ++seq_;
  for (int first = 0; first < gpus_; first += static_cast<int>(per)) {
    const int n = std::min<int>(static_cast<int>(per), gpus_ - first);
    FareMessage m;
    m.node = static_cast<uint16_t>(node_);
    m.port = static_cast<uint16_t>(port);
    m.seq = seq_;
    m.words = static_cast<uint16_t>(words_);
    m.first_dest = static_cast<uint16_t>(first);
    m.gbps.assign(adv_.begin() + first, adv_.begin() + first + n);
    m.hops.assign(n, 0);
    for (int i = 0; i < n; ++i) {
      m.hops[i] = static_cast<int16_t>(hops_[first + i]);
    }
    m.paths.assign(paths_.begin() + static_cast<size_t>(first) * words_,
                   paths_.begin() + static_cast<size_t>(first + n) * words_);
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<double> FareSpeaker::plane_gbps(int dest_gpu) const {
  std::vector<double> out(topo_.num_planes, 0.0);
  for (const NextHop& h : next_hops(dest_gpu)) {
    out[topo_.links[h.link].plane] += h.weight;
  }
  return out;
}

}  // namespace ifec::routing
