// Model shapes for capacity planning (`tandem plan`): the hyper-parameters
// that decide KV-cache size, weight bytes and FLOPs, for a few well-known
// Llama-family checkpoints and for models read from files (model_source.h).
//
// A ModelShape is a plain value; it holds no file or weights. Dimensions are
// counts (not bytes). Validate() bounds every field so that the products the
// planner forms (layers x KV heads x head_dim x context x batch) stay far from
// int64 overflow.
#ifndef TANDEM_COMMON_PLAN_MODEL_PRESETS_H_
#define TANDEM_COMMON_PLAN_MODEL_PRESETS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::plan {

// Bounds far above any real model (Llama-3-405B has 126 layers, hidden 16384).
inline constexpr int64_t kMaxLayers = 1024;
inline constexpr int64_t kMaxDim = 1 << 17;
inline constexpr int64_t kMaxHeads = 4096;
inline constexpr int64_t kMaxVocab = 1 << 22;
inline constexpr int64_t kMaxContext = 1 << 24;

struct ModelShape {
  std::string name;
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t num_heads = 0;     // query heads
  int64_t num_kv_heads = 0;  // K/V heads (== num_heads for MHA, fewer for GQA)
  int64_t head_dim = 0;
  int64_t ffn_size = 0;  // SwiGLU intermediate size
  int64_t vocab_size = 0;
  int64_t context_length = 0;  // the model's trained maximum, in tokens
  bool tied_embeddings = false;
  // Exact parameter count when known (a GGUF's tensors); 0: computed from the
  // dimensions for the Llama layout (LlamaParameters()).
  int64_t num_parameters = 0;
  // Bytes of the weights as stored in the file (GGUF), 0 when not from a file.
  int64_t file_weight_bytes = 0;
  // Bits per weight when --weight-bits is not given: 16 for presets and
  // bf16/fp16 configs, the file's average for a GGUF.
  double default_weight_bits = 16;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  // Llama layout: embeddings, per layer Q/K/V/O + gate/up/down + 2 norms, a
  // final norm, and an LM head unless tied.
  int64_t LlamaParameters() const;
  int64_t NumParameters() const { return num_parameters > 0 ? num_parameters : LlamaParameters(); }

  // InvalidArgument naming the field when a dimension is out of range or
  // num_kv_heads does not divide num_heads.
  absl::Status Validate() const;
};

// The preset for `name` (case-insensitive): llama-2-7b, llama-2-13b,
// llama-2-70b, llama-3-8b, llama-3-70b, smollm2-135m. NotFound otherwise.
absl::StatusOr<ModelShape> FindModelPreset(std::string_view name);

// Preset names in a fixed order (for --help and error messages).
std::vector<std::string> ModelPresetNames();

}  // namespace tandem::plan

#endif  // TANDEM_COMMON_PLAN_MODEL_PRESETS_H_
