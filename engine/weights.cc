#include "engine/weights.h"

#include <sys/mman.h>

#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/quant.h"

namespace tandem::engine {
namespace {

struct Expected {
  std::string name;
  std::vector<int64_t> shape;  // ggml order
  bool required = true;
};

std::vector<Expected> ExpectedTensors(const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  std::vector<Expected> e = {
      {"token_embd.weight", {h, c.vocab_size}},
      {"output_norm.weight", {h}},
      {"output.weight", {h, c.vocab_size}, !c.tied_embeddings},
      {"rope_freqs.weight", {c.rope_dim / 2}, false},
  };
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string b = absl::StrCat("blk.", i, ".");
    e.push_back({b + "attn_norm.weight", {h}});
    e.push_back({b + "ffn_norm.weight", {h}});
    e.push_back({b + "attn_q.weight", {h, c.q_dim()}});
    e.push_back({b + "attn_k.weight", {h, c.kv_dim()}});
    e.push_back({b + "attn_v.weight", {h, c.kv_dim()}});
    e.push_back({b + "attn_output.weight", {c.q_dim(), h}});
    e.push_back({b + "ffn_gate.weight", {h, c.ffn_size}});
    e.push_back({b + "ffn_up.weight", {h, c.ffn_size}});
    e.push_back({b + "ffn_down.weight", {c.ffn_size, h}});
    e.push_back({b + "attn_q.bias", {c.q_dim()}, c.has_qkv_bias});
    e.push_back({b + "attn_k.bias", {c.kv_dim()}, c.has_qkv_bias});
    e.push_back({b + "attn_v.bias", {c.kv_dim()}, c.has_qkv_bias});
  }
  return e;
}

std::string ShapeString(const std::vector<int64_t>& s) {
  std::string out = "{";
  for (size_t i = 0; i < s.size(); ++i) absl::StrAppend(&out, i ? ", " : "", s[i]);
  return out + "}";
}

absl::Status CheckTensor(const gguf::TensorInfo* t, const Expected& e) {
  if (t == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("tensor ", e.name, " is missing"));
  if (t->shape != e.shape) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", e.name, " has shape ",
                                                   ShapeString(t->shape), ", expected ",
                                                   ShapeString(e.shape)));
  }
  absl::StatusOr<gguf::TypeTraits> traits = gguf::GetTypeTraits(t->type);
  if (!traits.ok() || !traits->dequantizable) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", e.name, " has a type Tandem cannot dequantize"));
  }
  absl::StatusOr<uint64_t> row_bytes = gguf::RowBytes(t->type, e.shape[0]);
  if (!row_bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", e.name, ": ", row_bytes.status().message()));
  }
  const int64_t rows = e.shape.size() > 1 ? e.shape[1] : 1;
  if (t->data == nullptr || t->num_bytes != *row_bytes * static_cast<uint64_t>(rows)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", e.name, " has inconsistent size"));
  }
  return absl::OkStatus();
}

kernels::WeightView View(const gguf::TensorInfo& t) {
  kernels::WeightView w;
  w.type = t.type;
  w.data = t.data;
  w.cols = t.shape[0];
  w.rows = t.shape.size() > 1 ? t.shape[1] : 1;
  w.row_bytes = static_cast<int64_t>(t.num_bytes / static_cast<uint64_t>(w.rows));
  return w;
}

std::vector<float> Dequantize(const gguf::TensorInfo& t) {
  std::vector<float> out(t.num_elements);
  kernels::DequantizeRow(t.type, t.data, out.data(), t.num_elements);
  return out;
}

}  // namespace

absl::Status CheckTensors(const gguf::GgufFile& file, const ModelConfig& config) {
  for (const Expected& e : ExpectedTensors(config)) {
    const gguf::TensorInfo* t = file.FindTensor(e.name);
    if (t == nullptr && !e.required) continue;
    TANDEM_RETURN_IF_ERROR(CheckTensor(t, e));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelWeights> ModelWeights::Load(const gguf::GgufFile& file, const ModelConfig& c) {
  TANDEM_RETURN_IF_ERROR(CheckTensors(file, c));
  ModelWeights w;
  auto get = [&](const std::string& name) -> const gguf::TensorInfo& {
    const gguf::TensorInfo* t = file.FindTensor(name);  // checked above
    w.type_counts[std::string(gguf::GetTypeTraits(t->type)->name)]++;
    return *t;
  };
  w.token_embd = View(get("token_embd.weight"));
  w.lm_head = c.tied_embeddings ? w.token_embd : View(get("output.weight"));
  w.output_norm = Dequantize(get("output_norm.weight"));
  if (file.FindTensor("rope_freqs.weight") != nullptr) {
    w.rope_freqs = Dequantize(get("rope_freqs.weight"));
    for (float f : w.rope_freqs) {
      if (!(f > 0.f)) return absl::InvalidArgumentError("rope_freqs.weight must be positive");
    }
  }
  w.layers.resize(c.num_layers);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string b = absl::StrCat("blk.", i, ".");
    LayerWeights& l = w.layers[i];
    l.attn_norm = Dequantize(get(b + "attn_norm.weight"));
    l.ffn_norm = Dequantize(get(b + "ffn_norm.weight"));
    l.wq = View(get(b + "attn_q.weight"));
    l.wk = View(get(b + "attn_k.weight"));
    l.wv = View(get(b + "attn_v.weight"));
    l.wo = View(get(b + "attn_output.weight"));
    l.w_gate = View(get(b + "ffn_gate.weight"));
    l.w_up = View(get(b + "ffn_up.weight"));
    l.w_down = View(get(b + "ffn_down.weight"));
    if (c.has_qkv_bias) {
      l.bq = Dequantize(get(b + "attn_q.bias"));
      l.bk = Dequantize(get(b + "attn_k.bias"));
      l.bv = Dequantize(get(b + "attn_v.bias"));
    }
  }
  return w;
}

void ModelWeights::ArenaFree::operator()(uint8_t* p) const { std::free(p); }

int64_t PackedStack::bytes() const {
  int64_t total = 0;
  for (const Part& p : parts) total += p.w.bytes();
  return total;
}

void QGemm(const PackedStack& m, const kernels::QuantizedActs& acts, float* y, int64_t ldy,
           bool accumulate, ThreadPool* pool) {
  for (const PackedStack::Part& p : m.parts) {
    kernels::QGemm(p.w, acts, y + p.offset, ldy, accumulate, pool);
  }
}

void ModelWeights::Pack(ThreadPool* pool) {
  using kernels::IsPackable;
  using kernels::PackedWeight;
  struct Job {
    std::vector<kernels::WeightView> views;  // one type
    PackedWeight* out;
    int64_t offset = 0;
  };
  std::vector<Job> jobs;
  // Runs of consecutive views of one type become the parts of `out`.
  auto stack = [&](std::vector<kernels::WeightView> views, PackedStack* out) {
    out->parts.clear();
    out->parts.reserve(views.size());
    int64_t row = 0;
    for (size_t i = 0; i < views.size(); ++i) {
      if (i == 0 || views[i].type != views[i - 1].type) {
        out->parts.push_back({PackedWeight(), row});
        jobs.push_back({{}, &out->parts.back().w});
      }
      jobs.back().views.push_back(views[i]);
      row += views[i].rows;
    }
  };
  for (LayerWeights& l : layers) {
    bool ok = true;
    for (const kernels::WeightView* v :
         {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      ok = ok && IsPackable(v->type);
    }
    if (!ok) continue;
    stack({l.wq, l.wk, l.wv}, &l.qkv);
    jobs.push_back({{l.wo}, &l.wo_p});
    stack({l.w_gate, l.w_up}, &l.gate_up);
    jobs.push_back({{l.w_down}, &l.down_p});
  }
  if (IsPackable(lm_head.type)) jobs.push_back({{lm_head}, &lm_head_p});
  int64_t total = 0;
  for (Job& j : jobs) {
    j.offset = total;
    total += (PackedWeight::PackedBytes(j.views.data(), int(j.views.size())) + 63) / 64 * 64;
  }
  if (total == 0) return;
  constexpr int64_t kHuge = int64_t(2) << 20;
  packed_arena_bytes = (total + kHuge - 1) / kHuge * kHuge;
  packed_arena.reset(static_cast<uint8_t*>(std::aligned_alloc(kHuge, packed_arena_bytes)));
  TANDEM_CHECK(packed_arena != nullptr);
#if defined(MADV_HUGEPAGE)
  madvise(packed_arena.get(), packed_arena_bytes, MADV_HUGEPAGE);  // a hint; failure is fine
#endif
  for (Job& j : jobs) {
    *j.out = PackedWeight::Pack(j.views.data(), int(j.views.size()), pool,
                                packed_arena.get() + j.offset);
  }
}

int64_t ModelWeights::packed_bytes() const {
  int64_t total = lm_head_p.bytes();
  for (const LayerWeights& l : layers) {
    total += l.qkv.bytes() + l.wo_p.bytes() + l.gate_up.bytes() + l.down_p.bytes();
  }
  return total;
}

int64_t ModelWeights::num_packed_layers() const {
  int64_t n = 0;
  for (const LayerWeights& l : layers) n += l.packed();
  return n;
}

}  // namespace tandem::engine
