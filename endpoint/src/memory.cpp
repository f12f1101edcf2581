// Window registration and the rkey / bounds / job check.
#include "ifec/endpoint/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ifec/common/checks.h"
#include "ifec/common/names.h"

namespace ifec::endpoint {

namespace {

constexpr common::Name<AccessError> kAccessErrorNames[] = {
    {AccessError::kOk, "ok"},
    {AccessError::kBadRkey, "bad_rkey"},
    {AccessError::kOutOfBounds, "out_of_bounds"},
    {AccessError::kWrongJob, "wrong_job"},
    {AccessError::kMisaligned, "misaligned"},
};
constexpr common::Vocabulary kAccessErrors("access error", kAccessErrorNames);

// Zeroes the first `size` bytes of a kept mapping: the pages in memory by writing (they are warm), the others by
// dropping them (MADV_DONTNEED: zero when next touched, whatever swap held), so the parts of a sparse window its
// last user never touched are not faulted in now.
void zero_reused(uint8_t* p, uint64_t size) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t pages = (size + page - 1) / page;
  std::vector<unsigned char> in(pages);
  if (mincore(p, size, in.data()) != 0) {
    std::memset(p, 0, size);
    return;
  }
  for (size_t i = 0; i < pages;) {
    const bool resident = in[i] & 1;
    size_t j = i;
    while (j < pages && (in[j] & 1) == resident) {
      ++j;
    }
    const uint64_t from = i * page, to = std::min<uint64_t>(size, j * page);
    if (resident) {
      std::memset(p + from, 0, to - from);
    } else {
      madvise(p + from, j * page - from, MADV_DONTNEED);
    }
    i = j;
  }
}

}  // namespace

const char* access_error_name(AccessError e) { return kAccessErrors.name(e); }

const WindowInfo& SymmetricMemory::register_window(uint16_t id, void* data, uint64_t size, uint32_t job) {
  IFEC_CHECK(windows_.count(id) == 0, "endpoint " << endpoint_ << ": window " << id << " is already registered");
  IFEC_CHECK(data != nullptr, "endpoint " << endpoint_ << ": window " << id << " has no memory");
  IFEC_CHECK(size > 0 && size <= (uint64_t{1} << kWindowVaShift),
             "endpoint " << endpoint_ << ": window " << id << " size " << size << " outside 1.." << (1ULL << 36));
  IFEC_CHECK(job <= common::kMaxJob, "endpoint " << endpoint_ << ": job " << job << " does not fit the 15-bit P_Key");
  WindowInfo w;
  w.id = id;
  w.va = window_va(id);
  w.size = size;
  w.rkey = window_rkey(endpoint_, id);
  w.job = job;
  w.data = static_cast<uint8_t*>(data);
  by_rkey_[w.rkey] = id;
  return windows_[id] = w;
}

const WindowInfo& SymmetricMemory::allocate_window(uint16_t id, uint64_t size, uint32_t job) {
  IFEC_CHECK(size > 0 && size <= (uint64_t{1} << 32),
             "endpoint " << endpoint_ << ": allocated window size " << size << " outside 1..4 GiB");
  IFEC_CHECK(windows_.count(id) == 0, "endpoint " << endpoint_ << ": window " << id << " is already registered");
  std::unique_ptr<uint8_t, Unmap> m = take_spare(size);
  if (m) {
    zero_reused(m.get(), size);
    ++reused_;
  } else {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    IFEC_CHECK(p != MAP_FAILED,
               "endpoint " << endpoint_ << ": window " << id << " of " << size << " bytes: " << std::strerror(errno));
    m = std::unique_ptr<uint8_t, Unmap>(static_cast<uint8_t*>(p), Unmap{size});
  }
  uint8_t* data = m.get();
  owned_.emplace(id, std::move(m));
  return register_window(id, data, size, job);
}

void SymmetricMemory::Unmap::operator()(uint8_t* p) const { munmap(p, size); }

std::unique_ptr<uint8_t, SymmetricMemory::Unmap> SymmetricMemory::take_spare(uint64_t size) {
  size_t best = spare_.size();
  for (size_t i = 0; i < spare_.size(); ++i) {
    const uint64_t have = spare_[i].get_deleter().size;
    if (have >= size && have / 2 <= size && (best == spare_.size() || have < spare_[best].get_deleter().size)) {
      best = i;
    }
  }
  if (best == spare_.size()) {
    return nullptr;
  }
  std::unique_ptr<uint8_t, Unmap> m = std::move(spare_[best]);
  spare_.erase(spare_.begin() + static_cast<long>(best));
  spare_bytes_ -= m.get_deleter().size;
  return m;
}

void SymmetricMemory::keep_freed_windows(uint64_t bytes) {
  spare_limit_ = bytes;
  while (spare_bytes_ > spare_limit_) {
    spare_bytes_ -= spare_.front().get_deleter().size;
    spare_.erase(spare_.begin());
  }
}

void SymmetricMemory::free_window(uint16_t id) {
  auto it = windows_.find(id);
  IFEC_CHECK(it != windows_.end(), "endpoint " << endpoint_ << ": no window " << id << " to free");
  by_rkey_.erase(it->second.rkey);
  windows_.erase(it);
  auto own = owned_.find(id);
  if (own == owned_.end()) {
    return;
  }
  std::unique_ptr<uint8_t, Unmap> m = std::move(own->second);
  owned_.erase(own);
  const uint64_t size = m.get_deleter().size;
  if (size > spare_limit_) {
    return;  // unmapped here
  }
  spare_bytes_ += size;
  spare_.push_back(std::move(m));
  keep_freed_windows(spare_limit_);  // the oldest go while over the limit
}

const WindowInfo* SymmetricMemory::window(uint16_t id) const {
  auto it = windows_.find(id);
  return it == windows_.end() ? nullptr : &it->second;
}

AccessError SymmetricMemory::check(uint32_t rkey, uint64_t va, uint64_t len, uint32_t job, bool atomic) const {
  auto it = by_rkey_.find(rkey);
  if (it == by_rkey_.end()) {
    return AccessError::kBadRkey;
  }
  const WindowInfo& w = windows_.at(it->second);
  if (w.job != job) {
    return AccessError::kWrongJob;
  }
  if (va < w.va || len > w.size || va - w.va > w.size - len) {
    return AccessError::kOutOfBounds;
  }
  if (atomic && ((va & 7) != 0 || len != 8)) {
    return AccessError::kMisaligned;
  }
  return AccessError::kOk;
}

int SymmetricMemory::window_of_rkey(uint32_t rkey) const {
  auto it = by_rkey_.find(rkey);
  return it == by_rkey_.end() ? -1 : it->second;
}

uint8_t* SymmetricMemory::translate(uint32_t rkey, uint64_t va) const {
  const WindowInfo& w = windows_.at(by_rkey_.at(rkey));
  return w.data + (va - w.va);
}

}  // namespace ifec::endpoint
