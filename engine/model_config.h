// Llama-family model hyperparameters read from GGUF metadata.
//
// FromGguf validates everything a forward pass relies on (head counts divide,
// sane bounds, every required tensor present with the expected shape and a
// dequantizable type) and returns InvalidArgument / Unimplemented naming the
// problem: a hostile file never crashes the engine.
#ifndef TANDEM_ENGINE_MODEL_CONFIG_H_
#define TANDEM_ENGINE_MODEL_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/gguf/gguf.h"
#include "kernels/kernels.h"

namespace tandem::engine {

struct ModelConfig {
  std::string architecture;  // "llama", "qwen2", ...
  std::string name;          // general.name (may be empty)
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t ffn_size = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t context_length = 0;
  float rms_eps = 1e-5f;
  kernels::RopeStyle rope_style = kernels::RopeStyle::kAdjacentPairs;
  int64_t rope_dim = 0;  // rotated dims per head
  float rope_freq_base = 10000.f;
  float rope_freq_scale = 1.f;   // 1 / linear scaling factor
  bool tied_embeddings = false;  // no output.weight: LM head = token_embd.weight
  bool has_qkv_bias = false;     // attn_{q,k,v}.bias (Qwen2)

  static absl::StatusOr<ModelConfig> FromGguf(const gguf::GgufFile& file);

  // Checks the invariants between fields (also run by FromGguf).
  absl::Status Validate() const;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  // 2 (K and V) x layers x kv heads x head_dim x bytes per element.
  int64_t KvBytesPerToken(int64_t bytes_per_element) const {
    return 2 * num_layers * num_kv_heads * head_dim * bytes_per_element;
  }
  // Parameters of the matrices and norms (the tied head counted once).
  int64_t NumParameters() const;
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_MODEL_CONFIG_H_
