// Reads a ModelShape from a GGUF file or a Hugging Face config.json, or
// returns a preset. The files are untrusted: every missing, mistyped or
// out-of-range field is an InvalidArgument naming the field (and the file);
// nothing asserts.
#ifndef TANDEM_PLAN_MODEL_SOURCE_H_
#define TANDEM_PLAN_MODEL_SOURCE_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/gguf/gguf.h"
#include "plan/model_presets.h"

namespace tandem::plan {

// config.json files larger than this are rejected before parsing.
inline constexpr size_t kMaxConfigBytes = 1 << 20;

// From GGUF metadata (`<arch>.block_count`, `.embedding_length`,
// `.attention.head_count[_kv]`, `.attention.key_length`,
// `.feed_forward_length`, `.context_length`) and tensors (vocab from
// token_embd.weight; exact parameter count and stored bytes summed over all
// tensors, so a quantized file's real size is used).
absl::StatusOr<ModelShape> ModelShapeFromGguf(const gguf::GgufFile& file);

// From the text of an HF config.json (num_hidden_layers, hidden_size,
// num_attention_heads, num_key_value_heads, head_dim, intermediate_size,
// vocab_size, max_position_embeddings, tie_word_embeddings, torch_dtype).
absl::StatusOr<ModelShape> ModelShapeFromHfConfig(std::string_view json_text,
                                                  const std::string& name);

// `spec` is a preset name, a GGUF path (recognised by its magic), a
// config.json path, or a directory holding config.json. NotFound when it is
// none of those.
absl::StatusOr<ModelShape> LoadModelShape(const std::string& spec);

}  // namespace tandem::plan

#endif  // TANDEM_PLAN_MODEL_SOURCE_H_
