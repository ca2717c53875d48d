// Value accessors and constructors, and GgufFile's typed metadata getters.
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "common/gguf/gguf.h"

namespace tandem::gguf {
namespace {

absl::Status Mismatch(const Value& v, std::string_view wanted) {
  return absl::InvalidArgumentError(
      absl::StrFormat("gguf: value of type %s is not %s", ValueTypeName(v.type), wanted));
}

// Prefixes a value error with the key it belongs to.
absl::Status WithKey(const absl::Status& s, std::string_view key) {
  return absl::Status(s.code(), absl::StrFormat("key '%s': %s", key, s.message()));
}

template <typename T>
absl::StatusOr<T> KeyedGet(const GgufFile& f, std::string_view key,
                           absl::StatusOr<T> (Value::*get)() const) {
  const Value* v = f.Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrFormat("gguf: key '%s' not found", key));
  absl::StatusOr<T> r = (v->*get)();
  if (!r.ok()) return WithKey(r.status(), key);
  return r;
}

template <typename T>
absl::StatusOr<T> KeyedGetOr(const GgufFile& f, std::string_view key,
                             absl::StatusOr<T> (Value::*get)() const, T def) {
  if (f.Find(key) == nullptr) return def;
  return KeyedGet(f, key, get);
}

}  // namespace

std::string_view ValueTypeName(ValueType t) {
  switch (t) {
    case ValueType::kUint8:
      return "uint8";
    case ValueType::kInt8:
      return "int8";
    case ValueType::kUint16:
      return "uint16";
    case ValueType::kInt16:
      return "int16";
    case ValueType::kUint32:
      return "uint32";
    case ValueType::kInt32:
      return "int32";
    case ValueType::kFloat32:
      return "float32";
    case ValueType::kBool:
      return "bool";
    case ValueType::kString:
      return "string";
    case ValueType::kArray:
      return "array";
    case ValueType::kUint64:
      return "uint64";
    case ValueType::kInt64:
      return "int64";
    case ValueType::kFloat64:
      return "float64";
  }
  return "unknown";
}

bool Value::is_integer() const {
  return std::holds_alternative<uint64_t>(data) || std::holds_alternative<int64_t>(data);
}

absl::StatusOr<int64_t> Value::AsInt() const {
  if (const auto* u = std::get_if<uint64_t>(&data)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrFormat("gguf: %s value %u does not fit in int64", ValueTypeName(type), *u));
    }
    return static_cast<int64_t>(*u);
  }
  if (const auto* i = std::get_if<int64_t>(&data)) return *i;
  return Mismatch(*this, "an integer");
}

absl::StatusOr<uint64_t> Value::AsUint() const {
  if (const auto* u = std::get_if<uint64_t>(&data)) return *u;
  if (const auto* i = std::get_if<int64_t>(&data)) {
    if (*i < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("gguf: %s value %d is negative", ValueTypeName(type), *i));
    }
    return static_cast<uint64_t>(*i);
  }
  return Mismatch(*this, "an unsigned integer");
}

absl::StatusOr<double> Value::AsFloat() const {
  if (const auto* d = std::get_if<double>(&data)) return *d;
  if (const auto* u = std::get_if<uint64_t>(&data)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&data)) return static_cast<double>(*i);
  return Mismatch(*this, "a number");
}

absl::StatusOr<bool> Value::AsBool() const {
  if (const auto* b = std::get_if<bool>(&data)) return *b;
  return Mismatch(*this, "a bool");
}

absl::StatusOr<std::string_view> Value::AsString() const {
  if (const auto* s = std::get_if<std::string>(&data)) return std::string_view(*s);
  return Mismatch(*this, "a string");
}

absl::StatusOr<const Value::Array*> Value::AsArray() const {
  if (const auto* a = std::get_if<Array>(&data)) return a;
  return Mismatch(*this, "an array");
}

Value Value::Uint32(uint32_t v) {
  return Value{ValueType::kUint32, ValueType::kUint8, uint64_t{v}};
}
Value Value::Int32(int32_t v) { return Value{ValueType::kInt32, ValueType::kUint8, int64_t{v}}; }
Value Value::Uint64(uint64_t v) { return Value{ValueType::kUint64, ValueType::kUint8, v}; }
Value Value::Float32(float v) {
  return Value{ValueType::kFloat32, ValueType::kUint8, static_cast<double>(v)};
}
Value Value::Bool(bool v) { return Value{ValueType::kBool, ValueType::kUint8, v}; }
Value Value::String(std::string v) {
  return Value{ValueType::kString, ValueType::kUint8, std::move(v)};
}
Value Value::MakeArray(ValueType element_type, Array elements) {
  return Value{ValueType::kArray, element_type, std::move(elements)};
}
Value Value::StringArray(const std::vector<std::string>& v) {
  Array a;
  a.reserve(v.size());
  for (const std::string& s : v) a.push_back(String(s));
  return MakeArray(ValueType::kString, std::move(a));
}
Value Value::Float32Array(const std::vector<float>& v) {
  Array a;
  a.reserve(v.size());
  for (float f : v) a.push_back(Float32(f));
  return MakeArray(ValueType::kFloat32, std::move(a));
}
Value Value::Int32Array(const std::vector<int32_t>& v) {
  Array a;
  a.reserve(v.size());
  for (int32_t i : v) a.push_back(Int32(i));
  return MakeArray(ValueType::kInt32, std::move(a));
}

const Value* GgufFile::Find(std::string_view key) const {
  for (const auto& [k, v] : metadata_) {
    if (k == key) return &v;
  }
  return nullptr;
}

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  return KeyedGet(*this, key, &Value::AsInt);
}
absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  return KeyedGet(*this, key, &Value::AsFloat);
}
absl::StatusOr<std::string_view> GgufFile::GetString(std::string_view key) const {
  return KeyedGet(*this, key, &Value::AsString);
}
absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  return KeyedGet(*this, key, &Value::AsBool);
}
absl::StatusOr<const Value::Array*> GgufFile::GetArray(std::string_view key) const {
  return KeyedGet(*this, key, &Value::AsArray);
}
absl::StatusOr<int64_t> GgufFile::GetIntOr(std::string_view key, int64_t def) const {
  return KeyedGetOr(*this, key, &Value::AsInt, def);
}
absl::StatusOr<double> GgufFile::GetFloatOr(std::string_view key, double def) const {
  return KeyedGetOr(*this, key, &Value::AsFloat, def);
}
absl::StatusOr<bool> GgufFile::GetBoolOr(std::string_view key, bool def) const {
  return KeyedGetOr(*this, key, &Value::AsBool, def);
}

}  // namespace tandem::gguf
