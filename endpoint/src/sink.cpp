// OpStatus names and HostMemory, the LocalMemory of the CPU backend (addresses are host pointers).
#include "ifec/endpoint/sink.h"

#include <cstring>

namespace ifec::endpoint {

const char* op_status_name(OpStatus s) {
  switch (s) {
    case OpStatus::kPending:
      return "pending";
    case OpStatus::kOk:
      return "ok";
    case OpStatus::kRemoteAccessError:
      return "remote_access_error";
    case OpStatus::kRetryExceeded:
      return "retry_exceeded";
    case OpStatus::kInvalidArgument:
      return "invalid_argument";
  }
  return "?";
}

void HostMemory::read(uint64_t addr, void* dst, size_t len) {
  if (len != 0) std::memcpy(dst, reinterpret_cast<const void*>(static_cast<uintptr_t>(addr)), len);
}

void HostMemory::write(uint64_t addr, const void* src, size_t len) {
  if (len != 0) std::memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(addr)), src, len);
}

}  // namespace ifec::endpoint
