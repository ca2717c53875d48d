#include "common/tokenizer/bpe.h"

#include <queue>

#include "common/tokenizer/unicode.h"

namespace tandem::tokenizer {

BpeEncoder::BpeEncoder(const Vocab& vocab, const TokenIndex& index, bool ignore_merges)
    : index_(index), ignore_merges_(ignore_merges) {
  for (int b = 0; b < 256; ++b) {
    std::string text;
    AppendUtf8(ByteToCodepoint(static_cast<uint8_t>(b)), &text);
    auto it = index_.find(text);
    byte_token_[b] = it == index_.end() ? -1 : it->second;
  }
  merges_.reserve(vocab.merges.size());
  std::string joined;
  for (size_t r = 0; r < vocab.merges.size(); ++r) {
    const std::string& m = vocab.merges[r];
    const size_t sp = m.find(' ', 1);  // validated: present, both sides known tokens
    const auto left = index_.find(std::string_view(m).substr(0, sp));
    const auto right = index_.find(std::string_view(m).substr(sp + 1));
    joined.assign(m, 0, sp);
    joined.append(m, sp + 1);
    const auto result = index_.find(joined);
    // A merge whose result is not a token can never produce an id; skip it.
    if (left == index_.end() || right == index_.end() || result == index_.end()) continue;
    merges_.try_emplace(Key(left->second, right->second),
                        Merge{static_cast<int32_t>(r), result->second});
  }
}

void BpeEncoder::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = index_.find(BytesToByteLevel(word));
    if (it != index_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  const auto n = static_cast<int32_t>(word.size());
  std::vector<Symbol> sym(n);
  for (int32_t i = 0; i < n; ++i) {
    sym[i] = {byte_token_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  if (n > 1) {
    struct Candidate {
      int32_t rank;
      int32_t left;
      int32_t right;
      int32_t left_id;
      int32_t right_id;
      bool operator>(const Candidate& o) const {
        return rank != o.rank ? rank > o.rank : left > o.left;
      }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
    auto push = [&](int32_t l, int32_t r) {
      if (l < 0 || r < 0 || sym[l].id < 0 || sym[r].id < 0) return;
      auto it = merges_.find(Key(sym[l].id, sym[r].id));
      if (it != merges_.end()) heap.push({it->second.rank, l, r, sym[l].id, sym[r].id});
    };
    for (int32_t i = 0; i + 1 < n; ++i) push(i, i + 1);
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      // Stale when either side has merged since the candidate was pushed.
      if (sym[c.left].next != c.right || sym[c.left].id != c.left_id ||
          sym[c.right].id != c.right_id) {
        continue;
      }
      sym[c.left].id = merges_.find(Key(c.left_id, c.right_id))->second.result;
      sym[c.left].next = sym[c.right].next;
      if (sym[c.right].next >= 0) sym[sym[c.right].next].prev = c.left;
      sym[c.right].id = -2;  // dead
      sym[c.right].next = -1;
      push(sym[c.left].prev, c.left);
      push(c.left, sym[c.left].next);
    }
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    // A byte without a byte-level token is dropped, as llama.cpp and HF do
    // (SmolLM2 has no token for 21 bytes, e.g. 0x04 and 0xF5-0xFF).
    if (sym[i].id >= 0) out->push_back(sym[i].id);
  }
}

}  // namespace tandem::tokenizer
