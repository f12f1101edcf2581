// keep_freed_heap: frames allocated and freed leave the heap at its high-water mark instead of being handed back to
// the kernel (and faulted in again) at every turn.
#include <gtest/gtest.h>
#include <malloc.h>

#include <vector>

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
