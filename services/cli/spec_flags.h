// Speculative decoding flags, shared by generate, serve, router --colocated
// and decode: --spec-method off|ngram|draft, --spec-tokens K,
// --spec-ngram-min, --spec-ngram-max, --spec-draft-model PATH,
// --spec-draft-kernels (docs/speculative.md).
#ifndef TANDEM_SERVICES_CLI_SPEC_FLAGS_H_
#define TANDEM_SERVICES_CLI_SPEC_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "services/cli/args.h"

namespace tandem::cli {

struct SpecFlags {
  std::string method = "off";
  int64_t tokens = 4;
  int64_t ngram_min = 1;
  int64_t ngram_max = 4;
  std::string draft_model;
  std::string draft_kernels = "fast-int8";
};

void AddSpecFlags(ArgParser& p, SpecFlags* f);

// InvalidArgument naming the flag (an unreadable --spec-draft-model too).
absl::StatusOr<engine::SpecDecodeConfig> ResolveSpec(const SpecFlags& f);

// --spec-method draft: InvalidArgument unless the draft GGUF's vocabulary is
// the target model's, token for token (reads both tokenizers, no weights).
// OK for other methods.
absl::Status CheckDraftVocab(const SpecFlags& f, const std::string& target_model_path);

// The same flags as arguments for a child process (tandem serve's workers).
std::vector<std::string> SpecArgs(const SpecFlags& f);

}  // namespace tandem::cli

#endif  // TANDEM_SERVICES_CLI_SPEC_FLAGS_H_
