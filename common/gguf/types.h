// GGUF / ggml tensor element types and their block layouts.
//
// Numbering follows the GGUF specification (ggml_type). A "block" is the unit
// of quantization: `block_size` elements stored in `type_size` bytes. A row of
// n elements takes n / block_size * type_size bytes (n must be a multiple of
// block_size).
#ifndef TANDEM_COMMON_GGUF_TYPES_H_
#define TANDEM_COMMON_GGUF_TYPES_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem::gguf {

enum class TensorType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  // Known so that files holding them open; not dequantizable by Tandem.
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

struct TypeTraits {
  std::string_view name;  // "F32", "Q4_1", ...
  int64_t block_size;     // elements per block
  int64_t type_size;      // bytes per block
  bool dequantizable;     // Tandem can turn it into f32 (kernels/quant.h)
};

// Traits of a raw type value read from a file. Unknown values -> InvalidArgument.
absl::StatusOr<TypeTraits> GetTypeTraits(uint32_t raw_type);
inline absl::StatusOr<TypeTraits> GetTypeTraits(TensorType t) {
  return GetTypeTraits(static_cast<uint32_t>(t));
}

// Bytes needed for `num_elements` elements of type `t` (a whole number of
// blocks), or InvalidArgument if num_elements is not a multiple of the block
// size or the result overflows.
absl::StatusOr<uint64_t> RowBytes(TensorType t, int64_t num_elements);

}  // namespace tandem::gguf

#endif  // TANDEM_COMMON_GGUF_TYPES_H_
