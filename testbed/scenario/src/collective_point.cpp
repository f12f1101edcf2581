// A collective point's inputs (a pure function of seed, member and element) and the check of its outputs against
// an fp64 reference under the rounding bound of the path that ran.
#include "ifec/testbed/collective_point.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ifec/common/checks.h"
#include "ifec/common/hash.h"
#include "ifec/common/numeric.h"

namespace ifec::testbed {

using workloads::element_size;

using common::EchDtype;
using common::EchRedOp;

namespace {

// The check walks the elements in blocks: a block's reference stays in L1/L2 while every member's input is added
// into it and every output is compared with it, so the check streams each output once and keeps no full-size copy.
constexpr uint64_t kCheckBlock = 2048;

// Error bound of one element: every fp32 accumulation step may round (n steps), and the output type rounds once in
// the switch or once per ring step: |err| <= (n * 2^-24 + steps * unit) * sum |x_i| (min/max: one rounding of the
// result).
struct Rounding {
  Rounding(const CollectivePoint& p, int n, bool rounds_per_step)
      : multicast(p.kind == Collective::kMulticast), sum(p.op == EchRedOp::kSum), int32(p.dtype == EchDtype::kInt32) {
    const double unit = p.dtype == EchDtype::kBf16   ? 1.0 / 256
                        : p.dtype == EchDtype::kFp16 ? 1.0 / 2048
                        : p.dtype == EchDtype::kFp32 ? 1.0 / 16777216
                                                     : 0;
    const double steps = rounds_per_step ? n : 1;
    const double fp32_steps = int32 ? 0 : n / 16777216.0;
    factor = multicast ? 0 : fp32_steps + steps * unit;
  }
  bool multicast;  // the source's bytes alone
  bool sum;
  bool int32;
  double factor;
};

// Block scratch: the fp64 reference of elements [first, first + m) and its bound, with room for one member's input.
struct ReferenceBlock {
  explicit ReferenceBlock(size_t element_bytes)
      : value(kCheckBlock), bound(kCheckBlock), v(kCheckBlock), input(kCheckBlock * element_bytes) {}
  std::vector<double> value;  // fp64 (exact wrap-around for int32 sums)
  std::vector<double> bound;  // largest |error| the path's rounding explains
  std::vector<double> v;
  std::vector<uint8_t> input;
};

// Member by member, in member order: the same additions, in the same order, as element by element.
// Inlined into each of check_outputs' clones, so it is vectorized for the CPU too.
[[gnu::always_inline]] inline void reference_block(const CollectivePoint& p, int n, const Rounding& r, int source,
                                                   uint64_t first, uint64_t m, ReferenceBlock& b) {
  double* value = b.value.data();
  double* bound = b.bound.data();
  const double* v = b.v.data();
  std::fill_n(bound, m, 0.0);  // sum |x_i| first, then the bound
  for (int k = 0; k < (r.multicast ? 1 : n); ++k) {
    collective_input(p, r.multicast ? source : k, m, b.input.data(), first);
    common::load_elements(p.dtype, b.input.data(), m, b.v.data());
    // One loop per case, each one the compiler vectorizes.
    for (uint64_t i = 0; i < m; ++i) {
      bound[i] += std::fabs(v[i]);
    }
    if (k == 0) {
      std::copy_n(v, m, value);
    } else if (r.sum) {
      for (uint64_t i = 0; i < m; ++i) {
        value[i] += v[i];
      }
    } else if (p.op == EchRedOp::kMin) {
      for (uint64_t i = 0; i < m; ++i) {
        value[i] = std::min(value[i], v[i]);
      }
    } else {
      for (uint64_t i = 0; i < m; ++i) {
        value[i] = std::max(value[i], v[i]);
      }
    }
  }
  for (uint64_t i = 0; i < m; ++i) {
    const double magnitude = !r.sum || r.multicast ? std::fabs(value[i]) : bound[i];
    if (r.int32 && r.sum) {
      value[i] = static_cast<double>(static_cast<int32_t>(static_cast<uint32_t>(static_cast<int64_t>(value[i]))));
    }
    bound[i] = r.factor * magnitude + 1e-30;
  }
}

}  // namespace

// Cloned for AVX-512 where the CPU has it (its 64-bit multiplies vectorize the generator): same bytes either way.
IFEC_AVX512_CLONES void collective_input(const CollectivePoint& p, int member, uint64_t count, uint8_t* out,
                                         uint64_t first) {
  // Bell-shaped floats of mean 0 and variance 1 (the sum of four uniforms, Irwin-Hall, scaled), or small integers
  // for int32 so that sums stay meaningful; element i of the member from (seed, member, i) alone, 64 well-mixed
  // bits of them (a counter-based generator on splitmix64), so any member's input is a pure function of the three.
  // One loop per element type: 64 members x 16 M elements are written per 64 MiB point, and regenerated for the
  // reference.
  const uint64_t stream = common::splitmix64(p.seed * 7919 + static_cast<uint64_t>(member));
  auto bits = [stream, first](uint64_t i) {
    return common::splitmix64(stream ^ ((first + i) * 0xD1B54A32D192ED03ull));
  };
  auto bell = [](uint64_t r) {
    const double u = static_cast<double>((r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48));
    return static_cast<float>((u / 65536.0 - 2.0) * 1.7320508075688772);  // sqrt(3): variance 1
  };
  switch (p.dtype) {
    case EchDtype::kInt32:
      for (uint64_t i = 0; i < count; ++i) {
        const int32_t v = static_cast<int32_t>(bits(i) % 2001) - 1000;
        std::memcpy(out + 4 * i, &v, 4);
      }
      return;
    case EchDtype::kFp32:
      for (uint64_t i = 0; i < count; ++i) {
        const float v = bell(bits(i));
        std::memcpy(out + 4 * i, &v, 4);
      }
      return;
    case EchDtype::kFp16:
    case EchDtype::kBf16:
      for (uint64_t i = 0; i < count; ++i) {
        common::Acc a;
        a.f = bell(bits(i));
        common::store_element(p.dtype, a, out, i);
      }
      return;
  }
}

IFEC_AVX512_CLONES OutputCheck check_outputs(const CollectivePoint& p, int n, uint64_t count, bool rounds_per_step,
                                             const std::vector<const uint8_t*>& outputs, int source, uint64_t lo,
                                             uint64_t hi) {
  OutputCheck c;
  if (p.kind == Collective::kBarrier || n <= 0 || count == 0) {
    return c;
  }
  const Rounding rounding(p, n, rounds_per_step);
  const size_t es = element_size(p.dtype);
  ReferenceBlock ref(es);
  std::vector<double> got(kCheckBlock);
  std::vector<double> scale(kCheckBlock);  // what an error is relative to
  const uint64_t end = std::min(count, hi);
  for (uint64_t first = lo; first < end; first += kCheckBlock) {
    const uint64_t m = std::min(kCheckBlock, end - first);
    reference_block(p, n, rounding, source, first, m, ref);
    for (uint64_t i = 0; i < m; ++i) {
      scale[i] = std::max(1.0, std::fabs(ref.value[i]));
    }
    for (const uint8_t* out : outputs) {
      common::load_elements(p.dtype, out + first * es, m, got.data());
      // In two loops the compiler vectorizes (errors and the count), then a plain maximum.
      uint64_t wrong = 0;
      for (uint64_t i = 0; i < m; ++i) {
        const double err = std::fabs(got[i] - ref.value[i]);
        wrong += !(err <= ref.bound[i]);  // NaN or Inf where the reference is finite counts as wrong
        got[i] = err / scale[i];
      }
      c.wrong += wrong;
      for (uint64_t i = 0; i < m; ++i) {
        c.max_rel_error = std::max(c.max_rel_error, got[i]);
      }
    }
  }
  return c;
}

}  // namespace ifec::testbed
