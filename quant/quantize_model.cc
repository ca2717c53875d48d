#include "quant/quantize_model.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/llama_model.h"
#include "kernels/quant.h"
#include "quant/block_grid.h"
#include "quant/calibration.h"
#include "quant/smoothquant.h"

namespace tandem::quant {
namespace {

using engine::LinearInput;
using gguf::TensorType;

// One tensor of the model as f32 (matrices and norms) plus what is written.
struct Tensor {
  const gguf::TensorInfo* info = nullptr;
  std::vector<float> v;  // f32 values (empty: copied raw)
  bool modified = false;
  TensorType out_type = TensorType::kF32;
  std::string out_bytes;  // set by GPTQ
  bool has_out_bytes = false;
  int64_t cols() const { return info->shape[0]; }
  int64_t rows() const { return info->num_elements / info->shape[0]; }
};

using TensorMap = std::map<std::string, Tensor>;

absl::StatusOr<TensorMap> LoadTensors(const gguf::GgufFile& in, const TargetType& target,
                                      int64_t num_layers, ThreadPool* pool) {
  TensorMap map;
  const bool tied = in.FindTensor("output.weight") == nullptr;
  for (const gguf::TensorInfo& info : in.tensors()) {
    Tensor t;
    t.info = &info;
    const int rank = static_cast<int>(info.shape.size());
    t.out_type =
        TensorTargetType(target, info.name, rank, info.shape[0], num_layers, tied, info.type);
    const bool needs_f32 = rank >= 2 || info.name.find("_norm.") != std::string::npos ||
                           info.name.find(".bias") != std::string::npos;
    if (needs_f32 && t.out_type != info.type && !GetTypeTraits(info.type)->dequantizable) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", info.name, "' has type ",
                                                     std::string(GetTypeTraits(info.type)->name),
                                                     " which cannot be dequantized"));
    }
    if (needs_f32 && GetTypeTraits(info.type)->dequantizable) {
      t.v.resize(static_cast<size_t>(info.num_elements));
      const int64_t cols = info.shape[0], rows = info.num_elements / cols;
      const uint64_t row_bytes = *gguf::RowBytes(info.type, cols);
      ThreadPool::Run(pool, rows, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          kernels::DequantizeRow(info.type, info.data + r * row_bytes, t.v.data() + r * cols, cols);
        }
      });
    }
    map.emplace(info.name, std::move(t));
  }
  return map;
}

std::string Name(int64_t layer, const char* what) { return absl::StrCat("blk.", layer, ".", what); }

Tensor* Find(TensorMap& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() || it->second.v.empty() ? nullptr : &it->second;
}

AwqLinear LinearOf(Tensor& t) { return {t.v.data(), t.rows(), t.out_type}; }

bool Quantizable(const Tensor& t) { return HasGrid(t.out_type) && t.cols() % 32 == 0; }

// w[:, c] *= s[c].
void ScaleColumns(Tensor& t, const std::vector<float>& s) {
  for (int64_t r = 0; r < t.rows(); ++r) {
    for (int64_t c = 0; c < t.cols(); ++c) t.v[r * t.cols() + c] *= s[c];
  }
  t.modified = true;
}

// Row (or element, for 1-D) i /= s[i].
void DivideRows(Tensor& t, const std::vector<float>& s) {
  for (int64_t r = 0; r < t.rows(); ++r) {
    for (int64_t c = 0; c < t.cols(); ++c) {
      t.v[r * t.cols() + c] /= s[t.rows() == 1 ? c : r];
    }
  }
  t.modified = true;
}

struct Group {
  LinearInput input;
  std::vector<Tensor*> linears;
  std::vector<float> scales;  // empty: not scaled
  InputStats stats;
};

// What produces each linear group's input, where diag(1/s) is folded.
struct Producers {
  Tensor* attn_norm;
  Tensor* wv;
  Tensor* bv;  // may be null
  Tensor* ffn_norm;
  Tensor* wu;
};

// attn_output's channel h * head_dim + d comes from V channel
// kv(h) * head_dim + d: the heads of one KV group must share a scale (folded
// into that V row), so they get the group's mean (AWQ's mean |x|) or max
// (SmoothQuant's max |x|, max |w|) statistic.
void TieKvGroups(const engine::ModelConfig& c, std::vector<float>* stat, bool take_max = false) {
  const int64_t group = c.num_heads / c.num_kv_heads;
  for (int64_t kv = 0; kv < c.kv_dim(); ++kv) {
    const int64_t first = (kv / c.head_dim) * group * c.head_dim + kv % c.head_dim;
    float sum = 0, mx = 0;
    for (int64_t h = 0; h < group; ++h) {
      sum += (*stat)[first + h * c.head_dim];
      mx = std::max(mx, (*stat)[first + h * c.head_dim]);
    }
    for (int64_t h = 0; h < group; ++h)
      (*stat)[first + h * c.head_dim] = take_max ? mx : sum / group;
  }
}

void FoldIntoProducer(const engine::ModelConfig& c, LinearInput input, const std::vector<float>& s,
                      const Producers& p) {
  switch (input) {
    case LinearInput::kAttnIn:
      return DivideRows(*p.attn_norm, s);
    case LinearInput::kAttnOut: {
      const int64_t group = c.num_heads / c.num_kv_heads;
      std::vector<float> sv(c.kv_dim());
      for (int64_t kv = 0; kv < c.kv_dim(); ++kv) {
        sv[kv] = s[(kv / c.head_dim) * group * c.head_dim + kv % c.head_dim];
      }
      DivideRows(*p.wv, sv);
      if (p.bv != nullptr) DivideRows(*p.bv, sv);
      return;
    }
    case LinearInput::kFfnIn:
      return DivideRows(*p.ffn_norm, s);
    case LinearInput::kDownIn:
      return DivideRows(*p.wu, s);
  }
}

// A layer's four linear groups and the producers of their inputs.
struct LayerGroups {
  Producers producers;
  std::vector<Group> groups;
};

absl::StatusOr<LayerGroups> GetLayerGroups(TensorMap& m, int64_t layer) {
  auto need = [&](const char* what) -> absl::StatusOr<Tensor*> {
    Tensor* t = Find(m, Name(layer, what));
    if (t == nullptr)
      return absl::InvalidArgumentError(absl::StrCat("missing ", Name(layer, what)));
    return t;
  };
  TANDEM_ASSIGN_OR_RETURN(Tensor * wq, need("attn_q.weight"));
  TANDEM_ASSIGN_OR_RETURN(Tensor * wk, need("attn_k.weight"));
  TANDEM_ASSIGN_OR_RETURN(Tensor * wv, need("attn_v.weight"));
  TANDEM_ASSIGN_OR_RETURN(Tensor * wo, need("attn_output.weight"));
  TANDEM_ASSIGN_OR_RETURN(Tensor * wg, need("ffn_gate.weight"));
  TANDEM_ASSIGN_OR_RETURN(Tensor * wu, need("ffn_up.weight"));
  TANDEM_ASSIGN_OR_RETURN(Tensor * wd, need("ffn_down.weight"));
  TANDEM_ASSIGN_OR_RETURN(Tensor * attn_norm, need("attn_norm.weight"));
  TANDEM_ASSIGN_OR_RETURN(Tensor * ffn_norm, need("ffn_norm.weight"));
  return LayerGroups{{attn_norm, wv, Find(m, Name(layer, "attn_v.bias")), ffn_norm, wu},
                     {{LinearInput::kAttnIn, {wq, wk, wv}, {}, {}},
                      {LinearInput::kAttnOut, {wo}, {}, {}},
                      {LinearInput::kFfnIn, {wg, wu}, {}, {}},
                      {LinearInput::kDownIn, {wd}, {}, {}}}};
}

// The AWQ scales of one layer, folded into the producers of each input.
absl::Status AwqLayer(const engine::ModelConfig& c, int64_t layer, const CalibrationSet& calib,
                      TensorMap& m, const AwqOptions& opt, ThreadPool* pool,
                      std::vector<float>* alphas) {
  TANDEM_ASSIGN_OR_RETURN(LayerGroups layer_groups, GetLayerGroups(m, layer));
  std::vector<Group>& groups = layer_groups.groups;
  for (Group& g : groups) {
    const bool ok = std::all_of(g.linears.begin(), g.linears.end(),
                                [](const Tensor* t) { return Quantizable(*t); });
    if (!ok || calib.tokens(layer, g.input) == 0) {
      alphas->push_back(-1.f);
      continue;
    }
    const int64_t cols = g.linears[0]->cols();
    InputStats& st = g.stats;
    st = ComputeInputStats(calib.inputs(layer, g.input).data(), calib.tokens(layer, g.input), cols,
                           pool);
    if (g.input == LinearInput::kAttnOut) TieKvGroups(c, &st.mean_abs);
    std::vector<AwqLinear> ls;
    for (Tensor* t : g.linears) ls.push_back(LinearOf(*t));
    float alpha = 0;
    g.scales = SearchScales(st, ls, opt, pool, &alpha);
    alphas->push_back(alpha);
    for (Tensor* t : g.linears) ScaleColumns(*t, g.scales);
    FoldIntoProducer(c, g.input, g.scales, layer_groups.producers);
  }
  // Clips once every fold of the layer is in (attn_v's and ffn_up's rows).
  for (const Group& g : groups) {
    if (g.scales.empty()) continue;
    for (Tensor* t : g.linears) SearchClip(g.stats, g.scales, LinearOf(*t), opt, pool);
  }
  return absl::OkStatus();
}

// SmoothQuant's factors of one layer (quant/smoothquant.h), folded into the
// producers of each input as AWQ's are.
absl::Status SmoothLayer(const engine::ModelConfig& c, int64_t layer, const CalibrationSet& calib,
                         TensorMap& m, float alpha) {
  TANDEM_ASSIGN_OR_RETURN(LayerGroups layer_groups, GetLayerGroups(m, layer));
  for (Group& g : layer_groups.groups) {
    const int64_t tokens = calib.tokens(layer, g.input), cols = g.linears[0]->cols();
    if (tokens == 0) continue;
    std::vector<float> act = ColumnAbsMax(calib.inputs(layer, g.input).data(), tokens, cols);
    std::vector<float> w(cols, 0.f);
    for (const Tensor* t : g.linears) {
      const std::vector<float> wt = ColumnAbsMax(t->v.data(), t->rows(), cols);
      for (int64_t i = 0; i < cols; ++i) w[i] = std::max(w[i], wt[i]);
    }
    if (g.input == LinearInput::kAttnOut) {
      TieKvGroups(c, &act, /*take_max=*/true);
      TieKvGroups(c, &w, /*take_max=*/true);
    }
    g.scales = SmoothScales(act, w, alpha);
    for (Tensor* t : g.linears) ScaleColumns(*t, g.scales);
    FoldIntoProducer(c, g.input, g.scales, layer_groups.producers);
  }
  return absl::OkStatus();
}

absl::Status GptqLayer(int64_t layer, const CalibrationSet& calib, TensorMap& m,
                       const GptqOptions& opt, ThreadPool* pool) {
  const std::vector<std::pair<LinearInput, std::vector<const char*>>> groups = {
      {LinearInput::kAttnIn, {"attn_q.weight", "attn_k.weight", "attn_v.weight"}},
      {LinearInput::kAttnOut, {"attn_output.weight"}},
      {LinearInput::kFfnIn, {"ffn_gate.weight", "ffn_up.weight"}},
      {LinearInput::kDownIn, {"ffn_down.weight"}}};
  for (const auto& [input, names] : groups) {
    const int64_t tokens = calib.tokens(layer, input);
    if (tokens == 0) continue;
    const int64_t cols = calib.dim(layer, input);
    std::vector<double> h = Gram(calib.inputs(layer, input).data(), tokens, cols, pool);
    std::vector<bool> dead(cols);
    for (int64_t i = 0; i < cols; ++i) dead[i] = h[i * cols + i] == 0.0;
    std::vector<int64_t> order;
    if (opt.act_order) {
      order = ActOrder(h, cols);
      h = PermuteGram(h, order);
    }
    TANDEM_ASSIGN_OR_RETURN(std::vector<float> u,
                            InverseCholeskyUpper(std::move(h), cols, opt.damp, pool));
    for (const char* what : names) {
      Tensor* t = Find(m, Name(layer, what));
      if (t == nullptr || !Quantizable(*t) || t->cols() != cols ||
          t->cols() % BlockSize(t->out_type) != 0) {
        continue;
      }
      for (int64_t r = 0; r < t->rows(); ++r) {
        for (int64_t i = 0; i < cols; ++i) {
          if (dead[i]) t->v[r * cols + i] = 0.f;
        }
      }
      GptqQuantize(t->out_type, u, t->v.data(), t->rows(), cols, pool, &t->out_bytes, order);
      t->has_out_bytes = true;
    }
  }
  return absl::OkStatus();
}

// The bytes of one output tensor.
std::string OutputBytes(const Tensor& t, ThreadPool* pool) {
  const gguf::TensorInfo& info = *t.info;
  if (t.has_out_bytes) return t.out_bytes;
  if (t.v.empty() || (t.out_type == info.type && !t.modified)) {
    return std::string(reinterpret_cast<const char*>(info.data), info.num_bytes);
  }
  const int64_t cols = t.cols(), rows = t.rows();
  const uint64_t row_bytes = *gguf::RowBytes(t.out_type, cols);
  std::string bytes(row_bytes * rows, '\0');
  ThreadPool::Run(pool, rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      kernels::QuantizeRow(t.out_type, t.v.data() + r * cols, bytes.data() + r * row_bytes, cols);
    }
  });
  return bytes;
}

absl::Status CheckOptions(const QuantizeOptions& options) {
  if (options.method != Method::kSmoothQuant) return absl::OkStatus();
  if (options.target.type != TensorType::kQ8_0 && options.target.type != TensorType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "smoothquant writes int8 weights: the type must be q8_0, not ", options.target.name));
  }
  if (!(options.smooth_alpha >= 0.f && options.smooth_alpha <= 1.f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("smoothquant alpha must be in [0, 1], got ", options.smooth_alpha));
  }
  return absl::OkStatus();
}

// The input's metadata, then how the file was made (and, for SmoothQuant,
// the kernel mode it is meant to run with).
void AddMetadata(const gguf::GgufFile& in, const QuantizeOptions& options, gguf::GgufWriter* out) {
  for (const auto& [key, value] : in.metadata()) {
    if (key == "general.file_type" || key == "general.quantization_version" ||
        key.rfind("tandem.quantize.", 0) == 0) {
      continue;
    }
    out->Add(key, value);
  }
  out->Add("general.file_type", gguf::Value::Uint32(FileTypeOf(options.target)));
  out->Add("general.quantization_version", gguf::Value::Uint32(2));
  out->Add("tandem.quantize.type", gguf::Value::String(options.target.name));
  out->Add("tandem.quantize.method", gguf::Value::String(std::string(MethodName(options.method))));
  if (options.method == Method::kGptq) {
    out->Add("tandem.quantize.gptq_act_order", gguf::Value::Bool(options.gptq.act_order));
  }
  if (options.method == Method::kSmoothQuant) {
    out->Add("tandem.quantize.alpha", gguf::Value::Float32(options.smooth_alpha));
    out->Add(engine::kKernelsMetadataKey,
             gguf::Value::String(engine::KernelModeName(engine::KernelMode::kFastInt8Token)));
  }
}

}  // namespace

absl::StatusOr<QuantizeSummary> QuantizeModel(const gguf::GgufFile& in,
                                              const QuantizeOptions& options,
                                              gguf::GgufWriter* out) {
  TANDEM_RETURN_IF_ERROR(CheckOptions(options));
  engine::LoadOptions load;
  load.pool = options.pool;
  load.prefault = false;
  load.kernels = engine::KernelMode::kReference;
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<engine::LlamaModel> model,
                          engine::LlamaModel::Load(in, load));
  const engine::ModelConfig& c = model->config();
  TANDEM_ASSIGN_OR_RETURN(TensorMap tensors,
                          LoadTensors(in, options.target, c.num_layers, options.pool));
  QuantizeSummary summary;
  auto progress = [&](std::string_view stage, int64_t done, int64_t total) {
    if (options.progress) options.progress(stage, done, total);
  };
  if (options.method != Method::kRtn) {
    if (options.calibration_tokens.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(MethodName(options.method)), " needs calibration tokens"));
    }
    CalibrationSet calib(c.num_layers, options.max_calibration_tokens);
    TANDEM_RETURN_IF_ERROR(
        RunCalibration(model.get(), options.calibration_tokens, options.calibration_seq_len, &calib,
                       [&](int64_t done, int64_t total) { progress("calibrate", done, total); }));
    summary.calibration_tokens = static_cast<int64_t>(options.calibration_tokens.size());
    for (int64_t layer = 0; layer < c.num_layers; ++layer) {
      if (options.method == Method::kAwq) {
        TANDEM_RETURN_IF_ERROR(
            AwqLayer(c, layer, calib, tensors, options.awq, options.pool, &summary.awq_alphas));
      } else if (options.method == Method::kSmoothQuant) {
        TANDEM_RETURN_IF_ERROR(SmoothLayer(c, layer, calib, tensors, options.smooth_alpha));
      } else {
        TANDEM_RETURN_IF_ERROR(GptqLayer(layer, calib, tensors, options.gptq, options.pool));
      }
      progress(MethodName(options.method), layer + 1, c.num_layers);
    }
  }
  AddMetadata(in, options, out);
  int64_t done = 0;
  for (const gguf::TensorInfo& info : in.tensors()) {
    const Tensor& t = tensors.at(info.name);
    std::string bytes = OutputBytes(t, options.pool);
    const TensorType type =
        t.has_out_bytes || (!t.v.empty() && (t.out_type != info.type || t.modified)) ? t.out_type
                                                                                     : info.type;
    summary.bytes_out += bytes.size();
    ++summary.type_counts[std::string(gguf::GetTypeTraits(type)->name)];
    TANDEM_RETURN_IF_ERROR(out->AddTensor(info.name, info.shape, type, std::move(bytes)));
    progress("write", ++done, static_cast<int64_t>(in.tensors().size()));
  }
  return summary;
}

}  // namespace tandem::quant
