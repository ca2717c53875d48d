// Prompt-lookup (n-gram) drafting for speculative decoding: the longest
// suffix of the sequence, of length ngram_max down to ngram_min, that also
// occurs earlier in the sequence (prompt or output) proposes the tokens that
// followed it. Of several earlier occurrences, the one whose match with the
// sequence's end reaches furthest back (up to 16 tokens) wins, the most
// recent on ties; at most as many tokens are proposed as that match is long
// (a one-token match proposes one draft), since on a CPU every rejected
// draft costs verification work. No second model; it pays off where the
// output copies from the input (summaries, rewrites, code edits, document
// QA). O(num_tokens * (ngram_max + 16)) per call.
#ifndef TANDEM_ENGINE_SPEC_NGRAM_PROPOSER_H_
#define TANDEM_ENGINE_SPEC_NGRAM_PROPOSER_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace tandem::engine {

// Up to max_tokens drafts for `tokens` ({} when no suffix of length
// [ngram_min, ngram_max] recurs). REQUIRES: 1 <= ngram_min <= ngram_max.
std::vector<int32_t> ProposeNgram(absl::Span<const int32_t> tokens, int64_t ngram_min,
                                  int64_t ngram_max, int64_t max_tokens);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_SPEC_NGRAM_PROPOSER_H_
