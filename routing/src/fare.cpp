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
  return fare_bundles(topo, node, topo.links_of(node));
}

std::vector<FareBundle> fare_bundles(const Topology& topo, int node, const std::vector<int>& links) {
  std::vector<FareBundle> out;
  std::map<int, size_t> of_peer;
  for (int l : links) {
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

FarePathBits fare_path_bits(const Topology& topo, int node) {
  return {static_cast<size_t>(fare_path_words(topo)), node};
}

std::pair<double, int> fare_decide(const Topology& topo, int x, int dest, const std::vector<FareBundle>& bundles,
                                   const std::vector<double>& bundle_gbps, const std::vector<char>& link_up,
                                   const std::function<FareAdvert(size_t bundle)>& advert, FarePathBits bits,
                                   uint64_t* out, std::vector<NextHop>* group) {
  const size_t words = bits.words;
  const bool in_space = bits.self >= 0;
  const uint64_t self_bit = in_space ? uint64_t{1} << (bits.self % 64) : 0;
  const size_t self_word = in_space ? static_cast<size_t>(bits.self / 64) : 0;
  std::fill(out, out + words, 0);
  group->clear();
  if (x == dest) {
    if (in_space) out[self_word] |= self_bit;
    return {kUnlimited, 0};
  }
  thread_local std::vector<FareAdvert> adv;
  adv.resize(bundles.size());
  // A usable neighbor: bundle up, not a transit GPU, reaches d, and its paths do not already go through x.
  auto usable = [&](size_t i) {
    const int n = bundles[i].peer;
    if (bundle_gbps[i] <= 0) return false;
    if (topo.nodes[n].kind == NodeKind::kGpu && n != dest) return false;
    if (adv[i].hops < 0) return false;
    return adv[i].path == nullptr || !in_space || (adv[i].path[self_word] & self_bit) == 0;
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
    if (in_space) out[self_word] |= self_bit;
    return {total, best + 1};
  }
  std::fill(out, out + words, 0);
  return {0.0, -1};
}

// ------------------------------------------------------------------------------------------------ FareRib --

namespace {

// Live bandwidth of each of `node`'s bundles.
std::vector<double> bundle_gbps(const Topology& topo, const std::vector<FareBundle>& bundles,
                                const std::vector<char>& link_up) {
  std::vector<double> out;
  for (const FareBundle& b : bundles) {
    double bw = 0;
    for (int l : b.links) bw += link_up[l] ? topo.links[l].rate_gbps : 0.0;
    out.push_back(bw);
  }
  return out;
}

template <typename T>
void put(std::vector<char>& out, T v) {
  const char* p = reinterpret_cast<const char*>(&v);
  out.insert(out.end(), p, p + sizeof v);
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
  switch_index_.assign(num_nodes, -1);
  std::vector<std::vector<int>> adj = adjacency(topo_);
  for (int x = 0; x < num_nodes; ++x) {
    // NVLink-class links stay out of FARE: the fabric routes to a GPU's node peer on the plane (relay_table).
    std::vector<int>& links = adj[x];
    links.erase(std::remove_if(links.begin(), links.end(), [&](int l) { return topo_.links[l].plane == kNvlinkPlane; }),
                links.end());
    bundles_[x] = fare_bundles(topo_, x, links);
    if (topo_.nodes[x].kind == NodeKind::kSwitch) {
      switch_index_[x] = static_cast<int>(switches_.size());
      switches_.push_back(x);
    }
  }
  words_ = (switches_.size() + 63) / 64;
  scratch_path_.assign(words_, 0);
  build_classes();
}

std::vector<char> FareRib::signature(int gpu) const {
  std::vector<const FareBundle*> bundles;
  for (const FareBundle& b : bundles_[gpu_node_[gpu]]) bundles.push_back(&b);
  std::sort(bundles.begin(), bundles.end(), [](const FareBundle* a, const FareBundle* b) { return a->peer < b->peer; });
  std::vector<char> sig;
  for (const FareBundle* b : bundles) {
    put<int32_t>(sig, b->peer);
    put<uint32_t>(sig, static_cast<uint32_t>(b->links.size()));
    for (int l : b->links) {
      put<double>(sig, topo_.links[l].rate_gbps);
      sig.push_back(link_up_[l]);
    }
  }
  return sig;
}

// Initial state: only each GPU knows (and advertises) itself; every switch learns the classes round by round.
void FareRib::build_classes() {
  std::map<std::vector<char>, int> by_signature;
  class_of_.assign(gpu_node_.size(), -1);
  for (int g = 0; g < static_cast<int>(gpu_node_.size()); ++g) {
    std::vector<char> sig = signature(g);
    auto [it, fresh] = by_signature.emplace(sig, static_cast<int>(classes_.size()));
    if (fresh) {
      classes_.push_back(Class{{}, g, std::move(sig)});
    }
    classes_[it->second].members.push_back(g);
    class_of_[g] = it->second;
  }
  const size_t rows = classes_.size() * switches_.size();
  adv_.assign(rows, 0.0);
  hops_.assign(rows, -1);
  paths_.assign(rows * words_, 0);
  groups_.assign(rows, {});
  gpu_rows_.assign(classes_.size(),
                   std::vector<GpuRow>(classes_.size(), GpuRow{0, -1, {}, std::vector<uint64_t>(words_, 0)}));
  next_adv_ = adv_;
  next_hops_ = hops_;
  next_paths_ = paths_;
}

void FareRib::set_link_up(int link, bool up) {
  IFEC_CHECK(link >= 0 && link < static_cast<int>(link_up_.size()),
             "FareRib: link id " << link << " out of range [0, " << link_up_.size() << ")");
  link_up_[link] = up ? 1 : 0;
  for (int end : {topo_.links[link].a, topo_.links[link].b}) {
    const int g = topo_.nodes[end].gpu_index;
    if (g >= 0 && signature(g) != classes_[class_of_[g]].signature) {
      split_off(g);
    }
  }
}

bool FareRib::link_up(int link) const {
  IFEC_CHECK(link >= 0 && link < static_cast<int>(link_up_.size()),
             "FareRib: link id " << link << " out of range [0, " << link_up_.size() << ")");
  return link_up_[link] != 0;
}

void FareRib::split_off(int gpu) {
  const int from = class_of_[gpu];
  const int to = static_cast<int>(classes_.size());
  const int old_rep = classes_[from].rep;
  // The new class starts where the old one stood (every switch's row, the GPU rows from and toward it), named in
  // the old representative's links until renamed.
  classes_.push_back(Class{{gpu}, old_rep, signature(gpu)});
  class_of_[gpu] = to;
  const size_t first = row(0, from);
  const size_t count = switches_.size();
  for (size_t i = 0; i < count; ++i) {
    adv_.push_back(adv_[first + i]);
    hops_.push_back(hops_[first + i]);
    groups_.push_back(groups_[first + i]);
  }
  const std::vector<uint64_t> copied(paths_.begin() + static_cast<long>(first * words_),
                                     paths_.begin() + static_cast<long>((first + count) * words_));
  paths_.insert(paths_.end(), copied.begin(), copied.end());
  for (std::vector<GpuRow>& src : gpu_rows_) {
    src.push_back(src[from]);
  }
  gpu_rows_.push_back(gpu_rows_[from]);
  next_adv_.resize(adv_.size());
  next_hops_.resize(hops_.size());
  next_paths_.resize(paths_.size());
  rename_rep(to, gpu);
  std::vector<int>& members = classes_[from].members;
  members.erase(std::find(members.begin(), members.end(), gpu));
  if (members.empty()) {
    classes_[from].rep = -1;  // no member left: its rows are no longer computed
  } else if (old_rep == gpu) {
    rename_rep(from, members.front());
  }
}

void FareRib::rename_rep(int cls, int to_gpu) {
  const int from_gpu = classes_[cls].rep;
  if (from_gpu == to_gpu) {
    return;
  }
  const int from_node = gpu_node_[from_gpu];
  const int to_node = gpu_node_[to_gpu];
  for (const FareBundle& b : bundles_[from_node]) {  // the switches it hangs from name it in their direct groups
    const int s = switch_index_[b.peer];
    if (s >= 0) {
      groups_[row(s, cls)] = peer_renamed(groups_[row(s, cls)], b.peer, from_node, to_node);
    }
  }
  for (GpuRow& r : gpu_rows_[cls]) {  // its own routes
    r.group = owner_renamed(r.group, from_node, to_node);
  }
  classes_[cls].rep = to_gpu;
}

namespace {

// The bundle of `bundles` toward `peer`, or null.
const FareBundle* bundle_to(const std::vector<FareBundle>& bundles, int peer) {
  for (const FareBundle& b : bundles) {
    if (b.peer == peer) return &b;
  }
  return nullptr;
}

// Where link `link` sits in `bundles`: (bundle, position), or (null, 0).
std::pair<const FareBundle*, size_t> position_of(const std::vector<FareBundle>& bundles, int link) {
  for (const FareBundle& b : bundles) {
    for (size_t k = 0; k < b.links.size(); ++k) {
      if (b.links[k] == link) return {&b, k};
    }
  }
  return {nullptr, 0};
}

}  // namespace

std::vector<NextHop> FareRib::owner_renamed(const std::vector<NextHop>& group, int owner, int to) const {
  std::vector<NextHop> out;
  for (const NextHop& h : group) {
    const auto [b, k] = position_of(bundles_[owner], h.link);
    const FareBundle* mine = b != nullptr ? bundle_to(bundles_[to], b->peer) : nullptr;
    IFEC_CHECK(mine != nullptr && k < mine->links.size(),
               "FareRib: GPU nodes " << owner << " and " << to << " are not attached alike");
    out.push_back(NextHop{mine->links[k], mine->ports[k], h.weight});
  }
  std::sort(out.begin(), out.end(), [](const NextHop& a, const NextHop& b) { return a.link < b.link; });
  return out;
}

std::vector<NextHop> FareRib::peer_renamed(const std::vector<NextHop>& group, int node, int peer, int to) const {
  const FareBundle* from_bundle = bundle_to(bundles_[node], peer);
  const FareBundle* to_bundle = bundle_to(bundles_[node], to);
  std::vector<NextHop> out;
  for (const NextHop& h : group) {
    const auto [b, k] = position_of(bundles_[node], h.link);
    IFEC_CHECK(b == from_bundle && to_bundle != nullptr && k < to_bundle->links.size(),
               "FareRib: node " << node << " reaches GPU nodes " << peer << " and " << to << " differently");
    out.push_back(NextHop{to_bundle->links[k], to_bundle->ports[k], h.weight});
  }
  std::sort(out.begin(), out.end(), [](const NextHop& a, const NextHop& b) { return a.link < b.link; });
  return out;
}

FareAdvert FareRib::advert_from(int peer_node, int dest_node, int cls) const {
  const int s = switch_index_[peer_node];
  if (s >= 0) {
    const size_t r = row(s, cls);
    return FareAdvert{adv_[r], hops_[r], &paths_[r * words_]};
  }
  if (peer_node == dest_node) {
    return FareAdvert{kUnlimited, 0, nullptr};  // the destination GPU itself
  }
  return FareAdvert{};  // another GPU: never a transit
}

int FareRib::dest_node_for(int src_cls, int dst_cls) const {
  const std::vector<int>& m = classes_[dst_cls].members;
  if (src_cls != dst_cls) {
    return gpu_node_[classes_[dst_cls].rep];
  }
  return m.size() > 1 ? gpu_node_[m[1]] : -1;  // toward the class's other members
}

// A GPU's rows read its switches' rows as the previous round left them: run before step_switch_rows.
bool FareRib::step_gpu_rows() {
  bool changed = false;
  for (size_t a = 0; a < classes_.size(); ++a) {
    if (classes_[a].rep < 0) continue;
    const int x = gpu_node_[classes_[a].rep];
    const std::vector<FareBundle>& bundles = bundles_[x];
    const std::vector<double> bw = bundle_gbps(topo_, bundles, link_up_);
    for (size_t b = 0; b < classes_.size(); ++b) {
      if (classes_[b].rep < 0) continue;
      const int dest = dest_node_for(static_cast<int>(a), static_cast<int>(b));
      if (dest < 0) continue;
      const auto [gbps, hops] = fare_decide(
          topo_, x, dest, bundles, bw, link_up_,
          [&](size_t i) { return advert_from(bundles[i].peer, dest, static_cast<int>(b)); }, FarePathBits{words_, -1},
          scratch_path_.data(), &scratch_);
      GpuRow& r = gpu_rows_[a][b];
      if (gbps != r.adv || hops != r.hops || !same_group(r.group, scratch_) || r.path != scratch_path_) {
        r.adv = gbps;
        r.hops = hops;
        r.group = scratch_;
        r.path = scratch_path_;
        changed = true;
      }
    }
  }
  return changed;
}

bool FareRib::step_switch_rows() {
  std::vector<std::vector<double>> bw(switches_.size());
  for (size_t s = 0; s < switches_.size(); ++s) bw[s] = bundle_gbps(topo_, bundles_[switches_[s]], link_up_);
  bool changed = false;
  for (size_t c = 0; c < classes_.size(); ++c) {
    if (classes_[c].rep < 0) {  // no member left: its rows stand still
      const size_t first = row(0, static_cast<int>(c));
      std::copy_n(adv_.begin() + first, switches_.size(), next_adv_.begin() + first);
      std::copy_n(hops_.begin() + first, switches_.size(), next_hops_.begin() + first);
      std::copy_n(paths_.begin() + first * words_, switches_.size() * words_, next_paths_.begin() + first * words_);
      continue;
    }
    const int dest = gpu_node_[classes_[c].rep];
    for (size_t s = 0; s < switches_.size(); ++s) {
      const int x = switches_[s];
      const std::vector<FareBundle>& bundles = bundles_[x];
      const size_t r = row(static_cast<int>(s), static_cast<int>(c));
      const auto [gbps, hops] = fare_decide(
          topo_, x, dest, bundles, bw[s], link_up_,
          [&](size_t i) { return advert_from(bundles[i].peer, dest, static_cast<int>(c)); },
          FarePathBits{words_, static_cast<int>(s)}, &next_paths_[r * words_], &scratch_);
      next_adv_[r] = gbps;
      next_hops_[r] = hops;
      if (!same_group(groups_[r], scratch_)) {
        groups_[r] = scratch_;
        changed = true;
      }
    }
  }
  changed = changed || next_adv_ != adv_ || next_hops_ != hops_ || next_paths_ != paths_;
  std::swap(adv_, next_adv_);
  std::swap(hops_, next_hops_);
  std::swap(paths_, next_paths_);
  return changed;
}

bool FareRib::step() {
  const bool gpus = step_gpu_rows();
  const bool switches = step_switch_rows();
  return gpus || switches;
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

void FareRib::check_node(int node) const {
  IFEC_CHECK(node >= 0 && node < static_cast<int>(topo_.nodes.size()),
             "FareRib: node " << node << " out of range [0, " << topo_.nodes.size() << ")");
}

void FareRib::check_gpu(int gpu) const {
  IFEC_CHECK(gpu >= 0 && gpu < static_cast<int>(gpu_node_.size()),
             "FareRib: GPU " << gpu << " out of range [0, " << gpu_node_.size() << ")");
}

double FareRib::advertised_gbps(int node, int dest_gpu) const {
  check_node(node);
  check_gpu(dest_gpu);
  if (node == gpu_node_[dest_gpu]) {
    return kUnlimited;
  }
  const int c = class_of_[dest_gpu];
  const int s = switch_index_[node];
  if (s >= 0) {
    return adv_[row(s, c)];
  }
  return gpu_rows_[class_of_[topo_.nodes[node].gpu_index]][c].adv;
}

std::vector<NextHop> FareRib::next_hops(int node, int dest_gpu) const {
  check_node(node);
  check_gpu(dest_gpu);
  const int dest = gpu_node_[dest_gpu];
  if (node == dest) {
    return {};
  }
  const int c = class_of_[dest_gpu];
  const int rep = gpu_node_[classes_[c].rep];
  const int s = switch_index_[node];
  if (s >= 0) {
    const std::vector<NextHop>& g = groups_[row(s, c)];
    return attached(node, c) && rep != dest ? peer_renamed(g, node, rep, dest) : g;
  }
  const int a = class_of_[topo_.nodes[node].gpu_index];
  const std::vector<NextHop>& g = gpu_rows_[a][c].group;
  const int own_rep = gpu_node_[classes_[a].rep];
  return own_rep != node ? owner_renamed(g, own_rep, node) : g;
}

std::vector<double> FareRib::plane_gbps(int src_gpu, int dest_gpu) const {
  check_gpu(src_gpu);
  std::vector<double> out(topo_.num_planes, 0.0);
  for (const NextHop& h : next_hops(gpu_node_[src_gpu], dest_gpu)) out[topo_.links[h.link].plane] += h.weight;
  return out;
}

bool FareRib::attached(int node, int cls) const {
  const int rep = classes_.at(cls).rep;
  return rep >= 0 && bundle_to(bundles_[gpu_node_[rep]], node) != nullptr;
}

const std::vector<NextHop>& FareRib::class_hops(int node, int cls) const {
  check_node(node);
  const int s = switch_index_[node];
  IFEC_CHECK(s >= 0 && cls >= 0 && cls < num_classes(), "FareRib: class_hops of node " << node << ", class " << cls);
  return groups_[row(s, cls)];
}

size_t FareRib::memory_bytes() const {
  size_t bytes = adv_.size() * 2 * (sizeof(double) + sizeof(int)) + paths_.size() * 2 * sizeof(uint64_t);
  for (const std::vector<NextHop>& g : groups_) bytes += sizeof g + g.capacity() * sizeof(NextHop);
  for (const std::vector<GpuRow>& src : gpu_rows_) {
    for (const GpuRow& r : src) {
      bytes += sizeof r + r.group.capacity() * sizeof(NextHop) + r.path.capacity() * sizeof(uint64_t);
    }
  }
  return bytes;
}

}  // namespace ifec::routing
