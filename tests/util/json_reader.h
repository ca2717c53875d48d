// Test-only JSON reader for the goldens in tests/data (written by the
// tools/golden_*.py scripts) and for the CLI's --json output. Malformed input
// throws std::runtime_error, which fails the test.
#ifndef TANDEM_TESTS_UTIL_JSON_READER_H_
#define TANDEM_TESTS_UTIL_JSON_READER_H_

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/unicode.h"

namespace tandem::testing {

struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string str;
  std::vector<Json> array;
  std::map<std::string, Json> object;

  bool has(const std::string& k) const { return object.count(k) != 0; }
  const Json& operator[](const std::string& k) const { return object.at(k); }
  const Json& operator[](size_t i) const { return array.at(i); }
  size_t size() const { return kind == Kind::kArray ? array.size() : object.size(); }
  // The numbers of an array, converted to T.
  template <typename T>
  std::vector<T> As() const {
    std::vector<T> out;
    for (const Json& v : array) out.push_back(static_cast<T>(v.number));
    return out;
  }
  std::vector<int32_t> ints() const { return As<int32_t>(); }

  static Json Parse(std::string_view text);
};

class JsonParser {
 public:
  explicit JsonParser(std::string_view s) : s_(s) {}
  Json Parse() {
    Json v = Value();
    Ws();
    if (pos_ != s_.size()) throw std::runtime_error("json: trailing data");
    return v;
  }

 private:
  void Ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t')) {
      ++pos_;
    }
  }
  char Peek() {
    Ws();
    if (pos_ >= s_.size()) throw std::runtime_error("json: unexpected end");
    return s_[pos_];
  }
  void Expect(char c) {
    if (Peek() != c) throw std::runtime_error(std::string("json: expected ") + c);
    ++pos_;
  }
  uint32_t Hex4() {
    if (pos_ + 4 > s_.size()) throw std::runtime_error("json: bad \\u");
    uint32_t v = std::stoul(std::string(s_.substr(pos_, 4)), nullptr, 16);
    pos_ += 4;
    return v;
  }
  std::string String() {
    Expect('"');
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) throw std::runtime_error("json: unterminated string");
      char c = s_[pos_++];
      if (c == '"') return out;
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      char e = s_[pos_++];
      switch (e) {
        case 'n':
          out.push_back('\n');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'u': {
          uint32_t cp = Hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(pos_, 2) == "\\u") {
            pos_ += 2;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (Hex4() - 0xDC00);
          }
          tokenizer::AppendUtf8(cp, &out);
          break;
        }
        default:
          out.push_back(e);
      }
    }
  }
  Json Value() {
    Json v;
    const char c = Peek();
    if (c == '{') {
      v.kind = Json::Kind::kObject;
      ++pos_;
      if (Peek() == '}') return ++pos_, v;
      while (true) {
        std::string k = String();
        Expect(':');
        v.object[k] = Value();
        if (Peek() == ',') {
          ++pos_;
          continue;
        }
        Expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.kind = Json::Kind::kArray;
      ++pos_;
      if (Peek() == ']') return ++pos_, v;
      while (true) {
        v.array.push_back(Value());
        if (Peek() == ',') {
          ++pos_;
          continue;
        }
        Expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.kind = Json::Kind::kString;
      v.str = String();
      return v;
    }
    if (s_.substr(pos_, 4) == "true")
      return pos_ += 4, v.kind = Json::Kind::kBool, v.boolean = true, v;
    if (s_.substr(pos_, 5) == "false") return pos_ += 5, v.kind = Json::Kind::kBool, v;
    if (s_.substr(pos_, 4) == "null") return pos_ += 4, v;
    size_t used = 0;
    v.kind = Json::Kind::kNumber;
    v.number = std::stod(std::string(s_.substr(pos_, 32)), &used);
    pos_ += used;
    return v;
  }

  std::string_view s_;
  size_t pos_ = 0;
};

inline Json Json::Parse(std::string_view text) { return JsonParser(text).Parse(); }

inline std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<Json> ReadJsonl(const std::string& path) {
  std::vector<Json> rows;
  std::istringstream in(ReadFileOrEmpty(path));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) rows.push_back(JsonParser(line).Parse());
  }
  return rows;
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_UTIL_JSON_READER_H_
