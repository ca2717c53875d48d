#include <string>
#include <vector>

#include "common/json.h"
#include "gtest/gtest.h"

namespace tandem::json {
namespace {

TEST(JsonParseTest, ParsesEveryKind) {
  auto v = Parse(R"( {"a": [1, -2.5e3, true, false, null], "b": {"c": "x\"\\\/\n\u00e9\ud83d\ude00"}} )");
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_TRUE(v->is_object());
  const Value* a = v->Find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->array.size(), 5u);
  EXPECT_EQ(a->array[0].number, 1);
  EXPECT_EQ(a->array[1].number, -2500);
  EXPECT_TRUE(a->array[2].boolean);
  EXPECT_EQ(a->array[3].kind, Value::Kind::kBool);
  EXPECT_EQ(a->array[4].kind, Value::Kind::kNull);
  EXPECT_EQ(v->Find("b")->Find("c")->string, "x\"\\/\n\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_EQ(v->Find("missing"), nullptr);
}

TEST(JsonParseTest, RoundTripsQuote) {
  const std::string s = "tab\t quote\" back\\ \x01 caf\xC3\xA9";
  auto v = Parse(Quote(s));
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->string, s);
}

TEST(JsonParseTest, MalformedInputIsAnErrorWithOffset) {
  const std::vector<std::string> bad = {
      "", "{", "[1,]", "{\"a\":1,}", "{a:1}", "[1 2]", "01", "1.", "-", "1e", "tru", "nul",
      "\"abc", "\"\\x\"", "\"\\u12\"", "\"\\ud800\"", "\"\\udc00\"", "\"a\nb\"",
      "\"\xC3\"", "NaN", "1e999", "[1] x", "{\"a\" 1}", "\"\\ud800\\u0041\""};
  for (const std::string& b : bad) {
    auto v = Parse(b);
    ASSERT_FALSE(v.ok()) << b;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(v.status().message().find("at byte"), std::string::npos) << v.status();
  }
}

TEST(JsonParseTest, DepthAndSizeAreBounded) {
  std::string deep(100000, '[');
  auto v = Parse(deep);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("too deep"), std::string::npos);
  std::string ok_depth = std::string(10, '[') + std::string(10, ']');
  EXPECT_TRUE(Parse(ok_depth).ok());
  EXPECT_FALSE(Parse("[1,2,3]", {.max_depth = 32, .max_bytes = 4}).ok());
}

}  // namespace
}  // namespace tandem::json
