// Fuzzes the `tandem generate --prompts-file` reader (lines or JSONL with
// per-line sampling overrides): any file gives prompts whose parameters
// pass SamplingParams::Validate, or an InvalidArgument naming the line.
#include <cstdint>
#include <string>

#include "services/cli/prompt_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string contents(reinterpret_cast<const char*>(data), size);
  tandem::engine::SamplingParams defaults;
  defaults.stop.max_tokens = 16;
  auto specs = tandem::cli::ParsePrompts(contents, "fuzz.txt", defaults);
  if (!specs.ok()) {
    if (specs.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
    if (specs.status().message().find("fuzz.txt") == std::string::npos) __builtin_trap();
    return 0;
  }
  for (const auto& spec : *specs) {
    if (spec.line < 1) __builtin_trap();
    if (!spec.params.Validate().ok()) __builtin_trap();
  }
  return 0;
}
