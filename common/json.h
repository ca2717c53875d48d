// Minimal JSON: output helpers, and a parser for untrusted input (prompt
// files). The parser bounds nesting depth and size, accepts exactly RFC 8259
// (no comments, no trailing commas, no NaN), and reports the byte offset of the
// first error; it never crashes or recurses without bound.
#ifndef TANDEM_COMMON_JSON_H_
#define TANDEM_COMMON_JSON_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tandem::json {

// A JSON string literal (with quotes) for `s`. Control characters are escaped;
// bytes that are not valid UTF-8 become U+FFFD, so the output is always valid
// JSON and valid UTF-8.
std::string Quote(std::string_view s);

// "[1,2,3]"
std::string IntArray(absl::Span<const int32_t> values);

// A finite double printed with up to 10 significant digits; NaN/inf -> null.
std::string Number(double v);

// A parsed JSON value. Numbers are doubles; object keys keep the last
// duplicate (as most parsers do).
struct Value {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Value> array;
  std::map<std::string, Value> object;

  bool is_object() const { return kind == Kind::kObject; }
  // nullptr when this is not an object or the key is absent.
  const Value* Find(const std::string& key) const;
};

struct ParseLimits {
  int max_depth = 32;
  size_t max_bytes = 16 << 20;
};

// InvalidArgument "json: <what> at byte N" on malformed input.
absl::StatusOr<Value> Parse(std::string_view text, const ParseLimits& limits = {});

}  // namespace tandem::json

#endif  // TANDEM_COMMON_JSON_H_
