// Status codes for frame decoding: the hot path returns these instead of throwing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ifec::common {

enum class WireError : uint8_t {
  kOk = 0,
  kTruncated,     // buffer ends inside a header
  kOversized,     // frame longer than the configured maximum
  kBadEtherType,  // not IPv4
  kBadIpVersion,
  kBadIpHeaderLength,  // IHL < 5 or past the buffer
  kBadIpChecksum,
  kBadIpTotalLength,  // total length disagrees with the buffer
  kIpFragment,        // RoCEv2 is never fragmented
  kNotUdp,
  kBadUdpLength,
  kNotRoce,  // UDP destination port is neither 4791 nor the ECH port
  kUnknownOpcode,
  kPayloadNotAllowed,  // payload bytes on an opcode that carries none
  kPayloadTooLarge,    // payload above the configured path MTU
  kBadPadCount,        // pad count exceeds the bytes after the headers
  kBadIcrc,
  kEchBadVersion,
  kEchBadFormat,
  kEchBadLength,
  kEchBadOperation,
  kEchBadField,         // enum out of range, reserved bits set, empty bitmap
  kEchPayloadMismatch,  // element count x dtype size != payload length
  kBadMacControl,       // MAC control frame that is not a well-formed PFC frame
};

const char* wire_error_name(WireError e);

// A decode result: the error, the byte offset where it was found and the offending value.
struct WireStatus {
  WireError error = WireError::kOk;
  uint32_t offset = 0;
  uint64_t value = 0;

  bool ok() const { return error == WireError::kOk; }
  static WireStatus fail(WireError e, size_t offset, uint64_t value = 0) {
    return WireStatus{e, static_cast<uint32_t>(offset), value};
  }
  // "kBadIpChecksum at byte 24 (value 0x1a2b)"
  std::string message() const;
};

}  // namespace ifec::common
