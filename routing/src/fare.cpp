// FARE RIB: synchronous rounds of path-bandwidth advertisement and the WECMP groups derived from them.
#include "ifec/routing/fare.h"

#include <algorithm>
#include <climits>
#include <limits>
#include <map>
#include <tuple>

#include "ifec/common/checks.h"

namespace ifec::routing {

namespace {

constexpr double kUnlimited = std::numeric_limits<double>::infinity();

bool same_group(const std::vector<NextHop>& x, const std::vector<NextHop>& y) {
  return std::equal(x.begin(), x.end(), y.begin(), y.end(), [](const NextHop& a, const NextHop& b) {
    return a.link == b.link && a.port == b.port && a.weight == b.weight;
  });
}

}  // namespace

std::vector<FareBundle> fare_bundles(const Topology& topo, int node) {
  std::vector<FareBundle> out;
  std::map<int, size_t> of_peer;
  for (int l : topo.links_of(node)) {
    const Link& link = topo.links[l];
    const auto [peer, peer_port] = topo.peer(l, node);
    auto [it, fresh] = of_peer.emplace(peer, out.size());
    if (fresh) {
      out.push_back(FareBundle{peer, {}, {}});
    }
    out[it->second].links.push_back(l);
    out[it->second].ports.push_back(link.a == node ? link.a_port : link.b_port);
  }
  for (FareBundle& b : out) {  // link id order within a bundle
    std::vector<size_t> idx(b.links.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return b.links[x] < b.links[y]; });
    FareBundle sorted{b.peer, {}, {}};
    for (size_t i : idx) {
      sorted.links.push_back(b.links[i]);
      sorted.ports.push_back(b.ports[i]);
    }
    b = std::move(sorted);
  }
  return out;
}

int fare_path_words(const Topology& topo) { return (static_cast<int>(topo.nodes.size()) + 63) / 64; }

std::pair<double, int> fare_decide(const Topology& topo, int x, int dest, const std::vector<FareBundle>& bundles,
                                   const std::vector<double>& bundle_gbps, const std::vector<char>& link_up,
                                   const std::function<FareAdvert(size_t bundle)>& advert, uint64_t* out,
                                   std::vector<NextHop>* group) {
  const size_t words = static_cast<size_t>(fare_path_words(topo));
  const uint64_t self_bit = uint64_t{1} << (x % 64);
  const size_t self_word = static_cast<size_t>(x / 64);
  std::fill(out, out + words, 0);
  group->clear();
  if (x == dest) {
    out[self_word] |= self_bit;
    return {kUnlimited, 0};
  }
  std::vector<FareAdvert> adv(bundles.size());
  // A usable neighbor: bundle up, not a transit GPU, reaches d, and its paths do not already go through x.
  auto usable = [&](size_t i) {
    const int n = bundles[i].peer;
    if (bundle_gbps[i] <= 0) return false;
    if (topo.nodes[n].kind == NodeKind::kGpu && n != dest) return false;
    if (adv[i].hops < 0) return false;
    return adv[i].path == nullptr || (adv[i].path[self_word] & self_bit) == 0;
  };
  int best = INT_MAX;
  for (size_t i = 0; i < bundles.size(); ++i) {
    adv[i] = advert(i);
    if (usable(i)) best = std::min(best, adv[i].hops);
  }
  double total = 0;
  if (best != INT_MAX) {
    for (size_t i = 0; i < bundles.size(); ++i) {
      if (!usable(i) || adv[i].hops != best) continue;
      const double bw = bundle_gbps[i];
      const double pb = std::min(bw, adv[i].gbps);
      if (!(pb > 0)) continue;
      total += pb;
      for (size_t w = 0; adv[i].path != nullptr && w < words; ++w) out[w] |= adv[i].path[w];
      for (size_t k = 0; k < bundles[i].links.size(); ++k) {
        const int l = bundles[i].links[k];
        if (link_up[l]) group->push_back(NextHop{l, bundles[i].ports[k], pb * topo.links[l].rate_gbps / bw});
      }
    }
  }
  std::sort(group->begin(), group->end(), [](const NextHop& a, const NextHop& b) { return a.link < b.link; });
  if (total > 0) {
    out[self_word] |= self_bit;
    return {total, best + 1};
  }
  std::fill(out, out + words, 0);
  return {0.0, -1};
}

FareRib::FareRib(const Topology& topo) : topo_(topo) {
  validate(topo_);
  const int num_nodes = static_cast<int>(topo_.nodes.size());
  const int gpus = topo_.num_gpus();
  link_up_.assign(topo_.links.size(), 1);
  gpu_node_.resize(gpus);
  for (int g = 0; g < gpus; ++g) gpu_node_[g] = topo_.gpu_node(g);
  bundles_.resize(num_nodes);
  for (int x = 0; x < num_nodes; ++x) bundles_[x] = fare_bundles(topo_, x);

  // Initial state: only each GPU knows (and advertises) itself; everything else is learned round by round.
  words_ = fare_path_words(topo_);
  adv_.assign(num_nodes, std::vector<double>(gpus, 0.0));
  hops_.assign(num_nodes, std::vector<int>(gpus, -1));
  groups_.assign(num_nodes, std::vector<std::vector<NextHop>>(gpus));
  paths_.assign(static_cast<size_t>(num_nodes) * gpus * words_, 0);
  for (int g = 0; g < gpus; ++g) {
    const int n = gpu_node_[g];
    adv_[n][g] = kUnlimited;
    hops_[n][g] = 0;
    paths_[(static_cast<size_t>(n) * gpus + g) * words_ + n / 64] |= uint64_t{1} << (n % 64);
  }
  next_adv_ = adv_;
  next_hops_count_ = hops_;
  next_paths_ = paths_;
}

void FareRib::set_link_up(int link, bool up) {
  IFEC_CHECK(link >= 0 && link < static_cast<int>(link_up_.size()),
             "FareRib: link id " << link << " out of range [0, " << link_up_.size() << ")");
  link_up_[link] = up ? 1 : 0;
}

bool FareRib::link_up(int link) const {
  IFEC_CHECK(link >= 0 && link < static_cast<int>(link_up_.size()),
             "FareRib: link id " << link << " out of range [0, " << link_up_.size() << ")");
  return link_up_[link] != 0;
}

bool FareRib::step() {
  const int num_nodes = static_cast<int>(topo_.nodes.size());
  const int gpus = static_cast<int>(gpu_node_.size());
  const size_t words = static_cast<size_t>(words_);
  std::vector<std::vector<double>> bundle_bw(num_nodes);
  for (int x = 0; x < num_nodes; ++x) {
    for (const FareBundle& b : bundles_[x]) {
      double bw = 0;
      for (int l : b.links) bw += link_up_[l] ? topo_.links[l].rate_gbps : 0.0;
      bundle_bw[x].push_back(bw);
    }
  }

  bool changed = false;
  for (int x = 0; x < num_nodes; ++x) {
    const std::vector<FareBundle>& bundles = bundles_[x];
    for (int d = 0; d < gpus; ++d) {
      const auto [gbps, hops] = fare_decide(
          topo_, x, gpu_node_[d], bundles, bundle_bw[x], link_up_,
          [&](size_t i) {
            const int n = bundles[i].peer;
            return FareAdvert{adv_[n][d], hops_[n][d], &paths_[(static_cast<size_t>(n) * gpus + d) * words]};
          },
          &next_paths_[(static_cast<size_t>(x) * gpus + d) * words], &scratch_);
      next_adv_[x][d] = gbps;
      next_hops_count_[x][d] = hops;
      std::vector<NextHop>& group = groups_[x][d];
      if (!same_group(group, scratch_)) {
        group = scratch_;
        changed = true;
      }
    }
  }
  changed = changed || next_adv_ != adv_ || next_hops_count_ != hops_ || next_paths_ != paths_;
  std::swap(adv_, next_adv_);
  std::swap(hops_, next_hops_count_);
  std::swap(paths_, next_paths_);
  return changed;
}

int FareRib::converge() {
  // Loop detection bounds every advertised path to num_nodes - 1 hops and stale ones grow by a hop per round,
  // so this limit only trips on a bug.
  const int limit = 4 * static_cast<int>(topo_.nodes.size()) + 16;
  int rounds = 0;
  while (step()) {
    ++rounds;
    IFEC_CHECK(rounds <= limit, "FareRib: topology '" << topo_.name << "' did not converge in " << limit << " rounds");
  }
  return rounds;
}

double FareRib::advertised_gbps(int node, int dest_gpu) const {
  IFEC_CHECK(node >= 0 && node < static_cast<int>(adv_.size()),
             "FareRib: node " << node << " out of range [0, " << adv_.size() << ")");
  IFEC_CHECK(dest_gpu >= 0 && dest_gpu < static_cast<int>(gpu_node_.size()),
             "FareRib: GPU " << dest_gpu << " out of range [0, " << gpu_node_.size() << ")");
  return adv_[node][dest_gpu];
}

const std::vector<NextHop>& FareRib::next_hops(int node, int dest_gpu) const {
  IFEC_CHECK(node >= 0 && node < static_cast<int>(groups_.size()),
             "FareRib: node " << node << " out of range [0, " << groups_.size() << ")");
  IFEC_CHECK(dest_gpu >= 0 && dest_gpu < static_cast<int>(gpu_node_.size()),
             "FareRib: GPU " << dest_gpu << " out of range [0, " << gpu_node_.size() << ")");
  return groups_[node][dest_gpu];
}

std::vector<double> FareRib::plane_gbps(int src_gpu, int dest_gpu) const {
  IFEC_CHECK(src_gpu >= 0 && src_gpu < static_cast<int>(gpu_node_.size()),
             "FareRib: GPU " << src_gpu << " out of range [0, " << gpu_node_.size() << ")");
  std::vector<double> out(topo_.num_planes, 0.0);
  for (const NextHop& h : next_hops(gpu_node_[src_gpu], dest_gpu)) out[topo_.links[h.link].plane] += h.weight;
  return out;
}

}  // namespace ifec::routing
