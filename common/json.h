// Minimal JSON output helpers (Tandem writes JSON; it never needs to parse
// untrusted JSON in C++).
#ifndef TANDEM_COMMON_JSON_H_
#define TANDEM_COMMON_JSON_H_

#include <cstdint>
#include <string>
#include <string_view>

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

}  // namespace tandem::json

#endif  // TANDEM_COMMON_JSON_H_
