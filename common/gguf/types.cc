// Block layouts of the ggml tensor types (sizes as in ggml / gguf-py
// GGML_QUANT_SIZES).
#include "common/gguf/types.h"

#include <array>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace tandem::gguf {
namespace {

constexpr int64_t kQK = 256;  // QK_K: super-block size of the K-quants

struct Entry {
  uint32_t raw;
  TypeTraits traits;
};

constexpr std::array<Entry, 32> kTypes = {{
    {0, {"F32", 1, 4, true}},
    {1, {"F16", 1, 2, true}},
    {2, {"Q4_0", 32, 2 + 16, true}},
    {3, {"Q4_1", 32, 2 + 2 + 16, true}},
    {6, {"Q5_0", 32, 2 + 4 + 16, true}},
    {7, {"Q5_1", 32, 2 + 2 + 4 + 16, true}},
    {8, {"Q8_0", 32, 2 + 32, true}},
    {9, {"Q8_1", 32, 4 + 4 + 32, false}},
    {10, {"Q2_K", kQK, 2 + 2 + kQK / 16 + kQK / 4, true}},
    {11, {"Q3_K", kQK, 2 + kQK / 4 + kQK / 8 + 12, true}},
    {12, {"Q4_K", kQK, 2 + 2 + kQK / 2 + 12, true}},
    {13, {"Q5_K", kQK, 2 + 2 + kQK / 2 + kQK / 8 + 12, true}},
    {14, {"Q6_K", kQK, 2 + kQK / 2 + kQK / 4 + kQK / 16, true}},
    {15, {"Q8_K", kQK, 4 + kQK + kQK / 8, false}},
    {16, {"IQ2_XXS", kQK, 2 + kQK / 4, false}},
    {17, {"IQ2_XS", kQK, 2 + kQK / 4 + kQK / 32, false}},
    {18, {"IQ3_XXS", kQK, 2 + kQK / 4 + kQK / 8, false}},
    {19, {"IQ1_S", kQK, 2 + kQK / 8 + kQK / 16, false}},
    {20, {"IQ4_NL", 32, 2 + 16, false}},
    {21, {"IQ3_S", kQK, 2 + kQK / 4 + kQK / 8 + kQK / 32 + 4, false}},
    {22, {"IQ2_S", kQK, 2 + kQK / 4 + kQK / 16, false}},
    {23, {"IQ4_XS", kQK, 2 + 2 + kQK / 2 + kQK / 64, false}},
    {24, {"I8", 1, 1, false}},
    {25, {"I16", 1, 2, false}},
    {26, {"I32", 1, 4, false}},
    {27, {"I64", 1, 8, false}},
    {28, {"F64", 1, 8, false}},
    {29, {"IQ1_M", kQK, kQK / 8 + kQK / 16 + kQK / 32, false}},
    {30, {"BF16", 1, 2, true}},
    {34, {"TQ1_0", kQK, 2 + 4 * 13, false}},
    {35, {"TQ2_0", kQK, 2 + 64, false}},
    {39, {"MXFP4", 32, 1 + 16, false}},
}};

}  // namespace

absl::StatusOr<TypeTraits> GetTypeTraits(uint32_t raw_type) {
  for (const Entry& e : kTypes) {
    if (e.raw == raw_type) return e.traits;
  }
  return absl::InvalidArgumentError(absl::StrFormat("gguf: unknown tensor type %u", raw_type));
}

absl::StatusOr<uint64_t> RowBytes(TensorType t, int64_t num_elements) {
  absl::StatusOr<TypeTraits> traits = GetTypeTraits(t);
  if (!traits.ok()) return traits.status();
  if (num_elements < 0 || num_elements % traits->block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("gguf: %d elements of type %s is not a whole number of %d-element blocks",
                        num_elements, traits->name, traits->block_size));
  }
  const uint64_t num_blocks = static_cast<uint64_t>(num_elements / traits->block_size);
  const uint64_t type_size = static_cast<uint64_t>(traits->type_size);
  if (num_blocks > std::numeric_limits<uint64_t>::max() / type_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gguf: byte size of %d elements of type %s overflows", num_elements, traits->name));
  }
  return num_blocks * type_size;
}

}  // namespace tandem::gguf
