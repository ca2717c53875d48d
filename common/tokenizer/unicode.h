// UTF-8 and GPT-2 byte-level helpers shared by the tokenizer models.
//
// Thread safety: all functions are pure.
#ifndef TANDEM_COMMON_TOKENIZER_UNICODE_H_
#define TANDEM_COMMON_TOKENIZER_UNICODE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/utf8.h"

namespace tandem::tokenizer {

// UTF-8 primitives live in common/utf8.h (shared with common/json).
using utf8::AppendUtf8;
using utf8::IncompleteUtf8Suffix;
using utf8::ValidUtf8Len;

// GPT-2 byte-level alphabet: every byte maps to one printable code point
// (printable Latin-1 bytes map to themselves, the rest to U+0100 + n).
uint32_t ByteToCodepoint(uint8_t b);
// Inverse of ByteToCodepoint; -1 for code points outside the alphabet.
int ByteFromCodepoint(uint32_t cp);
// Maps raw bytes to their byte-level UTF-8 form ("hi there" -> "hiĠthere").
std::string BytesToByteLevel(std::string_view bytes);
// Inverse: byte-level text back to raw bytes. Code points outside the
// alphabet (and invalid UTF-8) are copied through unchanged.
std::string ByteLevelToBytes(std::string_view text);

// Replaces invalid UTF-8 sequences by U+FFFD (one per maximal invalid run
// of bytes that cannot start a valid sequence).
std::string SanitizeUtf8(std::string_view s);

}  // namespace tandem::tokenizer

#endif  // TANDEM_COMMON_TOKENIZER_UNICODE_H_
