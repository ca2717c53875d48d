// The JSON parser (see json.h). Recursive descent with an explicit depth
// bound; strings are validated as UTF-8 and \u escapes (with surrogate pairs)
// are decoded.
#include <cmath>
#include <cstdlib>
#include <string>

#include "absl/strings/str_format.h"
#include "common/json.h"
#include "common/utf8.h"

namespace tandem::json {
namespace {

class Parser {
 public:
  Parser(std::string_view s, const ParseLimits& limits) : s_(s), limits_(limits) {}

  absl::StatusOr<Value> ParseDocument() {
    if (s_.size() > limits_.max_bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "json: input of %d bytes exceeds the limit of %d", s_.size(), limits_.max_bytes));
    }
    Value v;
    if (!ParseValue(&v, 0)) return Error();
    SkipWs();
    if (pos_ != s_.size()) {
      Fail("trailing characters");
      return Error();
    }
    return v;
  }

 private:
  bool Fail(const char* what) {
    if (error_.empty()) {
      error_ = what;
      error_pos_ = pos_;
    }
    return false;
  }
  absl::Status Error() const {
    return absl::InvalidArgumentError(absl::StrFormat("json: %s at byte %d", error_, error_pos_));
  }
  void SkipWs() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return Fail("invalid literal");
    pos_ += word.size();
    return true;
  }

  bool ParseValue(Value* v, int depth) {
    if (depth > limits_.max_depth) return Fail("nesting too deep");
    SkipWs();
    if (pos_ >= s_.size()) return Fail("unexpected end of input");
    switch (s_[pos_]) {
      case '{':
        return ParseObject(v, depth);
      case '[':
        return ParseArray(v, depth);
      case '"':
        v->kind = Value::Kind::kString;
        return ParseString(&v->string);
      case 't':
        v->kind = Value::Kind::kBool;
        v->boolean = true;
        return Literal("true");
      case 'f':
        v->kind = Value::Kind::kBool;
        return Literal("false");
      case 'n':
        return Literal("null");
      default:
        return ParseNumber(v);
    }
  }

  bool ParseObject(Value* v, int depth) {
    v->kind = Value::Kind::kObject;
    ++pos_;  // '{'
    SkipWs();
    if (pos_ < s_.size() && s_[pos_] == '}') return ++pos_, true;
    while (true) {
      SkipWs();
      if (pos_ >= s_.size() || s_[pos_] != '"') return Fail("expected a string key");
      std::string key;
      if (!ParseString(&key)) return false;
      SkipWs();
      if (pos_ >= s_.size() || s_[pos_] != ':') return Fail("expected ':'");
      ++pos_;
      Value item;
      if (!ParseValue(&item, depth + 1)) return false;
      v->object[std::move(key)] = std::move(item);
      SkipWs();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == '}') return ++pos_, true;
      return Fail("expected ',' or '}'");
    }
  }

  bool ParseArray(Value* v, int depth) {
    v->kind = Value::Kind::kArray;
    ++pos_;  // '['
    SkipWs();
    if (pos_ < s_.size() && s_[pos_] == ']') return ++pos_, true;
    while (true) {
      Value item;
      if (!ParseValue(&item, depth + 1)) return false;
      v->array.push_back(std::move(item));
      SkipWs();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == ']') return ++pos_, true;
      return Fail("expected ',' or ']'");
    }
  }

  bool Hex4(uint32_t* out) {
    if (pos_ + 4 > s_.size()) return Fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_ + i];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= c - '0';
      else if (c >= 'a' && c <= 'f')
        v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        v |= c - 'A' + 10;
      else
        return Fail("bad hex digit in \\u escape");
    }
    pos_ += 4;
    *out = v;
    return true;
  }

  bool ParseEscape(std::string* out) {
    if (pos_ >= s_.size()) return Fail("unterminated string");
    const char e = s_[pos_++];
    switch (e) {
      case '"':
        out->push_back('"');
        return true;
      case '\\':
        out->push_back('\\');
        return true;
      case '/':
        out->push_back('/');
        return true;
      case 'b':
        out->push_back('\b');
        return true;
      case 'f':
        out->push_back('\f');
        return true;
      case 'n':
        out->push_back('\n');
        return true;
      case 'r':
        out->push_back('\r');
        return true;
      case 't':
        out->push_back('\t');
        return true;
      case 'u': {
        uint32_t cp;
        if (!Hex4(&cp)) return false;
        if (cp >= 0xDC00 && cp <= 0xDFFF) return Fail("lone low surrogate");
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          uint32_t lo;
          if (s_.substr(pos_, 2) != "\\u") return Fail("lone high surrogate");
          pos_ += 2;
          if (!Hex4(&lo)) return false;
          if (lo < 0xDC00 || lo > 0xDFFF) return Fail("bad low surrogate");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        utf8::AppendUtf8(cp, out);
        return true;
      }
      default:
        --pos_;
        return Fail("invalid escape");
    }
  }

  bool ParseString(std::string* out) {
    ++pos_;  // opening quote
    while (true) {
      if (pos_ >= s_.size()) return Fail("unterminated string");
      const auto c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') return ++pos_, true;
      if (c == '\\') {
        ++pos_;
        if (!ParseEscape(out)) return false;
        continue;
      }
      if (c < 0x20) return Fail("control character in string");
      const size_t len = utf8::ValidUtf8Len(s_, pos_);
      if (len == 0) return Fail("invalid UTF-8 in string");
      out->append(s_.substr(pos_, len));
      pos_ += len;
    }
  }

  bool ParseNumber(Value* v) {
    const size_t start = pos_;
    auto digits = [&] {
      const size_t from = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ > from;
    };
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    if (pos_ < s_.size() && s_[pos_] == '0') {
      ++pos_;
    } else if (!digits()) {
      pos_ = start;
      return Fail("unexpected character");
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (!digits()) return Fail("digits expected after '.'");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (!digits()) return Fail("digits expected in exponent");
    }
    const std::string text(s_.substr(start, pos_ - start));
    v->kind = Value::Kind::kNumber;
    v->number = std::strtod(text.c_str(), nullptr);
    if (!std::isfinite(v->number)) {
      pos_ = start;
      return Fail("number out of range");
    }
    return true;
  }

  std::string_view s_;
  ParseLimits limits_;
  size_t pos_ = 0;
  std::string error_;
  size_t error_pos_ = 0;
};

}  // namespace

const Value* Value::Find(const std::string& key) const {
  if (kind != Kind::kObject) return nullptr;
  auto it = object.find(key);
  return it == object.end() ? nullptr : &it->second;
}

absl::StatusOr<Value> Parse(std::string_view text, const ParseLimits& limits) {
  return Parser(text, limits).ParseDocument();
}

}  // namespace tandem::json
