// OpStatus names and HostMemory, the LocalMemory of the CPU backend (addresses are host pointers).
#include "ifec/endpoint/sink.h"

#include <cstring>

#include "ifec/common/names.h"

namespace ifec::endpoint {

namespace {

constexpr common::Name<OpStatus> kOpStatusNames[] = {
    {OpStatus::kPending, "pending"},
    {OpStatus::kOk, "ok"},
    {OpStatus::kRemoteAccessError, "remote_access_error"},
    {OpStatus::kRetryExceeded, "retry_exceeded"},
    {OpStatus::kInvalidArgument, "invalid_argument"},
};
constexpr common::Vocabulary kOpStatuses("operation status", kOpStatusNames);

}  // namespace

const char* op_status_name(OpStatus s) { return kOpStatuses.name(s); }

void HostMemory::read(uint64_t addr, void* dst, size_t len) {
  if (len != 0) std::memcpy(dst, reinterpret_cast<const void*>(static_cast<uintptr_t>(addr)), len);
}

void HostMemory::write(uint64_t addr, const void* src, size_t len) {
  if (len != 0) std::memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(addr)), src, len);
}

}  // namespace ifec::endpoint
