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

FareRib::FareRib(const Topology& topo) : topo_(topo) {
  validate(topo_);
  const int num_nodes = static_cast<int>(topo_.nodes.size());
  const int gpus = topo_.num_gpus();
  link_up_.assign(topo_.links.size(), 1);
  gpu_node_.resize(gpus);
  for (int g = 0; g < gpus; ++g) gpu_node_[g] = topo_.gpu_node(g);

  bundles_.resize(num_nodes);
  std::vector<std::map<int, int>> bundle_of(num_nodes);  // peer -> index into bundles_[node]
  for (const Link& l : topo_.links) {                    // link id order, so each bundle's links come out sorted
    for (auto [self, port, peer] : {std::tuple{l.a, l.a_port, l.b}, std::tuple{l.b, l.b_port, l.a}}) {
      auto [it, fresh] = bundle_of[self].emplace(peer, static_cast<int>(bundles_[self].size()));
      if (fresh) bundles_[self].push_back(Bundle{peer, {}, {}});
      bundles_[self][it->second].links.push_back(l.id);
      bundles_[self][it->second].ports.push_back(port);
    }
  }

  // Initial state: only each GPU knows (and advertises) itself; everything else is learned round by round.
  words_ = (num_nodes + 63) / 64;
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
    for (const Bundle& b : bundles_[x]) {
      double bw = 0;
      for (int l : b.links) bw += link_up_[l] ? topo_.links[l].rate_gbps : 0.0;
      bundle_bw[x].push_back(bw);
    }
  }

  bool changed = false;
  for (int x = 0; x < num_nodes; ++x) {
    const uint64_t self_bit = uint64_t{1} << (x % 64);
    const size_t self_word = static_cast<size_t>(x / 64);
    const std::vector<Bundle>& bundles = bundles_[x];
    for (int d = 0; d < gpus; ++d) {
      const int dest = gpu_node_[d];
      uint64_t* out = &next_paths_[(static_cast<size_t>(x) * gpus + d) * words];
      std::fill(out, out + words, 0);
      if (x == dest) {
        next_hops_count_[x][d] = 0;
        next_adv_[x][d] = kUnlimited;
        out[self_word] |= self_bit;
        continue;
      }
      // A usable neighbor: bundle up, not a transit GPU, reaches d, and its paths do not already go through x.
      auto usable = [&](size_t i) {
        const int n = bundles[i].peer;
        if (bundle_bw[x][i] <= 0) return false;
        if (topo_.nodes[n].kind == NodeKind::kGpu && n != dest) return false;
        if (hops_[n][d] < 0) return false;
        return (paths_[(static_cast<size_t>(n) * gpus + d) * words + self_word] & self_bit) == 0;
      };
      int best = INT_MAX;
      for (size_t i = 0; i < bundles.size(); ++i) {
        if (usable(i)) best = std::min(best, hops_[bundles[i].peer][d]);
      }
      scratch_.clear();
      double total = 0;
      if (best != INT_MAX) {
        for (size_t i = 0; i < bundles.size(); ++i) {
          const int n = bundles[i].peer;
          if (!usable(i) || hops_[n][d] != best) continue;
          const double bw = bundle_bw[x][i];
          const double pb = std::min(bw, adv_[n][d]);
          if (!(pb > 0)) continue;
          total += pb;
          const uint64_t* in = &paths_[(static_cast<size_t>(n) * gpus + d) * words];
          for (size_t w = 0; w < words; ++w) out[w] |= in[w];
          for (size_t k = 0; k < bundles[i].links.size(); ++k) {
            const int l = bundles[i].links[k];
            if (link_up_[l]) scratch_.push_back(NextHop{l, bundles[i].ports[k], pb * topo_.links[l].rate_gbps / bw});
          }
        }
      }
      if (total > 0) {
        out[self_word] |= self_bit;
        next_hops_count_[x][d] = best + 1;
        next_adv_[x][d] = total;
      } else {
        next_hops_count_[x][d] = -1;
        next_adv_[x][d] = 0;
      }
      std::sort(scratch_.begin(), scratch_.end(), [](const NextHop& a, const NextHop& b) { return a.link < b.link; });
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
