// Names, methods and per-tensor types of `tandem quantize`.
//
// Target types: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, and
// "q4_k_m" / "q5_k_m" (the K type plus llama.cpp's Q4_K_M mix: attn_v and
// ffn_down at Q6_K on the first and last eighth of the layers and every
// third layer between). Per tensor (TensorTargetType), as llama.cpp's
// llama_tensor_get_type does:
//   - 1-D tensors (norms, biases, rope factors) stay as they are;
//   - output.weight, or token_embd.weight of a tied model, is Q8_0 when its
//     rows are not a multiple of 256 (or the target is Q8_0), else Q6_K;
//   - a K type on rows that are not a multiple of 256 falls back: Q4_K ->
//     Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0 (SmolLM2's hidden size 576: every
//     matrix but ffn_down);
//   - rows that are not a multiple of 32 stay F16.
//
// Thread safety: pure functions.
#ifndef TANDEM_QUANT_QUANT_TYPES_H_
#define TANDEM_QUANT_QUANT_TYPES_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/gguf/types.h"

namespace tandem::quant {

struct TargetType {
  gguf::TensorType type = gguf::TensorType::kQ4_0;
  bool mix = false;  // the _M mix
  std::string name;  // as parsed, lower case ("q4_k_m")
};

// "q4_0", "Q4_K_M", ...: InvalidArgument listing the accepted names.
absl::StatusOr<TargetType> ParseTargetType(std::string_view name);

enum class Method { kRtn, kAwq, kGptq, kSmoothQuant };
// rtn | awq | gptq | smoothquant
absl::StatusOr<Method> ParseMethod(std::string_view name);
std::string_view MethodName(Method m);

// The type `name` (a tensor of `row_length` elements per row; `rank` dims)
// is written with. `tied`: the model has no output.weight.
gguf::TensorType TensorTargetType(const TargetType& target, const std::string& name, int rank,
                                  int64_t row_length, int64_t num_layers, bool tied,
                                  gguf::TensorType current);

// llama.cpp's general.file_type value for the target (LLAMA_FTYPE_*).
uint32_t FileTypeOf(const TargetType& target);

}  // namespace tandem::quant

#endif  // TANDEM_QUANT_QUANT_TYPES_H_
