// Llama-family forward pass (Llama 2/3, SmolLM2, TinyLlama, Mistral; Qwen2
// with qkv bias and NeoX rope) over a paged KV cache.
//
// One Forward() runs a flattened batch of tokens from any number of sequences
// (prefill chunks and decode tokens alike): embedding, per layer RMSNorm, QKV
// (+bias), RoPE, K/V written to the cache by slot_mapping, paged attention
// with GQA, output projection, SwiGLU FFN, then final norm and LM head for
// the logits_indices rows only.
//
// Determinism: a sequence's logits are bit-identical whatever else is in the
// batch, how its prompt was chunked, and the pool's thread count.
//
// Ownership: the GgufFile passed to Load must outlive the model (weights are
// views into its mapping). Thread safety: Forward is const and reentrant, but
// concurrent calls must use different caches; the ThreadPool serializes them.
#ifndef TANDEM_ENGINE_LLAMA_MODEL_H_
#define TANDEM_ENGINE_LLAMA_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/gguf/gguf.h"
#include "common/thread_pool.h"
#include "engine/forward_batch.h"
#include "engine/kv_cache.h"
#include "engine/model_config.h"
#include "engine/weights.h"

namespace tandem::engine {

// kFast: quantized matrices are repacked at load (kernels/qgemm.h) and run
// with two-level int8 activations on every matmul (AMX / VNNI / AVX2 /
// scalar chosen from CPUID, all bit-identical), with fused RMSNorm +
// quantize, SwiGLU + quantize and residual adds; within 0.01 nats of the
// goldens, greedy identical for >= 32 tokens (in practice all 64 golden
// tokens of every prompt; tests/engine/llama_model_test.cc). One-level int8
// on any matmul but o / down broke the 32-token greedy bound on some golden
// prompt (SmolLm2GoldenTest.ActLevelsStudy measures any mix).
// kFastInt8: the same with one-level int8 activations (llama.cpp's Q8
// activation precision): faster prefill, mean KL about 3e-3, greedy
// continuations may diverge early at near-ties.
// kFastInt8Token: as kFastInt8, but the four layer linears' activations get
// one int8 scale per token (kernels::ActScale::kPerToken) instead of one per
// 32-column block: SmoothQuant's W8A8 (quant/smoothquant.h), the default for
// a file whose tandem.quantize.kernels says so (DefaultKernelMode). The LM
// head keeps per-block scales (its input is not smoothed).
// kReference: the exact f32 path (dequantized weights, f32 activations),
// the one checked against the HF goldens at KL < 1e-3. Both are
// deterministic in the sense above; F32 / F16 / BF16 matrices always use the
// f32 path.
enum class KernelMode { kFast, kFastInt8, kFastInt8Token, kReference };

// Activation levels (1: int8, 2: int8 + int8 residual) of each packed matmul
// input on the fast path. Fixed per model at load, the same for every token
// and batch, so determinism is unaffected by the mix.
struct ActLevels {
  int qkv = 2, wo = 2, gate_up = 2, down = 2, lm_head = 2;
  // "QWGDH" digits, e.g. "22222" (tests, benchmarks); false on bad input.
  static bool Parse(const std::string& s, ActLevels* out);
  std::string ToString() const;
};
// The levels each mode runs with (kReference: unused).
ActLevels DefaultActLevels(KernelMode mode);

// "fast" / "fast-int8" / "fast-int8-token" / "reference" (flags, env);
// false on anything else.
bool ParseKernelMode(const std::string& s, KernelMode* mode);
std::string KernelModeName(KernelMode mode);
// "fast, fast-int8, fast-int8-token or reference" (flag help and errors).
inline constexpr char kKernelModeChoices[] = "fast, fast-int8, fast-int8-token or reference";

// The file's own kernel mode: its "tandem.quantize.kernels" metadata (written
// by `tandem quantize --method smoothquant`) when that names a mode, else
// kFast. A user's explicit choice (--kernels) overrides it.
inline constexpr char kKernelsMetadataKey[] = "tandem.quantize.kernels";
KernelMode DefaultKernelMode(const gguf::GgufFile& file);

// Sees the input of each group of linears on the f32 path (every layer
// with KernelMode::kReference; with the fast modes only layers that are not
// repacked): the calibration of `tandem quantize` (quant/). `x` is [num_tokens, dim]
// row-major, valid during the call only. Called from the Forward thread.
enum class LinearInput {
  kAttnIn,   // attn_norm output: input of attn_q / attn_k / attn_v
  kAttnOut,  // attention output: input of attn_output
  kFfnIn,    // ffn_norm output: input of ffn_gate / ffn_up
  kDownIn,   // silu(gate) * up: input of ffn_down
};
class ActivationObserver {
 public:
  virtual ~ActivationObserver() = default;
  virtual void Observe(int64_t layer, LinearInput which, const float* x, int64_t num_tokens,
                       int64_t dim) = 0;
};

struct LoadOptions {
  ThreadPool* pool = nullptr;  // not owned; null runs single-threaded
  bool prefault = true;        // touch all weight pages during Load
  gguf::ProgressFn progress;   // (bytes done, bytes total) while prefaulting
  KernelMode kernels = KernelMode::kFast;
  // Overrides DefaultActLevels(kernels) when set (accuracy studies, benchmarks).
  const ActLevels* act_levels = nullptr;
};

class LlamaModel {
 public:
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const gguf::GgufFile& file,
                                                          const LoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  ThreadPool* pool() const { return pool_; }
  KernelMode kernel_mode() const { return mode_; }
  const ActLevels& act_levels() const { return levels_; }

  // Multi-line start-up description: architecture, dims, parameter count,
  // tensor type counts, KV bytes per token.
  std::string Summary() const;

  // Checks `batch` against the config and `cache` (ids in vocab, positions <
  // context and < the sequence's context_len, slots and block tables in
  // range, each token's slot matching its position's block table entry):
  // InvalidArgument on any violation.
  absl::Status ValidateBatch(const ForwardBatch& batch, const KvCacheStorage& cache) const;

  // Runs the batch, writing K/V into `cache`.
  // logits: [logits_indices.size(), vocab_size], caller-allocated.
  absl::Status Forward(const ForwardBatch& batch, KvCacheStorage* cache, float* logits) const;

  // Installs (or with nullptr removes) the reference path's observer. Not
  // owned; REQUIRES: no Forward in flight.
  void set_activation_observer(ActivationObserver* observer) { observer_ = observer; }

  // A cache shaped for this model.
  absl::StatusOr<std::unique_ptr<KvCacheStorage>> MakeKvCache(
      int64_t num_blocks, int64_t block_size = KvCacheStorage::kDefaultBlockSize,
      KvDtype dtype = KvDtype::kF32) const;

 private:
  LlamaModel(ModelConfig config, ModelWeights weights, ThreadPool* pool, KernelMode mode,
             ActLevels levels)
      : config_(std::move(config)),
        weights_(std::move(weights)),
        pool_(pool),
        mode_(mode),
        levels_(levels) {}

  struct Scratch;
  void RunLayer(int64_t layer, const ForwardBatch& batch, const kernels::PagedAttentionArgs& args,
                KvCacheStorage* cache, Scratch& s) const;
  void RunPackedLayer(int64_t layer, const ForwardBatch& batch,
                      const kernels::PagedAttentionArgs& args, KvCacheStorage* cache,
                      Scratch& s) const;
  void Attend(int64_t layer, const ForwardBatch& b, const kernels::PagedAttentionArgs& args,
              KvCacheStorage* cache, Scratch& s) const;
  void LmHead(const ForwardBatch& b, Scratch& s, float* logits) const;
  kernels::RopeParams RopeOf() const;
  void Observe(int64_t layer, LinearInput which, const float* x, int64_t num_tokens,
               int64_t dim) const {
    if (observer_ != nullptr) observer_->Observe(layer, which, x, num_tokens, dim);
  }

  ModelConfig config_;
  ModelWeights weights_;
  ThreadPool* pool_;
  KernelMode mode_;
  ActLevels levels_;
  ActivationObserver* observer_ = nullptr;
};

// LlamaModel::ValidateBatch against any cache shape (the CUDA executor's
// cache is not a KvCacheStorage).
absl::Status ValidateForwardBatch(const ModelConfig& config, const KvCacheShape& shape,
                                  const ForwardBatch& batch);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_LLAMA_MODEL_H_
