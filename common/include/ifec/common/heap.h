// How a long-running process that allocates and frees frames at a high rate keeps its heap (the daemons, ifec-cli),
// and what fresh memory costs the machine (the benches report it beside their rates).
//
// glibc's malloc hands freed memory at the top of its heap back to the kernel once more than 128 KiB is free there
// (brk, or madvise in a thread's arena), and maps allocations of 128 KiB or more on their own once that limit is
// fixed. With frames of a few KiB going through queues of thousands, the heap's top then grows and shrinks all the
// time: every shrink unmaps pages that each core running the process may have cached (a TLB shootdown, an
// inter-processor interrupt, costly in a virtual machine) and every regrowth faults zeroed pages in again. Measured
// on a 2-core VM (`./ifec bench live --quick`, `ifec-cli sim` of fat-tree-2048x8's permutation): AF_XDP forwarding of
// 4 KiB frames 2.0 -> 12.5 Gb/s, the 2,048-GPU simulated permutation 14.1 -> 11.4 s.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ifec::common {

inline constexpr size_t kKeptFreeHeapBytes = size_t{256} << 20;  // freed memory the heap keeps for reuse
inline constexpr size_t kOwnMappingBytes = size_t{32} << 20;     // allocations this large are mapped on their own
inline constexpr size_t kHeapGrowthBytes = size_t{16} << 20;     // what the heap asks the kernel for beyond a need

// Keeps up to kKeptFreeHeapBytes of freed memory on the heap (it stays at its high-water mark), grows it
// kHeapGrowthBytes at a time, and maps only allocations of kOwnMappingBytes or more on their own. Call once at the
// start of main(); false where the C library refused (not glibc: nothing changed).
bool keep_freed_heap();

// Writes `bytes` of heap on this thread's arena (blocks well below the own-mapping size, freed again): call after
// keep_freed_heap, on the thread whose loop will allocate, so its first frames and buffers reuse pages already
// touched (see fresh_page_ns) instead of faulting them in at the first operation.
void warm_heap(size_t bytes);

// This machine's physical memory in bytes (0 where the system does not say).
uint64_t physical_memory_bytes();

// What one run's data may take: 3/4 of physical memory (the rest for the system and the run's other state), or
// `unknown` where the system does not say how much there is.
uint64_t memory_budget_bytes(uint64_t unknown);

// Pages this process has faulted in so far (minor faults, getrusage: every thread's). The difference over a phase is
// about how many fresh pages it touched for the first time.
uint64_t minor_page_faults();

// What this machine charges for the first write to a fresh 4 KiB page, in nanoseconds: the mean over `bytes` of
// anonymous memory mapped for the purpose (without huge pages), touched once per page and unmapped. A bare-metal
// Linux takes well under a microsecond; the 2-core VMs this project is developed on take 15-19 us (their hypervisor
// builds its own page table entry on that first touch too: populating the mapping in advance moves only a little
// of the cost), which makes every simulation whose frames in flight need fresh memory markedly slower there.
double fresh_page_ns(size_t bytes = size_t{32} << 20);

}  // namespace ifec::common
