// The randomized property check (workloads/property.h) as a test: a bounded slice of the sweep that
// `./ifec bench property` runs longer, and proof that the checker itself can fail, for every kind of case.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "ifec/testbed/property.h"

using namespace ifec;

namespace {

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::strtoull(v, nullptr, 10) : fallback;
}

}  // namespace

// A few hundred cases: in-fabric AllReduce, reduce, multicast, MoE combine and dispatch, random fabrics, sizes,
// dtypes, 0.5-5% loss and slot budgets, each against its host reference (IFEC_PROPERTY_CASES / _SEED to change).
TEST(Property, RandomizedCasesMatchTheirReferences) {
  const uint64_t cases = env_or("IFEC_PROPERTY_CASES", 500);
  const uint64_t seed = env_or("IFEC_PROPERTY_SEED", 1);
  const auto s = testbed::run_property_sweep(seed, cases, /*seconds=*/150);
  std::printf("property: %llu cases from seed %llu in %.1f s, %llu failed, %llu used the fallback path\n",
              static_cast<unsigned long long>(s.cases), static_cast<unsigned long long>(seed), s.wall_seconds,
              static_cast<unsigned long long>(s.failed), static_cast<unsigned long long>(s.fallback_cases));
  RecordProperty("cases", static_cast<int>(s.cases));
  EXPECT_GE(s.cases, std::min<uint64_t>(cases, 200)) << "the time bound cut the sweep short";
  EXPECT_EQ(s.failed, 0u);
  for (const auto& f : s.failures) {
    ADD_FAILURE() << f << "\n  reproduce: ./ifec bench property --case <seed above>";
  }
  EXPECT_GT(s.fallback_cases, 0u) << "no case exercised the fallback path: the sweep is too gentle";
}

// The same comparison must see a single wrong element, in every kind of case.
TEST(Property, TheCheckerSeesOneWrongElement) {
  for (int k = 0; k < 5; ++k) {
    for (uint64_t seed = 1;; ++seed) {
      testbed::PropertyCase c = testbed::random_case(seed);
      if (static_cast<int>(c.kind) != k) {
        continue;
      }
      c.loss = 0;
      c.corrupt_output = true;
      const auto r = testbed::run_property_case(c);
      EXPECT_FALSE(r.ok) << c.describe();
      EXPECT_GE(r.wrong, 1u) << c.describe();
      break;
    }
  }
}

TEST(Property, CasesArePureFunctionsOfTheirSeed) {
  for (uint64_t seed : {3u, 77u, 1234u}) {
    EXPECT_EQ(testbed::random_case(seed).describe(), testbed::random_case(seed).describe());
    const auto a = testbed::run_property_case(testbed::random_case(seed));
    const auto b = testbed::run_property_case(testbed::random_case(seed));
    EXPECT_EQ(a.sim_us, b.sim_us) << testbed::random_case(seed).describe();
  }
}
