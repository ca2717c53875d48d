// Text <-> token ids for the models Tandem serves, built from GGUF metadata.
//
//   auto vocab = tokenizer::VocabFromGguf(*gguf_file);          // validates
//   auto tok = tokenizer::Tokenizer::Create(*std::move(vocab));  // compiles regexes, merge table
//   std::vector<int32_t> ids = (*tok)->Encode(prompt, /*add_special=*/true,
//                                             /*parse_special=*/true);
//   std::string text = (*tok)->Decode(ids);
//
// Two models: byte-level BPE (VocabKind::kBpe: GPT-2, SmolLM2, Llama 3,
// Qwen 2; the pre-tokenizer regexes come from tokenizer.ggml.pre) and
// SentencePiece BPE with byte fallback (VocabKind::kSpm: Llama 2,
// TinyLlama). Ids match llama.cpp's tokenizer for the same GGUF.
//
// Encode accepts arbitrary bytes, including invalid UTF-8. For byte-level
// BPE, Decode(Encode(s)) == s for every s whose bytes all have a byte-level
// token (SmolLM2 lacks 21 of 256, e.g. 0x04, 0xC0, 0xF5-0xFF, which never
// occur in its training text; they are dropped, as llama.cpp and HF do). For
// SPM it holds for every s without special-token text (llama.cpp's SPM adds a
// space after each special token, and so does Tandem).
//
// Thread safety: immutable after Create(); all const methods may be called
// concurrently.
#ifndef TANDEM_COMMON_TOKENIZER_TOKENIZER_H_
#define TANDEM_COMMON_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/tokenizer/bpe.h"
#include "common/tokenizer/vocab.h"

namespace tandem::tokenizer {

class PreTokenizer;
class SpmEncoder;

class Tokenizer {
 public:
  // Validates `vocab` (ValidateVocab) and builds the lookup tables.
  // InvalidArgument for a broken vocab or an unsupported pre-tokenizer.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(Vocab vocab);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // add_special: prepend BOS when vocab().add_bos and append EOS when
  //   vocab().add_eos, as llama.cpp's add_special (SmolLM2 adds neither).
  // parse_special: text equal to a control token ("<|im_start|>") becomes
  //   that token (longest first). User-defined tokens are always matched.
  std::vector<int32_t> Encode(std::string_view text, bool add_special, bool parse_special) const;

  // Concatenated raw bytes of the tokens (may be invalid UTF-8 when `ids`
  // end inside a character). Out-of-range ids are skipped. skip_special
  // drops control and unknown tokens. SPM with add_space_prefix drops the
  // space that Encode added in front of the first text token.
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special = false) const;

  // Raw bytes of one token ("" for an out-of-range id); control tokens give
  // their text. No leading-space removal.
  std::string TokenToPiece(int32_t id) const;

  int32_t vocab_size() const { return vocab_.size(); }
  const Vocab& vocab() const { return vocab_; }
  bool IsEog(int32_t id) const;
  bool IsSpecial(int32_t id) const;  // control or unknown token
  // Id of the token whose GGUF text is `piece` ("<|im_end|>", "Ġthe", "▁the").
  std::optional<int32_t> FindToken(std::string_view piece) const;

 private:
  explicit Tokenizer(Vocab vocab);
  void EncodeText(std::string_view text, bool after_special, std::vector<int32_t>* out) const;
  // True when Decode drops one leading space of this token's piece if it is
  // the first text token.
  bool strips_leading_space() const;

  friend class StreamingDetokenizer;

  Vocab vocab_;
  TokenIndex index_;                     // token text -> id
  std::vector<std::string> pieces_;      // [n_vocab] raw bytes of each token
  std::vector<int32_t> special_tokens_;  // control/user-defined/unknown, longest first
  std::vector<bool> is_eog_;             // [n_vocab]
  std::unique_ptr<PreTokenizer> pre_;    // kBpe only
  std::unique_ptr<BpeEncoder> bpe_;      // kBpe only
  std::unique_ptr<SpmEncoder> spm_;      // kSpm only
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_COMMON_TOKENIZER_TOKENIZER_H_
