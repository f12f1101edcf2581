// This rank's part of a batch of point-to-point row stores (the endpoint-based MoE dispatch and combine): it posts
// its rows as RC WRITEs in the order given (rows for itself are copied), and finishes when every store it posted
// completed and every byte it expects from other ranks has landed.
#include <cstring>
#include <sstream>

#include "comm_op.h"
#include "ifec/common/range_set.h"

namespace ifec::workloads {

namespace {

class PutRowsOp : public CommOp {
 public:
  PutRowsOp(Communicator& c, BatchPutArgs a, Communicator::Done done) : CommOp(c, std::move(done)), a_(std::move(a)) {
    res_.algo = "point-to-point stores";
    for (const auto& [off, len] : a_.incoming) {
      expected_ += len;
    }
  }

 protected:
  void start() override {
    if (const std::string bad = check(); !bad.empty()) {
      fail("row stores: " + bad);
      return;
    }
    endpoint::Endpoint& ep = comm_.endpoint();
    const uint8_t* src = ep.memory().window(a_.source_window)->data;
    for (const RowPut& r : a_.rows) {
      if (r.destination == comm_.rank()) {
        std::memcpy(ep.memory().window(a_.dest_window)->data + r.to, src + r.from, a_.row_bytes);
        continue;
      }
      ++stores_out_;
      // From the window itself (RDMA WRITE): the rows are not copied while they queue behind each other.
      watch(
          ep.store_from_window(comm_.gpu(r.destination), a_.dest_window, r.to, a_.source_window, r.from, a_.row_bytes),
          [this](bool ok, const std::string& error) {
            if (!ok) {
              fail("row store: " + error);
              return;
            }
            --stores_out_;
            check_done();
          });
    }
    sent_ = true;
    check_done();
  }

  bool on_remote_write(int, uint16_t window, uint64_t offset, uint64_t len) override {
    if (window != a_.dest_window) {
      return false;
    }
    landed_.insert(offset, len);
    check_done();
    return true;
  }

  std::string describe_stuck() const override {
    std::ostringstream os;
    os << "row stores: " << stores_out_ << " in flight, " << landed_.bytes() << " of " << expected_ << " B received";
    return os.str();
  }

 private:
  // Why the arguments cannot run here (a window missing or overrun, a rank out of range), or "".
  std::string check() const {
    endpoint::Endpoint& ep = comm_.endpoint();
    const endpoint::WindowInfo* from = ep.memory().window(a_.source_window);
    if (from == nullptr || ep.memory().window(a_.dest_window) == nullptr) {
      return "rank " + std::to_string(comm_.rank()) + " lacks window " +
             std::to_string(from == nullptr ? a_.source_window : a_.dest_window);
    }
    for (const RowPut& r : a_.rows) {
      if (r.destination < 0 || r.destination >= comm_.size()) {
        return "destination rank " + std::to_string(r.destination) + " outside 0.." + std::to_string(comm_.size() - 1);
      }
      const endpoint::WindowInfo* to = r.destination == comm_.rank()
                                           ? ep.memory().window(a_.dest_window)
                                           : ep.peer_window(comm_.gpu(r.destination), a_.dest_window);
      if (to == nullptr) {
        return "rank " + std::to_string(r.destination) + " has no window " + std::to_string(a_.dest_window);
      }
      if (r.from + a_.row_bytes > from->size || r.to + a_.row_bytes > to->size) {
        return "row from offset " + std::to_string(r.from) + " to offset " + std::to_string(r.to) + " of rank " +
               std::to_string(r.destination) + " overruns window " +
               std::to_string(r.from + a_.row_bytes > from->size ? a_.source_window : a_.dest_window);
      }
    }
    return "";
  }

  void check_done() {
    if (sent_ && stores_out_ == 0 && landed_.bytes() >= expected_) {
      succeed();
    }
  }

  BatchPutArgs a_;
  uint64_t expected_ = 0;
  common::RangeSet landed_;
  size_t stores_out_ = 0;
  bool sent_ = false;
};

}  // namespace

std::shared_ptr<CommOp> make_put_rows_op(Communicator& c, BatchPutArgs a, Communicator::Done done) {
  return std::make_shared<PutRowsOp>(c, std::move(a), std::move(done));
}

}  // namespace ifec::workloads
