#include "plan/model_source.h"

#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/status.h"

namespace tandem::plan {
namespace {

absl::Status FieldError(const std::string& where, const std::string& key, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", key, " ", what));
}

absl::StatusOr<int64_t> GgufInt(const gguf::GgufFile& f, const std::string& key, int64_t lo,
                                int64_t hi, const int64_t* def = nullptr) {
  absl::StatusOr<int64_t> v = def != nullptr ? f.GetIntOr(key, *def) : f.GetInt(key);
  if (!v.ok()) return FieldError("gguf", key, v.status().message());
  if (*v < lo || *v > hi) {
    return FieldError("gguf", key, absl::StrCat("= ", *v, " is out of range [", lo, ", ", hi, "]"));
  }
  return *v;
}

// An integer-valued JSON number within [lo, hi]; `def` when absent (or
// required when def is nullptr).
absl::StatusOr<int64_t> JsonInt(const json::Json& obj, const std::string& key, int64_t lo,
                                int64_t hi, const int64_t* def = nullptr) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    if (def != nullptr) return *def;
    return FieldError("config.json", key, "is missing");
  }
  if (!it->is_number() || it->get<double>() != std::floor(it->get<double>())) {
    return FieldError("config.json", key, "must be an integer");
  }
  const double v = it->get<double>();
  if (v < static_cast<double>(lo) || v > static_cast<double>(hi)) {
    return FieldError("config.json", key,
                      absl::StrCat("= ", v, " is out of range [", lo, ", ", hi, "]"));
  }
  return static_cast<int64_t>(v);
}

absl::StatusOr<std::string> ReadBounded(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  std::string text(max_bytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is larger than ", max_bytes, " bytes"));
  }
  return text;
}

}  // namespace

absl::StatusOr<ModelShape> ModelShapeFromGguf(const gguf::GgufFile& f) {
  absl::StatusOr<std::string_view> arch = f.GetString("general.architecture");
  if (!arch.ok()) return absl::InvalidArgumentError("gguf: general.architecture is missing");
  ModelShape m;
  m.name = std::string(*arch);
  if (absl::StatusOr<std::string_view> name = f.GetString("general.name"); name.ok()) {
    m.name = std::string(*name);
  }
  const std::string p = std::string(*arch) + ".";
  TANDEM_ASSIGN_OR_RETURN(m.num_layers, GgufInt(f, p + "block_count", 1, kMaxLayers));
  TANDEM_ASSIGN_OR_RETURN(m.hidden_size, GgufInt(f, p + "embedding_length", 1, kMaxDim));
  TANDEM_ASSIGN_OR_RETURN(m.ffn_size, GgufInt(f, p + "feed_forward_length", 1, 4 * kMaxDim));
  TANDEM_ASSIGN_OR_RETURN(m.num_heads, GgufInt(f, p + "attention.head_count", 1, kMaxHeads));
  TANDEM_ASSIGN_OR_RETURN(m.num_kv_heads,
                          GgufInt(f, p + "attention.head_count_kv", 1, kMaxHeads, &m.num_heads));
  const int64_t head_dim = m.hidden_size / m.num_heads;
  TANDEM_ASSIGN_OR_RETURN(m.head_dim, GgufInt(f, p + "attention.key_length", 1, 4096, &head_dim));
  const int64_t default_context = 4096;
  TANDEM_ASSIGN_OR_RETURN(m.context_length,
                          GgufInt(f, p + "context_length", 1, kMaxContext, &default_context));
  const gguf::TensorInfo* embd = f.FindTensor("token_embd.weight");
  if (embd == nullptr || embd->shape.size() != 2 || embd->shape[1] < 1 ||
      embd->shape[1] > kMaxVocab) {
    return absl::InvalidArgumentError("gguf: tensor token_embd.weight is missing or misshapen");
  }
  m.vocab_size = embd->shape[1];
  m.tied_embeddings = f.FindTensor("output.weight") == nullptr;
  // The reader bounds each tensor by the file size, so these sums fit.
  for (const gguf::TensorInfo& t : f.tensors()) {
    m.num_parameters += t.num_elements;
    m.file_weight_bytes += static_cast<int64_t>(t.num_bytes);
  }
  if (m.num_parameters < 1) return absl::InvalidArgumentError("gguf: the file has no weights");
  m.default_weight_bits =
      8.0 * static_cast<double>(m.file_weight_bytes) / static_cast<double>(m.num_parameters);
  if (absl::Status s = m.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("gguf: ", s.message()));
  }
  return m;
}

absl::StatusOr<ModelShape> ModelShapeFromHfConfig(std::string_view json_text,
                                                  const std::string& name) {
  json::ParseLimits limits;
  limits.max_bytes = kMaxConfigBytes;
  absl::StatusOr<json::Json> root = json::Parse(json_text, limits);
  if (!root.ok())
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", root.status().message()));
  if (!root->is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  const json::Json& c = *root;
  ModelShape m;
  m.name = name;
  if (auto v = c.find("_name_or_path");
      v != c.end() && v->is_string() && !v->get_ref<const std::string&>().empty()) {
    m.name = v->get<std::string>();
  }
  TANDEM_ASSIGN_OR_RETURN(m.num_layers, JsonInt(c, "num_hidden_layers", 1, kMaxLayers));
  TANDEM_ASSIGN_OR_RETURN(m.hidden_size, JsonInt(c, "hidden_size", 1, kMaxDim));
  TANDEM_ASSIGN_OR_RETURN(m.ffn_size, JsonInt(c, "intermediate_size", 1, 4 * kMaxDim));
  TANDEM_ASSIGN_OR_RETURN(m.num_heads, JsonInt(c, "num_attention_heads", 1, kMaxHeads));
  TANDEM_ASSIGN_OR_RETURN(m.num_kv_heads,
                          JsonInt(c, "num_key_value_heads", 1, kMaxHeads, &m.num_heads));
  const int64_t head_dim = m.hidden_size / m.num_heads;
  TANDEM_ASSIGN_OR_RETURN(m.head_dim, JsonInt(c, "head_dim", 1, 4096, &head_dim));
  TANDEM_ASSIGN_OR_RETURN(m.vocab_size, JsonInt(c, "vocab_size", 1, kMaxVocab));
  const int64_t default_context = 4096;
  TANDEM_ASSIGN_OR_RETURN(m.context_length,
                          JsonInt(c, "max_position_embeddings", 1, kMaxContext, &default_context));
  if (auto v = c.find("tie_word_embeddings"); v != c.end()) {
    if (!v->is_boolean()) {
      return FieldError("config.json", "tie_word_embeddings", "must be true or false");
    }
    m.tied_embeddings = v->get<bool>();
  }
  if (auto v = c.find("torch_dtype"); v != c.end() && v->is_string()) {
    if (v->get_ref<const std::string&>() == "float32") m.default_weight_bits = 32;
  }
  if (absl::Status s = m.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", s.message()));
  }
  return m;
}

absl::StatusOr<ModelShape> LoadModelShape(const std::string& spec) {
  if (absl::StatusOr<ModelShape> preset = FindModelPreset(spec); preset.ok()) return preset;
  struct stat st;
  if (stat(spec.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(
        "model '", spec,
        "' is neither a preset nor an existing file: ", FindModelPreset(spec).status().message()));
  }
  std::string path = spec;
  if (S_ISDIR(st.st_mode)) path += "/config.json";
  char magic[4] = {};
  {
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
    in.read(magic, sizeof(magic));
  }
  if (std::string_view(magic, sizeof(magic)) == "GGUF") {
    absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file = gguf::GgufFile::Open(path);
    // The reader's message already names the file.
    if (!file.ok()) return absl::InvalidArgumentError(file.status().message());
    absl::StatusOr<ModelShape> m = ModelShapeFromGguf(**file);
    if (!m.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", m.status().message()));
    return m;
  }
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadBounded(path, kMaxConfigBytes));
  absl::StatusOr<ModelShape> m = ModelShapeFromHfConfig(text, path);
  if (!m.ok() && !absl::EndsWith(path, ".json")) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": neither a GGUF file (no GGUF magic) nor a config.json (",
                     m.status().message(), ")"));
  }
  if (!m.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", m.status().message()));
  return m;
}

}  // namespace tandem::plan
