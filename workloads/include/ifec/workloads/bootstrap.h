// A rank's bootstrap: how it learns who the other ranks are and exchanges small blobs with them out of band (window
// keys, the in-fabric plan, outcome bitmaps), NCCL's ncclBootstrap. Asynchronous: the answer comes later on the
// rank's own clock, so N ranks can share one simulated event loop or run one per process. The simulator's in-process
// hub is in testbed/sim; the live testbed's runs over its host daemons' control plane.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ifec::workloads {

struct Gathered {
  bool ok = true;
  std::string error;                        // why not (a rank is gone, the hub is down), naming the rank
  std::vector<std::vector<uint8_t>> parts;  // every rank's contribution, in rank order
};

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank calls allgather in the same order; `done` runs (as its own event on this rank's clock) once every
  // rank contributed, with all contributions.
  virtual void allgather(std::vector<uint8_t> mine, std::function<void(Gathered)> done) = 0;
  // An allgather of nothing.
  void barrier(std::function<void(Gathered)> done) { allgather({}, std::move(done)); }
};

}  // namespace ifec::workloads
