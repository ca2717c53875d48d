#include "engine/spec/ngram_proposer.h"

#include <algorithm>

namespace tandem::engine {

std::vector<int32_t> ProposeNgram(absl::Span<const int32_t> tokens, int64_t ngram_min,
                                  int64_t ngram_max, int64_t max_tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (max_tokens <= 0 || ngram_min < 1) return {};
  for (int64_t len = std::min(ngram_max, n - 1); len >= ngram_min; --len) {
    const int32_t* suffix = tokens.data() + n - len;
    // Most recent earlier occurrence first: its continuation is the most
    // likely to repeat (the text being copied right now).
    for (int64_t j = n - len - 1; j >= 0; --j) {
      if (tokens[j] != suffix[0] || !std::equal(suffix, suffix + len, tokens.data() + j)) continue;
      const int64_t from = j + len;
      const int64_t to = std::min(n, from + max_tokens);
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + to);
    }
  }
  return {};
}

}  // namespace tandem::engine
