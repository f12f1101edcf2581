// EndpointSink: the NIC side of the descriptor ring. Each descriptor a Proxy drains becomes the endpoint's own
// operation (store, put-with-signal, atomic, load, fence); payloads are read and loaded bytes and fetched values
// written through the initiator's LocalMemory (the NIC's DMA), and `done` runs when the operation completes.
// Single-threaded: submit() and progress() on the thread that runs the endpoint's clock.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "ifec/endpoint/endpoint.h"
#include "ifec/endpoint/sink.h"

namespace ifec::endpoint {

class EndpointSink : public TransactionSink {
 public:
  using EndpointOf = std::function<Endpoint&(int source)>;  // the initiating endpoint of a descriptor
  using Advance = std::function<void()>;  // moves a simulated transport along a little; empty: it runs by itself
  explicit EndpointSink(EndpointOf endpoint_of, Advance advance = {});

  void submit(int source, const Descriptor& d, LocalMemory& mem, Done done) override;
  // Advances (when operations are pending) and completes what finished, in any order.
  bool progress() override;
  uint64_t submitted() const { return submitted_; }
  size_t pending() const { return pending_.size(); }

 private:
  struct Pending {
    OpHandle handle;
    Done done;
    std::function<void()> on_ok;  // copy fetched data / results back to the initiator's memory
  };
  EndpointOf endpoint_of_;
  Advance advance_;
  std::vector<Pending> pending_;
  uint64_t submitted_ = 0;
};

}  // namespace ifec::endpoint
