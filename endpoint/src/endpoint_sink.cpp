// EndpointSink (endpoint_sink.h): descriptors as endpoint operations.
#include "ifec/endpoint/endpoint_sink.h"

#include <memory>

namespace ifec::endpoint {

EndpointSink::EndpointSink(EndpointOf endpoint_of, Advance advance)
    : endpoint_of_(std::move(endpoint_of)), advance_(std::move(advance)) {}

void EndpointSink::submit(int source, const Descriptor& d, LocalMemory& mem, Done done) {
  ++submitted_;
  Endpoint& e = endpoint_of_(source);
  Pending p;
  p.done = std::move(done);
  const auto op = static_cast<DescOp>(d.op);
  const bool local_data = op == DescOp::kPut || op == DescOp::kPutSignal || op == DescOp::kGet;
  const bool result = (op == DescOp::kFetchAdd || op == DescOp::kCompareSwap) && d.result_addr != 0;
  if ((local_data && d.length > 0 && !mem.valid(d.local_addr, d.length)) || (result && !mem.valid(d.result_addr, 8))) {
    p.done(OpStatus::kInvalidArgument);  // the initiator's buffer is not where it may be read or written
    return;
  }
  switch (op) {
    case DescOp::kNop:
      p.done(OpStatus::kOk);
      return;
    case DescOp::kFence:
      e.fence(d.target == kFenceAllTargets ? -1 : d.target);
      p.done(OpStatus::kOk);
      return;
    case DescOp::kPut:
    case DescOp::kPutSignal: {
      // The NIC's DMA read of the payload, emulated by the proxy.
      std::vector<uint8_t> buf(d.length);
      if (d.length > 0) {
        mem.read(d.local_addr, buf.data(), d.length);
      }
      p.handle = static_cast<DescOp>(d.op) == DescOp::kPut
                     ? e.store(d.target, d.window, d.remote_offset, buf.data(), buf.size())
                     : e.put_signal(d.target, d.window, d.remote_offset, buf.data(), buf.size(), d.signal_window,
                                    d.signal_offset, d.value, static_cast<SignalOp>(d.signal_op));
      break;
    }
    case DescOp::kAtomicAdd:
    case DescOp::kFetchAdd:
    case DescOp::kCompareSwap: {
      const bool cas = static_cast<DescOp>(d.op) == DescOp::kCompareSwap;
      p.handle = cas ? e.compare_swap(d.target, d.window, d.remote_offset, d.compare, d.value)
                     : e.fetch_add(d.target, d.window, d.remote_offset, d.value);
      if (d.result_addr != 0 && static_cast<DescOp>(d.op) != DescOp::kAtomicAdd) {
        auto h = p.handle;
        const uint64_t addr = d.result_addr;
        p.on_ok = [h, addr, &mem] { mem.write(addr, &h->result, 8); };
      }
      break;
    }
    case DescOp::kGet: {
      auto buf = std::make_shared<std::vector<uint8_t>>(d.length);
      p.handle = e.load(buf->data(), d.target, d.window, d.remote_offset, d.length);
      const uint64_t addr = d.local_addr;
      p.on_ok = [buf, addr, &mem] {
        if (!buf->empty()) {
          mem.write(addr, buf->data(), buf->size());  // the NIC's DMA write of the loaded bytes
        }
      };
      break;
    }
    default:
      p.done(OpStatus::kInvalidArgument);
      return;
  }
  pending_.push_back(std::move(p));
  progress();
}

bool EndpointSink::progress() {
  if (!pending_.empty() && advance_) {
    advance_();
  }
  size_t kept = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending& p = pending_[i];
    if (p.handle->done()) {
      if (p.handle->ok() && p.on_ok) {
        p.on_ok();
      }
      p.done(p.handle->status);
    } else {
      if (kept != i) {
        pending_[kept] = std::move(p);
      }
      ++kept;
    }
  }
  pending_.resize(kept);
  return !pending_.empty();
}

}  // namespace ifec::endpoint
