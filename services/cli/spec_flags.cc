#include "services/cli/spec_flags.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "services/cli/model_loader.h"

namespace tandem::cli {

void AddSpecFlags(ArgParser& p, SpecFlags* f) {
  p.AddString("spec-method", &f->method,
              "speculative decoding: off; ngram (prompt lookup: drafts copied from the prompt and "
              "output so far); or draft (a second model, --spec-draft-model; docs/speculative.md)");
  p.AddInt("spec-tokens", &f->tokens, 1, engine::kMaxSpeculativeTokens,
           "speculative decoding: draft tokens per step at most");
  p.AddInt("spec-ngram-min", &f->ngram_min, 1, 64, "--spec-method ngram: shortest suffix matched");
  p.AddInt("spec-ngram-max", &f->ngram_max, 1, 64, "--spec-method ngram: longest suffix matched");
  p.AddString("spec-draft-model", &f->draft_model,
              "--spec-method draft: the draft GGUF (same vocabulary as the model)");
  p.AddString(
      "spec-draft-kernels", &f->draft_kernels,
      absl::StrCat("--spec-method draft: the draft's CPU kernels: ", engine::kKernelModeChoices));
}

absl::StatusOr<engine::SpecDecodeConfig> ResolveSpec(const SpecFlags& f) {
  engine::SpecDecodeConfig c;
  if (!engine::ParseSpecMethod(f.method, &c.method)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--spec-method: unknown method '", f.method, "' (off, ngram or draft)"));
  }
  if (f.ngram_min > f.ngram_max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--spec-ngram-min ", f.ngram_min, " is above --spec-ngram-max ", f.ngram_max));
  }
  if (!engine::ParseKernelMode(f.draft_kernels, &c.draft_kernels)) {
    return absl::InvalidArgumentError(absl::StrCat("--spec-draft-kernels: expected ",
                                                   engine::kKernelModeChoices, ", got '",
                                                   f.draft_kernels, "'"));
  }
  const bool draft = c.method == engine::SpecDecodeConfig::Method::kDraft;
  if (draft && f.draft_model.empty()) {
    return absl::InvalidArgumentError("--spec-method draft needs --spec-draft-model PATH");
  }
  if (!draft && !f.draft_model.empty()) {
    return absl::InvalidArgumentError("--spec-draft-model needs --spec-method draft");
  }
  if (draft) {
    std::FILE* file = std::fopen(f.draft_model.c_str(), "rb");
    if (file == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--spec-draft-model: cannot read '",
                                                     f.draft_model, "': ", std::strerror(errno)));
    }
    std::fclose(file);
  }
  c.num_tokens = f.tokens;
  c.ngram_min = f.ngram_min;
  c.ngram_max = f.ngram_max;
  c.draft_model_path = f.draft_model;
  return c;
}

absl::Status CheckDraftVocab(const SpecFlags& f, const std::string& target_model_path) {
  if (f.method != "draft") return absl::OkStatus();
  auto target = LoadTokenizer(target_model_path);
  if (!target.ok()) return target.status();
  auto draft = LoadTokenizer(f.draft_model);
  if (!draft.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--spec-draft-model ", f.draft_model, ": ", draft.status().message()));
  }
  const std::vector<std::string>& a = target->tokenizer->vocab().tokens;
  const std::vector<std::string>& b = draft->tokenizer->vocab().tokens;
  if (a.size() != b.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--spec-draft-model ", f.draft_model, ": vocabulary of ", b.size(),
        " tokens, the model's has ", a.size(), " (the draft must share the model's vocabulary)"));
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("--spec-draft-model ", f.draft_model, ": token ", i,
                       " differs from the model's (the draft must share the model's vocabulary)"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> SpecArgs(const SpecFlags& f) {
  std::vector<std::string> args = {"--spec-method",        f.method,
                                   "--spec-tokens",        absl::StrCat(f.tokens),
                                   "--spec-ngram-min",     absl::StrCat(f.ngram_min),
                                   "--spec-ngram-max",     absl::StrCat(f.ngram_max),
                                   "--spec-draft-kernels", f.draft_kernels};
  if (!f.draft_model.empty()) {
    args.push_back("--spec-draft-model");
    args.push_back(f.draft_model);
  }
  return args;
}

}  // namespace tandem::cli
