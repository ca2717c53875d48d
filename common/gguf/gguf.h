// GGUF reader (format versions 2 and 3).
//
// GgufFile parses the header, the metadata key/value pairs and the tensor
// infos of a GGUF file and gives zero-copy access to tensor bytes (the file is
// mmap'ed read-only, or a caller buffer is used for tests and fuzzing).
//
// Untrusted input: every malformed file (truncated, wrong magic or version,
// counts or string lengths larger than the file, nested arrays too deep,
// unknown value or tensor types, tensor data past the end of the file,
// overlapping tensors, misaligned offsets, alignment not a power of two)
// yields an InvalidArgument / OutOfRange status naming the problem and the
// byte offset (OutOfRange: the file ends too early or a count/length exceeds
// the bytes left). Every count is checked against the bytes left before any
// reservation, so parsing allocates at most ~sizeof(Value) (48 bytes) per
// byte of file in the worst case (arrays of uint8).
//
// Accepted: GGUF v2 and v3, little-endian; arrays nested at most 8 levels;
// `general.alignment` (any unsigned integer type) a power of two in
// [1, 1 MiB], default 32; tensors with 1..4 dims, each dim >= 1, element count
// < 2^63, shape[0] a multiple of the type's block size, offset a multiple of
// the alignment, bytes inside the file and not overlapping another tensor;
// unique keys and tensor names. Open() of a missing file is NotFound.
// Tensor data is aligned to the file alignment for Open() (page-aligned
// mapping); for FromBuffer() only to malloc's alignment (16 bytes).
//
// Thread safety: a GgufFile is immutable after Open(); all const methods are
// safe to call concurrently.
#ifndef TANDEM_COMMON_GGUF_GGUF_H_
#define TANDEM_COMMON_GGUF_GGUF_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "common/gguf/types.h"

namespace tandem::gguf {

enum class ValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

std::string_view ValueTypeName(ValueType t);

// One metadata value. Arrays hold elements of a single `array_type` (which may
// itself be kArray: nested arrays).
struct Value {
  using Array = std::vector<Value>;
  using Storage = std::variant<uint64_t, int64_t, double, bool, std::string, Array>;

  ValueType type = ValueType::kUint8;
  ValueType array_type = ValueType::kUint8;  // only meaningful when type == kArray
  Storage data;  // unsigned ints -> uint64_t, signed -> int64_t, floats -> double

  bool is_integer() const;
  bool is_float() const { return type == ValueType::kFloat32 || type == ValueType::kFloat64; }
  // Typed views; InvalidArgument when the type does not fit (ints that do not
  // fit in the target range fail too).
  absl::StatusOr<int64_t> AsInt() const;
  absl::StatusOr<uint64_t> AsUint() const;
  absl::StatusOr<double> AsFloat() const;  // accepts integers too
  absl::StatusOr<bool> AsBool() const;
  absl::StatusOr<std::string_view> AsString() const;
  absl::StatusOr<const Array*> AsArray() const;

  // Convenience constructors (used by the writer and tests).
  static Value Uint32(uint32_t v);
  static Value Int32(int32_t v);
  static Value Uint64(uint64_t v);
  static Value Float32(float v);
  static Value Bool(bool v);
  static Value String(std::string v);
  static Value MakeArray(ValueType element_type, Array elements);
  static Value StringArray(const std::vector<std::string>& v);
  static Value Float32Array(const std::vector<float>& v);
  static Value Int32Array(const std::vector<int32_t>& v);
};

struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // ggml order: shape[0] is the innermost (contiguous) dim
  TensorType type = TensorType::kF32;
  uint64_t offset = 0;     // relative to the start of the data section
  uint64_t num_bytes = 0;  // computed from shape and type
  int64_t num_elements = 0;
  const uint8_t* data = nullptr;  // points into the mapped file
};

// Progress callback: (bytes done, bytes total). Called from the opening thread.
using ProgressFn = std::function<void(uint64_t, uint64_t)>;

class GgufFile {
 public:
  // mmaps `path` read-only and parses it.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses an in-memory image; the GgufFile keeps its own copy.
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBuffer(std::string bytes);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return size_; }
  uint64_t data_offset() const { return data_offset_; }  // start of tensor data

  // Metadata in file order.
  const std::vector<std::pair<std::string, Value>>& metadata() const { return metadata_; }
  const Value* Find(std::string_view key) const;  // nullptr if absent

  // Typed getters: NotFound if absent, InvalidArgument on a type mismatch.
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;
  absl::StatusOr<std::string_view> GetString(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<const Value::Array*> GetArray(std::string_view key) const;
  // With a default when the key is absent (a type mismatch is still an error).
  absl::StatusOr<int64_t> GetIntOr(std::string_view key, int64_t def) const;
  absl::StatusOr<double> GetFloatOr(std::string_view key, double def) const;
  absl::StatusOr<bool> GetBoolOr(std::string_view key, bool def) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* FindTensor(std::string_view name) const;  // nullptr if absent

  // Touches every page of tensor data (so that load time shows up front and
  // can report progress).
  void Prefault(const ProgressFn& progress) const;

 private:
  GgufFile() = default;
  absl::Status Parse();

  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* mapping_ = nullptr;  // mmap'ed region (nullptr when buffer-backed)
  std::string buffer_;       // owned bytes when buffer-backed
  std::vector<std::pair<std::string, Value>> metadata_;
  std::vector<TensorInfo> tensors_;
};

// Builds GGUF v3 images. Used by tests to make tiny models of any shape.
// Layout matches gguf-py: tensor infos, padding to the alignment, then each
// tensor's bytes padded to the alignment. A valid "general.alignment" value in
// the metadata overrides SetAlignment(); with a non-default alignment and no
// such key, Serialize() appends it. Values must be well formed (element
// storage matching `type` / `array_type`): a mismatch is a TANDEM_CHECK.
class GgufWriter {
 public:
  void SetAlignment(uint64_t alignment) { alignment_ = alignment; }  // power of two
  void Add(std::string key, Value value);
  // `bytes` must hold exactly RowBytes(type, prod(shape)) bytes.
  absl::Status AddTensor(std::string name, std::vector<int64_t> shape, TensorType type,
                         std::string bytes);
  // Convenience: an F32 tensor from floats.
  absl::Status AddF32Tensor(std::string name, std::vector<int64_t> shape,
                            const std::vector<float>& values);

  std::string Serialize() const;
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct PendingTensor {
    std::string name;
    std::vector<int64_t> shape;
    TensorType type;
    std::string bytes;
  };
  uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, Value>> metadata_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace tandem::gguf

#endif  // TANDEM_COMMON_GGUF_GGUF_H_
