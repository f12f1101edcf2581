// This rank's part of a batch of point-to-point row stores (the endpoint-based MoE dispatch and combine): it posts
// its rows as RC WRITEs in the order given (rows for itself are copied), and finishes when every store it posted
// completed and every byte it expects from other ranks has landed.
#include <algorithm>
#include <cstring>
#include <sstream>

#include "comm_op.h"
#include "ifec/common/fifo.h"
#include "ifec/common/range_set.h"

namespace ifec::workloads {

namespace {

class PutRowsOp : public CommOp {
 public:
  PutRowsOp(Communicator& c, BatchPutArgs a, Communicator::Done done)
      : CommOp(c, std::move(done)), a_(std::move(a)), landed_(a_.incoming) {
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
    queued_.assign(comm_.size(), {});
    ahead_.assign(comm_.size(), 0);
    uint64_t stores = 0;
    for (size_t i = 0; i < a_.rows.size(); ++i) {
      const RowPut& r = a_.rows[i];
      if (r.destination == comm_.rank()) {
        std::memcpy(ep.memory().window(a_.dest_window)->data + r.to, src + r.from, len(r));
        continue;
      }
      queued_[r.destination].push_back({static_cast<uint32_t>(i), stores++});
    }
    // Rows of their own lengths take their stripe turns as they are posted (all at once: rows_ahead is 0 for them).
    uniform_ = std::all_of(a_.rows.begin(), a_.rows.end(), [](const RowPut& r) { return r.bytes == 0; });
    first_turn_ = uniform_ ? ep.take_stripe_turns(stores, a_.row_bytes) : endpoint::Endpoint::kNextTurn;
    // In the rows' order, each destination's first rows_ahead (every row without a bound).
    for (const RowPut& r : a_.rows) {
      if (r.destination != comm_.rank() && (a_.rows_ahead == 0 || ahead_[r.destination] < a_.rows_ahead)) {
        post_next(r.destination);
      }
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
      if (r.from + len(r) > from->size || r.to + len(r) > to->size) {
        return "row from offset " + std::to_string(r.from) + " to offset " + std::to_string(r.to) + " of rank " +
               std::to_string(r.destination) + " overruns window " +
               std::to_string(r.from + len(r) > from->size ? a_.source_window : a_.dest_window);
      }
    }
    return "";
  }

  // Posts the next row toward `dest` (from the window itself, an RDMA WRITE: rows are not copied while they queue).
  void post_next(int dest) {
    auto& q = queued_[dest];
    const Queued row = q.front();
    q.pop_front();
    q.release_if_empty();
    const RowPut& r = a_.rows[row.index];
    ++stores_out_;
    ++ahead_[dest];
    watch(comm_.endpoint().store_from_window(comm_.gpu(dest), a_.dest_window, r.to, a_.source_window, r.from, len(r),
                                             uniform_ ? first_turn_ + row.store : endpoint::Endpoint::kNextTurn),
          [this, dest](bool ok, const std::string& error) {
            if (!ok) {
              fail("row store: " + error);
              return;
            }
            --stores_out_;
            --ahead_[dest];
            if (!queued_[dest].empty()) {
              post_next(dest);
            }
            check_done();
          });
  }

  uint64_t len(const RowPut& r) const { return r.bytes != 0 ? r.bytes : a_.row_bytes; }

  void check_done() {
    if (sent_ && stores_out_ == 0 && landed_.bytes() >= expected_) {
      succeed();
    }
  }

  struct Queued {
    uint32_t index = 0;  // in a_.rows
    uint64_t store = 0;  // its turn among this batch's stores
  };
  BatchPutArgs a_;
  common::ExpectedRanges landed_;
  std::vector<common::Fifo<Queued>> queued_;  // per destination rank: rows not posted yet
  std::vector<uint32_t> ahead_;               // per destination rank: rows posted and not complete
  uint64_t first_turn_ = 0;
  bool uniform_ = true;  // every row is row_bytes long
  uint64_t expected_ = 0;
  size_t stores_out_ = 0;
  bool sent_ = false;
};

}  // namespace

std::shared_ptr<CommOp> make_put_rows_op(Communicator& c, BatchPutArgs a, Communicator::Done done) {
  return std::make_shared<PutRowsOp>(c, std::move(a), std::move(done));
}

}  // namespace ifec::workloads
