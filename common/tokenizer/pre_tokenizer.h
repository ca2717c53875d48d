// Pre-tokenizer: splits text into the words that byte-level BPE merges
// within, using the regexes of the model's original tokenizer
// (tokenizer.ggml.pre). Regexes run in sequence as in llama.cpp: each one
// splits every piece left by the previous one, and text a regex does not
// match stays a piece of its own (so nothing is ever dropped).
//
// Invalid UTF-8 is allowed: PCRE2_MATCH_INVALID_UTF makes malformed bytes
// match nothing, so they end up in pieces of their own.
//
// Thread safety: immutable after Create(); Split() may run concurrently.
#ifndef TANDEM_COMMON_TOKENIZER_PRE_TOKENIZER_H_
#define TANDEM_COMMON_TOKENIZER_PRE_TOKENIZER_H_

#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::tokenizer {

class PreTokenizer {
 public:
  // `pre` is tokenizer.ggml.pre: "smollm" (and starcoder-style aliases),
  // "gpt2", "llama-bpe"/"llama3", "qwen2", or ""/"default". Unknown names
  // are InvalidArgument (silently wrong ids would be worse).
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> Create(std::string_view pre);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Appends the pieces of `text` to `out` (views into `text`, in order, none
  // empty; their concatenation is `text`).
  void Split(std::string_view text, std::vector<std::string_view>* out) const;

  // Llama 3: a word that is a token as a whole is emitted without merging.
  bool ignore_merges() const { return ignore_merges_; }

 private:
  PreTokenizer() = default;
  void SplitOne(const void* code, std::string_view piece, std::vector<std::string_view>* out) const;

  std::vector<void*> codes_;  // pcre2_code_8*, owned
  bool ignore_merges_ = false;
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_COMMON_TOKENIZER_PRE_TOKENIZER_H_
