// keep_freed_heap: frames allocated and freed leave the heap at its high-water mark instead of being handed back to
// the kernel (and faulted in again) at every turn.
#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/mman.h>

#include <cstring>
#include <vector>

#include "ifec/common/checks.h"
#include "ifec/common/heap.h"

using namespace ifec;

TEST(KeepFreedHeap, FreedFramesStayOnTheHeap) {
  ASSERT_TRUE(common::keep_freed_heap());
  std::vector<void*> frames;
  for (int i = 0; i < 4096; ++i) {  // 16 MiB of 4 KiB frames, as a queue of a software switch holds
    frames.push_back(malloc(4096));
  }
  const size_t grown = mallinfo2().arena;
  for (void* f : frames) {
    free(f);
  }
  EXPECT_GE(mallinfo2().arena, grown) << "the heap was trimmed: glibc gave the freed frames back to the kernel";
  EXPECT_GE(mallinfo2().fordblks, size_t{16} << 20);
}

// Touching fresh pages is counted as that many faults, and the machine's price of one is measured on the same kind of
// memory (a positive figure; what it is depends on the machine: under a microsecond bare, 15-19 us on this VM).
TEST(FreshPages, TouchesAreCountedAndPriced) {
  constexpr size_t kPages = 512;
  void* m = mmap(nullptr, kPages * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  madvise(m, kPages * 4096, MADV_NOHUGEPAGE);
  const uint64_t before = common::minor_page_faults();
  for (size_t i = 0; i < kPages; ++i) {
    static_cast<volatile char*>(m)[i * 4096] = 1;
  }
  EXPECT_GE(common::minor_page_faults() - before, kPages);
  munmap(m, kPages * 4096);
  const double ns = common::fresh_page_ns(size_t{4} << 20);
  EXPECT_GT(ns, 0);
  EXPECT_LT(ns, 1e6) << "a millisecond a page: the measurement is wrong";
  EXPECT_THROW(common::fresh_page_ns(100), common::Error);
}

// A warmed heap serves the next allocations from pages already written: 4 MiB of blocks after warming 8 MiB fault in
// a small fraction of their 1,024 pages.
TEST(WarmHeap, LaterBlocksReuseWrittenPages) {
  ASSERT_TRUE(common::keep_freed_heap());
  common::warm_heap(size_t{8} << 20);
  const uint64_t before = common::minor_page_faults();
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i) {
    blocks.push_back(malloc(size_t{256} << 10));
    memset(blocks.back(), 1, size_t{256} << 10);
  }
  const uint64_t faults = common::minor_page_faults() - before;
  for (void* b : blocks) {
    free(b);
  }
  EXPECT_LT(faults, 128u) << "of 1,024 pages";
}
