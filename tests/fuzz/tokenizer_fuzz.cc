// Fuzzes the tokenizer and the streaming detokenizer on arbitrary bytes
// (SentencePiece and byte-level BPE): Encode never crashes and gives ids in
// the vocabulary; streaming the ids gives valid UTF-8 deltas that add up to
// Decode() whenever Decode() is valid UTF-8 (detokenizer.h's contract); the
// same for arbitrary id sequences made from the input bytes.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/detokenizer.h"
#include "common/utf8.h"
#include "tests/fuzz/fuzz_models.h"

namespace {

void CheckStreaming(const tandem::tokenizer::Tokenizer& tok, const std::vector<int32_t>& ids,
                    bool skip_special) {
  tandem::tokenizer::DetokenizerOptions options;
  options.skip_special = skip_special;
  tandem::tokenizer::StreamingDetokenizer detok(tok, options);
  std::string streamed;
  for (int32_t id : ids) {
    std::string delta = detok.Push(id);
    if (!tandem::fuzz::IsValidUtf8(delta)) __builtin_trap();
    streamed += delta;
  }
  const std::string tail = detok.Flush();
  if (!tandem::fuzz::IsValidUtf8(tail)) __builtin_trap();
  streamed += tail;
  const std::string whole = tok.Decode(ids, skip_special);
  if (tandem::fuzz::IsValidUtf8(whole) && streamed != whole) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;  // long inputs add time, not coverage
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const auto& t : tandem::fuzz::FuzzTokenizers()) {
    const tandem::tokenizer::Tokenizer& tok = *t->tokenizer;
    const int32_t vocab = static_cast<int32_t>(tok.vocab().tokens.size());
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = tok.Encode(text, /*add_special=*/special, special);
      for (int32_t id : ids) {
        if (id < 0 || id >= vocab) __builtin_trap();
      }
      CheckStreaming(tok, ids, /*skip_special=*/false);
    }
    // Arbitrary id sequences (two bytes each, folded into the vocabulary).
    std::vector<int32_t> ids;
    for (size_t i = 0; i + 1 < size; i += 2) {
      ids.push_back(static_cast<int32_t>((data[i] | (data[i + 1] << 8)) % vocab));
    }
    CheckStreaming(tok, ids, /*skip_special=*/size > 0 && (data[0] & 1));
  }
  return 0;
}
