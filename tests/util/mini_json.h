// A tiny JSON reader for trusted test goldens (test-only; no error recovery:
// malformed input fails the test through TANDEM_CHECK).
#ifndef TANDEM_TESTS_UTIL_MINI_JSON_H_
#define TANDEM_TESTS_UTIL_MINI_JSON_H_

#include <cctype>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace tandem::testing {

struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  double number = 0;
  std::string str;
  std::vector<Json> array;
  std::map<std::string, Json> object;

  const Json& operator[](const std::string& k) const {
    auto it = object.find(k);
    TANDEM_CHECK(it != object.end());
    return it->second;
  }
  const Json& operator[](size_t i) const { return array.at(i); }
  size_t size() const { return kind == kArray ? array.size() : object.size(); }
  template <typename T>
  std::vector<T> As() const {
    std::vector<T> out;
    for (const Json& j : array) out.push_back(static_cast<T>(j.number));
    return out;
  }

  static Json Parse(const std::string& text) {
    size_t pos = 0;
    Json j = ParseValue(text, pos);
    return j;
  }

 private:
  static void Skip(const std::string& s, size_t& p) {
    while (p < s.size() && std::isspace(static_cast<unsigned char>(s[p]))) ++p;
  }
  static std::string ParseString(const std::string& s, size_t& p) {
    TANDEM_CHECK(s[p] == '"');
    std::string out;
    for (++p; s[p] != '"'; ++p) {
      if (s[p] == '\\') {
        ++p;
        switch (s[p]) {
          case 'n':
            out += '\n';
            break;
          case 't':
            out += '\t';
            break;
          case 'r':
            out += '\r';
            break;
          case 'b':
            out += '\b';
            break;
          case 'f':
            out += '\f';
            break;
          case 'u': {
            unsigned cp = std::strtoul(s.substr(p + 1, 4).c_str(), nullptr, 16);
            p += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && s[p + 1] == '\\' && s[p + 2] == 'u') {
              unsigned lo = std::strtoul(s.substr(p + 3, 4).c_str(), nullptr, 16);
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
              p += 6;
            }
            if (cp < 0x80) {
              out += char(cp);
            } else if (cp < 0x800) {
              out += char(0xC0 | (cp >> 6));
              out += char(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
              out += char(0xE0 | (cp >> 12));
              out += char(0x80 | ((cp >> 6) & 0x3F));
              out += char(0x80 | (cp & 0x3F));
            } else {
              out += char(0xF0 | (cp >> 18));
              out += char(0x80 | ((cp >> 12) & 0x3F));
              out += char(0x80 | ((cp >> 6) & 0x3F));
              out += char(0x80 | (cp & 0x3F));
            }
            break;
          }
          default:
            out += s[p];
        }
      } else {
        out += s[p];
      }
    }
    ++p;
    return out;
  }
  static Json ParseValue(const std::string& s, size_t& p) {
    Skip(s, p);
    Json j;
    TANDEM_CHECK(p < s.size());
    if (s[p] == '{') {
      j.kind = kObject;
      ++p;
      for (Skip(s, p); s[p] != '}'; Skip(s, p)) {
        std::string key = ParseString(s, p);
        Skip(s, p);
        TANDEM_CHECK(s[p] == ':');
        ++p;
        j.object[key] = ParseValue(s, p);
        Skip(s, p);
        if (s[p] == ',') ++p;
      }
      ++p;
    } else if (s[p] == '[') {
      j.kind = kArray;
      ++p;
      for (Skip(s, p); s[p] != ']'; Skip(s, p)) {
        j.array.push_back(ParseValue(s, p));
        Skip(s, p);
        if (s[p] == ',') ++p;
      }
      ++p;
    } else if (s[p] == '"') {
      j.kind = kString;
      j.str = ParseString(s, p);
    } else if (s.compare(p, 4, "true") == 0 || s.compare(p, 5, "false") == 0) {
      j.kind = kBool;
      j.number = s[p] == 't';
      p += s[p] == 't' ? 4 : 5;
    } else if (s.compare(p, 4, "null") == 0) {
      p += 4;
    } else {
      j.kind = kNumber;
      char* end = nullptr;
      j.number = std::strtod(s.c_str() + p, &end);
      TANDEM_CHECK(end != s.c_str() + p);
      p = end - s.c_str();
    }
    return j;
  }
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_UTIL_MINI_JSON_H_
