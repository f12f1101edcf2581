#include "ifec/common/heap.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace ifec::common {

bool keep_freed_heap() {
#if defined(__GLIBC__)
  return mallopt(M_TRIM_THRESHOLD, static_cast<int>(kKeptFreeHeapBytes)) == 1 &&
         mallopt(M_TOP_PAD, static_cast<int>(kHeapGrowthBytes)) == 1 &&
         mallopt(M_MMAP_THRESHOLD, static_cast<int>(kOwnMappingBytes)) == 1;
#else
  return false;
#endif
}

}  // namespace ifec::common
