// Element types of collectives (ECH dtypes) and the reductions every party applies: IEEE fp16, bfloat16 and FP8
// E4M3 conversions (round to nearest even), and accumulate/finalize helpers that reduce in fp32 (floats) or with
// two's-complement wrap-around (int32), so the switch, the endpoints and the tests agree bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ifec/common/ech.h"

// A function cloned for AVX-512 where the CPU has it (the loader picks the clone). One version under
// ThreadSanitizer: the clones' resolver runs at load time, before its runtime is up, and crashed there.
#if defined(__SANITIZE_THREAD__)
#define IFEC_AVX512_CLONES
#else
#define IFEC_AVX512_CLONES __attribute__((target_clones("arch=x86-64-v4", "default")))
#endif

namespace ifec::common {

float fp16_to_float(uint16_t h);
uint16_t float_to_fp16(float f);
float bf16_to_float(uint16_t b);
uint16_t float_to_bf16(float f);
// OCP FP8 E4M3 ("e4m3fn": bias 7, no infinities, S.1111.111 is NaN, largest finite 448), what DeepEP dispatches.
// Round to nearest even; finite values beyond 448 (and infinities) saturate to +-448, NaN stays NaN.
float fp8_e4m3_to_float(uint8_t b);
uint8_t float_to_fp8_e4m3(float f);
inline constexpr float kFp8E4m3Max = 448.0f;

// Accumulator lane: fp32 for the float types, int32 (stored in the same 4 bytes) for int32.
union Acc {
  float f;
  int32_t i;
};

// Element `i` of `data` (dtype `t`) widened to an accumulator lane.
Acc load_element(EchDtype t, const uint8_t* data, size_t i);
// Writes an accumulator lane back as dtype `t` (the single cast on the way out).
void store_element(EchDtype t, Acc v, uint8_t* data, size_t i);
// Elements [0, count) of `data` as doubles (int32 exactly), the type switch outside the loop: what checks of whole
// buffers use.
void load_elements(EchDtype t, const uint8_t* data, size_t count, double* out);
// a <- op(a, b) in the accumulator domain.
Acc combine(EchDtype t, EchRedOp op, Acc a, Acc b);

// acc[0..n) <- op(acc, src) (or acc <- src when `first`).
void accumulate(EchDtype t, EchRedOp op, Acc* acc, const uint8_t* src, size_t n, bool first);
// dst[0..n) <- acc cast to `t`.
void finalize(EchDtype t, const Acc* acc, uint8_t* dst, size_t n);
// In place: dst <- op(dst, src) element-wise in dtype `t` (one rounding per element: what a ring step does).
void reduce_into(EchDtype t, EchRedOp op, uint8_t* dst, const uint8_t* src, size_t n);
// Count of NaN/Inf among n elements (0 for int32).
size_t count_non_finite(EchDtype t, const uint8_t* data, size_t n);

}  // namespace ifec::common
