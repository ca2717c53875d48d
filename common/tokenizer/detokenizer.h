// Streaming detokenizer: turns generated token ids into UTF-8-safe text
// deltas. A token can end in the middle of a character (byte-fallback and
// byte-level tokens split emoji and CJK); those bytes are held back until the
// character completes, so every returned string is valid UTF-8. Bytes that
// can never form a character come out as U+FFFD.
//
// Contract: for ids whose Decode() is valid UTF-8,
//   Push(id_0) + ... + Push(id_n) + Flush() == tokenizer.Decode(ids, skip_special)
// (with continuation = false).
//
// Thread safety: not thread-safe (one per sequence). The Tokenizer must
// outlive it.
#ifndef TANDEM_COMMON_TOKENIZER_DETOKENIZER_H_
#define TANDEM_COMMON_TOKENIZER_DETOKENIZER_H_

#include <cstdint>
#include <string>

#include "common/tokenizer/tokenizer.h"

namespace tandem::tokenizer {

struct DetokenizerOptions {
  bool skip_special = false;  // drop control/unknown tokens (e.g. <|im_end|>)
  // The ids continue a prompt: keep the leading space of the first token
  // (SPM models), which Decode() of a whole text would remove.
  bool continuation = false;
};

class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer, DetokenizerOptions options = {});

  // Text completed by `id` (possibly empty). Out-of-range ids are ignored.
  std::string Push(int32_t id);
  // Everything still held back (an incomplete character becomes U+FFFD).
  // The detokenizer can be reused afterwards as if new.
  std::string Flush();

  size_t num_pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  DetokenizerOptions options_;
  bool at_start_ = true;
  std::string pending_;  // bytes of an incomplete UTF-8 character
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_COMMON_TOKENIZER_DETOKENIZER_H_
