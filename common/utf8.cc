#include "common/utf8.h"

namespace tandem::utf8 {

// Decodes one code point at s[pos]; returns its length or 0 if invalid. A
// sequence cut short by the end of `s` reports `*truncated`.
size_t DecodeUtf8(std::string_view s, size_t pos, uint32_t* cp, bool* truncated) {
  *truncated = false;
  const auto b0 = static_cast<uint8_t>(s[pos]);
  size_t len;
  uint32_t min;
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  } else if (b0 < 0xC2 || b0 > 0xF4) {
    return 0;  // continuation byte, overlong lead or out of range
  } else if ((b0 & 0xE0) == 0xC0) {
    len = 2, min = 0x80, *cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, min = 0x800, *cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, min = 0x10000, *cp = b0 & 0x07;
  } else {
    return 0;
  }
  for (size_t i = 1; i < len; ++i) {
    if (pos + i >= s.size()) {
      *truncated = true;
      return 0;
    }
    const auto b = static_cast<uint8_t>(s[pos + i]);
    if ((b & 0xC0) != 0x80) return 0;
    *cp = (*cp << 6) | (b & 0x3F);
    // Reject overlong / surrogate / out-of-range prefixes as early as
    // possible so that IncompleteUtf8Suffix does not hold back garbage.
    if (i == 1) {
      if (len == 3 && b0 == 0xE0 && b < 0xA0) return 0;
      if (len == 3 && b0 == 0xED && b >= 0xA0) return 0;
      if (len == 4 && b0 == 0xF0 && b < 0x90) return 0;
      if (len == 4 && (b0 > 0xF4 || (b0 == 0xF4 && b >= 0x90))) return 0;
    }
  }
  if (*cp < min || *cp > 0x10FFFF || (*cp >= 0xD800 && *cp <= 0xDFFF)) return 0;
  return len;
}

size_t ValidUtf8Len(std::string_view s, size_t pos) {
  uint32_t cp;
  bool truncated;
  return pos < s.size() ? DecodeUtf8(s, pos, &cp, &truncated) : 0;
}

bool IsValidUtf8(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    const size_t n = ValidUtf8Len(s, pos);
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

size_t IncompleteUtf8Suffix(std::string_view s) {
  // A lead byte within the last 3 bytes whose sequence runs past the end and
  // whose bytes so far are valid.
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const size_t pos = s.size() - back;
    const auto b = static_cast<uint8_t>(s[pos]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking
    uint32_t cp;
    bool truncated;
    DecodeUtf8(s, pos, &cp, &truncated);
    return truncated ? back : 0;
  }
  return 0;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace tandem::utf8
