// JSON for the whole tree is nlohmann-json (Debian nlohmann-json3-dev). This
// header adds what untrusted input needs on top of it: a parser with bounds on
// nesting depth and size that turns every malformed input into one
// InvalidArgument naming the byte offset, never an exception or a crash, and
// a dump that always produces valid UTF-8.
#ifndef TANDEM_COMMON_JSON_H_
#define TANDEM_COMMON_JSON_H_

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem::json {

using Json = nlohmann::json;
// For output: keys stay in the order they were added.
using OrderedJson = nlohmann::ordered_json;

struct ParseLimits {
  int max_depth = 32;
  size_t max_bytes = 16 << 20;
};

// Strict RFC 8259 (no comments, trailing commas, NaN or numbers that overflow
// a double; strings must be valid UTF-8, lone surrogates are rejected).
// Object keys keep the last duplicate. Errors: InvalidArgument
// "json: <what> at byte N" (or "... nesting too deep" / "... exceeds the
// limit") for malformed input.
absl::StatusOr<Json> Parse(std::string_view text, const ParseLimits& limits = {});

// Deepest [ / { nesting outside string literals; stops counting once the
// depth passes `limit` (so a hostile input costs at most one pass).
int NestingDepth(std::string_view text, int limit);

// Compact text of `j`; bytes that are not valid UTF-8 become U+FFFD, so the
// output is always valid JSON and valid UTF-8; NaN / inf print as null.
std::string Dump(const Json& j);
std::string Dump(const OrderedJson& j);

// Dump of one JSON string value (with quotes).
std::string Quote(std::string_view s);

}  // namespace tandem::json

#endif  // TANDEM_COMMON_JSON_H_
