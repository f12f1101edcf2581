// Smooth weighted round robin (nginx's upstream balancer): picks indices in proportion to their weights with the
// picks of each index spread evenly (no bursts), exact over any window of sum(weights) picks for integer weights.
// One implementation for the switch's per-packet WECMP, the endpoint's QP striping and the collectives' chunk
// placement over planes.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace ifec::common {

class SmoothWrr {
 public:
  SmoothWrr() = default;
  explicit SmoothWrr(std::vector<double> weights) { reset(std::move(weights)); }

  // New weights (negative ones count as 0); the rotation starts over.
  void reset(std::vector<double> weights) {
    weights_ = std::move(weights);
    current_.assign(weights_.size(), 0.0);
    total_ = 0;
    for (double& w : weights_) {
      w = w > 0 ? w : 0;
      total_ += w;
    }
  }

  // The next index, or -1 when no weight is positive.
  int next() {
    int best = -1;
    for (size_t i = 0; i < weights_.size(); ++i) {
      if (weights_[i] <= 0) {
        continue;
      }
      current_[i] += weights_[i];
      if (best < 0 || current_[i] > current_[best]) {
        best = static_cast<int>(i);
      }
    }
    if (best >= 0) {
      current_[best] -= total_;
    }
    return best;
  }

  const std::vector<double>& weights() const { return weights_; }
  double total() const { return total_; }
  size_t memory_bytes() const { return (weights_.capacity() + current_.capacity()) * sizeof(double); }

 private:
  std::vector<double> weights_;
  std::vector<double> current_;
  double total_ = 0;
};

}  // namespace ifec::common
