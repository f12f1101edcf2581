// Names and messages for WireError.
#include "ifec/common/wire_status.h"

#include <cstdio>

#include "ifec/common/names.h"

namespace ifec::common {

namespace {

constexpr Name<WireError> kWireErrorNames[] = {
    {WireError::kOk, "ok"},
    {WireError::kTruncated, "truncated"},
    {WireError::kOversized, "oversized"},
    {WireError::kBadEtherType, "bad_ethertype"},
    {WireError::kBadIpVersion, "bad_ip_version"},
    {WireError::kBadIpHeaderLength, "bad_ip_header_length"},
    {WireError::kBadIpChecksum, "bad_ip_checksum"},
    {WireError::kBadIpTotalLength, "bad_ip_total_length"},
    {WireError::kIpFragment, "ip_fragment"},
    {WireError::kNotUdp, "not_udp"},
    {WireError::kBadUdpLength, "bad_udp_length"},
    {WireError::kNotRoce, "not_roce"},
    {WireError::kUnknownOpcode, "unknown_opcode"},
    {WireError::kPayloadNotAllowed, "payload_not_allowed"},
    {WireError::kPayloadTooLarge, "payload_too_large"},
    {WireError::kBadPadCount, "bad_pad_count"},
    {WireError::kBadIcrc, "bad_icrc"},
    {WireError::kEchBadVersion, "ech_bad_version"},
    {WireError::kEchBadFormat, "ech_bad_format"},
    {WireError::kEchBadLength, "ech_bad_length"},
    {WireError::kEchBadOperation, "ech_bad_operation"},
    {WireError::kEchBadField, "ech_bad_field"},
    {WireError::kEchPayloadMismatch, "ech_payload_mismatch"},
    {WireError::kBadMacControl, "bad_mac_control"},
};
constexpr Vocabulary kWireErrors("wire error", kWireErrorNames, "unknown");

}  // namespace

const char* wire_error_name(WireError e) { return kWireErrors.name(e); }

std::string WireStatus::message() const {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%s at byte %u (value 0x%llx)", wire_error_name(error), offset,
                static_cast<unsigned long long>(value));
  return buf;
}

}  // namespace ifec::common
