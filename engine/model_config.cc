#include "engine/model_config.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/weights.h"

namespace tandem::engine {
namespace {

// Bounds far above any real model, low enough that products cannot overflow.
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxDim = 1 << 17;
constexpr int64_t kMaxVocab = 1 << 22;
constexpr int64_t kMaxContext = 1 << 24;

absl::StatusOr<int64_t> GetBounded(const gguf::GgufFile& f, const std::string& key, int64_t lo,
                                   int64_t hi, const int64_t* def = nullptr) {
  absl::StatusOr<int64_t> v = def != nullptr ? f.GetIntOr(key, *def) : f.GetInt(key);
  if (!v.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("metadata ", key, ": ", v.status().message()));
  }
  if (*v < lo || *v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata ", key, " = ", *v, " is out of range [", lo, ", ", hi, "]"));
  }
  return *v;
}

absl::StatusOr<float> GetFloatKey(const gguf::GgufFile& f, const std::string& key, double def,
                                  double lo, double hi) {
  absl::StatusOr<double> v = f.GetFloatOr(key, def);
  if (!v.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("metadata ", key, ": ", v.status().message()));
  }
  if (!(*v >= lo && *v <= hi)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata ", key, " = ", *v, " is out of range [", lo, ", ", hi, "]"));
  }
  return static_cast<float>(*v);
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromGguf(const gguf::GgufFile& f) {
  ModelConfig c;
  absl::StatusOr<std::string_view> arch = f.GetString("general.architecture");
  if (!arch.ok()) return absl::InvalidArgumentError("metadata general.architecture is missing");
  c.architecture = std::string(*arch);
  if (c.architecture == "llama" || c.architecture == "mistral") {
    c.rope_style = kernels::RopeStyle::kAdjacentPairs;
  } else if (c.architecture == "qwen2") {
    c.rope_style = kernels::RopeStyle::kNeox;
  } else {
    return absl::UnimplementedError(
        absl::StrCat("unsupported architecture '", c.architecture, "' (llama, mistral, qwen2)"));
  }
  if (absl::StatusOr<std::string_view> name = f.GetString("general.name"); name.ok()) {
    c.name = std::string(*name);
  }
  const std::string p = c.architecture + ".";
  TANDEM_ASSIGN_OR_RETURN(c.num_layers, GetBounded(f, p + "block_count", 1, kMaxLayers));
  TANDEM_ASSIGN_OR_RETURN(c.hidden_size, GetBounded(f, p + "embedding_length", 1, kMaxDim));
  TANDEM_ASSIGN_OR_RETURN(c.ffn_size, GetBounded(f, p + "feed_forward_length", 1, 4 * kMaxDim));
  TANDEM_ASSIGN_OR_RETURN(c.num_heads, GetBounded(f, p + "attention.head_count", 1, 4096));
  TANDEM_ASSIGN_OR_RETURN(c.num_kv_heads,
                          GetBounded(f, p + "attention.head_count_kv", 1, 4096, &c.num_heads));
  const int64_t default_head_dim =
      c.hidden_size % c.num_heads == 0 ? c.hidden_size / c.num_heads : 0;
  if (default_head_dim == 0 && f.Find(p + "attention.key_length") == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "head_count ", c.num_heads, " does not divide embedding_length ", c.hidden_size));
  }
  TANDEM_ASSIGN_OR_RETURN(c.head_dim,
                          GetBounded(f, p + "attention.key_length", 2, 4096, &default_head_dim));
  TANDEM_ASSIGN_OR_RETURN(int64_t value_dim,
                          GetBounded(f, p + "attention.value_length", 2, 4096, &c.head_dim));
  if (value_dim != c.head_dim) {
    return absl::UnimplementedError("attention.value_length != attention.key_length");
  }
  const int64_t default_ctx = 4096;
  TANDEM_ASSIGN_OR_RETURN(c.context_length,
                          GetBounded(f, p + "context_length", 1, kMaxContext, &default_ctx));
  TANDEM_ASSIGN_OR_RETURN(
      c.rms_eps, GetFloatKey(f, p + "attention.layer_norm_rms_epsilon", 1e-5, 1e-12, 1e-1));
  TANDEM_ASSIGN_OR_RETURN(c.rope_freq_base,
                          GetFloatKey(f, p + "rope.freq_base", 10000.0, 1.0, 1e12));
  TANDEM_ASSIGN_OR_RETURN(c.rope_dim,
                          GetBounded(f, p + "rope.dimension_count", 2, 4096, &c.head_dim));
  if (const gguf::Value* v = f.Find(p + "rope.scaling.type"); v != nullptr) {
    TANDEM_ASSIGN_OR_RETURN(std::string_view type, v->AsString());
    if (type == "linear") {
      TANDEM_ASSIGN_OR_RETURN(float factor,
                              GetFloatKey(f, p + "rope.scaling.factor", 1.0, 1e-3, 1e6));
      c.rope_freq_scale = 1.f / factor;
    } else if (type != "none") {
      return absl::UnimplementedError(absl::StrCat("rope scaling type '", std::string(type), "'"));
    }
  }
  const gguf::TensorInfo* embd = f.FindTensor("token_embd.weight");
  if (embd == nullptr) return absl::InvalidArgumentError("tensor token_embd.weight is missing");
  if (embd->shape.size() != 2 || embd->shape[1] < 1 || embd->shape[1] > kMaxVocab) {
    return absl::InvalidArgumentError("tensor token_embd.weight has a bad shape");
  }
  c.vocab_size = embd->shape[1];
  c.tied_embeddings = f.FindTensor("output.weight") == nullptr;
  c.has_qkv_bias = f.FindTensor("blk.0.attn_q.bias") != nullptr;
  TANDEM_RETURN_IF_ERROR(c.Validate());
  TANDEM_RETURN_IF_ERROR(CheckTensors(f, c));
  return c;
}

absl::Status ModelConfig::Validate() const {
  if (num_layers < 1 || hidden_size < 1 || ffn_size < 1 || num_heads < 1 || num_kv_heads < 1 ||
      head_dim < 2 || vocab_size < 1 || context_length < 1) {
    return absl::InvalidArgumentError("model config has a non-positive dimension");
  }
  if (num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_count_kv ", num_kv_heads, " does not divide head_count ", num_heads));
  }
  if (rope_dim % 2 != 0 || rope_dim > head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("rope.dimension_count ", rope_dim,
                                                   " must be even and <= head_dim ", head_dim));
  }
  if (q_dim() > 4 * kMaxDim) return absl::InvalidArgumentError("head_count * head_dim too large");
  return absl::OkStatus();
}

int64_t ModelConfig::NumParameters() const {
  const int64_t attn = hidden_size * (q_dim() + 2 * kv_dim()) + q_dim() * hidden_size +
                       (has_qkv_bias ? q_dim() + 2 * kv_dim() : 0);
  const int64_t ffn = 3 * hidden_size * ffn_size;
  const int64_t per_layer = attn + ffn + 2 * hidden_size;
  const int64_t head = tied_embeddings ? 0 : vocab_size * hidden_size;
  return num_layers * per_layer + vocab_size * hidden_size + head + hidden_size;
}

}  // namespace tandem::engine
