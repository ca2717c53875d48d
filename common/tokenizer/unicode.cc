#include "common/tokenizer/unicode.h"

#include <array>

namespace tandem::tokenizer {
namespace {

struct ByteTables {
  std::array<uint32_t, 256> to_cp{};
  // Every code point of the alphabet is < 0x144.
  std::array<int16_t, 0x144> from_cp{};
};

const ByteTables& Tables() {
  static const ByteTables tables = [] {
    ByteTables t;
    t.from_cp.fill(-1);
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : 256u + next++;
      t.to_cp[b] = cp;
      t.from_cp[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return tables;
}

}  // namespace

uint32_t ByteToCodepoint(uint8_t b) { return Tables().to_cp[b]; }

int ByteFromCodepoint(uint32_t cp) {
  return cp < Tables().from_cp.size() ? Tables().from_cp[cp] : -1;
}

std::string BytesToByteLevel(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) AppendUtf8(ByteToCodepoint(static_cast<uint8_t>(c)), &out);
  return out;
}

std::string ByteLevelToBytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    uint32_t cp;
    bool truncated;
    const size_t len = utf8::DecodeUtf8(text, pos, &cp, &truncated);
    if (len == 0) {
      out.push_back(text[pos++]);
      continue;
    }
    const int b = ByteFromCodepoint(cp);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      out.append(text.substr(pos, len));
    }
    pos += len;
  }
  return out;
}

std::string SanitizeUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  bool in_bad_run = false;
  while (pos < s.size()) {
    const size_t len = ValidUtf8Len(s, pos);
    if (len == 0) {
      if (!in_bad_run) out.append("\xEF\xBF\xBD");
      in_bad_run = true;
      ++pos;
      continue;
    }
    in_bad_run = false;
    out.append(s.substr(pos, len));
    pos += len;
  }
  return out;
}

}  // namespace tandem::tokenizer
