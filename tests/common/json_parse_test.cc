// common/json.h: the bounded parse and the always-valid dump on top of
// nlohmann-json.
#include <cmath>
#include <string>
#include <vector>

#include "common/json.h"
#include "gtest/gtest.h"

namespace tandem::json {
namespace {

TEST(JsonParseTest, ParsesEveryKind) {
  auto v = Parse(
      R"( {"a": [1, -2.5e3, true, false, null], "b": {"c": "x\"\\\/\n\u00e9\ud83d\ude00"}} )");
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_TRUE(v->is_object());
  const Json& a = v->at("a");
  ASSERT_EQ(a.size(), 5u);
  EXPECT_EQ(a[0].get<double>(), 1);
  EXPECT_EQ(a[1].get<double>(), -2500);
  EXPECT_TRUE(a[2].get<bool>());
  EXPECT_TRUE(a[3].is_boolean());
  EXPECT_TRUE(a[4].is_null());
  EXPECT_EQ(v->at("b").at("c").get<std::string>(), "x\"\\/\n\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_FALSE(v->contains("missing"));
}

TEST(JsonParseTest, DuplicateKeysKeepTheLast) {
  auto v = Parse(R"({"k": 1, "k": 2})");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->at("k").get<int>(), 2);
}

TEST(JsonParseTest, RoundTripsQuote) {
  const std::string s = "tab\t quote\" back\\ \x01 caf\xC3\xA9";
  auto v = Parse(Quote(s));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->get<std::string>(), s);
}

TEST(JsonParseTest, MalformedInputIsAnErrorWithOffset) {
  const std::vector<std::string> bad = {"",
                                        "{",
                                        "[1,]",
                                        "{\"a\":1,}",
                                        "{a:1}",
                                        "[1 2]",
                                        "01",
                                        "1.",
                                        "-",
                                        "1e",
                                        "tru",
                                        "nul",
                                        "\"abc",
                                        "\"\\x\"",
                                        "\"\\u12\"",
                                        "\"\\ud800\"",
                                        "\"\\udc00\"",
                                        "\"a\nb\"",
                                        "\"\xC3\"",
                                        "NaN",
                                        "[1] x",
                                        "{\"a\" 1}",
                                        "\"\\ud800\\u0041\"",
                                        "// c\n1",
                                        "[1]/**/"};
  for (const std::string& b : bad) {
    auto v = Parse(b);
    ASSERT_FALSE(v.ok()) << b;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(v.status().message().find("at byte"), std::string::npos) << v.status();
    // The message never echoes the input (which may be any bytes).
    EXPECT_EQ(v.status().message().find("last read"), std::string::npos) << v.status();
    EXPECT_EQ(v.status().message().find('\xC3'), std::string::npos) << v.status();
  }
  {
    auto s = Parse("{\"p\": \"\\ud800\"}");
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find("surrogate"), std::string::npos) << s.status();
  }
  // The offset points at the offending byte.
  auto v = Parse("[1, 2, x]");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("at byte 7"), std::string::npos) << v.status();
}

TEST(JsonParseTest, NumbersThatOverflowADoubleAreRejected) {
  for (const char* b : {"1e999", "[-1e400]", "{\"x\": 2e308}"}) {
    auto v = Parse(b);
    ASSERT_FALSE(v.ok()) << b;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(Parse("1.7976931348623157e308").ok());
}

TEST(JsonParseTest, DepthAndSizeAreBounded) {
  std::string deep(100000, '[');
  auto v = Parse(deep);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("too deep"), std::string::npos);
  EXPECT_TRUE(Parse(std::string(10, '[') + std::string(10, ']')).ok());
  EXPECT_TRUE(Parse(std::string(32, '[') + std::string(32, ']')).ok());
  EXPECT_FALSE(Parse(std::string(33, '[') + std::string(33, ']')).ok());
  // Brackets inside strings do not count.
  EXPECT_TRUE(Parse("[\"" + std::string(100, '[') + "\"]").ok());
  EXPECT_FALSE(Parse("[1,2,3]", {.max_depth = 32, .max_bytes = 4}).ok());
}

TEST(JsonParseTest, NestingDepthStopsPastTheLimit) {
  EXPECT_EQ(NestingDepth("{}", 8), 1);
  EXPECT_EQ(NestingDepth("{\"a\":[[1]]}", 8), 3);
  EXPECT_EQ(NestingDepth("\"[[[\\\"[[\"", 8), 0);
  EXPECT_EQ(NestingDepth(std::string(1000, '['), 8), 9);
}

TEST(JsonDumpTest, EscapesControlAndQuotes) {
  EXPECT_EQ(Quote("a\"b\\c\n\t\r"), "\"a\\\"b\\\\c\\n\\t\\r\"");
  EXPECT_EQ(Quote(std::string("\x01\x1f", 2)), "\"\\u0001\\u001f\"");
  EXPECT_EQ(Quote(""), "\"\"");
}

TEST(JsonDumpTest, KeepsValidUtf8AndReplacesInvalid) {
  EXPECT_EQ(Quote("caf\xC3\xA9 \xE4\xB8\xAD \xF0\x9F\x98\x80"),
            "\"caf\xC3\xA9 \xE4\xB8\xAD \xF0\x9F\x98\x80\"");
  // Lone continuation byte, truncated sequence, overlong '/', surrogate: each
  // output is valid UTF-8 that parses back, with U+FFFD where the bad bytes were.
  for (const std::string bad : {"a\x80z", "\xE4\xB8", "\xC0\xAF", "\xED\xA0\x80"}) {
    const std::string q = Quote(bad);
    auto back = Parse(q);
    ASSERT_TRUE(back.ok()) << q << ": " << back.status();
    EXPECT_NE(back->get<std::string>().find("\xEF\xBF\xBD"), std::string::npos) << q;
  }
  EXPECT_EQ(Quote("a\x80z"), "\"a\xEF\xBF\xBDz\"");
}

TEST(JsonDumpTest, NonFiniteNumbersAreNullAndOrderIsKept) {
  OrderedJson j = {{"z", 1.5}, {"a", NAN}, {"m", INFINITY}, {"ids", std::vector<int>{1, -2, 30}}};
  EXPECT_EQ(Dump(j), "{\"z\":1.5,\"a\":null,\"m\":null,\"ids\":[1,-2,30]}");
}

}  // namespace
}  // namespace tandem::json
