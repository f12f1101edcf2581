#include "ifec/common/heap.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ifec/common/checks.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace ifec::common {

uint64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

uint64_t memory_budget_bytes(uint64_t unknown) {
  const uint64_t physical = physical_memory_bytes();
  return physical == 0 ? unknown : physical / 4 * 3;
}

bool keep_freed_heap() {
#if defined(__GLIBC__)
  return mallopt(M_TRIM_THRESHOLD, static_cast<int>(kKeptFreeHeapBytes)) == 1 &&
         mallopt(M_TOP_PAD, static_cast<int>(kHeapGrowthBytes)) == 1 &&
         mallopt(M_MMAP_THRESHOLD, static_cast<int>(kOwnMappingBytes)) == 1;
#else
  return false;
#endif
}

void warm_heap(size_t bytes) {
  constexpr size_t kBlock = size_t{256} << 10;
  std::vector<void*> blocks;
  for (size_t done = 0; done < bytes; done += kBlock) {
    void* p = std::malloc(kBlock);
    if (p == nullptr) {
      break;
    }
    std::memset(p, 0, kBlock);
    blocks.push_back(p);
  }
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    std::free(*it);
  }
}

uint64_t minor_page_faults() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_minflt);
}

double fresh_page_ns(size_t bytes) {
  constexpr size_t kPage = 4096;
  IFEC_CHECK(bytes >= kPage, "fresh_page_ns: " << bytes << " bytes is less than one page");
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  IFEC_CHECK(m != MAP_FAILED, "fresh_page_ns: cannot map " << bytes << " bytes: " << std::strerror(errno));
  madvise(m, bytes, MADV_NOHUGEPAGE);  // one fault per 4 KiB page, whatever the system's huge page policy
  auto* p = static_cast<volatile uint8_t*>(m);
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t off = 0; off < bytes; off += kPage) {
    p[off] = 1;
  }
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  munmap(m, bytes);
  return ns / static_cast<double>(bytes / kPage);
}

}  // namespace ifec::common
