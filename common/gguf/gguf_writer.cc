// GGUF v3 image builder.
#include <bit>
#include <cstring>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "common/gguf/gguf.h"
#include "common/status.h"

namespace tandem::gguf {
namespace {

constexpr uint64_t kDefaultAlignment = 32;

template <typename T>
void Put(std::string& out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out.append(buf, sizeof(T));
}

void PutString(std::string& out, std::string_view s) {
  Put<uint64_t>(out, s.size());
  out.append(s);
}

void PadTo(std::string& out, uint64_t alignment) {
  const uint64_t rem = out.size() % alignment;
  if (rem != 0) out.append(alignment - rem, '\0');
}

// Writes the payload of `v` as type `type` (the type tag itself is written by
// the caller). Values are built by code, not read from untrusted input, so a
// storage/type mismatch is a bug: TANDEM_CHECK.
void PutPayload(std::string& out, ValueType type, const Value& v) {
  TANDEM_CHECK(v.type == type);
  auto u = [&] {
    TANDEM_CHECK(std::holds_alternative<uint64_t>(v.data));
    return std::get<uint64_t>(v.data);
  };
  auto i = [&] {
    TANDEM_CHECK(std::holds_alternative<int64_t>(v.data));
    return std::get<int64_t>(v.data);
  };
  auto f = [&] {
    TANDEM_CHECK(std::holds_alternative<double>(v.data));
    return std::get<double>(v.data);
  };
  switch (type) {
    case ValueType::kUint8:
      Put<uint8_t>(out, static_cast<uint8_t>(u()));
      break;
    case ValueType::kInt8:
      Put<int8_t>(out, static_cast<int8_t>(i()));
      break;
    case ValueType::kUint16:
      Put<uint16_t>(out, static_cast<uint16_t>(u()));
      break;
    case ValueType::kInt16:
      Put<int16_t>(out, static_cast<int16_t>(i()));
      break;
    case ValueType::kUint32:
      Put<uint32_t>(out, static_cast<uint32_t>(u()));
      break;
    case ValueType::kInt32:
      Put<int32_t>(out, static_cast<int32_t>(i()));
      break;
    case ValueType::kUint64:
      Put<uint64_t>(out, u());
      break;
    case ValueType::kInt64:
      Put<int64_t>(out, i());
      break;
    case ValueType::kFloat32:
      Put<float>(out, static_cast<float>(f()));
      break;
    case ValueType::kFloat64:
      Put<double>(out, f());
      break;
    case ValueType::kBool:
      TANDEM_CHECK(std::holds_alternative<bool>(v.data));
      Put<uint8_t>(out, std::get<bool>(v.data) ? 1 : 0);
      break;
    case ValueType::kString:
      TANDEM_CHECK(std::holds_alternative<std::string>(v.data));
      PutString(out, std::get<std::string>(v.data));
      break;
    case ValueType::kArray: {
      TANDEM_CHECK(std::holds_alternative<Value::Array>(v.data));
      const Value::Array& elems = std::get<Value::Array>(v.data);
      Put<uint32_t>(out, static_cast<uint32_t>(v.array_type));
      Put<uint64_t>(out, elems.size());
      for (const Value& e : elems) PutPayload(out, v.array_type, e);
      break;
    }
  }
}

}  // namespace

void GgufWriter::Add(std::string key, Value value) {
  metadata_.emplace_back(std::move(key), std::move(value));
}

absl::Status GgufWriter::AddTensor(std::string name, std::vector<int64_t> shape, TensorType type,
                                   std::string bytes) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0 || __builtin_mul_overflow(n, d, &n)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("gguf writer: tensor '%s' has a bad shape", name));
    }
  }
  TANDEM_ASSIGN_OR_RETURN(const uint64_t want, RowBytes(type, n));
  if (bytes.size() != want) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gguf writer: tensor '%s' needs %d bytes, got %d", name, want, bytes.size()));
  }
  tensors_.push_back({std::move(name), std::move(shape), type, std::move(bytes)});
  return absl::OkStatus();
}

absl::Status GgufWriter::AddF32Tensor(std::string name, std::vector<int64_t> shape,
                                      const std::vector<float>& values) {
  std::string bytes(values.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return AddTensor(std::move(name), std::move(shape), TensorType::kF32, std::move(bytes));
}

std::string GgufWriter::Serialize() const {
  // A valid "general.alignment" in the metadata wins over SetAlignment(), so
  // the layout always matches what a reader will compute; a non-default
  // alignment without the key gets the key appended.
  uint64_t alignment = alignment_;
  bool has_key = false;
  for (const auto& [k, v] : metadata_) {
    if (k != "general.alignment") continue;
    has_key = true;
    absl::StatusOr<uint64_t> a = v.AsUint();
    if (a.ok() && *a != 0 && std::has_single_bit(*a)) alignment = *a;
  }
  TANDEM_CHECK(alignment != 0 && std::has_single_bit(alignment));
  const bool add_key = !has_key && alignment != kDefaultAlignment;

  std::string out = "GGUF";
  Put<uint32_t>(out, 3);
  Put<uint64_t>(out, tensors_.size());
  Put<uint64_t>(out, metadata_.size() + (add_key ? 1 : 0));
  for (const auto& [k, v] : metadata_) {
    PutString(out, k);
    Put<uint32_t>(out, static_cast<uint32_t>(v.type));
    PutPayload(out, v.type, v);
  }
  if (add_key) {
    PutString(out, "general.alignment");
    Put<uint32_t>(out, static_cast<uint32_t>(ValueType::kUint32));
    Put<uint32_t>(out, static_cast<uint32_t>(alignment));
  }
  uint64_t offset = 0;
  for (const PendingTensor& t : tensors_) {
    PutString(out, t.name);
    Put<uint32_t>(out, static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) Put<uint64_t>(out, static_cast<uint64_t>(d));
    Put<uint32_t>(out, static_cast<uint32_t>(t.type));
    Put<uint64_t>(out, offset);
    offset += (t.bytes.size() + alignment - 1) / alignment * alignment;
  }
  PadTo(out, alignment);
  for (const PendingTensor& t : tensors_) {
    out.append(t.bytes);
    PadTo(out, alignment);
  }
  return out;
}

absl::Status GgufWriter::WriteFile(const std::string& path) const {
  const std::string bytes = Serialize();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return absl::UnavailableError(absl::StrFormat("gguf writer: cannot create '%s'", path));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) return absl::UnavailableError(absl::StrFormat("gguf writer: cannot write '%s'", path));
  return absl::OkStatus();
}

}  // namespace tandem::gguf
