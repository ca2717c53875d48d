#include "common/tokenizer/spm.h"

#include <queue>
#include <string>

#include "absl/strings/str_format.h"
#include "common/tokenizer/unicode.h"

namespace tandem::tokenizer {

SpmEncoder::SpmEncoder(const Vocab& vocab, const TokenIndex& index) : vocab_(vocab), index_(index) {
  for (int b = 0; b < 256; ++b) {
    auto it = index_.find(absl::StrFormat("<0x%02X>", b));
    byte_token_[b] = it == index_.end() ? -1 : it->second;
  }
}

int32_t SpmEncoder::MergeableId(std::string_view text) const {
  auto it = index_.find(text);
  if (it == index_.end()) return -1;
  // As in sentencepiece, control, unknown and byte pieces are never the
  // result of a merge.
  const TokenType t = vocab_.token_types[it->second];
  if (t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kByte) return -1;
  return it->second;
}

void SpmEncoder::EmitSymbol(std::string_view text, std::vector<int32_t>* out) const {
  const int32_t id = MergeableId(text);
  if (id >= 0) {
    out->push_back(id);
    return;
  }
  for (char c : text) {
    const int32_t b = byte_token_[static_cast<uint8_t>(c)];
    if (b >= 0) {
      out->push_back(b);
    } else if (vocab_.unk_id >= 0) {
      out->push_back(vocab_.unk_id);
      break;  // one unk per character, as sentencepiece without byte fallback
    }
  }
}

void SpmEncoder::Encode(std::string_view text, std::vector<int32_t>* out) const {
  struct Symbol {
    size_t begin;
    size_t len;  // 0: merged into its left neighbour
    int32_t prev;
    int32_t next;
  };
  std::vector<Symbol> sym;
  for (size_t pos = 0; pos < text.size();) {
    size_t len = ValidUtf8Len(text, pos);
    if (len == 0) len = 1;  // an invalid byte is a symbol of its own
    const auto i = static_cast<int32_t>(sym.size());
    sym.push_back({pos, len, i - 1, -1});
    if (i > 0) sym[i - 1].next = i;
    pos += len;
  }
  if (sym.empty()) return;

  struct Candidate {
    float score;
    int32_t left;
    int32_t right;
    size_t len;  // combined length when pushed, to detect stale entries
    bool operator<(const Candidate& o) const {
      return score != o.score ? score < o.score : left > o.left;
    }
  };
  std::priority_queue<Candidate> heap;
  auto push = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const size_t len = sym[l].len + sym[r].len;
    const int32_t id = MergeableId(text.substr(sym[l].begin, len));
    if (id >= 0) heap.push({vocab_.scores[id], l, r, len});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) push(i, i + 1);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = sym[c.left];
    Symbol& right = sym[c.right];
    if (left.len == 0 || right.len == 0 || left.next != c.right || left.len + right.len != c.len) {
      continue;
    }
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = c.left;
    push(left.prev, c.left);
    push(c.left, left.next);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    EmitSymbol(text.substr(sym[i].begin, sym[i].len), out);
  }
}

}  // namespace tandem::tokenizer
