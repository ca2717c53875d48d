// Internal: SentencePiece-style BPE (Llama 2, TinyLlama) with byte fallback.
// Not part of the public tokenizer API.
//
// Starting from single UTF-8 characters, repeatedly merges the adjacent pair
// whose concatenation is the vocabulary piece with the highest score
// (leftmost on ties). Characters without a piece fall back to <0xXX> byte
// tokens (or unk when those are missing).
//
// Thread safety: immutable after construction; Encode is reentrant.
#ifndef TANDEM_COMMON_TOKENIZER_SPM_H_
#define TANDEM_COMMON_TOKENIZER_SPM_H_

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "common/tokenizer/bpe.h"
#include "common/tokenizer/vocab.h"

namespace tandem::tokenizer {

class SpmEncoder {
 public:
  // REQUIRES: ValidateVocab(vocab) is OK; `vocab` and `index` outlive this.
  SpmEncoder(const Vocab& vocab, const TokenIndex& index);

  // Appends the ids of `text` to `out`. `text` is already escaped (spaces
  // replaced by U+2581) and prefixed as the caller wants.
  void Encode(std::string_view text, std::vector<int32_t>* out) const;

 private:
  // Id of the piece `text` if merging may produce it, else -1.
  int32_t MergeableId(std::string_view text) const;
  void EmitSymbol(std::string_view text, std::vector<int32_t>* out) const;

  const Vocab& vocab_;
  const TokenIndex& index_;
  std::array<int32_t, 256> byte_token_{};  // id of "<0xXX>", -1 if absent
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_COMMON_TOKENIZER_SPM_H_
