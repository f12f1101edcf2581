// Independent runs on several threads under a memory budget (parallel.h).
#include "ifec/testbed/parallel.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>

#include "ifec/common/heap.h"

namespace ifec::testbed {

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
  // No more threads than jobs; where the system refuses one, the threads made so far share the work.
  const size_t wanted = std::min<size_t>(std::max(1u, threads), std::max<size_t>(order.size(), 1));
  std::vector<std::thread> pool;
  try {
    for (size_t t = 1; t < wanted; ++t) {
      pool.emplace_back(worker);
    }
  } catch (const std::system_error&) {
  }
  worker();
  for (std::thread& t : pool) {
    t.join();
  }
}

}  // namespace ifec::testbed
