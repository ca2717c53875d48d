#include "common/tokenizer/detokenizer.h"

#include "common/tokenizer/unicode.h"

namespace tandem::tokenizer {

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, DetokenizerOptions options)
    : tokenizer_(tokenizer), options_(options), at_start_(!options.continuation) {}

std::string StreamingDetokenizer::Push(int32_t id) {
  if (id < 0 || id >= tokenizer_.vocab_size()) return "";
  const bool special = tokenizer_.IsSpecial(id);
  if (special && options_.skip_special) return "";
  std::string_view piece = tokenizer_.pieces_[id];
  if (!special && at_start_) {
    // Same rule as Tokenizer::Decode.
    if (tokenizer_.strips_leading_space() && piece.starts_with(' ')) piece.remove_prefix(1);
    at_start_ = false;
  }
  pending_.append(piece);
  const size_t keep = IncompleteUtf8Suffix(pending_);
  std::string out = SanitizeUtf8(std::string_view(pending_).substr(0, pending_.size() - keep));
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StreamingDetokenizer::Flush() {
  std::string out = SanitizeUtf8(pending_);
  pending_.clear();
  at_start_ = !options_.continuation;
  return out;
}

}  // namespace tandem::tokenizer
