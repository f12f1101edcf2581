// ifec-ring: a local program posting memory transactions through a hostd's descriptor ring (host_ring.h), the way
// CPU threads or a GPU kernel use the testbed. `info` prints the ring; `exercise` stores patterned rows into another
// GPU's ring window and fetch-adds one 64-bit counter there (ring_exercise.h), from T CPU threads or, with --gpu,
// from a CUDA kernel on the region registered as mapped memory; waits for every completion, loads the rows back
// through the fabric and checks them, and prints one JSON line (the fetched values must be consecutive: each
// fetch-add ran exactly once). `bad` posts descriptors that must fail cleanly.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ifec/common/checks.h"
#include "ifec/common/json.h"
#include "ifec/endpoint/ring_exercise.h"
#include "ifec/live/host_ring.h"
#ifdef IFEC_RING_CUDA
#include "endpoint/cuda/api.h"
#endif

namespace {

using ifec::endpoint::DescOp;
using ifec::endpoint::Descriptor;

uint64_t number(const std::string& text, const char* what, uint64_t lo, uint64_t hi) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 0);
  IFEC_CHECK(!text.empty() && *end == '\0' && errno == 0 && v >= lo && v <= hi,
             what << " '" << text << "' is not a number in " << lo << ".." << hi);
  return v;
}

struct Options {
  ifec::endpoint::RingExercise ex;
  uint32_t threads = 4;
  bool gpu = false;  // post from a CUDA kernel instead of CPU threads
};

// The producers: CPU threads, each its share of the rows and fetch-adds.
void post_from_cpu(ifec::live::HostRing& hr, const Options& o) {
  const ifec::endpoint::RingExercise& ex = o.ex;
  uint8_t* data = hr.data();
  std::vector<std::thread> ts;
  // A post that fails (hostd gone while the ring is full) ends its thread, and the first error is rethrown once
  // every thread has joined: thrown inside a std::thread it was std::terminate and a core dump.
  std::vector<std::exception_ptr> errors(o.threads);
  for (uint32_t t = 0; t < o.threads; ++t) {
    ts.emplace_back([&, t] {
      try {
        for (uint64_t i = t; i < ex.puts; i += o.threads) {
          for (uint64_t k = 0; k < ex.row_bytes; ++k) {
            data[ex.rows_at + i * ex.row_bytes + k] = ifec::endpoint::RingExercise::byte(ex.seed, i, k);
          }
          hr.post(ex.put(i));
        }
        for (uint64_t i = t; i < ex.fetch_adds; i += o.threads) {
          hr.post(ex.fetch_add(i));
        }
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  }
  for (auto& th : ts) {
    th.join();
  }
  for (const std::exception_ptr& e : errors) {
    if (e) {
      std::rethrow_exception(e);
    }
  }
}

// ... or a CUDA kernel on the region registered as mapped host memory.
void post_from_gpu(ifec::live::HostRing& hr, const Options& o) {
#ifdef IFEC_RING_CUDA
  std::string why;
  IFEC_CHECK(ifec::endpoint::cuda_available(&why), "--gpu: no usable CUDA device: " << why);
  ifec::endpoint::MappedHostRegion region(hr.region(), hr.region_bytes());
  uint32_t timeouts = 0;
  ifec::endpoint::launch_ring_exercise(region.ring_view(hr.ring(), 60'000'000'000ULL),
                                       static_cast<uint8_t*>(region.device_ptr(hr.data())), o.ex, 4, 128, &timeouts);
  IFEC_CHECK(timeouts == 0, "--gpu: " << timeouts << " device waits on the ring gave up");
#else
  (void)hr;
  (void)o;
  IFEC_FAIL("--gpu: this ifec-ring was built without CUDA");
#endif
}

int run_exercise(ifec::live::HostRing& hr, Options o) {
  ifec::live::HostRingInfo& info = hr.info();
  ifec::endpoint::RingExercise& ex = o.ex;
  IFEC_CHECK(ex.target < info.ranks, "target GPU " << ex.target << " outside 0.." << info.ranks - 1);
  IFEC_CHECK(ex.counter + 64 + ex.puts * ex.row_bytes <= info.window_bytes,
             ex.puts << " rows of " << ex.row_bytes << " B after offset " << ex.counter + 64
                     << " overrun the ring window (" << info.window_bytes << " B)");
  ex.window = info.window;
  // Data area: [64 B unused: result_addr 0 means "no result"][fetched values][rows to store][rows loaded back].
  ex.results_at = 64;
  ex.rows_at = ex.results_at + (ex.fetch_adds * 8 + 63) / 64 * 64;
  const uint64_t back_at = ex.rows_at + ex.puts * ex.row_bytes;
  IFEC_CHECK(back_at + ex.puts * ex.row_bytes <= info.data_bytes, "the exercise needs "
                                                                      << back_at + ex.puts * ex.row_bytes
                                                                      << " B of ring data; it has " << info.data_bytes);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (__atomic_load_n(&info.ready, __ATOMIC_ACQUIRE) == 0) {
    IFEC_CHECK(std::chrono::steady_clock::now() < deadline, "hostd of GPU " << info.gpu << " never drained its ring");
    IFEC_CHECK(hr.owner_alive(), "hostd of GPU " << info.gpu << " (pid " << info.owner_pid << ") stopped");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  uint8_t* data = hr.data();
  const uint64_t errors0 = hr.ring().errors();
  const auto t0 = std::chrono::steady_clock::now();
  o.gpu ? post_from_gpu(hr, o) : post_from_cpu(hr, o);
  const bool quiet = hr.quiet(std::chrono::seconds(60));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Load the rows back through the fabric and compare.
  for (uint64_t i = 0; i < ex.puts; ++i) {
    Descriptor d = ex.put(i);
    d.op = static_cast<uint8_t>(DescOp::kGet);
    d.local_addr = back_at + i * ex.row_bytes;
    hr.post(d);
  }
  const bool quiet_back = hr.quiet(std::chrono::seconds(60));
  uint64_t wrong_bytes = 0;
  for (uint64_t i = 0; i < ex.puts; ++i) {
    for (uint64_t k = 0; k < ex.row_bytes; ++k) {
      wrong_bytes += data[back_at + i * ex.row_bytes + k] != ifec::endpoint::RingExercise::byte(ex.seed, i, k);
    }
  }
  std::vector<uint64_t> olds(ex.fetch_adds);
  std::memcpy(olds.data(), data + ex.results_at, ex.fetch_adds * 8);
  std::sort(olds.begin(), olds.end());
  bool consecutive = true;
  for (size_t i = 1; i < olds.size(); ++i) {
    consecutive = consecutive && olds[i] == olds[0] + i;
  }
  const uint64_t errors = hr.ring().errors() - errors0;
  ifec::common::JsonObject j;
  j.add("gpu", static_cast<uint64_t>(info.gpu)).add("target", static_cast<uint64_t>(ex.target));
  j.add("producer", o.gpu ? "cuda kernel" : "cpu threads").add("puts", ex.puts).add("row_bytes", ex.row_bytes);
  j.add("fetch_adds", ex.fetch_adds).add("threads", o.threads).add("completed", quiet && quiet_back);
  j.add("errors", errors).add("wrong_bytes", wrong_bytes).add("fetched_consecutive", consecutive);
  j.add("first_fetched", olds.empty() ? uint64_t{0} : olds.front()).add("seconds", seconds);
  j.add("ops_per_s", seconds > 0 ? (ex.puts + ex.fetch_adds) / seconds : 0.0);
  std::printf("%s\n", j.str().c_str());
  return quiet && quiet_back && errors == 0 && wrong_bytes == 0 && consecutive ? 0 : 1;
}

// Descriptors a careless program could post: a GPU that does not exist, a window no rank has, a payload outside the
// ring's data area, a store past the end of the target's window. Each must complete with an error (never a crash
// or a hang of hostd), and the ring must go on working.
int run_bad(ifec::live::HostRing& hr) {
  ifec::live::HostRingInfo& info = hr.info();
  const uint32_t target = info.gpu == 0 ? 1 : 0;
  const uint64_t errors0 = hr.ring().errors();
  Descriptor d;
  d.op = static_cast<uint8_t>(DescOp::kPut);
  d.length = 64;
  d.target = 9999;
  d.window = info.window;
  hr.post(d);
  d.target = static_cast<uint16_t>(target);
  d.window = 7777;
  hr.post(d);
  d.window = info.window;
  d.local_addr = info.data_bytes - 8;
  hr.post(d);
  d.local_addr = 0;
  d.remote_offset = info.window_bytes - 8;
  hr.post(d);
  const bool quiet = hr.quiet(std::chrono::seconds(30));
  const uint64_t errors = hr.ring().errors() - errors0;
  Descriptor ok;
  ok.op = static_cast<uint8_t>(DescOp::kFetchAdd);
  ok.target = static_cast<uint16_t>(target);
  ok.window = info.window;
  ok.remote_offset = info.window_bytes - 8;
  ok.value = 1;
  ok.result_addr = 0;
  hr.post(ok);
  const bool then_ok = hr.quiet(std::chrono::seconds(30)) && hr.ring().errors() - errors0 == errors;
  ifec::common::JsonObject o;
  o.add("posted", uint64_t{4}).add("completed", quiet).add("errors", errors).add("then_ok", then_ok);
  std::printf("%s\n", o.str().c_str());
  return quiet && errors == 4 && then_ok ? 0 : 1;
}

int usage(FILE* to, int status) {
  std::fprintf(to,
               "usage: ifec-ring NODE info\n"
               "       ifec-ring NODE bad\n"
               "       ifec-ring NODE exercise TARGET_GPU [--puts N] [--bytes B] [--fetch-adds N] [--threads T]\n"
               "                 [--counter OFFSET] [--seed S] [--gpu]\n");
  return status;
}

// exercise's arguments (argv[3] on), checked before the ring is opened: a bad one is named whether or not the hostd
// runs.
Options parse_exercise(int argc, char** argv) {
  Options o;
  o.ex.target = static_cast<uint16_t>(number(argv[3], "target GPU", 0, 65535));
  o.ex.puts = 64;
  o.ex.row_bytes = 4096;
  o.ex.fetch_adds = 1000;
  std::set<std::string> given;
  for (int i = 4; i < argc; ++i) {
    const std::string flag = argv[i];
    IFEC_CHECK(given.insert(flag).second, flag << " given twice");
    if (flag == "--gpu") {
      o.gpu = true;
      continue;
    }
    IFEC_CHECK(i + 1 < argc, flag << " needs a value");
    const std::string v = argv[++i];
    if (flag == "--puts") {
      o.ex.puts = number(v, "--puts", 0, 1 << 20);
    } else if (flag == "--bytes") {
      o.ex.row_bytes = number(v, "--bytes", 1, 1 << 20);
    } else if (flag == "--fetch-adds") {
      o.ex.fetch_adds = number(v, "--fetch-adds", 0, 1 << 20);
    } else if (flag == "--threads") {
      o.threads = static_cast<uint32_t>(number(v, "--threads", 1, 64));
    } else if (flag == "--counter") {
      o.ex.counter = number(v, "--counter", 0, uint64_t{1} << 40);
      IFEC_CHECK(o.ex.counter % 8 == 0, "--counter " << o.ex.counter << " is not 8-byte aligned");
    } else if (flag == "--seed") {
      o.ex.seed = number(v, "--seed", 0, uint64_t{1} << 32);
    } else {
      IFEC_FAIL("unknown option " << flag);
    }
  }
  return o;
}

int info(ifec::live::HostRing& hr, const char* node) {
  const ifec::live::HostRingInfo& i = hr.info();
  ifec::common::JsonObject o;
  o.add("path", ifec::live::host_ring_path(node)).add("gpu", static_cast<uint64_t>(i.gpu));
  o.add("ranks", static_cast<uint64_t>(i.ranks)).add("slots", i.ring_capacity).add("data_bytes", i.data_bytes);
  o.add("window", static_cast<uint64_t>(i.window)).add("window_bytes", i.window_bytes).add("ready", i.ready != 0);
  o.add("issued", hr.ring().issued()).add("completed", hr.ring().completed()).add("errors", hr.ring().errors());
  std::printf("%s\n", o.str().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    return usage(stdout, 0);
  }
  if (argc < 3) {
    return usage(stderr, 2);
  }
  const std::string cmd = argv[2];
  const bool exercise = cmd == "exercise" && argc >= 4;
  if (!exercise && !((cmd == "info" || cmd == "bad") && argc == 3)) {
    return usage(stderr, 2);
  }
  try {
    const Options o = exercise ? parse_exercise(argc, argv) : Options{};
    auto hr = ifec::live::HostRing::open(argv[1]);
    if (cmd == "info") {
      return info(*hr, argv[1]);
    }
    return cmd == "bad" ? run_bad(*hr) : run_exercise(*hr, o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ifec-ring: %s\n", e.what());
    return 1;
  }
}
