// A first-in first-out queue on a ring that allocates nothing until its first element (std::deque allocates on
// construction: a switch port's nine queues took a quarter of a GB across a 2,048-GPU fabric before any frame).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace ifec::common {

template <typename T>
class Fifo {
 public:
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  T& front() { return ring_[head_]; }
  const T& front() const { return ring_[head_]; }
  T& back() { return ring_[(head_ + size_ - 1) & (ring_.size() - 1)]; }
  void push_back(T&& v) {
    if (size_ == ring_.size()) {
      grow();
    }
    ring_[(head_ + size_) & (ring_.size() - 1)] = std::move(v);
    ++size_;
  }
  // Drops the front element (its storage goes with it: a frame's buffer is freed here, not kept in the ring).
  void pop_front() {
    ring_[head_] = T{};
    head_ = (head_ + 1) & (ring_.size() - 1);
    --size_;
  }
  size_t capacity() const { return ring_.size(); }
  // The i-th element from the front (i < size()).
  T& operator[](size_t i) { return ring_[(head_ + i) & (ring_.size() - 1)]; }
  const T& operator[](size_t i) const { return ring_[(head_ + i) & (ring_.size() - 1)]; }
  // Gives the ring back once empty (a queue that was long once need not keep its peak: thousands of QPs do).
  void release_if_empty() {
    if (size_ == 0) {
      std::vector<T>().swap(ring_);
      head_ = 0;
    }
  }

  // Front to back, for range-for.
  template <typename Q, typename V>
  class Iter {
   public:
    Iter(Q* q, size_t i) : q_(q), i_(i) {}
    V& operator*() const { return (*q_)[i_]; }
    Iter& operator++() {
      ++i_;
      return *this;
    }
    bool operator!=(const Iter& o) const { return i_ != o.i_; }

   private:
    Q* q_;
    size_t i_;
  };
  Iter<Fifo, T> begin() { return {this, 0}; }
  Iter<Fifo, T> end() { return {this, size_}; }
  Iter<const Fifo, const T> begin() const { return {this, 0}; }
  Iter<const Fifo, const T> end() const { return {this, size_}; }

 private:
  void grow() {
    std::vector<T> bigger(ring_.empty() ? 4 : ring_.size() * 2);
    for (size_t i = 0; i < size_; ++i) {
      bigger[i] = std::move(ring_[(head_ + i) & (ring_.size() - 1)]);
    }
    ring_.swap(bigger);
    head_ = 0;
  }

  std::vector<T> ring_;  // a power of two long
  size_t head_ = 0;
  size_t size_ = 0;
};

}  // namespace ifec::common
