// GGUF v2/v3 parser. Every read is bounds-checked against the file size and
// every count is checked against the bytes left before anything is reserved,
// so hostile files produce a status, never a crash or a huge allocation.

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>

#include "absl/container/flat_hash_set.h"
#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/gguf/gguf.h"
#include "common/status.h"

namespace tandem::gguf {
namespace {

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a LE host");

constexpr int kMaxArrayDepth = 8;  // nested array levels
constexpr int kMaxDims = 4;        // GGML_MAX_DIMS
constexpr uint64_t kMaxAlignment = uint64_t{1} << 20;
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;              // key length, type, smallest value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // name length, n_dims, type, offset

// Bounds-checked little-endian reader over the file image.
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  absl::Status Truncated(std::string_view what, uint64_t need) const {
    return absl::OutOfRangeError(absl::StrFormat(
        "gguf: truncated file: %s at offset %d needs %d bytes, only %d left (file size %d)", what,
        pos_, need, remaining(), size_));
  }

  template <typename T>
  absl::Status Read(std::string_view what, T* out) {
    if (remaining() < sizeof(T)) return Truncated(what, sizeof(T));
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  absl::Status ReadString(std::string_view what, std::string* out) {
    const uint64_t at = pos_;
    uint64_t len = 0;
    TANDEM_RETURN_IF_ERROR(Read(what, &len));
    if (len > remaining()) {
      return absl::OutOfRangeError(absl::StrFormat(
          "gguf: %s at offset %d: string length %d exceeds the %d bytes left (file size %d)", what,
          at, len, remaining(), size_));
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return absl::OkStatus();
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

bool IsKnownValueType(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::kFloat64); }

// Smallest encoding of one value of type `t`: what a count must be checked
// against before reserving.
uint64_t MinEncodedBytes(ValueType t) {
  switch (t) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kBool:
      return 1;
    case ValueType::kUint16:
    case ValueType::kInt16:
      return 2;
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kFloat32:
      return 4;
    case ValueType::kUint64:
    case ValueType::kInt64:
    case ValueType::kFloat64:
    case ValueType::kString:
      return 8;
    case ValueType::kArray:
      return 4 + 8;
  }
  return 1;
}

template <typename Raw, typename Stored>
absl::Status ReadScalar(Cursor& c, std::string_view what, Value* out) {
  Raw raw{};
  TANDEM_RETURN_IF_ERROR(c.Read(what, &raw));
  out->data = static_cast<Stored>(raw);
  return absl::OkStatus();
}

absl::Status ReadValue(Cursor& c, ValueType type, int depth, std::string_view what, Value* out);

absl::Status ReadArray(Cursor& c, int depth, std::string_view what, Value* out) {
  const uint64_t at = c.pos();
  if (depth >= kMaxArrayDepth) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gguf: %s at offset %d: arrays nested deeper than %d levels", what, at, kMaxArrayDepth));
  }
  uint32_t raw_type = 0;
  uint64_t count = 0;
  TANDEM_RETURN_IF_ERROR(c.Read(what, &raw_type));
  if (!IsKnownValueType(raw_type)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gguf: %s at offset %d: unknown array element type %u", what, at, raw_type));
  }
  TANDEM_RETURN_IF_ERROR(c.Read(what, &count));
  const auto elem_type = static_cast<ValueType>(raw_type);
  const uint64_t min_bytes = MinEncodedBytes(elem_type);
  if (count > c.remaining() / min_bytes) {
    return absl::OutOfRangeError(absl::StrFormat(
        "gguf: %s at offset %d: array count %d of %s needs at least %d bytes per element, only "
        "%d bytes left",
        what, at, count, ValueTypeName(elem_type), min_bytes, c.remaining()));
  }
  out->array_type = elem_type;
  Value::Array elems(count);
  for (Value& e : elems) {
    TANDEM_RETURN_IF_ERROR(ReadValue(c, elem_type, depth + 1, what, &e));
  }
  out->data = std::move(elems);
  return absl::OkStatus();
}

// `depth` counts the arrays enclosing this value.
absl::Status ReadValue(Cursor& c, ValueType type, int depth, std::string_view what, Value* out) {
  out->type = type;
  switch (type) {
    case ValueType::kUint8:
      return ReadScalar<uint8_t, uint64_t>(c, what, out);
    case ValueType::kInt8:
      return ReadScalar<int8_t, int64_t>(c, what, out);
    case ValueType::kUint16:
      return ReadScalar<uint16_t, uint64_t>(c, what, out);
    case ValueType::kInt16:
      return ReadScalar<int16_t, int64_t>(c, what, out);
    case ValueType::kUint32:
      return ReadScalar<uint32_t, uint64_t>(c, what, out);
    case ValueType::kInt32:
      return ReadScalar<int32_t, int64_t>(c, what, out);
    case ValueType::kUint64:
      return ReadScalar<uint64_t, uint64_t>(c, what, out);
    case ValueType::kInt64:
      return ReadScalar<int64_t, int64_t>(c, what, out);
    case ValueType::kFloat32:
      return ReadScalar<float, double>(c, what, out);
    case ValueType::kFloat64:
      return ReadScalar<double, double>(c, what, out);
    case ValueType::kBool: {
      const uint64_t at = c.pos();
      uint8_t b = 0;
      TANDEM_RETURN_IF_ERROR(c.Read(what, &b));
      if (b > 1) {
        return absl::InvalidArgumentError(
            absl::StrFormat("gguf: %s at offset %d: bool byte is %d, not 0 or 1", what, at, b));
      }
      out->data = b == 1;
      return absl::OkStatus();
    }
    case ValueType::kString: {
      std::string s;
      TANDEM_RETURN_IF_ERROR(c.ReadString(what, &s));
      out->data = std::move(s);
      return absl::OkStatus();
    }
    case ValueType::kArray:
      return ReadArray(c, depth, what, out);
  }
  return absl::InternalError("gguf: unreachable value type");
}

absl::Status ReadHeader(Cursor& c, uint32_t* version, uint64_t* tensor_count, uint64_t* kv_count) {
  uint8_t magic[4];
  TANDEM_RETURN_IF_ERROR(c.Read("magic", &magic));
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("gguf: bad magic at offset 0: %02x %02x %02x %02x (expected \"GGUF\")",
                        magic[0], magic[1], magic[2], magic[3]));
  }
  TANDEM_RETURN_IF_ERROR(c.Read("version", version));
  const uint32_t swapped = __builtin_bswap32(*version);
  if (*version != 2 && *version != 3) {
    if (swapped >= 1 && swapped <= 3) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "gguf: version field at offset 4 is %u: big-endian GGUF files are not supported",
          *version));
    }
    return absl::InvalidArgumentError(absl::StrFormat(
        "gguf: unsupported GGUF version %u at offset 4 (supported: 2, 3)", *version));
  }
  TANDEM_RETURN_IF_ERROR(c.Read("tensor_count", tensor_count));
  TANDEM_RETURN_IF_ERROR(c.Read("kv_count", kv_count));
  if (*tensor_count > c.remaining() / kMinTensorInfoBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("gguf: tensor_count %d at offset 8 cannot fit in the %d bytes left",
                        *tensor_count, c.remaining()));
  }
  if (*kv_count > c.remaining() / kMinKvBytes ||
      *kv_count * kMinKvBytes + *tensor_count * kMinTensorInfoBytes > c.remaining()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("gguf: kv_count %d at offset 16 cannot fit in the %d bytes left", *kv_count,
                        c.remaining()));
  }
  return absl::OkStatus();
}

absl::Status ReadMetadata(Cursor& c, uint64_t kv_count,
                          std::vector<std::pair<std::string, Value>>* metadata) {
  metadata->reserve(kv_count);
  absl::flat_hash_set<std::string> seen;
  for (uint64_t i = 0; i < kv_count; ++i) {
    const uint64_t at = c.pos();
    std::string key;
    TANDEM_RETURN_IF_ERROR(c.ReadString(absl::StrFormat("key #%d", i), &key));
    const std::string what = absl::StrFormat("key '%s'", key);
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("gguf: duplicate %s at offset %d", what, at));
    }
    const uint64_t type_at = c.pos();
    uint32_t raw_type = 0;
    TANDEM_RETURN_IF_ERROR(c.Read(what, &raw_type));
    if (!IsKnownValueType(raw_type)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("gguf: %s at offset %d: unknown value type %u", what, type_at, raw_type));
    }
    Value v;
    TANDEM_RETURN_IF_ERROR(ReadValue(c, static_cast<ValueType>(raw_type), 0, what, &v));
    metadata->emplace_back(std::move(key), std::move(v));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ReadAlignment(const GgufFile& f) {
  const Value* v = f.Find("general.alignment");
  if (v == nullptr) return uint64_t{32};
  absl::StatusOr<uint64_t> a = v->AsUint();
  if (!a.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gguf: general.alignment must be an unsigned integer: ", a.status().message()));
  }
  if (*a == 0 || !std::has_single_bit(*a) || *a > kMaxAlignment) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gguf: general.alignment = %d must be a nonzero power of two <= %d", *a, kMaxAlignment));
  }
  return *a;
}

absl::Status ReadTensorInfo(Cursor& c, uint64_t index, uint64_t alignment, TensorInfo* t) {
  const uint64_t at = c.pos();
  TANDEM_RETURN_IF_ERROR(c.ReadString(absl::StrFormat("tensor #%d name", index), &t->name));
  const std::string what = absl::StrFormat("tensor '%s' (info at offset %d)", t->name, at);
  uint32_t n_dims = 0;
  TANDEM_RETURN_IF_ERROR(c.Read(what, &n_dims));
  if (n_dims == 0 || n_dims > kMaxDims) {
    return absl::InvalidArgumentError(
        absl::StrFormat("gguf: %s: n_dims %u not in [1, %d]", what, n_dims, kMaxDims));
  }
  t->shape.resize(n_dims);
  int64_t num_elements = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    uint64_t dim = 0;
    TANDEM_RETURN_IF_ERROR(c.Read(what, &dim));
    if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrFormat("gguf: %s: dimension %u is %d (must be in [1, 2^63))", what, d,
                          static_cast<int64_t>(dim)));
    }
    t->shape[d] = static_cast<int64_t>(dim);
    if (__builtin_mul_overflow(num_elements, t->shape[d], &num_elements)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("gguf: %s: element count overflows int64", what));
    }
  }
  t->num_elements = num_elements;
  uint32_t raw_type = 0;
  TANDEM_RETURN_IF_ERROR(c.Read(what, &raw_type));
  absl::StatusOr<TypeTraits> traits = GetTypeTraits(raw_type);
  if (!traits.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("gguf: %s: unknown tensor type %u", what, raw_type));
  }
  t->type = static_cast<TensorType>(raw_type);
  if (t->shape[0] % traits->block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("gguf: %s: row length %d is not a multiple of the %s block size %d", what,
                        t->shape[0], traits->name, traits->block_size));
  }
  absl::StatusOr<uint64_t> bytes = RowBytes(t->type, num_elements);
  if (!bytes.ok())
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", bytes.status().message()));
  t->num_bytes = *bytes;
  TANDEM_RETURN_IF_ERROR(c.Read(what, &t->offset));
  if (t->offset % alignment != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gguf: %s: offset %d is not a multiple of the alignment %d", what, t->offset, alignment));
  }
  return absl::OkStatus();
}

// Checks that every tensor lies inside the file and that no two overlap.
absl::Status CheckTensorRanges(const std::vector<TensorInfo>& tensors, uint64_t data_offset,
                               uint64_t file_size) {
  for (const TensorInfo& t : tensors) {
    const uint64_t room = file_size > data_offset ? file_size - data_offset : 0;
    if (t.offset > room || t.num_bytes > room - t.offset) {
      return absl::InvalidArgumentError(
          absl::StrFormat("gguf: tensor '%s': data [%d, %d) extends past end of file (size %d)",
                          t.name, absl::uint128(data_offset) + t.offset,
                          absl::uint128(data_offset) + t.offset + t.num_bytes, file_size));
    }
  }
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return tensors[a].offset < tensors[b].offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const TensorInfo& a = tensors[order[i - 1]];
    const TensorInfo& b = tensors[order[i]];
    if (a.offset + a.num_bytes > b.offset) {
      return absl::InvalidArgumentError(
          absl::StrFormat("gguf: tensors '%s' [%d, %d) and '%s' [%d, %d) overlap", a.name,
                          data_offset + a.offset, data_offset + a.offset + a.num_bytes, b.name,
                          data_offset + b.offset, data_offset + b.offset + b.num_bytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GgufFile::Parse() {
  Cursor c(base_, size_);
  uint64_t tensor_count = 0;
  uint64_t kv_count = 0;
  TANDEM_RETURN_IF_ERROR(ReadHeader(c, &version_, &tensor_count, &kv_count));
  TANDEM_RETURN_IF_ERROR(ReadMetadata(c, kv_count, &metadata_));
  TANDEM_ASSIGN_OR_RETURN(alignment_, ReadAlignment(*this));

  tensors_.resize(tensor_count);
  absl::flat_hash_set<std::string_view> names;
  for (uint64_t i = 0; i < tensor_count; ++i) {
    const uint64_t at = c.pos();
    TANDEM_RETURN_IF_ERROR(ReadTensorInfo(c, i, alignment_, &tensors_[i]));
    // tensors_ never reallocates from here on, so views of names stay valid.
    if (!names.insert(tensors_[i].name).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("gguf: duplicate tensor name '%s' at offset %d", tensors_[i].name, at));
    }
  }
  // The data section starts at the next multiple of the alignment.
  data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  TANDEM_RETURN_IF_ERROR(CheckTensorRanges(tensors_, data_offset_, size_));
  for (TensorInfo& t : tensors_) t.data = base_ + data_offset_ + t.offset;
  return absl::OkStatus();
}

}  // namespace tandem::gguf
