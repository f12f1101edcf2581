// fp16 / bf16 conversions against known encodings and exhaustive round trips; reductions per dtype and op.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ifec/common/numeric.h"

using namespace ifec::common;

TEST(Fp16, KnownEncodings) {
  EXPECT_EQ(float_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(float_to_fp16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7BFF) << "largest finite half";
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7C00) << "rounds up to Inf";
  EXPECT_EQ(float_to_fp16(5.9604645e-8f), 0x0001) << "smallest subnormal";
  EXPECT_EQ(float_to_fp16(1.0f + 1.0f / 2048), 0x3C00) << "halfway rounds to even";
  EXPECT_EQ(float_to_fp16(1.0f + 3.0f / 2048), 0x3C02) << "halfway rounds to even (up)";
  EXPECT_FLOAT_EQ(fp16_to_float(0x3555), 0.333251953125f);
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(NAN))));
}

TEST(Fp16, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      continue;
    }
    EXPECT_EQ(float_to_fp16(f), h) << std::hex << h;
  }
}

TEST(Bf16, KnownEncodingsAndRoundTrips) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(-1.5f), 0xBFC0);
  EXPECT_EQ(float_to_bf16(1.00390625f), 0x3F80) << "halfway rounds to even";
  EXPECT_EQ(float_to_bf16(1.01171875f), 0x3F82) << "halfway rounds to even (up)";
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = bf16_to_float(static_cast<uint16_t>(b));
    if (!std::isnan(f)) {
      EXPECT_EQ(float_to_bf16(f), b) << std::hex << b;
    }
  }
}

// E4M3 by its definition (OCP FP8): the value of every code, computed without the conversion under test.
double e4m3_value(int code) {
  const int exp = (code >> 3) & 0xF;
  const int mant = code & 7;
  const double mag = exp == 0 ? mant / 8.0 * std::pow(2.0, -6) : (1 + mant / 8.0) * std::pow(2.0, exp - 7);
  return (code & 0x80) ? -mag : mag;
}

TEST(Fp8E4m3, KnownEncodings) {
  EXPECT_EQ(float_to_fp8_e4m3(1.0f), 0x38);
  EXPECT_EQ(float_to_fp8_e4m3(-2.0f), 0xC0);
  EXPECT_EQ(float_to_fp8_e4m3(448.0f), 0x7E) << "largest finite";
  EXPECT_EQ(float_to_fp8_e4m3(1e6f), 0x7E) << "saturates";
  EXPECT_EQ(float_to_fp8_e4m3(-INFINITY), 0xFE) << "saturates";
  EXPECT_EQ(float_to_fp8_e4m3(0.001953125f), 0x01) << "smallest subnormal, 2^-9";
  EXPECT_EQ(float_to_fp8_e4m3(1.0625f), 0x38) << "halfway rounds to even";
  EXPECT_EQ(float_to_fp8_e4m3(1.1875f), 0x3A) << "halfway rounds to even (up)";
  EXPECT_FLOAT_EQ(fp8_e4m3_to_float(0x3B), 1.375f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(float_to_fp8_e4m3(NAN))));
}

TEST(Fp8E4m3, EveryCodeDecodesByDefinitionAndRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) {
      continue;  // NaN
    }
    EXPECT_EQ(static_cast<double>(fp8_e4m3_to_float(static_cast<uint8_t>(c))), e4m3_value(c)) << std::hex << c;
    if (c != 0x80) {  // -0 encodes as itself too, but compares equal to +0 above
      EXPECT_EQ(float_to_fp8_e4m3(fp8_e4m3_to_float(static_cast<uint8_t>(c))), c) << std::hex << c;
    }
  }
}

TEST(Fp8E4m3, EncodesTheNearestCodeTiesToEven) {
  // Every float on a fine grid over the finite range: the nearest code by brute force over all finite codes, ties
  // to the even code (even mantissa).
  for (double x = -460; x <= 460; x += 0.0078125 * (std::fabs(x) < 1 ? 0.0625 : 1)) {
    const auto f = static_cast<float>(x);
    int best = -1;
    double dist = 1e300;
    for (int c = 0; c < 256; ++c) {
      if ((c & 0x7F) == 0x7F || c == 0x80) {
        continue;
      }
      const double d = std::fabs(e4m3_value(c) - f);
      if (d < dist || (d == dist && (c & 1) == 0)) {
        best = c;
        dist = d;
      }
    }
    const uint8_t got = float_to_fp8_e4m3(f);
    EXPECT_EQ(fp8_e4m3_to_float(got), static_cast<float>(e4m3_value(best))) << "x = " << x;
  }
}

TEST(Reduce, Int32SumWrapsLikeTwosComplement) {
  const std::vector<int32_t> a = {std::numeric_limits<int32_t>::max(), -5, 7};
  const std::vector<int32_t> b = {1, -7, std::numeric_limits<int32_t>::min()};
  std::vector<int32_t> d = a;
  reduce_into(EchDtype::kInt32, EchRedOp::kSum, reinterpret_cast<uint8_t*>(d.data()),
              reinterpret_cast<const uint8_t*>(b.data()), 3);
  EXPECT_EQ(d[0], std::numeric_limits<int32_t>::min());
  EXPECT_EQ(d[1], -12);
  EXPECT_EQ(d[2], std::numeric_limits<int32_t>::min() + 7);
}

TEST(Reduce, Bf16AccumulatedInFp32BeatsPerStepRounding) {
  // 64 contributions of 1/64 + 1: per-step bf16 rounding loses the small parts, fp32 accumulation keeps them.
  const int k = 64;
  std::vector<uint16_t> x(1, float_to_bf16(1.0f + 1.0f / 64));
  std::vector<Acc> acc(1);
  std::vector<uint16_t> ring(1, x[0]);
  for (int i = 0; i < k; ++i) {
    accumulate(EchDtype::kBf16, EchRedOp::kSum, acc.data(), reinterpret_cast<const uint8_t*>(x.data()), 1, i == 0);
    if (i > 0) {
      reduce_into(EchDtype::kBf16, EchRedOp::kSum, reinterpret_cast<uint8_t*>(ring.data()),
                  reinterpret_cast<const uint8_t*>(x.data()), 1);
    }
  }
  std::vector<uint16_t> out(1);
  finalize(EchDtype::kBf16, acc.data(), reinterpret_cast<uint8_t*>(out.data()), 1);
  const double exact = k * static_cast<double>(bf16_to_float(x[0]));
  EXPECT_LE(std::fabs(bf16_to_float(out[0]) - exact), std::fabs(bf16_to_float(ring[0]) - exact));
  EXPECT_NEAR(bf16_to_float(out[0]), exact, exact * 0.004) << "one final rounding only";
}

TEST(Reduce, MinMaxAndNonFinite) {
  const std::vector<float> a = {1, -3, 2};
  const std::vector<float> b = {0, 5, NAN};
  std::vector<float> mn = a;
  std::vector<float> mx = a;
  reduce_into(EchDtype::kFp32, EchRedOp::kMin, reinterpret_cast<uint8_t*>(mn.data()),
              reinterpret_cast<const uint8_t*>(b.data()), 3);
  reduce_into(EchDtype::kFp32, EchRedOp::kMax, reinterpret_cast<uint8_t*>(mx.data()),
              reinterpret_cast<const uint8_t*>(b.data()), 3);
  EXPECT_EQ(mn[0], 0);
  EXPECT_EQ(mn[1], -3);
  EXPECT_TRUE(std::isnan(mn[2])) << "NaN propagates";
  EXPECT_EQ(mx[1], 5);
  EXPECT_EQ(count_non_finite(EchDtype::kFp32, reinterpret_cast<const uint8_t*>(b.data()), 3), 1u);
}

// The vectorizable loops of accumulate, finalize and count_non_finite against the element-by-element definition
// (load_element, combine, store_element, std::isfinite), for every dtype, op and first/not first, on inputs with
// Inf, NaN, negative zero, subnormals and the largest finite values among ordinary ones.
TEST(Reduce, FastLoopsEqualTheElementwiseDefinition) {
  const std::vector<float> special = {INFINITY, -INFINITY, NAN, -0.0f, 1e-40f, -1e-40f, 3.4e38f, -3.4e38f, 65504.0f};
  for (EchDtype t : {EchDtype::kFp32, EchDtype::kInt32, EchDtype::kFp16, EchDtype::kBf16}) {
    const size_t n = 301;
    const size_t es = ech_dtype_size(t);
    std::vector<uint8_t> a(n * es);
    std::vector<uint8_t> b(n * es);
    uint32_t x = 99;
    for (size_t i = 0; i < n; ++i) {
      x = x * 1103515245u + 12345u;
      Acc va;
      Acc vb;
      if (t == EchDtype::kInt32) {
        va.i = static_cast<int32_t>(x);
        vb.i = static_cast<int32_t>(x * 7u + 3u);
      } else {
        va.f = i % 7 == 0 ? special[(i / 7) % special.size()] : static_cast<float>(x % 2001) / 64.0f - 15.0f;
        vb.f = i % 11 == 0 ? special[(i / 11) % special.size()] : static_cast<float>((x >> 8) % 999) / 32.0f;
      }
      store_element(t, va, a.data(), i);
      store_element(t, vb, b.data(), i);
    }
    size_t want_bad = 0;
    for (size_t i = 0; i < n && t != EchDtype::kInt32; ++i) {
      want_bad += !std::isfinite(load_element(t, a.data(), i).f);
    }
    EXPECT_EQ(count_non_finite(t, a.data(), n), want_bad) << ech_dtype_name(t);
    if (t != EchDtype::kInt32) {
      EXPECT_GT(want_bad, 0u) << ech_dtype_name(t);
    }
    for (EchRedOp op : {EchRedOp::kSum, EchRedOp::kMin, EchRedOp::kMax}) {
      std::vector<Acc> acc(n);
      accumulate(t, op, acc.data(), a.data(), n, true);
      accumulate(t, op, acc.data(), b.data(), n, false);
      std::vector<uint8_t> got(n * es);
      finalize(t, acc.data(), got.data(), n);
      std::vector<uint8_t> want(n * es);
      for (size_t i = 0; i < n; ++i) {
        store_element(t, combine(t, op, load_element(t, a.data(), i), load_element(t, b.data(), i)), want.data(), i);
      }
      EXPECT_EQ(got, want) << ech_dtype_name(t) << " " << ech_redop_name(op);
    }
  }
}

// A slot of zero elements (a barrier's) reaches the reductions with no buffers at all: nothing is read or written
// (UBSan checks that no null pointer reaches memcpy).
TEST(Reduce, ZeroElementsTouchNothing) {
  for (EchDtype t : {EchDtype::kFp32, EchDtype::kInt32, EchDtype::kFp16, EchDtype::kBf16}) {
    accumulate(t, EchRedOp::kSum, nullptr, nullptr, 0, true);
    accumulate(t, EchRedOp::kMax, nullptr, nullptr, 0, false);
    finalize(t, nullptr, nullptr, 0);
    EXPECT_EQ(count_non_finite(t, nullptr, 0), 0u) << ech_dtype_name(t);
  }
}
