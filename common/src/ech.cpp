// ECH v1 encode/decode with full validation (docs/ech-v1.md is the byte-level contract).
#include "ifec/common/ech.h"

#include "ifec/common/byte_order.h"
#include "ifec/common/names.h"

namespace ifec::common {

namespace {

constexpr Name<EchOp> kEchOpNames[] = {
    {EchOp::kMulticast, "multicast"},
    {EchOp::kReduce, "reduce"},
    {EchOp::kAllReduce, "allreduce"},
    {EchOp::kBarrier, "barrier"},
};
constexpr Vocabulary kEchOps("ECH operation", kEchOpNames, "unknown");

// In the order reports and errors list them; "float" and "half" as C and PyTorch spell them.
constexpr Name<EchDtype> kEchDtypeNames[] = {
    {EchDtype::kFp32, "fp32"},   {EchDtype::kBf16, "bf16"},  {EchDtype::kFp16, "fp16"},
    {EchDtype::kInt32, "int32"}, {EchDtype::kFp32, "float"}, {EchDtype::kFp16, "half"},
};
constexpr Vocabulary kEchDtypes("dtype", kEchDtypeNames, "unknown");

constexpr Name<EchRedOp> kEchRedOpNames[] = {
    {EchRedOp::kSum, "sum"},
    {EchRedOp::kMin, "min"},
    {EchRedOp::kMax, "max"},
};
constexpr Vocabulary kEchRedOps("reduction op", kEchRedOpNames, "unknown");

}  // namespace

const char* ech_op_name(EchOp op) { return kEchOps.name(op); }
const char* ech_dtype_name(EchDtype dtype) { return kEchDtypes.name(dtype); }
const char* ech_redop_name(EchRedOp op) { return kEchRedOps.name(op); }
EchDtype parse_ech_dtype(std::string_view text) { return kEchDtypes.parse(text); }
EchRedOp parse_ech_redop(std::string_view text) { return kEchRedOps.parse(text); }

size_t ech_dtype_size(EchDtype dtype) {
  switch (dtype) {
    case EchDtype::kFp32:
    case EchDtype::kInt32:
      return 4;
    case EchDtype::kFp16:
    case EchDtype::kBf16:
      return 2;
  }
  return 0;
}

void Ech::encode(uint8_t* out) const {
  out[0] = static_cast<uint8_t>(((compact_v2() ? kEchVersion2 : kEchVersion) << 4) | static_cast<uint8_t>(format));
  out[1] = static_cast<uint8_t>(op);
  out[2] = flags & ech_flags::kDefined;
  out[3] = static_cast<uint8_t>(size() / 4);
  if (format == EchFormat::kCompact) {
    store_be16(out + 4, source_id);
    store_be16(out + 6, window_id);
    if (compact_v2()) {
      store_be16(out + 8, bitmap_base);
      store_be16(out + 10, 0);
      store_be64(out + 12, dest_bitmap);
    } else {
      store_be64(out + 8, dest_bitmap);
    }
    return;
  }
  store_be32(out + 4, job_id);
  store_be16(out + 8, group_id);
  store_be16(out + 10, contributor_id);
  store_be32(out + 12, chunk_index);
  out[16] = static_cast<uint8_t>((static_cast<uint8_t>(dtype) << 4) | static_cast<uint8_t>(redop));
  out[17] = expected;
  store_be16(out + 18, element_count);
  store_be16(out + 20, window_id);
  store_be16(out + 22, 0);
}

// The compact header's fields (v1: 16 bytes; v2: 20, with a bitmap base), `e` holding the common prefix.
// Every header has one encoding: a v2 header that v1 could carry is refused, as is a bitmap past endpoint 65535.
WireStatus Ech::decode_compact(const uint8_t* in, uint8_t version, Ech e, Ech* out) {
  e.source_id = load_be16(in + 4);
  e.window_id = load_be16(in + 6);
  const size_t bitmap_at = version == kEchVersion2 ? 12 : 8;
  if (version == kEchVersion2) {
    e.bitmap_base = load_be16(in + 8);
    if (load_be16(in + 10) != 0) {
      return WireStatus::fail(WireError::kEchBadField, 10, load_be16(in + 10));
    }
  }
  e.dest_bitmap = load_be64(in + bitmap_at);
  if (version == kEchVersion && e.source_id >= 64) {
    return WireStatus::fail(WireError::kEchBadField, 4, e.source_id);
  }
  if (version == kEchVersion2 && !e.compact_v2()) {
    return WireStatus::fail(WireError::kEchBadField, 8, e.bitmap_base);  // v1's header, sent as v2
  }
  if (e.dest_bitmap == 0) {
    return WireStatus::fail(WireError::kEchBadField, bitmap_at, 0);
  }
  if (e.bitmap_base + (63 - __builtin_clzll(e.dest_bitmap)) > 0xFFFF) {
    return WireStatus::fail(WireError::kEchBadField, 8, e.bitmap_base);
  }
  *out = e;
  return {};
}

WireStatus Ech::decode(const uint8_t* in, size_t len, Ech* out) {
  if (len < kCommonSize) {
    return WireStatus::fail(WireError::kTruncated, 0, len);
  }
  const uint8_t version = in[0] >> 4;
  if (version != kEchVersion && version != kEchVersion2) {
    return WireStatus::fail(WireError::kEchBadVersion, 0, version);
  }
  const uint8_t format = in[0] & 0xF;
  if (format > static_cast<uint8_t>(EchFormat::kStandard) ||
      (version == kEchVersion2 && format != static_cast<uint8_t>(EchFormat::kCompact))) {
    return WireStatus::fail(WireError::kEchBadFormat, 0, format);  // v2 defines the compact header only
  }
  Ech e;
  e.format = static_cast<EchFormat>(format);
  const size_t declared = size_t{in[3]} * 4;
  const size_t expected_size = version == kEchVersion2 ? kCompactV2Size : e.size();
  if (declared != expected_size) {
    return WireStatus::fail(WireError::kEchBadLength, 3, in[3]);
  }
  if (len < declared) {
    return WireStatus::fail(WireError::kTruncated, len, declared);
  }
  const uint8_t op = in[1];
  const bool op_known = op >= static_cast<uint8_t>(EchOp::kMulticast) && op <= static_cast<uint8_t>(EchOp::kBarrier);
  if (!op_known || (e.format == EchFormat::kCompact && op != static_cast<uint8_t>(EchOp::kMulticast))) {
    return WireStatus::fail(WireError::kEchBadOperation, 1, op);
  }
  e.op = static_cast<EchOp>(op);
  if (in[2] & ~ech_flags::kDefined) {
    return WireStatus::fail(WireError::kEchBadField, 2, in[2]);
  }
  e.flags = in[2];
  if (e.format == EchFormat::kCompact) {
    return decode_compact(in, version, e, out);
  }
  e.job_id = load_be32(in + 4);
  e.group_id = load_be16(in + 8);
  e.contributor_id = load_be16(in + 10);
  e.chunk_index = load_be32(in + 12);
  const uint8_t dtype = in[16] >> 4;
  const uint8_t redop = in[16] & 0xF;
  if (dtype > static_cast<uint8_t>(EchDtype::kInt32)) {
    return WireStatus::fail(WireError::kEchBadField, 16, dtype);
  }
  if (redop > static_cast<uint8_t>(EchRedOp::kMax)) {
    return WireStatus::fail(WireError::kEchBadField, 16, redop);
  }
  e.expected = in[17];  // 1..255, 0: every member (a group has at most kMaxGroupMembers = 256)
  e.dtype = static_cast<EchDtype>(dtype);
  e.redop = static_cast<EchRedOp>(redop);
  e.element_count = load_be16(in + 18);
  e.window_id = load_be16(in + 20);
  if (load_be16(in + 22) != 0) {
    return WireStatus::fail(WireError::kEchBadField, 22, load_be16(in + 22));
  }
  if (e.op == EchOp::kBarrier && e.element_count != 0) {
    return WireStatus::fail(WireError::kEchBadField, 18, e.element_count);
  }
  *out = e;
  return {};
}

}  // namespace ifec::common
