#include "engine/spec/ngram_proposer.h"

#include <algorithm>

namespace tandem::engine {
namespace {

// How far back a match is followed to rank occurrences and to cap k.
constexpr int64_t kMaxMatch = 16;

// Length of the common suffix of tokens[0, end) and the whole sequence,
// given that the last `len` tokens already match, at most kMaxMatch.
int64_t MatchLength(absl::Span<const int32_t> tokens, int64_t end, int64_t len) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  int64_t m = len;
  while (m < kMaxMatch && end - m - 1 >= 0 && tokens[end - m - 1] == tokens[n - m - 1]) ++m;
  return m;
}

}  // namespace

std::vector<int32_t> ProposeNgram(absl::Span<const int32_t> tokens, int64_t ngram_min,
                                  int64_t ngram_max, int64_t max_tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (max_tokens <= 0 || ngram_min < 1) return {};
  for (int64_t len = std::min(ngram_max, n - 1); len >= ngram_min; --len) {
    const int32_t* suffix = tokens.data() + n - len;
    // Of the earlier occurrences of the suffix, the one whose match reaches
    // furthest back (the passage being copied right now), the most recent
    // on ties.
    int64_t best_end = -1, best_match = 0;
    for (int64_t j = n - len - 1; j >= 0; --j) {
      if (tokens[j] != suffix[0] || !std::equal(suffix, suffix + len, tokens.data() + j)) continue;
      const int64_t match = MatchLength(tokens, j + len, len);
      if (match > best_match) {
        best_end = j + len;
        best_match = match;
      }
    }
    if (best_end < 0) continue;
    // A short match is weak evidence: no more drafts than matched tokens.
    const int64_t to = std::min({n, best_end + max_tokens, best_end + best_match});
    return std::vector<int32_t>(tokens.begin() + best_end, tokens.begin() + to);
  }
  return {};
}

}  // namespace tandem::engine
