#include "common/json.h"

#include <cmath>

#include "gtest/gtest.h"

namespace tandem::json {
namespace {

TEST(JsonTest, QuoteEscapesControlAndQuotes) {
  EXPECT_EQ(Quote("a\"b\\c\n\t\r"), "\"a\\\"b\\\\c\\n\\t\\r\"");
  EXPECT_EQ(Quote(std::string("\x01\x1f\x7f", 3)), "\"\\u0001\\u001f\\u007f\"");
  EXPECT_EQ(Quote(""), "\"\"");
}

TEST(JsonTest, QuoteKeepsValidUtf8) {
  EXPECT_EQ(Quote("caf\xC3\xA9 \xE4\xB8\xAD \xF0\x9F\x98\x80"),
            "\"caf\xC3\xA9 \xE4\xB8\xAD \xF0\x9F\x98\x80\"");
}

TEST(JsonTest, QuoteReplacesInvalidUtf8) {
  // Lone continuation byte, truncated 3-byte sequence, overlong '/', surrogate.
  EXPECT_EQ(Quote("a\x80z"), "\"a\\ufffdz\"");
  EXPECT_EQ(Quote("\xE4\xB8"), "\"\\ufffd\\ufffd\"");
  EXPECT_EQ(Quote("\xC0\xAF"), "\"\\ufffd\\ufffd\"");
  EXPECT_EQ(Quote("\xED\xA0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");
}

TEST(JsonTest, Numbers) {
  EXPECT_EQ(IntArray({}), "[]");
  EXPECT_EQ(IntArray({1, -2, 30}), "[1,-2,30]");
  EXPECT_EQ(Number(1.5), "1.5");
  EXPECT_EQ(Number(NAN), "null");
  EXPECT_EQ(Number(INFINITY), "null");
}

}  // namespace
}  // namespace tandem::json
