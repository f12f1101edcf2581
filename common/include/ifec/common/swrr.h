// Smooth weighted round robin (nginx's upstream balancer): picks indices in proportion to their weights with the
// picks of each index spread evenly (no bursts), exact over any window of sum(weights) picks for integer weights.
// Picks may carry a cost (a frame's bytes): the shares are then of the cost, not of the picks, each index's lag
// behind its share bounded by a few of the largest cost (a switch spraying frames of mixed sizes over a Y-cable's
// sub-links balances their bytes, not their frame counts).
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

  // The next index, or -1 when no weight is positive; `cost` is what this pick takes of its index's share.
  int next(double cost = 1.0) { return next(weights_, total_, current_.data(), cost); }
  // The same pick for a rotation that keeps only its `current` state (one per weight), over weights (>= 0, summing
  // to `total`) kept elsewhere: several rotations over one list of weights (a switch's groups toward destinations
  // it reaches over the same members) share it.
  static int next(const std::vector<double>& weights, double total, double* current, double cost) {
    int best = -1;
    for (size_t i = 0; i < weights.size(); ++i) {
      if (weights[i] <= 0) {
        continue;
      }
      current[i] += weights[i] * cost;
      if (best < 0 || current[i] > current[best]) {
        best = static_cast<int>(i);
      }
    }
    if (best >= 0) {
      current[best] -= total * cost;
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
