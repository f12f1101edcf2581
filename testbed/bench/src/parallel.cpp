// Independent runs on several threads under a memory budget (parallel.h).
#include "ifec/testbed/parallel.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace ifec::testbed {

uint64_t host_memory_budget() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) {
    return 12ULL << 30;
  }
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 4 * 3;
}

void run_parallel(const ParallelJobs& jobs, unsigned threads) {
  std::mutex mu;
  std::condition_variable cv;
  size_t next = 0;  // order[next..] not started
  size_t done = 0;
  uint64_t in_use = 0;
  std::vector<std::string> running;
  const std::vector<size_t>& order = jobs.order;
  auto worker = [&] {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [&] {
        return next == order.size() || running.empty() || in_use + jobs.need(order[next]) <= jobs.budget;
      });
      if (next == order.size()) {
        return;
      }
      const size_t i = order[next++];
      const uint64_t need = jobs.need(i);
      const std::string label = jobs.label(i);
      in_use += need;
      running.push_back(label);
      lock.unlock();
      jobs.run(i);
      lock.lock();
      in_use -= need;
      running.erase(std::find(running.begin(), running.end(), label));
      ++done;
      if (jobs.progress) {
        std::string now;
        for (const std::string& l : running) {
          now += (now.empty() ? "" : ", ") + l;
        }
        jobs.progress(done, order.size(), now);
      }
      cv.notify_all();
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < std::max(1u, threads); ++t) {
    pool.emplace_back(worker);
  }
  worker();
  for (std::thread& t : pool) {
    t.join();
  }
}

}  // namespace ifec::testbed
