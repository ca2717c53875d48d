// UTF-8 validation and encoding, shared by the tokenizer (streaming
// detokenizer) and the JSON writer. Stateless and thread-safe.
#ifndef TANDEM_COMMON_UTF8_H_
#define TANDEM_COMMON_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::utf8 {

// Decodes one code point at s[pos] (REQUIRES: pos < s.size()) into *cp and
// returns its length, or 0 if the bytes there are invalid; a sequence cut
// short by the end of `s` also sets *truncated.
size_t DecodeUtf8(std::string_view s, size_t pos, uint32_t* cp, bool* truncated);

// Length in bytes of the well-formed UTF-8 sequence starting at s[pos], or 0
// when the bytes there are not a complete, valid sequence (truncated, stray
// continuation byte, overlong form, surrogate, > U+10FFFF).
size_t ValidUtf8Len(std::string_view s, size_t pos);

// Whether all of `s` is well-formed UTF-8 (ValidUtf8Len over every sequence).
bool IsValidUtf8(std::string_view s);

// Number of trailing bytes of `s` that form an incomplete (but so far valid)
// UTF-8 sequence, i.e. bytes that a streaming decoder must hold back. 0..3.
size_t IncompleteUtf8Suffix(std::string_view s);

// Appends the UTF-8 encoding of code point `cp` (must be <= 0x10FFFF).
void AppendUtf8(uint32_t cp, std::string* out);

}  // namespace tandem::utf8

#endif  // TANDEM_COMMON_UTF8_H_
