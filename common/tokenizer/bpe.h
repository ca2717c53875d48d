// Internal: byte-level BPE over one pre-tokenized word (GPT-2, SmolLM2,
// Llama 3, Qwen 2). Not part of the public tokenizer API.
//
// Merging repeatedly joins the adjacent pair with the lowest merge rank
// (leftmost first on ties), using a linked list of symbols and a heap.
//
// Thread safety: immutable after construction; EncodeWord is reentrant.
#ifndef TANDEM_COMMON_TOKENIZER_BPE_H_
#define TANDEM_COMMON_TOKENIZER_BPE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/tokenizer/vocab.h"

namespace tandem::tokenizer {

// Token text -> id, looked up by std::string_view without copies.
struct TokenTextHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
struct TokenTextEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};
using TokenIndex = absl::flat_hash_map<std::string, int32_t, TokenTextHash, TokenTextEq>;

class BpeEncoder {
 public:
  // REQUIRES: ValidateVocab(vocab) is OK; `index` maps token text -> id and
  // outlives this object.
  BpeEncoder(const Vocab& vocab, const TokenIndex& index, bool ignore_merges);

  // Appends the ids of `word` (raw bytes, any content) to `out`. Bytes the
  // vocab has no byte-level token for are dropped.
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  static uint64_t Key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  const TokenIndex& index_;
  const bool ignore_merges_;
  std::array<int32_t, 256> byte_token_{};  // id of each byte's byte-level token, -1 if absent
  absl::flat_hash_map<uint64_t, Merge> merges_;
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_COMMON_TOKENIZER_BPE_H_
