// fp16 / bf16 / FP8 E4M3 conversions and element-wise reductions.
#include "ifec/common/numeric.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ifec::common {

namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

float fp16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t{static_cast<uint32_t>(h >> 15)} << 31;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) {
    return from_bits(sign | 0x7F800000u | (mant << 13));  // Inf / NaN
  }
  if (exp == 0) {
    if (mant == 0) {
      return from_bits(sign);
    }
    // Subnormal: normalize.
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while ((mant & 0x400) == 0);
    mant &= 0x3FF;
    return from_bits(sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant << 13));
  }
  return from_bits(sign | (exp + 127 - 15) << 23 | (mant << 13));
}

uint16_t float_to_fp16(float f) {
  const uint32_t u = bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint32_t exp = (u >> 23) & 0xFF;
  uint32_t mant = u & 0x7FFFFF;
  if (exp == 0xFF) {
    return static_cast<uint16_t>(sign | 0x7C00 | (mant ? 0x200 | (mant >> 13) : 0));
  }
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 0x1F) {
    return static_cast<uint16_t>(sign | 0x7C00);  // overflow to Inf
  }
  if (e <= 0) {
    if (e < -10) {
      return sign;  // underflow to zero
    }
    mant |= 0x800000;
    const int shift = 14 - e;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1))) {
      ++half;
    }
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) {
    ++half;  // may carry into the exponent, up to Inf: correct rounding
  }
  return static_cast<uint16_t>(sign | half);
}

float bf16_to_float(uint16_t b) { return from_bits(uint32_t{b} << 16); }

uint16_t float_to_bf16(float f) {
  const uint32_t u = bits(f);
  if ((u & 0x7FFFFFFF) > 0x7F800000) {
    return static_cast<uint16_t>((u >> 16) | 0x40);  // keep NaN a (quiet) NaN
  }
  const uint32_t rounding = 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float fp8_e4m3_to_float(uint8_t b) {
  const int exp = (b >> 3) & 0xF;
  const int mant = b & 7;
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  if (exp == 0xF && mant == 7) {
    return std::numeric_limits<float>::quiet_NaN();
  }
  // Subnormals: m/8 x 2^-6; normals: (8 + m)/8 x 2^(exp - 7).
  return sign *
         (exp == 0 ? std::ldexp(static_cast<float>(mant), -9) : std::ldexp(static_cast<float>(8 + mant), exp - 10));
}

uint8_t float_to_fp8_e4m3(float f) {
  const auto sign = static_cast<uint8_t>((bits(f) >> 24) & 0x80);
  if (std::isnan(f)) {
    return static_cast<uint8_t>(sign | 0x7F);
  }
  const float a = std::fabs(f);
  if (a >= kFp8E4m3Max) {
    return static_cast<uint8_t>(sign | 0x7E);
  }
  if (a < std::ldexp(1.0f, -6)) {
    // Subnormal range, quantum 2^-9 (exact scaling; nearbyint rounds half to even). 8 quanta is the smallest
    // normal, whose code is 8 as well.
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(std::nearbyint(std::ldexp(a, 9))));
  }
  int e = 0;
  std::frexp(a, &e);  // a = [0.5, 1) x 2^e, so a = 1.m x 2^(e - 1)
  int exp = e - 1;
  auto q = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - exp)));  // 8..16 eighths
  if (q == 16) {
    q = 8;
    ++exp;
  }
  const int code = ((exp + 7) << 3) | (q - 8);
  return static_cast<uint8_t>(sign | std::min(code, 0x7E));  // 480 would be the NaN code: saturate to 448
}

Acc load_element(EchDtype t, const uint8_t* data, size_t i) {
  Acc a{};
  switch (t) {
    case EchDtype::kFp32:
      std::memcpy(&a.f, data + 4 * i, 4);
      break;
    case EchDtype::kInt32:
      std::memcpy(&a.i, data + 4 * i, 4);
      break;
    case EchDtype::kFp16: {
      uint16_t h;
      std::memcpy(&h, data + 2 * i, 2);
      a.f = fp16_to_float(h);
      break;
    }
    case EchDtype::kBf16: {
      uint16_t h;
      std::memcpy(&h, data + 2 * i, 2);
      a.f = bf16_to_float(h);
      break;
    }
  }
  return a;
}

// Cloned for AVX-512 where the CPU has it (whole-buffer checks widen 64 x 64 MiB): exact conversions either way.
IFEC_AVX512_CLONES void load_elements(EchDtype t, const uint8_t* data, size_t count, double* out) {
  switch (t) {
    case EchDtype::kFp32:
      for (size_t i = 0; i < count; ++i) {
        float f;
        std::memcpy(&f, data + 4 * i, 4);
        out[i] = f;
      }
      return;
    case EchDtype::kInt32:
      for (size_t i = 0; i < count; ++i) {
        int32_t v;
        std::memcpy(&v, data + 4 * i, 4);
        out[i] = v;
      }
      return;
    case EchDtype::kFp16:
    case EchDtype::kBf16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, data + 2 * i, 2);
        out[i] = t == EchDtype::kFp16 ? fp16_to_float(h) : bf16_to_float(h);
      }
      return;
  }
}

void store_element(EchDtype t, Acc v, uint8_t* data, size_t i) {
  switch (t) {
    case EchDtype::kFp32:
      std::memcpy(data + 4 * i, &v.f, 4);
      break;
    case EchDtype::kInt32:
      std::memcpy(data + 4 * i, &v.i, 4);
      break;
    case EchDtype::kFp16: {
      const uint16_t h = float_to_fp16(v.f);
      std::memcpy(data + 2 * i, &h, 2);
      break;
    }
    case EchDtype::kBf16: {
      const uint16_t h = float_to_bf16(v.f);
      std::memcpy(data + 2 * i, &h, 2);
      break;
    }
  }
}

Acc combine(EchDtype t, EchRedOp op, Acc a, Acc b) {
  Acc r{};
  if (t == EchDtype::kInt32) {
    switch (op) {
      case EchRedOp::kSum:
        // Two's-complement wrap-around, as numpy's int32 sum does.
        r.i = static_cast<int32_t>(static_cast<uint32_t>(a.i) + static_cast<uint32_t>(b.i));
        break;
      case EchRedOp::kMin:
        r.i = a.i < b.i ? a.i : b.i;
        break;
      case EchRedOp::kMax:
        r.i = a.i > b.i ? a.i : b.i;
        break;
    }
    return r;
  }
  switch (op) {
    case EchRedOp::kSum:
      r.f = a.f + b.f;
      break;
    case EchRedOp::kMin:
      r.f = std::isnan(a.f) || std::isnan(b.f) ? NAN : (a.f < b.f ? a.f : b.f);
      break;
    case EchRedOp::kMax:
      r.f = std::isnan(a.f) || std::isnan(b.f) ? NAN : (a.f > b.f ? a.f : b.f);
      break;
  }
  return r;
}

void accumulate(EchDtype t, EchRedOp op, Acc* acc, const uint8_t* src, size_t n, bool first) {
  static_assert(sizeof(Acc) == 4, "an accumulator lane holds one fp32 or int32");
  // The common cases in loops the compiler vectorizes (the same additions, in the same order).
  if (n == 0) {
    return;  // (and no null pointer reaches memcpy)
  }
  if (first && (t == EchDtype::kFp32 || t == EchDtype::kInt32)) {
    std::memcpy(acc, src, 4 * n);
    return;
  }
  if (t == EchDtype::kFp32 && op == EchRedOp::kSum) {
    for (size_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, src + 4 * i, 4);
      acc[i].f += v;
    }
    return;
  }
  if (t == EchDtype::kBf16 && op == EchRedOp::kSum) {
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      const float v = from_bits(uint32_t{h} << 16);
      acc[i].f = first ? v : acc[i].f + v;
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const Acc v = load_element(t, src, i);
    acc[i] = first ? v : combine(t, op, acc[i], v);
  }
}

void finalize(EchDtype t, const Acc* acc, uint8_t* dst, size_t n) {
  if (n > 0 && (t == EchDtype::kFp32 || t == EchDtype::kInt32)) {
    std::memcpy(dst, acc, 4 * n);
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    store_element(t, acc[i], dst, i);
  }
}

void reduce_into(EchDtype t, EchRedOp op, uint8_t* dst, const uint8_t* src, size_t n) {
  if (t == EchDtype::kFp32 && op == EchRedOp::kSum) {
    for (size_t i = 0; i < n; ++i) {  // the common case, in a loop the compiler vectorizes: the same additions
      float a;
      float b;
      std::memcpy(&a, dst + 4 * i, 4);
      std::memcpy(&b, src + 4 * i, 4);
      a += b;
      std::memcpy(dst + 4 * i, &a, 4);
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    store_element(t, combine(t, op, load_element(t, dst, i), load_element(t, src, i)), dst, i);
  }
}

size_t count_non_finite(EchDtype t, const uint8_t* data, size_t n) {
  // All exponent bits set: Inf or NaN. Tested on the bits, in loops the compiler vectorizes.
  size_t bad = 0;
  switch (t) {
    case EchDtype::kInt32:
      return 0;
    case EchDtype::kFp32:
      for (size_t i = 0; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, data + 4 * i, 4);
        bad += (u & 0x7F800000u) == 0x7F800000u;
      }
      return bad;
    case EchDtype::kFp16:
    case EchDtype::kBf16: {
      const uint16_t exp = t == EchDtype::kFp16 ? 0x7C00 : 0x7F80;
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, data + 2 * i, 2);
        bad += (h & exp) == exp;
      }
      return bad;
    }
  }
  return bad;
}

}  // namespace ifec::common
