// Batch reduction over rows (MoE combine in the fabric): one group per destination and plane, each row cut into
// one-slot chunks spread over planes, contributions sent by every contributor in one global order (row index,
// chunk, destination) so the slots a group reuses free up in that order; slot-busy RNR NAKs retried after a short
// back-off, losses after a timeout; whatever the fabric did not deliver is summed at the destination from
// point-to-point stores.
#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <unordered_map>

#include "ifec/common/checks.h"
#include "ifec/common/numeric.h"
#include "ifec/workloads/ifec_collectives.h"
#include "ifec_frames.h"

namespace ifec::workloads {

using common::Ech;
using common::EchFormat;
using common::EchOp;
using common::Opcode;
using common::TimeNs;

namespace {

constexpr uint16_t kScratchWindow = 0xFFE1;  // fallback: contributions of undelivered chunks, at the destination

// (destination, plane, per-plane sequence) of a chunk; GPUs are below 64 and planes below 32.
uint64_t chunk_key(int dest, int plane, uint32_t seq) { return (static_cast<uint64_t>(dest * 32 + plane) << 32) | seq; }

}  // namespace

struct IfecCollectives::Rows {
  BatchReduceSpec spec;
  uint64_t generation = 0;
  size_t esize = 4;
  uint32_t chunk_elems = 1;
  uint32_t cpr = 1;  // chunks per row
  uint64_t row_bytes = 0;
  std::vector<int> gpus;  // group members; index = contributor id
  std::map<int, int> member_of;
  std::map<int, uint16_t> group_of_dest;
  std::map<uint16_t, int> dest_of_group;
  std::map<int, int> switch_of_plane;
  std::map<uint32_t, int> plane_of_switch_ip;
  std::vector<std::pair<int, uint16_t>> reservations;  // (switch, group)
  enum State : uint8_t { kPending, kDone, kFailed };
  struct Chunk {
    int plane = -1;
    uint32_t seq = 0;
    State state = kPending;
  };
  std::vector<Chunk> chunk;                         // [row * cpr + c]
  std::unordered_map<uint64_t, uint32_t> chunk_of;  // (destination, plane, seq) -> chunk
  struct Item {
    uint32_t chunk = 0;
    int gpu = 0;
    uint64_t offset = 0;  // the contributor's row in source_window
    int tries = 0;
    int busy = 0;
    uint32_t epoch = 0;
    State state = kPending;
    bool sent = false;   // left the queue (counts in the window) at least once
    TimeNs sent_ns = 0;  // first transmission
  };
  std::vector<Item> item;
  std::unordered_map<uint64_t, uint32_t> item_of;  // (contributor, destination group, plane) ^ seq -> item
  // Per (contributor, plane): items not yet sent, in the batch's one global order, and how many are in flight.
  std::map<std::pair<int, int>, std::deque<uint32_t>> queue;
  std::map<std::pair<int, int>, uint32_t> inflight;
  detail::RttEstimator rtt;
  uint64_t items_pending = 0;
  uint64_t chunks_pending = 0;
  TimeNs rto_ns = 0;  // first retransmission timeout: at least four windows' drain time on the slowest plane

  uint32_t row_of(uint32_t k) const { return k / cpr; }
  uint32_t elems_of(uint32_t k) const {
    const uint32_t c = k % cpr;
    return std::min<uint32_t>(chunk_elems, spec.row_elements - c * chunk_elems);
  }
  uint64_t item_key(int gpu, uint16_t group, int plane, uint32_t seq) const {
    return (((static_cast<uint64_t>(gpu * 32 + plane) << 16) | group) << 32) | seq;
  }
};

CollectiveResult IfecCollectives::reduce_rows(const BatchReduceSpec& spec, TimeNs limit) {
  IFEC_CHECK(!op_ && !rows_, "an IFEC operation is already running on this cluster");
  common::EventLoop& loop = cluster_.loop();
  switchemu::Fabric& fabric = cluster_.fabric();
  const routing::Topology& topo = fabric.topology();
  const int n = cluster_.size();
  auto r = std::make_shared<Rows>();
  r->spec = spec;
  r->esize = element_size(spec.dtype);
  IFEC_CHECK(spec.row_elements > 0, "batch reduction: row_elements is 0");
  r->row_bytes = uint64_t{spec.row_elements} * r->esize;
  r->chunk_elems = static_cast<uint32_t>(std::max<size_t>(1, std::min<uint32_t>(topo.params.mtu, 4096) / r->esize));
  r->cpr = (spec.row_elements + r->chunk_elems - 1) / r->chunk_elems;
  // Validation: every GPU, window and row must exist and fit, with no row index used twice at a destination.
  std::set<int> gpus;
  std::set<std::pair<int, uint32_t>> used;
  for (const RowReduce& row : spec.rows) {
    IFEC_CHECK(row.destination >= 0 && row.destination < n,
               "batch reduction: destination GPU " << row.destination << " outside 0.." << n - 1);
    const endpoint::WindowInfo* w = cluster_.ep(row.destination).memory().window(spec.result_window);
    IFEC_CHECK(w != nullptr, "batch reduction: GPU " << row.destination << " has no window " << spec.result_window);
    IFEC_CHECK(spec.result_offset + (uint64_t{row.index} + 1) * r->row_bytes <= w->size,
               "batch reduction: row index " << row.index << " overruns window " << spec.result_window << " ("
                                             << w->size << " B) of GPU " << row.destination);
    IFEC_CHECK(used.insert({row.destination, row.index}).second,
               "batch reduction: row index " << row.index << " used twice for GPU " << row.destination);
    IFEC_CHECK(row.contributions.size() <= 255,
               "batch reduction: " << row.contributions.size() << " contributors to one row (at most 255)");
    gpus.insert(row.destination);
    for (const auto& [g, off] : row.contributions) {
      IFEC_CHECK(g >= 0 && g < n, "batch reduction: contributor GPU " << g << " outside 0.." << n - 1);
      IFEC_CHECK(g != row.destination, "batch reduction: GPU " << g << " contributes to its own row " << row.index
                                                               << " (add the local part locally)");
      const endpoint::WindowInfo* sw = cluster_.ep(g).memory().window(spec.source_window);
      IFEC_CHECK(sw != nullptr, "batch reduction: GPU " << g << " has no window " << spec.source_window);
      IFEC_CHECK(off + r->row_bytes <= sw->size, "batch reduction: contribution at offset "
                                                     << off << " overruns window " << spec.source_window << " ("
                                                     << sw->size << " B) of GPU " << g);
      gpus.insert(g);
    }
  }
  IFEC_CHECK(topo.num_planes <= 32, "batch reduction: " << topo.num_planes << " planes (at most 32)");
  IFEC_CHECK(gpus.size() <= 64 && (gpus.empty() || *gpus.rbegin() < 64),
             "batch reduction: " << gpus.size() << " GPUs take part (a group holds at most 64, GPU ids below 64)");
  r->gpus.assign(gpus.begin(), gpus.end());
  for (size_t m = 0; m < r->gpus.size(); ++m) {
    r->member_of[r->gpus[m]] = static_cast<int>(m);
  }
  CollectiveResult res;
  res.start_ns = loop.now();
  stats_.operations++;
  r->generation = stats_.operations;

  // Planes where every taking-part GPU hangs off the same IFEC switch (one-tier); each destination gets a group
  // there. Two-tier planes are not used by batches (rows finish point to point where no plane serves).
  std::vector<int> dests;
  for (const RowReduce& row : spec.rows) {
    dests.push_back(row.destination);
  }
  std::sort(dests.begin(), dests.end());
  dests.erase(std::unique(dests.begin(), dests.end()), dests.end());
  std::vector<std::pair<int, double>> planes;
  std::string reasons;
  for (int p = 0; p < topo.num_planes && !r->gpus.empty(); ++p) {
    const int sw = fabric.switch_of_plane(r->gpus[0], p);
    double w = -1;
    bool ok = sw >= 0 && fabric.switch_at(sw).ifec() != nullptr;
    for (int g : r->gpus) {
      double live = 0;
      for (const auto& gp : fabric.gpu_ports(g)) {
        live += gp.plane == p && gp.io->link_up() ? gp.io->rate_bps() / 1e9 : 0;
      }
      w = w < 0 ? live : std::min(w, live);
      ok = ok && fabric.switch_of_plane(g, p) == sw;
    }
    if (!ok || w <= 0) {
      reasons += (reasons.empty() ? "" : "; ") + std::string("plane ") + std::to_string(p) +
                 ": not one live IFEC switch for every GPU";
      continue;
    }
    // Slot budget: the switch's free pool shared by this batch's groups.
    const uint32_t slots = std::min<uint32_t>(
        opts_.slots_per_plane, fabric.switch_at(sw).ifec()->free_slots() / std::max<size_t>(1, dests.size()));
    std::vector<std::pair<int, uint16_t>> made;
    std::string why = slots == 0 ? "slot pool exhausted" : "";
    for (size_t di = 0; slots > 0 && di < dests.size(); ++di) {
      auto git = r->group_of_dest.find(dests[di]);
      const uint16_t group = git != r->group_of_dest.end() ? git->second : next_group_++;
      switchemu::GroupReservation gr;
      gr.job = opts_.job;
      gr.group = group;
      gr.op = EchOp::kReduce;
      gr.dtype = spec.dtype;
      gr.redop = common::EchRedOp::kSum;
      gr.window = spec.result_window;
      gr.slots = slots;
      for (int g : r->gpus) {
        const endpoint::WindowInfo* win = cluster_.ep(g).memory().window(spec.result_window);
        switchemu::GroupMember gm;
        gm.ip = fabric.gpu_ip(g);
        gm.destination = g == dests[di];
        gm.result_va = gm.destination ? win->va + spec.result_offset : 0;
        gm.rkey = gm.destination ? win->rkey : 0;
        gr.members.push_back(gm);
      }
      if (!fabric.switch_at(sw).ifec()->reserve(gr, &why)) {
        break;
      }
      made.push_back({sw, group});
      r->group_of_dest[dests[di]] = group;
      r->dest_of_group[group] = dests[di];
    }
    if (made.size() != dests.size()) {
      for (const auto& [s, g] : made) {
        fabric.switch_at(s).ifec()->release(opts_.job, g);
      }
      reasons += (reasons.empty() ? "" : "; ") + std::string("plane ") + std::to_string(p) + ": " + why;
      continue;
    }
    r->reservations.insert(r->reservations.end(), made.begin(), made.end());
    r->switch_of_plane[p] = sw;
    r->plane_of_switch_ip[fabric.switch_ip(sw)] = p;
    planes.push_back({p, w});
  }

  // Chunks over planes per destination in row-index order, each to the plane least loaded in bytes relative to its
  // bandwidth, so every contributor derives the same plane and per-plane sequence number for a chunk.
  const size_t rows = spec.rows.size();
  r->chunk.assign(rows * r->cpr, {});
  std::vector<uint32_t> order(rows);
  for (uint32_t i = 0; i < rows; ++i) {
    order[i] = i;
  }
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return spec.rows[a].index != spec.rows[b].index ? spec.rows[a].index < spec.rows[b].index
                                                    : spec.rows[a].destination < spec.rows[b].destination;
  });
  std::map<int, std::vector<double>> cur;
  std::map<std::pair<int, int>, uint32_t> next_seq;
  for (uint32_t ri : order) {
    const RowReduce& row = spec.rows[ri];
    auto& c = cur[row.destination];
    c.resize(planes.size(), 0);
    for (uint32_t ci = 0; ci < r->cpr; ++ci) {
      const uint32_t k = ri * r->cpr + ci;
      Rows::Chunk& ch = r->chunk[k];
      if (row.contributions.empty()) {
        ch.state = Rows::kDone;  // nothing to sum: the destination's zeros are the answer
        continue;
      }
      r->chunks_pending++;
      if (planes.empty()) {
        continue;  // plane -1: point to point after the in-fabric phase
      }
      const double bytes = static_cast<double>(r->elems_of(k) * r->esize);
      size_t best = 0;
      for (size_t q = 1; q < planes.size(); ++q) {
        if ((c[q] + bytes) / planes[q].second < (c[best] + bytes) / planes[best].second) {
          best = q;
        }
      }
      c[best] += bytes;
      ch.plane = planes[best].first;
      ch.seq = next_seq[{row.destination, ch.plane}]++;
      r->chunk_of[chunk_key(row.destination, ch.plane, ch.seq)] = k;
      for (const auto& [g, off] : row.contributions) {
        Rows::Item it;
        it.chunk = k;
        it.gpu = g;
        it.offset = off;
        const uint32_t id = static_cast<uint32_t>(r->item.size());
        r->item_of[r->item_key(g, r->group_of_dest[row.destination], ch.plane, ch.seq)] = id;
        r->queue[{g, ch.plane}].push_back(id);
        r->item.push_back(it);
      }
    }
  }
  r->items_pending = r->item.size();
  double slowest_gbps = 0;
  for (const auto& pw : planes) {
    slowest_gbps = slowest_gbps > 0 ? std::min(slowest_gbps, pw.second) : pw.second;
  }
  r->rto_ns = opts_.retransmit_ns;
  if (slowest_gbps > 0) {
    r->rto_ns = std::max<TimeNs>(
        r->rto_ns, static_cast<TimeNs>(4.0 * opts_.row_window * (r->chunk_elems * r->esize + 100) * 8 / slowest_gbps));
  }
  r->rtt = detail::RttEstimator(opts_.min_rto_ns);
  rows_ = r;
  detail::ScopeExit cleanup([this, r] {
    if (rows_ == r) {  // left by an exception (Interrupted): release what this batch reserved
      rows_.reset();
      for (const auto& [sw, g] : r->reservations) {
        cluster_.fabric().switch_at(sw).ifec()->release(opts_.job, g);
      }
    }
  });
  for (const auto& [key, q] : r->queue) {
    row_pump(key.first, key.second);
  }
  const TimeNs deadline = loop.now() + limit;
  TimeNs grace_end = 0;
  while (r->items_pending > 0 || (r->chunks_pending > 0 && !planes.empty())) {
    if (r->items_pending == 0 && grace_end == 0) {
      // Every contribution was accepted: results still on their way (the switch resends lost ones) get a little
      // while, then the rest is redone.
      grace_end = loop.now() + 4 * r->rtt.rto(r->rto_ns);
    }
    const TimeNs stop = grace_end ? std::min(deadline, grace_end) : deadline;
    if (loop.idle() || loop.next_event_time() > stop) {
      break;
    }
    loop.run(loop.next_event_time());
  }
  rows_.reset();
  for (const auto& [sw, g] : r->reservations) {
    fabric.switch_at(sw).ifec()->release(opts_.job, g);
  }
  if (r->items_pending > 0) {
    res.error =
        "batch reduction: " + std::to_string(r->items_pending) + " contributions unfinished after the time limit";
    res.end_ns = loop.now();
    return res;
  }

  // Undelivered chunks: their contributors store their pieces into the destination's scratch window, which sums
  // them (fp32 accumulation, one rounding, as the switch does).
  std::map<int, std::vector<uint32_t>> redo;  // destination -> chunks
  for (uint32_t k = 0; k < r->chunk.size(); ++k) {
    if (r->chunk[k].state != Rows::kDone) {
      redo[spec.rows[r->row_of(k)].destination].push_back(k);
    }
  }
  res.ok = true;
  if (!redo.empty()) {
    uint64_t pieces_max = 0;
    for (const auto& [d, ks] : redo) {
      uint64_t pieces = 0;
      for (uint32_t k : ks) {
        pieces += spec.rows[r->row_of(k)].contributions.size();
      }
      pieces_max = std::max(pieces_max, pieces);
    }
    const uint64_t chunk_bytes = uint64_t{r->chunk_elems} * r->esize;
    cluster_.allocate_window(kScratchWindow, pieces_max * chunk_bytes, opts_.job);
    std::vector<endpoint::OpHandle> hs;
    for (const auto& [d, ks] : redo) {
      uint64_t slot = 0;
      for (uint32_t k : ks) {
        const uint64_t rel = uint64_t{k % r->cpr} * chunk_bytes;
        for (const auto& [g, off] : spec.rows[r->row_of(k)].contributions) {
          hs.push_back(cluster_.ep(g).store(d, kScratchWindow, slot * chunk_bytes,
                                            cluster_.window_data(g, spec.source_window) + off + rel,
                                            r->elems_of(k) * r->esize));
          slot++;
        }
      }
    }
    if (const std::string err =
            cluster_.wait_ok(hs, deadline > loop.now() ? deadline - loop.now() : 1, "batch reduction fallback stores");
        !err.empty()) {
      res.ok = false;
      res.error = err;
    }
    std::vector<common::Acc> acc(r->chunk_elems);
    for (const auto& [d, ks] : redo) {
      const uint8_t* scratch = cluster_.window_data(d, kScratchWindow);
      uint64_t slot = 0;
      for (uint32_t k : ks) {
        const RowReduce& row = spec.rows[r->row_of(k)];
        const uint32_t elems = r->elems_of(k);
        for (size_t i = 0; i < row.contributions.size(); ++i, ++slot) {
          common::accumulate(spec.dtype, common::EchRedOp::kSum, acc.data(), scratch + slot * chunk_bytes, elems,
                             i == 0);
        }
        uint8_t* out = cluster_.window_data(d, spec.result_window) + spec.result_offset + row.index * r->row_bytes +
                       uint64_t{k % r->cpr} * chunk_bytes;
        common::finalize(spec.dtype, acc.data(), out, elems);
      }
    }
    cluster_.free_window(kScratchWindow);
    res.fell_back = true;
    for (const auto& [d, ks] : redo) {
      res.fallback_chunks += ks.size();
    }
    res.fallback_reason = planes.empty() ? (reasons.empty() ? "no plane" : reasons)
                                         : "chunks the fabric did not deliver (timeouts, lost results, anomalies, "
                                           "planes that lost a path)";
    res.faults.push_back(std::to_string(res.fallback_chunks) +
                         " chunks summed at their destination from point-to-point stores: " + res.fallback_reason);
    stats_.fallback_operations++;
    stats_.fallback_chunks += res.fallback_chunks;
  }
  res.end_ns = loop.now();
  return res;
}

// Sends this GPU's next contributions on `plane` in the batch's one global order (row index, destination, chunk),
// at most row_window in flight. The order is what keeps the groups' in-order slots free of deadlock: the globally
// oldest pending chunk has every contribution on its way, and its slot's previous chunk is done.
void IfecCollectives::row_pump(int gpu, int plane) {
  Rows& r = *rows_;
  detail::drain_window(r.queue[{gpu, plane}], r.inflight[{gpu, plane}], opts_.row_window, [this](uint32_t id) {
    Rows::Item& it = rows_->item[id];
    if (it.state != Rows::kPending) {
      return false;  // given up while queued
    }
    it.sent = true;
    it.sent_ns = cluster_.loop().now();
    send_row_contribution(id, false);
    return true;
  });
}

// `pump`: send what the freed window allows (false when called from inside the pump itself).
void IfecCollectives::finish_row_item(uint32_t id, bool stuck, bool pump) {
  Rows& r = *rows_;
  Rows::Item& it = r.item[id];
  if (it.state != Rows::kPending) {
    return;
  }
  it.state = stuck ? Rows::kFailed : Rows::kDone;
  it.epoch++;
  r.items_pending--;
  const int plane = r.chunk[it.chunk].plane;
  if (it.sent) {
    r.inflight[{it.gpu, plane}]--;  // (one still queued is skipped when the pump reaches it)
  }
  if (!stuck && it.tries == 0 && it.busy == 0) {
    r.rtt.sample(cluster_.loop().now() - it.sent_ns);
  }
  if (pump) {
    row_pump(it.gpu, plane);
  }
}

// FARE lost a path on a plane: a contributor gives up its items there at once (the destination redoes them point to
// point), and a destination stops waiting for results there.
void IfecCollectives::rows_routes_changed(int gpu) {
  Rows& r = *rows_;
  auto lost = [&](int from, int to, int plane) {
    return port_for(from, plane, 0) < 0 || cluster_.ep(from).plane_weight(to, plane) <= 0;
  };
  for (uint32_t id = 0; id < r.item.size(); ++id) {
    const Rows::Item& it = r.item[id];
    const int plane = r.chunk[it.chunk].plane;
    if (it.gpu == gpu && it.state == Rows::kPending && lost(gpu, r.spec.rows[r.row_of(it.chunk)].destination, plane)) {
      finish_row_item(id, true, true);
    }
  }
  for (uint32_t k = 0; k < r.chunk.size(); ++k) {
    Rows::Chunk& ch = r.chunk[k];
    const RowReduce& row = r.spec.rows[r.row_of(k)];
    if (ch.state != Rows::kPending || ch.plane < 0 || row.destination != gpu) {
      continue;
    }
    for (const auto& [g, off] : row.contributions) {
      if (lost(gpu, g, ch.plane)) {
        ch.state = Rows::kFailed;
        r.chunks_pending--;
        break;
      }
    }
  }
}

void IfecCollectives::arm_row(uint32_t id, TimeNs delay, bool counts_as_try) {
  Rows& r = *rows_;
  const uint32_t epoch = ++r.item[id].epoch;
  const uint64_t gen = r.generation;
  std::weak_ptr<bool> alive = alive_;
  cluster_.loop().schedule(cluster_.loop().now() + delay, [this, alive, gen, id, epoch, counts_as_try] {
    if (auto a = alive.lock(); !a || !*a || !rows_ || rows_->generation != gen) {
      return;
    }
    Rows::Item& it = rows_->item[id];
    if (it.state != Rows::kPending || it.epoch != epoch) {
      return;
    }
    if (counts_as_try && ++it.tries > opts_.max_retries) {
      finish_row_item(id, true, true);  // the destination's chunk is finished point to point
      return;
    }
    send_row_contribution(id, true);
  });
}

void IfecCollectives::send_row_contribution(uint32_t id, bool retransmit) {
  Rows& r = *rows_;
  Rows::Item& it = r.item[id];
  const Rows::Chunk& ch = r.chunk[it.chunk];
  const RowReduce& row = r.spec.rows[r.row_of(it.chunk)];
  const int port = port_for(it.gpu, ch.plane, ch.seq + static_cast<uint32_t>(row.destination));
  if (port < 0) {
    finish_row_item(id, true, false);  // its link to that plane is down: the chunk is redone point to point
    return;
  }
  arm_row(id, backoff(r.rtt.rto(r.rto_ns), it.tries), true);
  if (suppressed_.count(it.gpu)) {
    return;  // fault injection: this contributor never arrives
  }
  endpoint::Endpoint& e = cluster_.ep(it.gpu);
  const uint32_t elems = r.elems_of(it.chunk);
  const uint64_t rel = uint64_t{it.chunk % r.cpr} * r.chunk_elems * r.esize;
  common::FrameHeaders h = detail::ech_headers(
      e, port, cluster_.fabric().switch_ip(r.switch_of_plane[ch.plane]), static_cast<uint16_t>(it.gpu * 977 + ch.seq),
      static_cast<uint8_t>(Opcode::kWriteOnly), detail::pkey_for(opts_.job), ch.seq);
  Ech ech;
  ech.format = EchFormat::kStandard;
  ech.op = EchOp::kReduce;
  ech.flags = retransmit ? common::ech_flags::kRetransmission : 0;
  ech.job_id = opts_.job;
  ech.group_id = r.group_of_dest[row.destination];
  ech.contributor_id = static_cast<uint16_t>(r.member_of[it.gpu]);
  ech.chunk_index = ch.seq;
  ech.dtype = r.spec.dtype;
  ech.redop = common::EchRedOp::kSum;
  ech.element_count = static_cast<uint16_t>(elems);
  ech.window_id = r.spec.result_window;
  ech.expected = static_cast<uint8_t>(row.contributions.size());
  h.ech = ech;
  h.reth = common::Reth{uint64_t{row.index} * r.row_bytes + rel, 0, static_cast<uint32_t>(elems * r.esize)};
  const uint8_t* src = cluster_.window_data(it.gpu, r.spec.source_window) + it.offset + rel;
  e.send_frame(port, common::encode_frame(h, src, elems * r.esize));
  stats_.contributions_sent++;
  stats_.retransmissions += retransmit;
}

void IfecCollectives::on_row_ech(int gpu, int port, const common::ParsedFrame& pf, const uint8_t* frame) {
  Rows& r = *rows_;
  const Ech& ech = *pf.h.ech;
  auto pit = r.plane_of_switch_ip.find(pf.h.ip.src);
  auto dit = r.dest_of_group.find(ech.group_id);
  if (ech.format != EchFormat::kStandard || ech.job_id != opts_.job || pit == r.plane_of_switch_ip.end() ||
      dit == r.dest_of_group.end()) {
    return;
  }
  const int plane = pit->second;
  const int dest = dit->second;
  const bool write = pf.h.bth.opcode == static_cast<uint8_t>(Opcode::kWriteOnly);
  if (gpu != dest) {
    // A contributor: acknowledgement, RNR NAK (slot busy), or an anomaly notice (the slot timed out).
    auto iit = r.item_of.find(r.item_key(gpu, ech.group_id, plane, ech.chunk_index));
    if (iit == r.item_of.end()) {
      return;
    }
    const uint32_t id = iit->second;
    if (write) {
      send_ech_ack(gpu, port, pf, 0);
      if (ech.flags & common::ech_flags::kAnomaly) {
        stats_.anomalies++;
        finish_row_item(id, true, true);
      }
      return;
    }
    Rows::Item& it = r.item[id];
    if (pf.h.aeth && pf.h.aeth->kind() == common::AethKind::kRnrNak) {
      if (it.state == Rows::kPending) {
        stats_.busy_naks++;
        arm_row(id, opts_.busy_retry_ns << std::min(it.busy++, 3), false);
      }
      return;
    }
    finish_row_item(id, false, true);
    return;
  }
  if (!write) {
    return;
  }
  auto cit = r.chunk_of.find(chunk_key(gpu, plane, ech.chunk_index));
  if (cit == r.chunk_of.end()) {
    return;
  }
  Rows::Chunk& ch = r.chunk[cit->second];
  if (ch.state != Rows::kPending) {
    stats_.duplicate_results++;  // already landed (or given up): acknowledge again, write nothing
    send_ech_ack(gpu, port, pf, 0);
    return;
  }
  if ((ech.flags & common::ech_flags::kAnomaly) && pf.payload_size == 0) {
    ch.state = Rows::kFailed;  // the slot timed out: redone point to point
    stats_.anomalies++;
  } else {
    const common::Reth& reth = *pf.h.reth;
    endpoint::SymmetricMemory& mem = cluster_.ep(gpu).memory();
    if (pf.payload_size != r.elems_of(cit->second) * r.esize ||
        mem.check(reth.rkey, reth.virtual_address, pf.payload_size, pf.h.bth.pkey & 0x7FFF, false) !=
            endpoint::AccessError::kOk) {
      stats_.protection_drops++;
      return;  // not acknowledged: a wrong result never lands
    }
    std::memcpy(mem.translate(reth.rkey, reth.virtual_address), frame + pf.payload_offset, pf.payload_size);
    ch.state = Rows::kDone;
    stats_.results_received++;
  }
  r.chunks_pending--;
  send_ech_ack(gpu, port, pf, 0);
}

}  // namespace ifec::workloads
