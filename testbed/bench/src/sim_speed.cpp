// The simulator's speed on named scenarios: raw all-to-all through run_sim, AllReduce through run_collective_point.
#include "ifec/testbed/sim_speed.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <numeric>

#include "ifec/common/checks.h"
#include "ifec/common/frame.h"
#include "ifec/common/numeric.h"
#include "ifec/common/protocol.h"
#include "ifec/testbed/collective_run.h"
#include "ifec/testbed/traffic_run.h"

namespace ifec::testbed {

double SpeedRow::best() const { return seconds.empty() ? 0 : *std::min_element(seconds.begin(), seconds.end()); }

double SpeedRow::median() const {
  if (seconds.empty()) {
    return 0;
  }
  std::vector<double> s = seconds;
  std::sort(s.begin(), s.end());
  return s.size() % 2 ? s[s.size() / 2] : (s[s.size() / 2 - 1] + s[s.size() / 2]) / 2;
}

double wire_bytes_in_flight(const routing::Topology& topo) {
  double bytes = 0;
  for (const routing::Link& l : topo.links) {
    bytes += 2 * l.rate_gbps * 1e9 / 8 * static_cast<double>(l.delay_ns) * 1e-9;  // both directions
  }
  return bytes;
}

std::vector<SpeedScenario> speed_scenarios(const std::string& topo_dir, bool quick, int runs) {
  const std::string big = topo_dir + "/superpod-64x4.yaml";
  const std::string small = topo_dir + "/superpod-8x2.yaml";
  const uint64_t mib = 1 << 20;
  return {{big, false, workloads::Algo::kRing, quick ? mib / 4 : mib, runs},
          {small, false, workloads::Algo::kRing, (quick ? 16 : 64) * mib, runs},
          {big, true, workloads::Algo::kRing, (quick ? 16 : 64) * mib, std::min(runs, 2)},
          {big, true, workloads::Algo::kIfec, (quick ? 16 : 64) * mib, std::min(runs, 2)}};
}

SpeedRow measure_speed(const routing::Topology& topo, const SpeedScenario& s) {
  IFEC_CHECK(s.runs >= 1, "runs " << s.runs << " must be >= 1");
  SpeedRow row;
  row.scenario = s;
  row.topology = topo.name;
  row.gpus = topo.num_gpus();
  row.wire_bytes = wire_bytes_in_flight(topo);
  for (int i = 0; i < s.runs; ++i) {
    uint64_t hops = 0;
    if (s.allreduce) {
      CollectivePoint p;
      p.algo = s.algo;
      p.bytes = s.bytes;
      const CollectiveRow r = run_collective_point(topo, p);
      IFEC_CHECK(r.ok, "AllReduce " << workloads::algo_name(s.algo) << " of " << s.bytes << " B: " << r.error);
      hops = r.frame_hops;
      row.events = r.sim_events;
      row.seconds.push_back(r.sim_seconds);
      row.point_seconds = r.wall_seconds;
    } else {
      SimOptions o;
      o.bytes = s.bytes;
      o.progress = false;
      const SimRun r = run_sim(topo, o);
      IFEC_CHECK(r.traffic.complete, "all-to-all of " << s.bytes << " B per pair did not deliver every byte");
      hops = r.frame_hops;
      row.events = r.events;
      row.seconds.push_back(r.wall_seconds);
    }
    IFEC_CHECK(i == 0 || hops == row.frame_hops,
               "run " << i + 1 << " sent " << hops << " frame-hops, run 1 sent " << row.frame_hops);
    row.frame_hops = hops;
  }
  return row;
}

namespace {

// The headers of an RDMA WRITE ONLY frame of `payload` bytes, as the bytes-alone figures build them.
common::FrameHeaders write_headers(size_t payload) {
  common::FrameHeaders h;
  h.ip.src = 0x0A000001;
  h.ip.dst = 0x0A000002;
  h.ip.dscp = common::kRoceDscp;
  h.bth.opcode = static_cast<uint8_t>(common::Opcode::kWriteOnly);
  h.bth.dest_qp = 0x100;
  h.reth = common::Reth{0x10000, 0x1001, static_cast<uint32_t>(payload)};
  return h;
}

// Parses a frame that arrived, throwing Error when it fails its checks.
const uint8_t* verified_payload(const std::vector<uint8_t>& frame, uint64_t index) {
  common::ParsedFrame pf;
  const common::WireStatus st = common::parse_frame(frame.data(), frame.size(), &pf);
  IFEC_CHECK(st.ok(), "frame " << index << " failed its check: " << st.message());
  return frame.data() + pf.payload_offset;
}

}  // namespace

double frame_bytes_ns(double bytes_in_flight, size_t payload, int frames) {
  IFEC_CHECK(payload > 0 && payload <= common::kDefaultPathMtu,
             "frame payload " << payload << " B outside 1.." << common::kDefaultPathMtu);
  IFEC_CHECK(frames > 0, "frames " << frames << " must be > 0");
  IFEC_CHECK(bytes_in_flight >= 0 && bytes_in_flight <= 64e9, "bytes in flight " << bytes_in_flight << " out of range");
  common::FrameHeaders h = write_headers(payload);
  const std::vector<uint8_t> data(payload, 0x5A);
  const size_t frame = common::header_bytes(h) + payload + common::kIcrcSize;
  const size_t n = std::max<size_t>(1, static_cast<size_t>(bytes_in_flight / static_cast<double>(frame)));
  std::vector<std::vector<uint8_t>> ring(n);
  for (std::vector<uint8_t>& f : ring) {
    f = common::encode_frame(h, data.data(), payload);
  }
  size_t stride = 7919;  // a prime; any step coprime to n visits every slot once per n frames
  while (std::gcd(stride, n) != 1) {
    stride += 2;
  }
  double best = 0;
  size_t slot = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < frames; ++i) {
      slot = (slot + stride) % n;
      verified_payload(ring[slot], static_cast<uint64_t>(i));
      common::recycle_frame(std::move(ring[slot]));
      h.bth.psn = static_cast<uint32_t>(i) & common::Bth::kPsnMask;
      ring[slot] = common::encode_frame(h, data.data(), payload);
    }
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / frames;
    best = pass == 0 ? ns : std::min(best, ns);
  }
  return best;
}

double RingBytes::ns_per_frame() const { return frames > 0 ? seconds * 1e9 / static_cast<double>(frames) : 0; }

namespace {

// One ring AllReduce's memory work over `buf` (one buffer per rank) and `slots` (kRingSlots staging slices per
// rank), frames delivered in order once `queue_frames` newer ones were built, or earlier when the next step needs
// them. Returns the frames sent.
uint64_t ring_pass(std::vector<std::vector<float>>& buf, std::vector<std::vector<float>>& slots, size_t queue_frames) {
  constexpr size_t kFrame = common::kDefaultPathMtu;
  const int n = static_cast<int>(buf.size());
  const size_t block = buf[0].size() * sizeof(float) / n;
  const size_t slice = std::min<size_t>(workloads::kRingSliceBytes, block);
  const size_t slices = block / slice;
  struct InFlight {
    std::vector<uint8_t> frame;
    uint8_t* dst;
    uint8_t* reduce_dst;  // set on a slice's last frame during reduce-scatter: the slot is summed into it
    const uint8_t* slot;
  };
  std::deque<InFlight> q;
  uint64_t built = 0, delivered = 0;
  const auto deliver = [&] {
    InFlight& x = q.front();
    std::memcpy(x.dst, verified_payload(x.frame, delivered), kFrame);
    if (x.reduce_dst != nullptr) {
      common::reduce_into(common::EchDtype::kFp32, common::EchRedOp::kSum, x.reduce_dst, x.slot, slice / 4);
    }
    common::recycle_frame(std::move(x.frame));
    q.pop_front();
    ++delivered;
  };
  common::FrameHeaders h = write_headers(kFrame);
  std::vector<uint64_t> built_after;         // per step and slice: frames built by its end
  for (int phase = 0; phase < 2; ++phase) {  // reduce-scatter, then all-gather
    for (int step = 0; step < n - 1; ++step) {
      for (size_t k = 0; k < slices; ++k) {
        // What this step sends arrived in the previous step's same slice: deliver it first.
        const size_t it = built_after.size();
        while (it >= slices && delivered < built_after[it - slices]) {
          deliver();
        }
        const uint64_t seq = static_cast<uint64_t>(step) * slices + k;  // the reduce-scatter's slot rule
        for (int p = 0; p < n; ++p) {
          const int to = (p + 1) % n;
          const size_t off = static_cast<size_t>((p - step + phase + n) % n) * block + k * slice;
          uint8_t* src = reinterpret_cast<uint8_t*>(buf[p].data()) + off;
          uint8_t* dst = reinterpret_cast<uint8_t*>(buf[to].data()) + off;
          uint8_t* slot = reinterpret_cast<uint8_t*>(slots[to].data()) + (seq % workloads::kRingSlots) * slice;
          for (size_t f = 0; f < slice; f += kFrame) {
            h.bth.psn = static_cast<uint32_t>(built) & common::Bth::kPsnMask;
            const bool last = f + kFrame == slice;
            q.push_back({common::encode_frame(h, src + f, kFrame), phase == 0 ? slot + f : dst + f,
                         phase == 0 && last ? dst : nullptr, slot});
            ++built;
            if (q.size() > queue_frames) {
              deliver();
            }
          }
        }
        built_after.push_back(built);
      }
    }
  }
  while (!q.empty()) {
    deliver();
  }
  return built;
}

// Rank r's element e before the AllReduce: small integers, so every sum is exact in fp32.
float ring_input(int r, size_t e) { return static_cast<float>((static_cast<size_t>(r) * 7 + e) % 16); }

}  // namespace

RingBytes ring_bytes(int ranks, uint64_t bytes, double bytes_in_flight, int passes) {
  IFEC_CHECK(ranks >= 2 && ranks <= 1024, "ranks " << ranks << " outside 2..1024");
  IFEC_CHECK(bytes > 0 && bytes % (static_cast<uint64_t>(ranks) * common::kDefaultPathMtu) == 0,
             "AllReduce of " << bytes << " B: must be a positive multiple of " << ranks << " ranks x "
                             << common::kDefaultPathMtu << " B");
  IFEC_CHECK(bytes / ranks <= workloads::kRingSliceBytes || bytes / ranks % workloads::kRingSliceBytes == 0,
             "AllReduce of " << bytes << " B: a rank's block of " << bytes / ranks << " B is not whole "
                             << workloads::kRingSliceBytes << " B slices");
  IFEC_CHECK(bytes * static_cast<uint64_t>(ranks) <= (uint64_t{16} << 30),
             ranks << " ranks x " << bytes << " B exceeds the 16 GiB this measurement may allocate");
  IFEC_CHECK(bytes_in_flight >= 0 && bytes_in_flight <= 64e9, "bytes in flight " << bytes_in_flight << " out of range");
  IFEC_CHECK(passes >= 1, "passes " << passes << " must be >= 1");
  const size_t count = bytes / sizeof(float);
  const size_t slice = std::min<uint64_t>(workloads::kRingSliceBytes, bytes / ranks);
  std::vector<std::vector<float>> buf(ranks, std::vector<float>(count));
  std::vector<std::vector<float>> slots(ranks, std::vector<float>(workloads::kRingSlots * slice / sizeof(float)));
  const double frame = static_cast<double>(common::header_bytes(write_headers(common::kDefaultPathMtu)) +
                                           common::kDefaultPathMtu + common::kIcrcSize);
  const size_t queue = static_cast<size_t>(bytes_in_flight / frame);
  float want[16] = {};
  for (int r = 0; r < ranks; ++r) {
    for (size_t e = 0; e < 16; ++e) {
      want[e] += ring_input(r, e);
    }
  }
  RingBytes out;
  for (int pass = 0; pass < passes; ++pass) {
    for (int r = 0; r < ranks; ++r) {
      for (size_t e = 0; e < count; ++e) {
        buf[r][e] = ring_input(r, e);
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    out.frames = ring_pass(buf, slots, queue);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out.seconds = pass == 0 ? s : std::min(out.seconds, s);
    for (int r = 0; r < ranks; ++r) {  // every rank holds the sum, which repeats every 16 elements
      for (size_t e = 0; e < count; ++e) {
        IFEC_CHECK(buf[r][e] == want[e % 16], "ring AllReduce: rank " << r << " holds " << buf[r][e] << " at element "
                                                                      << e << ", not " << want[e % 16]);
      }
    }
  }
  return out;
}

namespace {

std::string size_text(uint64_t bytes) {
  return bytes % (1 << 20) == 0 ? std::to_string(bytes >> 20) + " MiB" : std::to_string(bytes >> 10) + " KiB";
}

}  // namespace

std::string speed_table(const std::vector<SpeedRow>& rows) {
  std::string out =
      "# scenario                                      frame-hops       events  runs   best s median s  M hops/s"
      "  on wires\n";
  for (const SpeedRow& r : rows) {
    char what[80];
    if (r.scenario.allreduce) {
      std::snprintf(what, sizeof(what), "AllReduce %s %s, %s", workloads::algo_name(r.scenario.algo),
                    size_text(r.scenario.bytes).c_str(), r.topology.c_str());
    } else {
      std::snprintf(what, sizeof(what), "all-to-all %s per pair, %s", size_text(r.scenario.bytes).c_str(),
                    r.topology.c_str());
    }
    char line[240];
    std::snprintf(line, sizeof(line), "  %-44s %11llu %12llu %5zu %8.2f %8.2f %9.2f %7.1f MB\n", what,
                  static_cast<unsigned long long>(r.frame_hops), static_cast<unsigned long long>(r.events),
                  r.seconds.size(), r.best(), r.median(), r.best_rate() / 1e6, r.wire_bytes / 1e6);
    out += line;
  }
  return out;
}

std::string ring_bytes_note(const SpeedRow& row, const RingBytes& b) {
  IFEC_CHECK(b.frames > 0 && b.seconds > 0, "ring bytes alone: no frames measured");
  char out[800];
  std::snprintf(
      out, sizeof(out),
      "# bytes alone for the ring AllReduce of %s on %d ranks (%s): building its %llu frames of 4 KiB,\n"
      "#   verifying each at most %.1f MB of frames later (sooner when the ring's next step needs it) and placing\n"
      "#   it (staged and summed during reduce-scatter) take %.2f s on this core, %.0f ns per frame; at this row's\n"
      "#   %.2f frame-hops per data frame (ACKs and switch hops included) a ceiling of %.2f M frame-hops/s; this\n"
      "#   AllReduce spends %.0f ns per frame\n",
      size_text(row.scenario.bytes).c_str(), row.gpus, row.topology.c_str(), static_cast<unsigned long long>(b.frames),
      row.wire_bytes / 1e6, b.seconds, b.ns_per_frame(),
      static_cast<double>(row.frame_hops) / static_cast<double>(b.frames),
      static_cast<double>(row.frame_hops) / b.seconds / 1e6, row.best() * 1e9 / static_cast<double>(b.frames));
  return out;
}

std::string ifec_bytes_note(const SpeedRow& row, double frame_ns) {
  IFEC_CHECK(frame_ns > 0 && row.gpus > 0, "in-fabric bytes alone: no frame cost or no GPUs");
  const uint64_t frames = 2 * static_cast<uint64_t>(row.gpus) *
                          ((row.scenario.bytes + common::kDefaultPathMtu - 1) / common::kDefaultPathMtu);
  const double seconds = static_cast<double>(frames) * frame_ns * 1e-9;
  char out[800];
  std::snprintf(
      out, sizeof(out),
      "# bytes alone for the in-fabric AllReduce of %s on %d ranks (%s): its %llu contributions and\n"
      "#   results are 4 KiB frames built and verified once each (a switch ends the one and starts the other); at\n"
      "#   the %.0f ns per frame measured above, before any reduction, copy or ACK, and this row's %.2f frame-hops\n"
      "#   per frame, a ceiling of %.2f M frame-hops/s; this AllReduce spends %.0f ns per frame\n",
      size_text(row.scenario.bytes).c_str(), row.gpus, row.topology.c_str(), static_cast<unsigned long long>(frames),
      frame_ns, static_cast<double>(row.frame_hops) / static_cast<double>(frames),
      static_cast<double>(row.frame_hops) / seconds / 1e6, row.best() * 1e9 / static_cast<double>(frames));
  return out;
}

}  // namespace ifec::testbed
