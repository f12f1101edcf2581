// The collective points' inputs and check against references written out here: the generator's definition
// (splitmix64's finaliser, Irwin-Hall bells), and outputs summed element by element in fp64.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "ifec/common/numeric.h"
#include "ifec/testbed/collective_point.h"

using namespace ifec;
using common::EchDtype;
using common::EchRedOp;

namespace {

uint64_t splitmix_finaliser(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Element i of member m's input, one at a time, as the header defines it.
uint64_t element_bits(uint64_t seed, int member, uint64_t i) {
  const uint64_t stream = splitmix_finaliser(seed * 7919 + static_cast<uint64_t>(member));
  return splitmix_finaliser(stream ^ (i * 0xD1B54A32D192ED03ull));
}

float bell(uint64_t r) {
  const double u = static_cast<double>((r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48));
  return static_cast<float>((u / 65536.0 - 2.0) * 1.7320508075688772);
}

testbed::CollectivePoint point(EchDtype t, EchRedOp op = EchRedOp::kSum) {
  testbed::CollectivePoint p;
  p.dtype = t;
  p.op = op;
  p.seed = 42;
  return p;
}

std::vector<uint8_t> input(const testbed::CollectivePoint& p, int member, uint64_t count, uint64_t first = 0) {
  std::vector<uint8_t> out(count * workloads::element_size(p.dtype));
  testbed::collective_input(p, member, count, out.data(), first);
  return out;
}

// The members' outputs of a correct AllReduce: each element summed (or min/max) in fp64, rounded once.
std::vector<uint8_t> exact_result(const testbed::CollectivePoint& p, int n, uint64_t count) {
  std::vector<double> acc(count);
  std::vector<double> v(count);
  for (int k = 0; k < n; ++k) {
    common::load_elements(p.dtype, input(p, k, count).data(), count, v.data());
    for (uint64_t i = 0; i < count; ++i) {
      acc[i] = k == 0                   ? v[i]
               : p.op == EchRedOp::kSum ? acc[i] + v[i]
               : p.op == EchRedOp::kMin ? std::min(acc[i], v[i])
                                        : std::max(acc[i], v[i]);
    }
  }
  std::vector<uint8_t> out(count * workloads::element_size(p.dtype));
  for (uint64_t i = 0; i < count; ++i) {
    common::Acc a;
    if (p.dtype == EchDtype::kInt32) {
      a.i = static_cast<int32_t>(acc[i]);
    } else {
      a.f = static_cast<float>(acc[i]);
    }
    common::store_element(p.dtype, a, out.data(), i);
  }
  return out;
}

}  // namespace

// Every element equals its definition, on whichever code path this CPU takes (an AVX-512 clone where it has one).
TEST(CollectiveInput, EveryElementIsItsDefinition) {
  const uint64_t count = 5003;  // not a multiple of any vector width
  for (const int member : {0, 3, 63}) {
    const auto f32 = input(point(EchDtype::kFp32), member, count);
    const auto i32 = input(point(EchDtype::kInt32), member, count);
    const auto b16 = input(point(EchDtype::kBf16), member, count);
    for (uint64_t i = 0; i < count; ++i) {
      const uint64_t r = element_bits(42, member, i);
      float f;
      std::memcpy(&f, f32.data() + 4 * i, 4);
      ASSERT_EQ(f, bell(r)) << "fp32 member " << member << " element " << i;
      int32_t v;
      std::memcpy(&v, i32.data() + 4 * i, 4);
      ASSERT_EQ(v, static_cast<int32_t>(r % 2001) - 1000) << "int32 member " << member << " element " << i;
      uint16_t h;
      std::memcpy(&h, b16.data() + 2 * i, 2);
      ASSERT_EQ(h, common::float_to_bf16(bell(r))) << "bf16 member " << member << " element " << i;
    }
  }
}

// A range is the same elements as the slice of the whole: the check regenerates inputs block by block.
TEST(CollectiveInput, ARangeIsTheSliceOfTheWhole) {
  for (const EchDtype t : {EchDtype::kFp32, EchDtype::kBf16, EchDtype::kFp16, EchDtype::kInt32}) {
    const auto p = point(t);
    const size_t es = workloads::element_size(t);
    const auto whole = input(p, 5, 6000);
    const auto part = input(p, 5, 3001, 2047);
    ASSERT_EQ(std::memcmp(part.data(), whole.data() + 2047 * es, part.size()), 0) << common::ech_dtype_name(t);
  }
}

// Correct outputs pass; one bad element in any block of any output is counted once, with its relative error.
TEST(CheckOutputs, CountsExactlyTheElementsOutsideTheBound) {
  const int n = 8;
  const uint64_t count = 2048 * 2 + 77;  // three blocks, the last one short
  for (const EchDtype t : {EchDtype::kFp32, EchDtype::kBf16, EchDtype::kInt32}) {
    for (const EchRedOp op : {EchRedOp::kSum, EchRedOp::kMax}) {
      const auto p = point(t, op);
      const std::string what = std::string(common::ech_dtype_name(t)) + (op == EchRedOp::kSum ? " sum" : " max");
      std::vector<uint8_t> a = exact_result(p, n, count);
      std::vector<uint8_t> b = a;
      const testbed::OutputCheck good = testbed::check_outputs(p, n, count, true, {a.data(), b.data()});
      EXPECT_EQ(good.wrong, 0u) << what;
      EXPECT_LT(good.max_rel_error, 1e-2) << what;
      for (const uint64_t bad : {uint64_t{0}, uint64_t{2049}, count - 1}) {
        std::vector<uint8_t> c = b;
        common::Acc x;
        if (t == EchDtype::kInt32) {
          x.i = 123456;  // 8 members of |x| <= 1000
        } else {
          x.f = 5000.0f;  // 8 bells of |x| <= 2 sqrt(3)
        }
        common::store_element(t, x, c.data(), bad);
        const testbed::OutputCheck chk = testbed::check_outputs(p, n, count, true, {a.data(), c.data()});
        EXPECT_EQ(chk.wrong, 1u) << what << " element " << bad;
        EXPECT_GT(chk.max_rel_error, 1.0) << what << " element " << bad;
      }
      std::vector<uint8_t> d = b;
      if (t != EchDtype::kInt32) {
        common::Acc nan;
        nan.f = std::nanf("");
        common::store_element(t, nan, d.data(), 4095);
        EXPECT_EQ(testbed::check_outputs(p, n, count, true, {d.data()}).wrong, 1u) << what << " NaN";
      }
    }
  }
}
