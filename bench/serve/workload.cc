#include "bench/serve/workload.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/cli/prompt_file.h"

namespace tandem::bench {
namespace {

// Common English words; most BPE vocabularies hold " word" as one token, so a
// text prompt of N words is close to N tokens.
constexpr const char* kWords[] = {
    "the",   "of",    "and",   "to",     "in",     "is",      "was",   "for",   "on",    "are",
    "with",  "as",    "at",    "be",     "by",     "this",    "had",   "not",   "but",   "from",
    "or",    "have",  "an",    "they",   "which",  "one",     "you",   "were",  "her",   "all",
    "she",   "there", "would", "their",  "we",     "him",     "been",  "has",   "when",  "who",
    "will",  "more",  "no",    "if",     "out",    "so",      "said",  "what",  "up",    "its",
    "about", "into",  "than",  "them",   "can",    "only",    "other", "new",   "some",  "could",
    "time",  "these", "two",   "may",    "then",   "do",      "first", "any",   "my",    "now",
    "such",  "like",  "our",   "over",   "man",    "me",      "even",  "most",  "made",  "after",
    "also",  "did",   "many",  "before", "must",   "through", "back",  "years", "where", "much",
    "your",  "way",   "well",  "down",   "should", "because", "each",  "just",  "those", "people",
};
constexpr int kNumWords = sizeof(kWords) / sizeof(kWords[0]);
// Token ids below this are left out of synthetic prompts: vocabularies put
// their special tokens first.
constexpr int32_t kFirstOrdinaryId = 256;

int64_t SampleLen(int64_t len, double ratio, std::mt19937_64& rng) {
  if (ratio <= 0) return len;
  const int64_t lo = std::max<int64_t>(1, static_cast<int64_t>(std::floor(len * (1 - ratio))));
  const int64_t hi = std::max<int64_t>(lo, static_cast<int64_t>(std::ceil(len * (1 + ratio))));
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

void AppendRandom(const WorkloadOptions& o, int64_t n, std::mt19937_64& rng, BenchRequest& r) {
  if (o.vocab_size > 0) {
    const int32_t lo = o.vocab_size > 2 * kFirstOrdinaryId ? kFirstOrdinaryId : 0;
    std::uniform_int_distribution<int32_t> id(lo, static_cast<int32_t>(o.vocab_size - 1));
    for (int64_t i = 0; i < n; ++i) r.prompt_ids.push_back(id(rng));
  } else {
    std::uniform_int_distribution<int> w(0, kNumWords - 1);
    for (int64_t i = 0; i < n; ++i) {
      if (!r.prompt_text.empty()) r.prompt_text += ' ';
      r.prompt_text += kWords[w(rng)];
    }
  }
  r.expected_prompt_tokens += n;
}

}  // namespace

absl::StatusOr<std::vector<BenchRequest>> BuildWorkload(const WorkloadOptions& o) {
  if (o.num_requests < 1) return absl::InvalidArgumentError("--num-requests must be >= 1");
  if (o.range_ratio < 0 || o.range_ratio >= 1) {
    return absl::InvalidArgumentError("--range-ratio must be in [0, 1)");
  }
  std::mt19937_64 rng(o.seed);
  std::vector<BenchRequest> out;
  out.reserve(static_cast<size_t>(o.num_requests));
  if (!o.dataset.empty()) {
    engine::SamplingParams defaults;
    defaults.stop.max_tokens = o.output_len;
    defaults.stop.ignore_eos = o.ignore_eos;
    absl::StatusOr<std::vector<cli::PromptSpec>> prompts =
        cli::ReadPromptsFile(o.dataset, defaults);
    if (!prompts.ok()) return prompts.status();
    if (prompts->empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--dataset ", o.dataset, ": no prompts"));
    }
    for (int64_t i = 0; i < o.num_requests; ++i) {
      const cli::PromptSpec& p = (*prompts)[static_cast<size_t>(i) % prompts->size()];
      BenchRequest r;
      r.prompt_text = p.text;
      r.max_tokens = p.params.stop.max_tokens.value_or(o.output_len);
      r.ignore_eos = p.params.stop.ignore_eos;
      r.seed = o.seed + static_cast<uint64_t>(i);
      out.push_back(std::move(r));
    }
    return out;
  }
  if (o.shared_prefix_len < 0 || o.num_prefixes < 1) {
    return absl::InvalidArgumentError("--shared-prefix-len must be >= 0, --num-prefixes >= 1");
  }
  // The shared system prompts, drawn first so they do not depend on N.
  std::vector<BenchRequest> prefixes(static_cast<size_t>(o.num_prefixes));
  if (o.shared_prefix_len > 0) {
    for (BenchRequest& p : prefixes) AppendRandom(o, o.shared_prefix_len, rng, p);
  }
  for (int64_t i = 0; i < o.num_requests; ++i) {
    BenchRequest r = prefixes[static_cast<size_t>(i % o.num_prefixes)];
    AppendRandom(o, SampleLen(o.input_len, o.range_ratio, rng), rng, r);
    r.max_tokens = SampleLen(o.output_len, o.range_ratio, rng);
    r.ignore_eos = o.ignore_eos;
    r.seed = o.seed + static_cast<uint64_t>(i);
    if (o.context_length > 0 && r.expected_prompt_tokens + r.max_tokens > o.context_length) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "prompt (%d tokens) + output (%d) exceeds the model's context length %d; lower "
          "--input-len / --shared-prefix-len / --output-len",
          r.expected_prompt_tokens, r.max_tokens, o.context_length));
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace tandem::bench
