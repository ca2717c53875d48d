// The goldens in tests/data (written by the tools/golden_*.py scripts) and
// the CLI's --json output, read into a plain struct for the tests. Malformed
// input throws std::runtime_error, which fails the test.
#ifndef TANDEM_TESTS_UTIL_JSON_READER_H_
#define TANDEM_TESTS_UTIL_JSON_READER_H_

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

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

// Parsed by nlohmann-json (the project's one JSON library), then copied into
// this plain struct, which keeps the tests short.
inline Json FromNlohmann(const nlohmann::json& j) {
  Json v;
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      break;
    case nlohmann::json::value_t::boolean:
      v.kind = Json::Kind::kBool;
      v.boolean = j.get<bool>();
      break;
    case nlohmann::json::value_t::string:
      v.kind = Json::Kind::kString;
      v.str = j.get<std::string>();
      break;
    case nlohmann::json::value_t::array:
      v.kind = Json::Kind::kArray;
      v.array.reserve(j.size());
      for (const auto& e : j) v.array.push_back(FromNlohmann(e));
      break;
    case nlohmann::json::value_t::object:
      v.kind = Json::Kind::kObject;
      for (const auto& [k, e] : j.items()) v.object.emplace(k, FromNlohmann(e));
      break;
    default:  // the number types
      v.kind = Json::Kind::kNumber;
      v.number = j.get<double>();
      break;
  }
  return v;
}

inline Json Json::Parse(std::string_view text) {
  try {
    return FromNlohmann(nlohmann::json::parse(text));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("json: ") + e.what());
  }
}

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
    if (!line.empty()) rows.push_back(Json::Parse(line));
  }
  return rows;
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_UTIL_JSON_READER_H_
