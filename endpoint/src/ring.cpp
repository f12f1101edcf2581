// DescriptorRing: region layout, the host producer path (CPU backend) and the proxy's consumer path.
#include "ifec/endpoint/ring.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <utility>

#include "ifec/common/checks.h"

namespace ifec::endpoint {

namespace {

// Slots start on a descriptor boundary after the header so no slot shares a cache line with a counter.
constexpr size_t kSlotsOffset = (sizeof(RingHeader) + sizeof(Descriptor) - 1) / sizeof(Descriptor) * sizeof(Descriptor);
// Everything after `seq` is plain data the producer copies before publishing.
constexpr size_t kBodyOffset = offsetof(Descriptor, op);
static_assert(kBodyOffset == sizeof(uint64_t), "seq must be the first 8 bytes of a descriptor");

bool is_power_of_two(size_t v) { return v != 0 && (v & (v - 1)) == 0; }

void check_capacity(size_t capacity) {
  IFEC_CHECK(
      is_power_of_two(capacity) && capacity <= DescriptorRing::kMaxCapacity,
      "descriptor ring capacity " << capacity << " is not a power of two in 1.." << DescriptorRing::kMaxCapacity);
}

uint64_t load_acquire(const unsigned long long* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

}  // namespace

void DescriptorRing::Free::operator()(void* p) const { ::operator delete (p, std::align_val_t{alignof(RingHeader)}); }

size_t DescriptorRing::region_bytes(size_t capacity) {
  check_capacity(capacity);
  return kSlotsOffset + capacity * sizeof(Descriptor);
}

RingHeader* DescriptorRing::init_region(void* region, size_t region_size, size_t capacity) {
  const size_t need = region_bytes(capacity);
  IFEC_CHECK(region != nullptr, "descriptor ring region is null");
  IFEC_CHECK(reinterpret_cast<uintptr_t>(region) % alignof(RingHeader) == 0,
             "descriptor ring region " << region << " is not " << alignof(RingHeader) << "-byte aligned");
  IFEC_CHECK(region_size >= need, "descriptor ring region of " << region_size << " bytes is smaller than the " << need
                                                               << " bytes capacity " << capacity << " needs");
  std::memset(region, 0, need);
  auto* hdr = new (region) RingHeader{};
  hdr->capacity = capacity;
  hdr->slots_offset = kSlotsOffset;
  return hdr;
}

DescriptorRing DescriptorRing::view(void* region) {
  IFEC_CHECK(region != nullptr, "descriptor ring region is null");
  const auto* hdr = static_cast<const RingHeader*>(region);
  check_capacity(hdr->capacity);
  IFEC_CHECK(hdr->slots_offset >= sizeof(RingHeader) && hdr->slots_offset % alignof(Descriptor) == 0,
             "descriptor ring slots_offset " << hdr->slots_offset << " is inside the header or misaligned");
  return DescriptorRing(region, nullptr);
}

DescriptorRing::DescriptorRing(size_t capacity) {
  const size_t bytes = region_bytes(capacity);
  std::unique_ptr<void, Free> mem(::operator new (bytes, std::align_val_t{alignof(RingHeader)}));
  void* region = mem.get();  // read before the move below: argument evaluation order is unspecified
  init_region(region, bytes, capacity);
  *this = DescriptorRing(region, std::move(mem));
}

DescriptorRing::DescriptorRing(void* region, std::unique_ptr<void, Free> owned)
    : owned_(std::move(owned)),
      header_(static_cast<RingHeader*>(region)),
      slots_(reinterpret_cast<Descriptor*>(static_cast<char*>(region) + header_->slots_offset)),
      capacity_(header_->capacity),
      mask_(header_->capacity - 1) {}

DescriptorRing::DescriptorRing(DescriptorRing&& o) noexcept { *this = std::move(o); }

DescriptorRing& DescriptorRing::operator=(DescriptorRing&& o) noexcept {
  owned_ = std::move(o.owned_);
  header_ = std::exchange(o.header_, nullptr);
  slots_ = std::exchange(o.slots_, nullptr);
  capacity_ = std::exchange(o.capacity_, 0);
  mask_ = std::exchange(o.mask_, 0);
  return *this;
}

DescriptorRing::~DescriptorRing() = default;

uint64_t DescriptorRing::post(const Descriptor& d) {
  const uint64_t ticket = __atomic_fetch_add(&header_->head, 1ULL, __ATOMIC_RELAXED);
  // The slot is free once the consumer has taken ticket - capacity; its acquire pairs with try_pop's release of
  // tail, so our writes below cannot overtake its reads of the previous occupant.
  SpinBackoff backoff;
  while (ticket - load_acquire(&header_->tail) >= capacity_) backoff.pause();
  Descriptor* slot = &slots_[ticket & mask_];
  std::memcpy(reinterpret_cast<char*>(slot) + kBodyOffset, reinterpret_cast<const char*>(&d) + kBodyOffset,
              sizeof(Descriptor) - kBodyOffset);
  __atomic_store_n(&slot->seq, ticket + 1, __ATOMIC_RELEASE);
  __atomic_fetch_add(&header_->doorbell, 1ULL, __ATOMIC_RELEASE);
  return ticket;
}

uint64_t DescriptorRing::issued() const { return load_acquire(&header_->head); }
uint64_t DescriptorRing::completed() const { return load_acquire(&header_->completed); }
uint64_t DescriptorRing::errors() const { return load_acquire(&header_->errors); }
uint64_t DescriptorRing::doorbell() const { return load_acquire(&header_->doorbell); }
uint64_t DescriptorRing::consumed() const { return load_acquire(&header_->tail); }

bool DescriptorRing::quiet(std::chrono::nanoseconds timeout) const {
  const uint64_t target = issued();
  if (completed() >= target) return true;
  const bool bounded = timeout != std::chrono::nanoseconds::max();
  const auto deadline = bounded ? std::chrono::steady_clock::now() + timeout : std::chrono::steady_clock::time_point{};
  SpinBackoff backoff;
  for (uint64_t spins = 1;; ++spins) {
    if (completed() >= target) return true;
    // Reading the clock costs more than a spin; check it every few iterations.
    if (bounded && spins % 64 == 0 && std::chrono::steady_clock::now() >= deadline) return completed() >= target;
    backoff.pause();
  }
}

bool DescriptorRing::try_pop(Descriptor* out) {
  // Only this thread writes tail, so a relaxed read of our own last store is exact.
  const uint64_t ticket = __atomic_load_n(&header_->tail, __ATOMIC_RELAXED);
  const Descriptor* slot = &slots_[ticket & mask_];
  const uint64_t seq = __atomic_load_n(&slot->seq, __ATOMIC_ACQUIRE);
  if (seq != ticket + 1) return false;
  std::memcpy(reinterpret_cast<char*>(out) + kBodyOffset, reinterpret_cast<const char*>(slot) + kBodyOffset,
              sizeof(Descriptor) - kBodyOffset);
  out->seq = seq;
  __atomic_store_n(&header_->tail, ticket + 1, __ATOMIC_RELEASE);
  return true;
}

void DescriptorRing::mark_completed(bool error) {
  // errors first: a quiet() caller that sees the new completed count also sees the error that belongs to it.
  if (error) __atomic_fetch_add(&header_->errors, 1ULL, __ATOMIC_RELEASE);
  __atomic_fetch_add(&header_->completed, 1ULL, __ATOMIC_RELEASE);
}

}  // namespace ifec::endpoint
