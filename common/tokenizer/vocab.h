// Tokenizer vocabulary as stored in GGUF metadata (tokenizer.ggml.*).
//
// VocabFromGguf() is the only way a Vocab is built from a file. The file is
// untrusted: every inconsistency (missing or mistyped keys, array lengths that
// differ, special ids out of range, merges naming unknown tokens, unknown
// tokenizer model) returns InvalidArgument naming the key; nothing asserts.
//
// Thread safety: a Vocab is a plain value.
#ifndef TANDEM_COMMON_TOKENIZER_VOCAB_H_
#define TANDEM_COMMON_TOKENIZER_VOCAB_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/gguf/gguf.h"

namespace tandem::tokenizer {

enum class VocabKind {
  kBpe,  // GPT-2 style byte-level BPE (tokenizer.ggml.model "gpt2")
  kSpm,  // SentencePiece BPE with byte fallback (tokenizer.ggml.model "llama")
};

// Values of tokenizer.ggml.token_type (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct Vocab {
  VocabKind kind = VocabKind::kBpe;
  std::vector<std::string> tokens;     // [n_vocab] token text as stored in GGUF
  std::vector<float> scores;           // [n_vocab] (0 when absent)
  std::vector<TokenType> token_types;  // [n_vocab] (kNormal when absent)
  std::vector<std::string> merges;     // BPE only: "left right", rank = index
  std::string pre;                     // tokenizer.ggml.pre ("" when absent)

  int32_t bos_id = -1;  // -1: none
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;  // SPM: prepend " " to the text before encoding

  std::vector<int32_t> eog_ids;  // end-of-generation: eos plus <|im_end|>, <|eot_id|>, ...
  std::string chat_template;     // tokenizer.chat_template ("" when absent)

  int32_t size() const { return static_cast<int32_t>(tokens.size()); }
};

// Reads and validates the tokenizer metadata of `file`.
absl::StatusOr<Vocab> VocabFromGguf(const gguf::GgufFile& file);

// Checks the invariants VocabFromGguf guarantees (lengths, id ranges, merge
// parts known for kBpe). Tokenizer::Create calls it too, so a hand-built
// Vocab is checked the same way.
absl::Status ValidateVocab(const Vocab& vocab);

}  // namespace tandem::tokenizer

#endif  // TANDEM_COMMON_TOKENIZER_VOCAB_H_
