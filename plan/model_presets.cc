#include "plan/model_presets.h"

#include <array>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::plan {
namespace {

// Hyper-parameters from each checkpoint's Hugging Face config.json.
struct ModelPresetRow {
  const char* name;
  int64_t layers, hidden, heads, kv_heads, head_dim, ffn, vocab, context;
  bool tied;
};

constexpr std::array<ModelPresetRow, 6> kModelPresetRows = {{
    // name            layers hidden heads kv  hd   ffn    vocab   ctx   tied
    {"llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000, 4096, false},
    {"llama-2-13b", 40, 5120, 40, 40, 128, 13824, 32000, 4096, false},
    {"llama-2-70b", 80, 8192, 64, 8, 128, 28672, 32000, 4096, false},
    {"llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256, 8192, false},
    {"llama-3-70b", 80, 8192, 64, 8, 128, 28672, 128256, 8192, false},
    {"smollm2-135m", 30, 576, 9, 3, 64, 1536, 49152, 8192, true},
}};

absl::Status CheckRange(const char* field, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = ", v, " is out of range [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t ModelShape::LlamaParameters() const {
  const int64_t attn = hidden_size * (q_dim() + 2 * kv_dim()) + q_dim() * hidden_size;
  const int64_t ffn = 3 * hidden_size * ffn_size;
  const int64_t per_layer = attn + ffn + 2 * hidden_size;
  const int64_t embeddings = vocab_size * hidden_size;
  const int64_t head = tied_embeddings ? 0 : vocab_size * hidden_size;
  return num_layers * per_layer + embeddings + head + hidden_size;
}

absl::Status ModelShape::Validate() const {
  struct Field {
    const char* name;
    int64_t value, lo, hi;
  };
  const Field fields[] = {
      {"num_layers", num_layers, 1, kMaxLayers}, {"hidden_size", hidden_size, 1, kMaxDim},
      {"num_heads", num_heads, 1, kMaxHeads},    {"num_kv_heads", num_kv_heads, 1, kMaxHeads},
      {"head_dim", head_dim, 1, 4096},           {"ffn_size", ffn_size, 1, 4 * kMaxDim},
      {"vocab_size", vocab_size, 1, kMaxVocab},  {"context_length", context_length, 1, kMaxContext},
  };
  for (const Field& f : fields) {
    if (absl::Status s = CheckRange(f.name, f.value, f.lo, f.hi); !s.ok()) return s;
  }
  if (num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_kv_heads ", num_kv_heads, " does not divide num_heads ", num_heads));
  }
  if (q_dim() > 4 * kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_heads x head_dim = ", q_dim(), " is too large"));
  }
  if (num_parameters < 0 || file_weight_bytes < 0) {
    return absl::InvalidArgumentError("negative parameter or weight byte count");
  }
  if (!(default_weight_bits > 0 && default_weight_bits <= 64)) {
    return absl::InvalidArgumentError("default weight bits out of range (0, 64]");
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelShape> FindModelPreset(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(std::string(name));
  for (const ModelPresetRow& p : kModelPresetRows) {
    if (lower != p.name) continue;
    ModelShape m;
    m.name = p.name;
    m.num_layers = p.layers;
    m.hidden_size = p.hidden;
    m.num_heads = p.heads;
    m.num_kv_heads = p.kv_heads;
    m.head_dim = p.head_dim;
    m.ffn_size = p.ffn;
    m.vocab_size = p.vocab;
    m.context_length = p.context;
    m.tied_embeddings = p.tied;
    return m;
  }
  return absl::NotFoundError(absl::StrCat("unknown model preset '", std::string(name),
                                          "' (presets: ", absl::StrJoin(ModelPresetNames(), ", "),
                                          ")"));
}

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> names;
  for (const ModelPresetRow& p : kModelPresetRows) names.emplace_back(p.name);
  return names;
}

}  // namespace tandem::plan
