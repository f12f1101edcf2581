// HostRing (host_ring.h): hostd's descriptor ring and data area in POSIX shared memory.
#include "ifec/live/host_ring.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <thread>

#include "ifec/common/checks.h"

namespace ifec::live {

namespace {

constexpr char kMagic[8] = {'I', 'F', 'E', 'C', 'R', 'N', 'G', '1'};

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::string shm_name(const std::string& node) { return "/ifec-ring-" + node; }

// Maps the region; the fd stays open (the owner's lock lives on it), closed here only on failure.
uint8_t* map_fd(int fd, size_t bytes, const std::string& path) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  if (p == MAP_FAILED) {
    close(fd);
  }
  IFEC_CHECK(p != MAP_FAILED, path << ": mmap of " << bytes << " B failed: " << std::strerror(err));
  return static_cast<uint8_t*>(p);
}

// A region whose owner's lock is still held belongs to a running hostd of the same node: taking it over would
// unlink the ring that hostd's local programs post into.
void refuse_live_owner(const std::string& node, const std::string& path) {
  const int fd = shm_open(shm_name(node).c_str(), O_RDONLY, 0);
  if (fd < 0) {
    return;
  }
  const bool held = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  int32_t pid = 0;
  struct stat st {};
  if (held && fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= sizeof(HostRingInfo)) {
    const ssize_t n = pread(fd, &pid, sizeof pid, offsetof(HostRingInfo, owner_pid));
    pid = n == static_cast<ssize_t>(sizeof pid) ? pid : 0;
  }
  close(fd);  // drops the shared lock, if it was taken
  IFEC_CHECK(!held, path << ": node " << node << "'s ring belongs to a running ifec-hostd (pid " << pid
                         << "): one hostd per node");
}

}  // namespace

std::string host_ring_path(const std::string& node) { return "/dev/shm" + shm_name(node); }

HostRing::HostRing(int fd, uint8_t* base, size_t bytes, bool owner, std::string path)
    : fd_(fd),
      base_(base),
      bytes_(bytes),
      owner_(owner),
      path_(std::move(path)),
      info_(reinterpret_cast<HostRingInfo*>(base)),
      ring_(endpoint::DescriptorRing::view(base + info_->ring_offset)) {}

HostRing::~HostRing() {
  munmap(base_, bytes_);
  if (owner_) {
    shm_unlink(path_.substr(std::string("/dev/shm").size()).c_str());
  }
  close(fd_);
}

std::unique_ptr<HostRing> HostRing::create(const std::string& node, uint32_t gpu, uint32_t ranks, size_t capacity,
                                           size_t data_bytes, uint64_t window_bytes) {
  const std::string path = host_ring_path(node);
  const uint64_t ring_offset = align_up(sizeof(HostRingInfo), 64);
  const uint64_t data_offset = align_up(ring_offset + endpoint::DescriptorRing::region_bytes(capacity), 4096);
  const uint64_t bytes = data_offset + align_up(data_bytes, 4096);
  refuse_live_owner(node, path);
  shm_unlink(shm_name(node).c_str());  // a stale region of a daemon that died
  const int fd = shm_open(shm_name(node).c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  IFEC_CHECK(fd >= 0, path << ": cannot create the descriptor ring: " << std::strerror(errno));
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    close(fd);
    shm_unlink(shm_name(node).c_str());
    IFEC_FAIL(path << ": cannot size the descriptor ring to " << bytes << " B: " << std::strerror(err));
  }
  // The owner's lock: held while hostd lives (the kernel drops it with the process, zombie or not).
  flock(fd, LOCK_EX);
  uint8_t* base = map_fd(fd, bytes, path);
  auto* info = reinterpret_cast<HostRingInfo*>(base);
  std::memset(info, 0, sizeof *info);
  std::memcpy(info->magic, kMagic, sizeof kMagic);
  info->gpu = gpu;
  info->ranks = ranks;
  info->ring_offset = ring_offset;
  info->ring_capacity = capacity;
  info->data_offset = data_offset;
  info->data_bytes = align_up(data_bytes, 4096);
  info->window = kHostRingWindow;
  info->window_bytes = window_bytes;
  info->owner_pid = static_cast<int32_t>(getpid());
  endpoint::DescriptorRing::init_region(base + ring_offset, data_offset - ring_offset, capacity);
  return std::unique_ptr<HostRing>(new HostRing(fd, base, bytes, true, path));
}

std::unique_ptr<HostRing> HostRing::open(const std::string& node) {
  const std::string path = host_ring_path(node);
  const int fd = shm_open(shm_name(node).c_str(), O_RDWR, 0);
  IFEC_CHECK(fd >= 0, path << ": no descriptor ring of hostd '" << node << "': " << std::strerror(errno)
                           << " (is its ifec-hostd running on this machine?)");
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(HostRingInfo)) {
    close(fd);
    IFEC_FAIL(path << ": too short to be a descriptor ring");
  }
  uint8_t* base = map_fd(fd, static_cast<size_t>(st.st_size), path);
  const auto* info = reinterpret_cast<const HostRingInfo*>(base);
  const bool ok = std::memcmp(info->magic, kMagic, sizeof kMagic) == 0 &&
                  info->data_offset + info->data_bytes <= static_cast<uint64_t>(st.st_size) &&
                  info->ring_offset < info->data_offset;
  if (!ok) {
    munmap(base, static_cast<size_t>(st.st_size));
    close(fd);
    IFEC_FAIL(path << ": not a version-1 ifec descriptor ring");
  }
  std::unique_ptr<HostRing> ring(new HostRing(fd, base, static_cast<size_t>(st.st_size), false, path));
  IFEC_CHECK(ring->owner_alive(),
             path << ": a stale ring: the ifec-hostd that made it (pid " << info->owner_pid << ") is not running");
  return ring;
}

bool HostRing::owner_alive() const {
  if (owner_) {
    return true;
  }
  // Anyone may take a shared lock only once the owner's exclusive one is gone.
  if (flock(fd_, LOCK_SH | LOCK_NB) == 0) {
    flock(fd_, LOCK_UN);
    return false;
  }
  return errno == EWOULDBLOCK;
}

void HostRing::post(const endpoint::Descriptor& d) {
  for (int waits = 0; ring_.issued() - ring_.consumed() >= ring_.capacity(); ++waits) {
    IFEC_CHECK(waits % 200 != 199 || owner_alive(),
               path_ << ": its ifec-hostd (pid " << info_->owner_pid << ") stopped with the ring full");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ring_.post(d);
}

bool HostRing::quiet(std::chrono::nanoseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (ring_.quiet(std::min<std::chrono::nanoseconds>(left, std::chrono::milliseconds(200)))) {
      return true;
    }
    IFEC_CHECK(owner_alive(), path_ << ": its ifec-hostd (pid " << info_->owner_pid << ") stopped with "
                                    << ring_.issued() - ring_.completed() << " descriptors not completed");
    if (std::chrono::steady_clock::now() >= deadline) {
      return false;
    }
  }
}

void RingDataMemory::read(uint64_t addr, void* dst, size_t len) {
  IFEC_CHECK(valid(addr, len), "ring data [" << addr << ", +" << len << ") outside its " << bytes_ << " B");
  std::memcpy(dst, data_ + addr, len);
}

void RingDataMemory::write(uint64_t addr, const void* src, size_t len) {
  IFEC_CHECK(valid(addr, len), "ring data [" << addr << ", +" << len << ") outside its " << bytes_ << " B");
  std::memcpy(data_ + addr, src, len);
}

}  // namespace ifec::live
