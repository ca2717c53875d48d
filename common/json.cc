#include "common/json.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_format.h"

namespace tandem::json {
namespace {

// True when every number in `j` is finite (nlohmann stores 1e999 as inf).
bool AllFinite(const Json& root) {
  std::vector<const Json*> stack = {&root};
  while (!stack.empty()) {
    const Json* j = stack.back();
    stack.pop_back();
    if (j->is_number_float() && !std::isfinite(j->get<double>())) return false;
    if (j->is_structured()) {
      for (const Json& e : *j) stack.push_back(&e);
    }
  }
  return true;
}

// The reason of a nlohmann parse_error's what(), without its prefix and
// without the echo of the input it read (which may be any bytes):
// "[json.exception.parse_error.101] parse error at line 1, column 4: syntax
// error while parsing array - unexpected number literal; last read: '2';
// expected ']'" -> "unexpected number literal; expected ']'".
std::string Reason(std::string what) {
  if (size_t col = what.find("column "); col != std::string::npos) {
    if (size_t colon = what.find(": ", col); colon != std::string::npos) {
      what = what.substr(colon + 2);
    }
  }
  if (size_t dash = what.find(" - ");
      what.rfind("syntax error", 0) == 0 && dash != std::string::npos) {
    what = what.substr(dash + 3);
  }
  if (size_t lr = what.find("; last read: '"); lr != std::string::npos) {
    const size_t expected = what.find("'; expected ", lr);
    what = expected == std::string::npos ? what.substr(0, lr)
                                         : what.substr(0, lr) + what.substr(expected + 1);
  }
  return what;
}

}  // namespace

int NestingDepth(std::string_view text, int limit) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
      if (max_depth > limit) return max_depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

absl::StatusOr<Json> Parse(std::string_view text, const ParseLimits& limits) {
  if (text.size() > limits.max_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "json: input of %d bytes exceeds the limit of %d", text.size(), limits.max_bytes));
  }
  // The depth bound is checked before parsing: nlohmann's parser is
  // iterative, but a deep value costs memory and recursion to destroy.
  if (NestingDepth(text, limits.max_depth) > limits.max_depth) {
    return absl::InvalidArgumentError(
        absl::StrFormat("json: nesting too deep (more than %d levels)", limits.max_depth));
  }
  Json j;
  try {
    j = Json::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/true,
                    /*ignore_comments=*/false);
  } catch (const Json::parse_error& e) {
    // e.byte is 1-based: the byte after the last one read.
    const size_t at = e.byte > 0 ? e.byte - 1 : 0;
    return absl::InvalidArgumentError(absl::StrFormat("json: %s at byte %d", Reason(e.what()), at));
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrFormat("json: %s at byte 0", e.what()));
  }
  if (!AllFinite(j)) {
    return absl::InvalidArgumentError("json: number out of range at byte 0");
  }
  return j;
}

std::string Dump(const Json& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

std::string Dump(const OrderedJson& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/false, OrderedJson::error_handler_t::replace);
}

std::string Quote(std::string_view s) { return Dump(Json(std::string(s))); }

}  // namespace tandem::json
