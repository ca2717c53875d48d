// Reads the prompts of `tandem generate --prompts-file`.
//
// Each non-empty line is one request. A line starting with '{' is a JSON
// object (JSONL): {"prompt": "...", and optionally "max_tokens",
// "temperature", "top_k", "top_p", "min_p", "seed", "ignore_eos", "stop":
// ["..."]} overriding the command-line values for that request; any other
// line is the prompt text itself. Every malformed line is an InvalidArgument
// naming the file and line number.
#ifndef TANDEM_SERVICES_CLI_PROMPT_FILE_H_
#define TANDEM_SERVICES_CLI_PROMPT_FILE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/sampling_params.h"

namespace tandem::cli {

struct PromptSpec {
  std::string text;
  int64_t line = 0;  // 1-based line in the file (0 for --prompt)
  engine::SamplingParams params;
};

inline constexpr int64_t kMaxPromptsPerFile = 100000;

// Parses the file's lines; `defaults` gives the fields a line leaves out.
absl::StatusOr<std::vector<PromptSpec>> ReadPromptsFile(const std::string& path,
                                                        const engine::SamplingParams& defaults);

// Same, from the file's contents (for tests).
absl::StatusOr<std::vector<PromptSpec>> ParsePrompts(const std::string& contents,
                                                     const std::string& name,
                                                     const engine::SamplingParams& defaults);

}  // namespace tandem::cli

#endif  // TANDEM_SERVICES_CLI_PROMPT_FILE_H_
