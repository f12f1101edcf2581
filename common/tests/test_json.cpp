// The report writer: one record, its JSON and its CSV forms (hand-written expectations).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ifec/common/json.h"

using ifec::common::JsonObject;

TEST(JsonObject, JsonHoldsEveryFieldCsvOnlyTheScalarsInOrder) {
  JsonObject o;
  o.add("name", "a,\"b\"").add("n", 3).add("x", 0.1234567890123).add("ok", true);
  o.add("planes", std::vector<uint64_t>{1, 2}).add("tiny", 1.5e-7).add("big", 1e6);
  EXPECT_EQ(o.str(),
            R"({"name":"a,\"b\"","n":3,"x":0.123456789,"ok":true,"planes":[1,2],"tiny":1.5e-07,"big":1000000})");
  EXPECT_EQ(o.csv_header(), "name,n,x,ok,tiny,big");
  EXPECT_EQ(o.csv_row(), R"("a,""b""",3,0.123456789,true,1.5e-07,1000000)");
}

TEST(JsonObject, StringsAreEscapedInJsonAndQuotedInCsvOnlyWhenNeeded) {
  JsonObject o;
  o.add("plain", "per_rank").add("line", "a\nb").add("ctl", std::string("\x01", 1));
  EXPECT_EQ(o.str(), R"({"plain":"per_rank","line":"a\u000ab","ctl":"\u0001"})");
  EXPECT_EQ(o.csv_row(), "per_rank,\"a\nb\",\x01");
}

// JSON has no NaN or infinity: such a number is null there (Python's json module refused the row's "nan"), and its
// text in the CSV, which float() reads back.
TEST(JsonObject, NonFiniteNumbersAreNullInJsonAndTextInCsv) {
  JsonObject o;
  const double inf = std::numeric_limits<double>::infinity();
  o.add("speedup", std::nan("")).add("t", -inf).add("f", 2.5f).add("v", std::vector<double>{1, inf});
  EXPECT_EQ(o.str(), R"({"speedup":null,"t":null,"f":2.5,"v":[1,null]})");
  EXPECT_EQ(o.csv_row(), "nan,-inf,2.5");
}
