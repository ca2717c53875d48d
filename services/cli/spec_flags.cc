#include "services/cli/spec_flags.h"

#include "absl/strings/str_cat.h"

namespace tandem::cli {

void AddSpecFlags(ArgParser& p, SpecFlags* f) {
  p.AddString("spec-method", &f->method,
              "speculative decoding: off, or ngram (prompt lookup: drafts copied from the "
              "prompt and output so far; docs/speculative.md)");
  p.AddInt("spec-tokens", &f->tokens, 1, engine::kMaxSpeculativeTokens,
           "speculative decoding: draft tokens per step at most");
  p.AddInt("spec-ngram-min", &f->ngram_min, 1, 64, "--spec-method ngram: shortest suffix matched");
  p.AddInt("spec-ngram-max", &f->ngram_max, 1, 64, "--spec-method ngram: longest suffix matched");
}

absl::StatusOr<engine::SpecDecodeConfig> ResolveSpec(const SpecFlags& f) {
  engine::SpecDecodeConfig c;
  if (!engine::ParseSpecMethod(f.method, &c.method)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--spec-method: unknown method '", f.method, "' (off or ngram)"));
  }
  if (f.ngram_min > f.ngram_max) {
    return absl::InvalidArgumentError(absl::StrCat("--spec-ngram-min ", f.ngram_min,
                                                   " is above --spec-ngram-max ", f.ngram_max));
  }
  c.num_tokens = f.tokens;
  c.ngram_min = f.ngram_min;
  c.ngram_max = f.ngram_max;
  return c;
}

std::vector<std::string> SpecArgs(const SpecFlags& f) {
  return {"--spec-method",    f.method,
          "--spec-tokens",    absl::StrCat(f.tokens),
          "--spec-ngram-min", absl::StrCat(f.ngram_min),
          "--spec-ngram-max", absl::StrCat(f.ngram_max)};
}

}  // namespace tandem::cli
