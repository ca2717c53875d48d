#include "engine/llama_model.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "kernels/kernels.h"
#include "kernels/qgemm.h"

namespace tandem::engine {
namespace {

// Per-token passes run on the pool in chunks of at least this many tokens.
constexpr int64_t kMinParallelTokens = 4;

}  // namespace

// Per-Forward activations, all row-major over the batch's tokens.
struct LlamaModel::Scratch {
  std::vector<float> x;     // [T, hidden] residual stream
  std::vector<float> h;     // [T, hidden] normed input / projection output
  std::vector<float> q;     // [T, q_dim]
  std::vector<float> k;     // [T, kv_dim]
  std::vector<float> v;     // [T, kv_dim]
  std::vector<float> attn;  // [T, q_dim]
  std::vector<float> gate;  // [T, ffn]
  std::vector<float> up;    // [T, ffn]
  // Fast path only.
  std::vector<float> qkv;       // [T, q_dim + 2 * kv_dim]
  std::vector<float> gu;        // [T, 2 * ffn] gate | up
  kernels::QuantizedActs acts;  // int8 input of the next matmul
  std::vector<float> rope_cs;   // [T, rope_dim] (cos, sin) pairs, for every layer
};

bool ParseKernelMode(const std::string& s, KernelMode* mode) {
  if (s == "fast") {
    *mode = KernelMode::kFast;
  } else if (s == "fast-int8") {
    *mode = KernelMode::kFastInt8;
  } else if (s == "fast-int8-token") {
    *mode = KernelMode::kFastInt8Token;
  } else if (s == "reference") {
    *mode = KernelMode::kReference;
  } else {
    return false;
  }
  return true;
}

std::string KernelModeName(KernelMode mode) {
  switch (mode) {
    case KernelMode::kFast:
      return "fast";
    case KernelMode::kFastInt8:
      return "fast-int8";
    case KernelMode::kFastInt8Token:
      return "fast-int8-token";
    case KernelMode::kReference:
      return "reference";
  }
  return "?";
}

KernelMode DefaultKernelMode(const gguf::GgufFile& file) {
  KernelMode mode = KernelMode::kFast;
  const absl::StatusOr<std::string_view> name = file.GetString(kKernelsMetadataKey);
  if (name.ok() && ParseKernelMode(std::string(*name), &mode)) return mode;
  return KernelMode::kFast;
}

bool ActLevels::Parse(const std::string& s, ActLevels* out) {
  if (s.size() != 5) return false;
  int v[5];
  for (int i = 0; i < 5; ++i) {
    if (s[i] != '1' && s[i] != '2') return false;
    v[i] = s[i] - '0';
  }
  *out = {v[0], v[1], v[2], v[3], v[4]};
  return true;
}

std::string ActLevels::ToString() const { return absl::StrCat(qkv, wo, gate_up, down, lm_head); }

ActLevels DefaultActLevels(KernelMode mode) {
  if (mode == KernelMode::kFastInt8 || mode == KernelMode::kFastInt8Token) return {1, 1, 1, 1, 1};
  return {2, 2, 2, 2, 2};
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const gguf::GgufFile& file,
                                                             const LoadOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::FromGguf(file));
  TANDEM_ASSIGN_OR_RETURN(ModelWeights weights, ModelWeights::Load(file, config));
  if (options.prefault) file.Prefault(options.progress);
  if (options.kernels != KernelMode::kReference) weights.Pack(options.pool);
  const ActLevels levels =
      options.act_levels != nullptr ? *options.act_levels : DefaultActLevels(options.kernels);
  return std::unique_ptr<LlamaModel>(
      new LlamaModel(std::move(config), std::move(weights), options.pool, options.kernels, levels));
}

absl::StatusOr<std::unique_ptr<KvCacheStorage>> LlamaModel::MakeKvCache(int64_t num_blocks,
                                                                        int64_t block_size,
                                                                        KvDtype dtype) const {
  return KvCacheStorage::Create(config_.num_layers, num_blocks, block_size, config_.num_kv_heads,
                                config_.head_dim, dtype);
}

namespace {

// "f32 46080, f16 23040, bf16 23040, int8 11700, fp8 11700" (--kv-cache-dtype).
std::string KvBytesPerTokenSummary(const ModelConfig& c) {
  std::string out;
  for (KvDtype d : {KvDtype::kF32, KvDtype::kF16, KvDtype::kBf16, KvDtype::kInt8, KvDtype::kFp8}) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", kernels::KvDtypeName(d), " ",
                    kernels::KvBytesPerToken(d, c.num_layers, c.num_kv_heads, c.head_dim));
  }
  return out;
}

}  // namespace

std::string LlamaModel::Summary() const {
  const ModelConfig& c = config_;
  std::string types;
  for (const auto& [name, count] : weights_.type_counts) {
    absl::StrAppend(&types, types.empty() ? "" : ", ", name, " x", count);
  }
  return absl::StrFormat(
      "model: %s (arch %s)\n"
      "  layers %d, hidden %d, ffn %d, heads %d, kv heads %d, head dim %d, vocab %d, context %d\n"
      "  rope: %s, dim %d, freq base %g, freq scale %g; rms eps %g; %s LM head%s\n"
      "  parameters: %d (%.1f M)\n"
      "  tensor types: %s\n"
      "  KV cache bytes/token: %s\n"
      "  kernels: %s",
      c.name.empty() ? "(unnamed)" : c.name, c.architecture, c.num_layers, c.hidden_size,
      c.ffn_size, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size, c.context_length,
      c.rope_style == kernels::RopeStyle::kNeox ? "neox" : "adjacent pairs", c.rope_dim,
      c.rope_freq_base, c.rope_freq_scale, c.rms_eps, c.tied_embeddings ? "tied" : "separate",
      c.has_qkv_bias ? ", qkv bias" : "", c.NumParameters(), c.NumParameters() / 1e6, types,
      KvBytesPerTokenSummary(c),
      (mode_ == KernelMode::kReference
           ? std::string("reference (exact f32)")
           : absl::StrFormat("%s (%s, activation levels qkv/o/gu/down/head %s), %d/%d layers "
                             "packed%s, %.1f MB repacked weights",
                             KernelModeName(mode_), kernels::QGemmIsa(), levels_.ToString(),
                             weights_.num_packed_layers(), c.num_layers,
                             weights_.lm_head_p.empty() ? "" : " + LM head",
                             weights_.packed_bytes() / 1e6)) +
          ", attention / f32 kernels: " + kernels::SimdKernelsVariant() + " build");
}

absl::Status LlamaModel::ValidateBatch(const ForwardBatch& b, const KvCacheStorage& cache) const {
  return ValidateForwardBatch(config_, cache.shape(), b);
}

absl::Status ValidateForwardBatch(const ModelConfig& c, const KvCacheShape& shape,
                                  const ForwardBatch& b) {
  const int64_t T = b.num_tokens(), S = b.num_seqs();
  if (shape.num_layers != c.num_layers || shape.layout.num_kv_heads != c.num_kv_heads ||
      shape.layout.head_dim != c.head_dim) {
    return absl::InvalidArgumentError("KV cache geometry does not match the model");
  }
  if (int64_t(b.positions.size()) != T || int64_t(b.slot_mapping.size()) != T) {
    return absl::InvalidArgumentError("positions / slot_mapping size != token_ids size");
  }
  if (int64_t(b.query_start.size()) != S + 1 || int64_t(b.block_tables.size()) != S) {
    return absl::InvalidArgumentError("query_start / block_tables size does not match num_seqs");
  }
  if (S > 0 && (b.query_start[0] != 0 || b.query_start[S] != T)) {
    return absl::InvalidArgumentError("query_start must run from 0 to num_tokens");
  }
  if (S == 0 && T != 0) return absl::InvalidArgumentError("tokens without sequences");
  const int64_t bs = shape.layout.block_size;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t begin = b.query_start[s], end = b.query_start[s + 1];
    if (end < begin) return absl::InvalidArgumentError("query_start is not monotonic");
    const int64_t ctx = b.context_lens[s];
    const auto& table = b.block_tables[s];
    if (ctx < end - begin || ctx > c.context_length || ctx > int64_t(table.size()) * bs) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": context_len ", ctx,
                                                     " is below its query tokens, above the model ",
                                                     "context or above its block table capacity"));
    }
    for (int64_t i = 0; i < (ctx + bs - 1) / bs; ++i) {
      if (table[i] < 0 || table[i] >= shape.layout.num_blocks) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", s, ": block table entry ", table[i], " out of range"));
      }
    }
    for (int64_t t = begin; t < end; ++t) {
      if (b.token_ids[t] < 0 || b.token_ids[t] >= c.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", b.token_ids[t], " outside vocab of ", c.vocab_size));
      }
      const int64_t pos = b.positions[t];
      if (pos < 0 || pos >= ctx) {
        return absl::InvalidArgumentError(
            absl::StrCat("token ", t, ": position ", pos, " outside context_len ", ctx));
      }
      const int64_t want = int64_t(table[pos / bs]) * bs + pos % bs;
      if (b.slot_mapping[t] != want) {
        return absl::InvalidArgumentError(absl::StrCat("token ", t, ": slot ", b.slot_mapping[t],
                                                       " is not its block table slot ", want));
      }
    }
  }
  for (int32_t i : b.logits_indices) {
    if (i < 0 || i >= T) return absl::InvalidArgumentError("logits index out of range");
  }
  return absl::OkStatus();
}

void LlamaModel::RunLayer(int64_t layer, const ForwardBatch& b,
                          const kernels::PagedAttentionArgs& args, KvCacheStorage* cache,
                          Scratch& s) const {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_.layers[layer];
  const int64_t T = b.num_tokens();
  kernels::RmsNorm(s.x.data(), w.attn_norm.data(), T, c.hidden_size, c.rms_eps, s.h.data());
  Observe(layer, LinearInput::kAttnIn, s.h.data(), T, c.hidden_size);
  const kernels::WeightView qkv[3] = {w.wq, w.wk, w.wv};
  float* const qkv_out[3] = {s.q.data(), s.k.data(), s.v.data()};
  kernels::MatMulShared(qkv, qkv_out, 3, s.h.data(), T, pool_);
  if (c.has_qkv_bias) {
    for (int64_t t = 0; t < T; ++t) {
      kernels::Add(s.q.data() + t * c.q_dim(), w.bq.data(), c.q_dim(), s.q.data() + t * c.q_dim());
      kernels::Add(s.k.data() + t * c.kv_dim(), w.bk.data(), c.kv_dim(),
                   s.k.data() + t * c.kv_dim());
      kernels::Add(s.v.data() + t * c.kv_dim(), w.bv.data(), c.kv_dim(),
                   s.v.data() + t * c.kv_dim());
    }
  }
  Attend(layer, b, args, cache, s);
  Observe(layer, LinearInput::kAttnOut, s.attn.data(), T, c.q_dim());
  kernels::MatMul(w.wo, s.attn.data(), T, s.h.data(), pool_);
  kernels::Add(s.x.data(), s.h.data(), T * c.hidden_size, s.x.data());

  kernels::RmsNorm(s.x.data(), w.ffn_norm.data(), T, c.hidden_size, c.rms_eps, s.h.data());
  Observe(layer, LinearInput::kFfnIn, s.h.data(), T, c.hidden_size);
  const kernels::WeightView gate_up[2] = {w.w_gate, w.w_up};
  float* const gate_up_out[2] = {s.gate.data(), s.up.data()};
  kernels::MatMulShared(gate_up, gate_up_out, 2, s.h.data(), T, pool_);
  kernels::SiluMul(s.gate.data(), s.up.data(), T * c.ffn_size, s.gate.data());
  Observe(layer, LinearInput::kDownIn, s.gate.data(), T, c.ffn_size);
  kernels::MatMul(w.w_down, s.gate.data(), T, s.h.data(), pool_);
  kernels::Add(s.x.data(), s.h.data(), T * c.hidden_size, s.x.data());
}

kernels::RopeParams LlamaModel::RopeOf() const {
  kernels::RopeParams rope;
  rope.style = config_.rope_style;
  rope.rot_dim = config_.rope_dim;
  rope.freq_base = config_.rope_freq_base;
  rope.freq_scale = config_.rope_freq_scale;
  rope.freq_factors = weights_.rope_freqs.empty() ? nullptr : weights_.rope_freqs.data();
  return rope;
}

// RoPE on s.q / s.k, K/V into the cache, attention into s.attn.
void LlamaModel::Attend(int64_t layer, const ForwardBatch& b,
                        const kernels::PagedAttentionArgs& args, KvCacheStorage* cache,
                        Scratch& s) const {
  const ModelConfig& c = config_;
  const int64_t T = b.num_tokens();
  const kernels::RopeParams rope = RopeOf();
  kernels::RopeQKAngles(s.q.data(), s.k.data(), s.rope_cs.data(), T, c.num_heads, c.num_kv_heads,
                        c.head_dim, rope);
  const kernels::KvCacheView view = cache->view(layer);
  kernels::WriteKv(cache->layout(), s.k.data(), s.v.data(), b.slot_mapping.data(), T, view);
  kernels::PagedAttention(args, s.q.data(), view, s.attn.data(), pool_);
}

// The fast path: int8 activations x repacked weights, norms and SwiGLU fused
// with the quantization, residual adds fused into the output matmuls.
void LlamaModel::RunPackedLayer(int64_t layer, const ForwardBatch& b,
                                const kernels::PagedAttentionArgs& args, KvCacheStorage* cache,
                                Scratch& s) const {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_.layers[layer];
  const int64_t T = b.num_tokens(), qd = c.q_dim(), kvd = c.kv_dim();
  const int64_t width = qd + 2 * kvd;
  const kernels::ActScale scale = mode_ == KernelMode::kFastInt8Token
                                      ? kernels::ActScale::kPerToken
                                      : kernels::ActScale::kPerBlock;
  kernels::RmsNormQuantize(s.x.data(), w.attn_norm.data(), T, c.hidden_size, c.rms_eps, &s.acts,
                           levels_.qkv, pool_, scale);
  QGemm(w.qkv, s.acts, s.qkv.data(), width, false, pool_);
  // Split Q|K|V (+ bias), RoPE and the K/V cache write, per token (each
  // token's values are computed by one thread alone).
  const kernels::RopeParams rope = RopeOf();
  const kernels::KvCacheView view = cache->view(layer);
  ThreadPool::Run(
      pool_, T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const float* row = s.qkv.data() + t * width;
          std::copy_n(row, qd, s.q.data() + t * qd);
          std::copy_n(row + qd, kvd, s.k.data() + t * kvd);
          std::copy_n(row + qd + kvd, kvd, s.v.data() + t * kvd);
          if (c.has_qkv_bias) {
            kernels::Add(s.q.data() + t * qd, w.bq.data(), qd, s.q.data() + t * qd);
            kernels::Add(s.k.data() + t * kvd, w.bk.data(), kvd, s.k.data() + t * kvd);
            kernels::Add(s.v.data() + t * kvd, w.bv.data(), kvd, s.v.data() + t * kvd);
          }
        }
        kernels::RopeQKAngles(s.q.data() + t0 * qd, s.k.data() + t0 * kvd,
                              s.rope_cs.data() + t0 * c.rope_dim, t1 - t0, c.num_heads,
                              c.num_kv_heads, c.head_dim, rope);
        kernels::WriteKv(cache->layout(), s.k.data() + t0 * kvd, s.v.data() + t0 * kvd,
                         b.slot_mapping.data() + t0, t1 - t0, view);
      },
      kMinParallelTokens);
  kernels::PagedAttention(args, s.q.data(), view, s.attn.data(), pool_);
  kernels::QuantizeActs(s.attn.data(), T, qd, &s.acts, levels_.wo, pool_, scale);
  kernels::QGemm(w.wo_p, s.acts, s.x.data(), c.hidden_size, true, pool_);

  kernels::RmsNormQuantize(s.x.data(), w.ffn_norm.data(), T, c.hidden_size, c.rms_eps, &s.acts,
                           levels_.gate_up, pool_, scale);
  QGemm(w.gate_up, s.acts, s.gu.data(), 2 * c.ffn_size, false, pool_);
  kernels::SiluMulQuantize(s.gu.data(), T, c.ffn_size, &s.acts, levels_.down, pool_, scale);
  kernels::QGemm(w.down_p, s.acts, s.x.data(), c.hidden_size, true, pool_);
}

void LlamaModel::LmHead(const ForwardBatch& b, Scratch& s, float* logits) const {
  const ModelConfig& c = config_;
  const int64_t L = static_cast<int64_t>(b.logits_indices.size());
  std::vector<float> last(L * c.hidden_size);
  for (int64_t i = 0; i < L; ++i) {
    std::copy_n(s.x.data() + b.logits_indices[i] * c.hidden_size, c.hidden_size,
                last.data() + i * c.hidden_size);
  }
  if (mode_ != KernelMode::kReference && !weights_.lm_head_p.empty()) {
    kernels::RmsNormQuantize(last.data(), weights_.output_norm.data(), L, c.hidden_size, c.rms_eps,
                             &s.acts, levels_.lm_head, pool_);
    kernels::QGemm(weights_.lm_head_p, s.acts, logits, c.vocab_size, false, pool_);
    return;
  }
  kernels::RmsNorm(last.data(), weights_.output_norm.data(), L, c.hidden_size, c.rms_eps,
                   last.data());
  kernels::MatMul(weights_.lm_head, last.data(), L, logits, pool_);
}

absl::Status LlamaModel::Forward(const ForwardBatch& b, KvCacheStorage* cache,
                                 float* logits) const {
  if (cache == nullptr) return absl::InvalidArgumentError("null KV cache");
  TANDEM_RETURN_IF_ERROR(ValidateBatch(b, *cache));
  const ModelConfig& c = config_;
  const int64_t T = b.num_tokens(), S = b.num_seqs();
  if (T == 0) return absl::OkStatus();

  // Block tables flattened to [S, max_blocks] for the kernel.
  int64_t max_blocks = 1;
  for (const auto& table : b.block_tables) max_blocks = std::max<int64_t>(max_blocks, table.size());
  std::vector<int32_t> tables(S * max_blocks, 0);
  for (int64_t s = 0; s < S; ++s) {
    std::copy(b.block_tables[s].begin(), b.block_tables[s].end(), tables.begin() + s * max_blocks);
  }
  kernels::PagedAttentionArgs args;
  args.layout = cache->layout();
  args.num_heads = c.num_heads;
  args.scale = 1.f / std::sqrt(float(c.head_dim));
  args.num_seqs = S;
  args.query_start = b.query_start.data();
  args.positions = b.positions.data();
  args.context_lens = b.context_lens.data();
  args.block_tables = tables.data();
  args.max_blocks_per_seq = max_blocks;

  Scratch s;
  s.x.resize(T * c.hidden_size);
  s.h.resize(T * c.hidden_size);
  s.q.resize(T * c.q_dim());
  s.k.resize(T * c.kv_dim());
  s.v.resize(T * c.kv_dim());
  s.attn.resize(T * c.q_dim());
  s.gate.resize(T * c.ffn_size);
  s.up.resize(T * c.ffn_size);
  const bool fast = mode_ != KernelMode::kReference;
  if (fast) {
    s.qkv.resize(T * (c.q_dim() + 2 * c.kv_dim()));
    s.gu.resize(T * 2 * c.ffn_size);
  }
  s.rope_cs.resize(T * c.rope_dim);
  kernels::RopeAngles(b.positions.data(), T, RopeOf(), s.rope_cs.data());
  kernels::EmbeddingLookup(weights_.token_embd, b.token_ids.data(), T, s.x.data());
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    if (b.abort != nullptr && b.abort->load(std::memory_order_relaxed)) {
      return absl::CancelledError("step aborted: every request in it was cancelled");
    }
    if (fast && weights_.layers[layer].packed()) {
      RunPackedLayer(layer, b, args, cache, s);
    } else {
      RunLayer(layer, b, args, cache, s);
    }
  }
  if (!b.logits_indices.empty()) LmHead(b, s, logits);
  return absl::OkStatus();
}

}  // namespace tandem::engine
