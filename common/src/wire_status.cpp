// Names and messages for WireError.
#include "ifec/common/wire_status.h"

#include <cstdio>

namespace ifec::common {

const char* wire_error_name(WireError e) {
  switch (e) {
    case WireError::kOk:
      return "ok";
    case WireError::kTruncated:
      return "truncated";
    case WireError::kOversized:
      return "oversized";
    case WireError::kBadEtherType:
      return "bad_ethertype";
    case WireError::kBadIpVersion:
      return "bad_ip_version";
    case WireError::kBadIpHeaderLength:
      return "bad_ip_header_length";
    case WireError::kBadIpChecksum:
      return "bad_ip_checksum";
    case WireError::kBadIpTotalLength:
      return "bad_ip_total_length";
    case WireError::kIpFragment:
      return "ip_fragment";
    case WireError::kNotUdp:
      return "not_udp";
    case WireError::kBadUdpLength:
      return "bad_udp_length";
    case WireError::kNotRoce:
      return "not_roce";
    case WireError::kUnknownOpcode:
      return "unknown_opcode";
    case WireError::kPayloadNotAllowed:
      return "payload_not_allowed";
    case WireError::kPayloadTooLarge:
      return "payload_too_large";
    case WireError::kBadPadCount:
      return "bad_pad_count";
    case WireError::kBadIcrc:
      return "bad_icrc";
    case WireError::kEchBadVersion:
      return "ech_bad_version";
    case WireError::kEchBadFormat:
      return "ech_bad_format";
    case WireError::kEchBadLength:
      return "ech_bad_length";
    case WireError::kEchBadOperation:
      return "ech_bad_operation";
    case WireError::kEchBadField:
      return "ech_bad_field";
    case WireError::kEchPayloadMismatch:
      return "ech_payload_mismatch";
    case WireError::kBadMacControl:
      return "bad_mac_control";
  }
  return "unknown";
}

std::string WireStatus::message() const {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%s at byte %u (value 0x%llx)", wire_error_name(error), offset,
                static_cast<unsigned long long>(value));
  return buf;
}

}  // namespace ifec::common
