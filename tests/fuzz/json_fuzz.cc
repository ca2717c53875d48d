// Fuzzes the bounded JSON parser (common/json_parse.cc) that reads prompt
// files and bench inputs: any byte string gives a value or an
// InvalidArgument, never a crash, and strings in a parsed value are valid
// UTF-8 (the parser's contract).
#include <cstdint>
#include <string_view>

#include "common/json.h"
#include "tests/fuzz/fuzz_models.h"

namespace {


void Walk(const tandem::json::Value& v, int depth) {
  if (depth > 64) __builtin_trap();  // the parser's depth bound was not honoured
  if (v.kind == tandem::json::Value::Kind::kString && !tandem::fuzz::IsValidUtf8(v.string)) {
    __builtin_trap();
  }
  for (const auto& e : v.array) Walk(e, depth + 1);
  for (const auto& [k, e] : v.object) {
    if (!tandem::fuzz::IsValidUtf8(k)) __builtin_trap();
    Walk(e, depth + 1);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  tandem::json::ParseLimits limits;
  limits.max_depth = 32;
  auto v = tandem::json::Parse(text, limits);
  if (v.ok()) {
    Walk(*v, 0);
  } else if (v.status().code() != absl::StatusCode::kInvalidArgument) {
    __builtin_trap();
  }
  return 0;
}
