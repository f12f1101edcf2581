// Vocabulary tables (names.h): names, parsing with aliases, the errors' wording, and a value the table lacks.
#include <gtest/gtest.h>

#include "ifec/common/ech.h"
#include "ifec/common/names.h"

using namespace ifec::common;

namespace {

enum class Fruit : uint8_t { kApple, kPear, kPlum, kFig };

constexpr Name<Fruit> kFruitNames[] = {
    {Fruit::kApple, "apple"}, {Fruit::kPear, "pear"},   {Fruit::kPlum, "plum"},
    {Fruit::kApple, "malus"}, {Fruit::kApple, "pomme"},
};
constexpr Vocabulary kFruits("fruit", kFruitNames, "no fruit");

static_assert(kFruits.name(Fruit::kPear)[0] == 'p', "names are constant expressions");

TEST(Vocabulary, NamesAValueByItsFirstRow) {
  EXPECT_STREQ(kFruits.name(Fruit::kApple), "apple");
  EXPECT_STREQ(kFruits.name(Fruit::kPlum), "plum");
  EXPECT_STREQ(kFruits.name(Fruit::kFig), "no fruit");
  EXPECT_STREQ(kFruits.name(static_cast<Fruit>(200)), "no fruit");
}

TEST(Vocabulary, ParsesNamesAndAliases) {
  EXPECT_EQ(kFruits.parse("pear"), Fruit::kPear);
  EXPECT_EQ(kFruits.parse("malus"), Fruit::kApple);
  EXPECT_EQ(kFruits.parse("pomme"), Fruit::kApple);
  EXPECT_EQ(kFruits.find(std::string_view("fig")), nullptr);
}

TEST(Vocabulary, AnUnknownNameIsNamedWithEveryAcceptedOne) {
  try {
    kFruits.parse("Pear");
    FAIL() << "parsed 'Pear' (names are case-sensitive)";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "unknown fruit 'Pear' (expected apple (malus, pomme), pear or plum)");
  }
}

TEST(Vocabulary, EchDtypesTakeCsAndPyTorchsSpellings) {
  EXPECT_EQ(parse_ech_dtype("float"), EchDtype::kFp32);
  EXPECT_EQ(parse_ech_dtype("half"), EchDtype::kFp16);
  EXPECT_EQ(parse_ech_dtype("bf16"), EchDtype::kBf16);
  EXPECT_STREQ(ech_dtype_name(EchDtype::kFp16), "fp16");
  EXPECT_EQ(parse_ech_redop("max"), EchRedOp::kMax);
  try {
    parse_ech_dtype("fp64");
    FAIL() << "parsed fp64";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "unknown dtype 'fp64' (expected fp32 (float), bf16, fp16 (half) or int32)");
  }
}

}  // namespace
