// Fuzzes the bounded JSON parse (common/json.h on nlohmann-json) that reads
// prompt files, bench inputs and HTTP bodies: any byte string gives a value
// or an InvalidArgument, never a crash or an exception; a parsed value is
// within the depth bound, its strings are valid UTF-8, and its dump parses
// back to the same value.
#include <cstdint>
#include <string_view>

#include "common/json.h"
#include "tests/fuzz/fuzz_models.h"

namespace {
void Walk(const tandem::json::Json& v, int depth) {
  if (depth > 33) __builtin_trap();  // the depth bound was not honoured
  if (v.is_string() && !tandem::fuzz::IsValidUtf8(v.get_ref<const std::string&>())) {
    __builtin_trap();
  }
  if (v.is_object()) {
    for (const auto& [k, e] : v.items()) {
      if (!tandem::fuzz::IsValidUtf8(k)) __builtin_trap();
      Walk(e, depth + 1);
    }
  } else if (v.is_array()) {
    for (const auto& e : v) Walk(e, depth + 1);
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
    auto back = tandem::json::Parse(tandem::json::Dump(*v), limits);
    if (!back.ok() || *back != *v) __builtin_trap();
  } else if (v.status().code() != absl::StatusCode::kInvalidArgument) {
    __builtin_trap();
  }
  return 0;
}
