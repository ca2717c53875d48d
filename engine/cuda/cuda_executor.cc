// The CUDA executor: weights and the paged KV cache in device memory, one
// stream, the forward pass of engine/llama_model.cc on kernels/cuda.
#include "engine/cuda/cuda_executor.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/background_free.h"
#include "common/status.h"
#include "engine/cuda/cuda_synthetic.h"
#include "engine/cuda/cuda_weights.h"
#include "engine/kv_export.h"
#include "engine/llama_model.h"

namespace tandem::engine::cuda {
namespace {

namespace kc = kernels::cuda;

// Decode steps of up to this many sequences run as CUDA graphs.
constexpr int64_t kMaxGraphTokens = 64;

bool EnvIs(const char* name, std::string_view value) {
  const char* v = std::getenv(name);
  return v != nullptr && value == v;
}

// The activation buffers of a step of T tokens and L logits rows, in floats:
// x, h, qkv, attention out, gate|up, SiLU out, logits rows, logits,
// attention workspace.
std::array<int64_t, 9> ActivationFloats(const ModelConfig& c, int64_t T, int64_t L,
                                        int64_t attn_ws_floats) {
  const int64_t H = c.hidden_size, W = c.q_dim() + 2 * c.kv_dim();
  return {T * H,
          T * H,
          T * W,
          T * c.q_dim(),
          T * 2 * c.ffn_size,
          T * c.ffn_size,
          L * H,
          L * c.vocab_size,
          attn_ws_floats};
}

struct HostFree {
  void operator()(void* p) const { kc::FreeHost(p); }
};

int64_t Align(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// A buffer that only grows: device memory (Scratch) or pinned host memory
// (HostStaging), freed by Ptr's deleter.
template <typename Ptr, absl::StatusOr<void*> (*Alloc)(int64_t)>
class GrowingBuffer {
 public:
  absl::StatusOr<char*> Get(int64_t bytes) {
    if (bytes > bytes_) {
      ptr_.reset();
      TANDEM_ASSIGN_OR_RETURN(void* p, Alloc(bytes));
      ptr_.reset(p);
      bytes_ = bytes;
    }
    return static_cast<char*>(ptr_.get());
  }
  int64_t bytes() const { return bytes_; }

 private:
  Ptr ptr_;
  int64_t bytes_ = 0;
};
using Scratch = GrowingBuffer<DevicePtr, kc::Malloc>;
using HostStaging = GrowingBuffer<std::unique_ptr<void, HostFree>, kc::MallocHost>;

class CudaExecutor final : public Executor {
 public:
  using WeightsFn = std::function<absl::StatusOr<DeviceWeights>(kc::Stream)>;

  static absl::StatusOr<std::unique_ptr<Executor>> Create(const ModelConfig& config,
                                                          const ExecutorOptions& options,
                                                          const WeightsFn& make_weights);
  ~CudaExecutor() override;

  Device device() const override { return Device::kCuda; }
  std::string Describe() const override;
  const KvCacheShape& kv_shape() const override { return shape_; }
  int64_t kv_cache_bytes() const override {
    return 2 * shape_.num_layers * shape_.num_slots() * shape_.row_bytes();
  }
  absl::Status CopyBlocks(absl::Span<const BlockCopy> copies) override;
  absl::Status Forward(const ForwardBatch& batch, float* logits) override;
  absl::Status ReadKv(absl::Span<const int64_t> slots, char* dst) override;
  absl::Status WriteKv(absl::Span<const int64_t> slots, const char* src) override;
  std::string kv_memory_domain() const override { return absl::StrCat("cuda:", device_index_); }
  absl::StatusOr<std::shared_ptr<KvDeviceBytes>> AllocKvDevice(int64_t bytes) override;
  absl::Status ReadKvDevice(absl::Span<const int64_t> slots, void* dst) override;
  absl::Status WriteKvDevice(absl::Span<const int64_t> slots, const void* src) override;

 private:
  explicit CudaExecutor(const ModelConfig& config) : config_(config) {}
  // The slot list of a ReadKv / WriteKv on the device (validated), and the
  // device buffer for its data in the interchange layout.
  struct SlotIo {
    int64_t n = 0;
    int64_t data_bytes = 0;
    int64_t* slots = nullptr;
    char* buf = nullptr;  // interchange bytes
  };
  // with_buffer false: the data is elsewhere on the device (buf stays null).
  absl::StatusOr<SlotIo> UploadSlots(absl::Span<const int64_t> slots, bool with_buffer = true);
  absl::Status RunLayer(int64_t layer, int64_t T, const kc::DeviceAttentionArgs& attn_base);
  absl::Status MatMul(const kc::DeviceMatrix& w, const float* x, int64_t n, float* y, int64_t ldy,
                      bool accumulate);

  // The sizes a step's buffers are laid out for: the batch's own (eager), or
  // a captured graph's (tokens padded up, block tables and attention splits
  // sized for a context bucket).
  struct Geometry {
    int64_t T = 0, S = 0, L = 0, max_blocks = 1, max_pos = 0;
    // Byte offsets in the metadata upload.
    int64_t off_tokens = 0, off_pos = 0, off_seq = 0, off_logits = 0, off_tables = 0, off_slots = 0,
            meta_bytes = 0;
    int64_t attn_ws_floats = 0, acts_bytes = 0;
  };
  Geometry Layout(int64_t T, int64_t S, int64_t L, int64_t max_blocks, int64_t max_pos) const;
  // The batch's metadata into `host` in g's layout; rows past the batch's
  // (graph padding) are dummy tokens writing the scratch block.
  void StageMeta(const ForwardBatch& b, const Geometry& g, char* host) const;
  // The step's device work, from the metadata upload to the logits copy
  // into `host_logits` (L rows): what a graph captures.
  absl::Status Enqueue(const Geometry& g, const char* host_meta, char* meta, char* acts,
                       float* host_logits);
  // A validated step: a graph replay when ForwardGraph takes it, else eager.
  absl::Status Run(const ForwardBatch& b, float* logits);
  absl::Status ForwardEager(const ForwardBatch& b, float* logits);
  // Decode steps (one token per sequence) of up to kMaxGraphTokens tokens
  // whose matrix products all run on the Gemv: a CUDA graph per (padded
  // size, context bucket), captured at first use. Unavailable: eager.
  absl::StatusOr<bool> ForwardGraph(const ForwardBatch& b, float* logits);
  // Steps of 16, 8, 4, 2 and 1 one-token sequences in the scratch block:
  // every kernel loaded (CUDA loads them at first launch), cuBLAS's first
  // GEMM done, the short-context decode graphs captured, before the first
  // request (its TTFT pays none of it).
  absl::Status Warmup();
  struct GraphKey {
    int64_t tokens, splits;
    bool operator<(const GraphKey& o) const {
      return tokens != o.tokens ? tokens < o.tokens : splits < o.splits;
    }
  };

  ModelConfig config_;
  KvCacheShape shape_;
  int device_index_ = 0;
  bool batch_invariant_ = false;
  bool int8_acts_ = false;
  kc::Stream stream_ = nullptr;
  void* blas_ = nullptr;
  DeviceWeights weights_;
  DevicePtr kv_data_;
  kc::DeviceKvCache kv_;
  HostStaging staging_;  // host side of metadata and slot uploads
  Scratch meta_, acts_, gemm_ws_, kv_io_;
  // Graphs: their own buffers, sized once for the largest graph (addresses
  // a graph recorded never move), and the scratch block (index
  // shape_.layout.num_blocks, past the engine's) that padding tokens write.
  bool use_graphs_ = true;
  std::map<GraphKey, void*> graphs_;
  HostStaging graph_host_;  // metadata, then logits
  Scratch graph_meta_, graph_acts_;
  // Activation views into acts_ for the current Forward.
  float *x_ = nullptr, *h_ = nullptr, *qkv_ = nullptr, *attn_ = nullptr, *gu_ = nullptr,
        *act_ = nullptr;
  const int64_t* d_slots_ = nullptr;
};

absl::StatusOr<std::unique_ptr<Executor>> CudaExecutor::Create(const ModelConfig& config,
                                                               const ExecutorOptions& options,
                                                               const WeightsFn& make_weights) {
  if (options.num_blocks <= 0 || options.block_size <= 0 || options.block_size > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda executor: bad KV geometry, ", options.num_blocks, " blocks of ", options.block_size));
  }
  // The device kernels (rope_kv.cu, attention.cu, kv_ops.cu) read and write
  // f32, f16 and bf16 rows.
  TANDEM_RETURN_IF_ERROR(CheckKvDtypeSupported(Device::kCuda, options.kv_dtype));
  std::unique_ptr<CudaExecutor> ex(new CudaExecutor(config));
  ex->device_index_ = options.device_index;
  ex->batch_invariant_ = options.batch_invariant || EnvIs("TANDEM_BATCH_INVARIANT", "1");
  ex->int8_acts_ = options.int8_activations || EnvIs("TANDEM_CUDA_INT8_ACTS", "1");
  ex->use_graphs_ = options.cuda_graphs && !EnvIs("TANDEM_CUDA_GRAPHS", "0");
  TANDEM_RETURN_IF_ERROR(kc::SetDevice(options.device_index));
  TANDEM_ASSIGN_OR_RETURN(ex->stream_, kc::StreamCreate());
  TANDEM_ASSIGN_OR_RETURN(ex->blas_, kc::CreateBlasHandle());
  TANDEM_ASSIGN_OR_RETURN(ex->weights_, make_weights(ex->stream_));
  ex->shape_.num_layers = config.num_layers;
  ex->shape_.layout = {options.num_blocks, options.block_size, config.num_kv_heads,
                       config.head_dim};
  ex->shape_.dtype = options.kv_dtype;
  const int64_t bytes = ex->kv_cache_bytes();
  if (bytes / options.num_blocks / options.block_size !=
      2 * config.num_layers * ex->shape_.row_bytes()) {
    return absl::InvalidArgumentError("cuda executor: KV cache size overflows");
  }
  // One block more than the engine's: the scratch block graph padding writes.
  kernels::PagedKvLayout device_layout = ex->shape_.layout;
  ++device_layout.num_blocks;
  const int64_t device_bytes = bytes / options.num_blocks * device_layout.num_blocks;
  TANDEM_ASSIGN_OR_RETURN(void* kv, kc::Malloc(device_bytes));
  ex->kv_data_.reset(kv);
  TANDEM_RETURN_IF_ERROR(kc::Memset(kv, 0, device_bytes, ex->stream_));
  ex->kv_ = {kv, config.num_layers, device_layout, options.kv_dtype};
  TANDEM_RETURN_IF_ERROR(kc::StreamSync(ex->stream_));
  TANDEM_RETURN_IF_ERROR(ex->Warmup());
  return std::unique_ptr<Executor>(std::move(ex));
}

CudaExecutor::~CudaExecutor() {
  if (stream_ != nullptr) (void)kc::StreamSync(stream_);
  for (auto& [key, exec] : graphs_) kc::DestroyGraph(exec);
  kc::DestroyBlasHandle(blas_);
  kc::StreamDestroy(stream_);
}

std::string CudaExecutor::Describe() const {
  std::string types;
  for (const auto& [name, count] : weights_.device_types) {
    absl::StrAppend(&types, types.empty() ? "" : ", ", name, " x", count);
  }
  return absl::StrFormat(
      "cuda:%d (%s): weights %.2f GiB on device [%s], KV cache f32 in device "
      "memory (%.1f MiB)%s%s",
      device_index_, kc::DeviceDescription(device_index_), weights_.bytes / 1073741824.0, types,
      kv_cache_bytes() / 1048576.0, batch_invariant_ ? ", batch invariant" : "",
      int8_acts_ ? ", int8 activations on the Gemv" : "");
}

absl::Status CudaExecutor::CopyBlocks(absl::Span<const BlockCopy> copies) {
  TANDEM_RETURN_IF_ERROR(ValidateBlockCopies(shape_, copies));
  // One launch per copy, in stream order: a later copy may read an earlier dst.
  for (const BlockCopy& c : copies)
    TANDEM_RETURN_IF_ERROR(kc::CopyBlock(kv_, c.src, c.dst, stream_));
  return absl::OkStatus();
}

absl::Status CudaExecutor::MatMul(const kc::DeviceMatrix& w, const float* x, int64_t n, float* y,
                                  int64_t ldy, bool accumulate) {
  const kc::GemmContext ctx{blas_, gemm_ws_.bytes() > 0 ? gemm_ws_.Get(0).value() : nullptr,
                            gemm_ws_.bytes(), batch_invariant_, int8_acts_};
  return kc::MatMul(ctx, w, x, n, y, ldy, accumulate, stream_);
}

absl::Status CudaExecutor::RunLayer(int64_t layer, int64_t T,
                                    const kc::DeviceAttentionArgs& attn_base) {
  const ModelConfig& c = config_;
  const DeviceLayer& w = weights_.layers[layer];
  const int64_t width = c.q_dim() + 2 * c.kv_dim();
  TANDEM_RETURN_IF_ERROR(kc::RmsNorm(x_, w.attn_norm, T, c.hidden_size, c.rms_eps, h_, stream_));
  for (const MatrixPart& p : w.qkv) {
    TANDEM_RETURN_IF_ERROR(MatMul(p.m, h_, T, qkv_ + p.offset, width, false));
  }
  kc::QkvRopeArgs rope;
  rope.d_qkv = qkv_;
  rope.num_tokens = T;
  rope.stride = width;
  rope.num_heads = c.num_heads;
  rope.num_kv_heads = c.num_kv_heads;
  rope.head_dim = c.head_dim;
  rope.d_bias = w.qkv_bias;
  rope.d_positions = attn_base.d_positions;
  rope.d_slots = d_slots_;
  rope.style = c.rope_style;
  rope.rot_dim = c.rope_dim;
  rope.freq_base = c.rope_freq_base;
  rope.freq_scale = c.rope_freq_scale;
  rope.d_freq_factors = weights_.rope_freqs;
  rope.d_k_cache = kv_.k(layer);
  rope.d_v_cache = kv_.v(layer);
  rope.kv_dtype = kv_.dtype;
  TANDEM_RETURN_IF_ERROR(kc::QkvRopeKvWrite(rope, stream_));
  kc::DeviceAttentionArgs a = attn_base;
  a.d_q = qkv_;
  a.q_stride = width;
  a.d_k_cache = kv_.k(layer);
  a.d_v_cache = kv_.v(layer);
  a.kv_dtype = kv_.dtype;
  a.d_out = attn_;
  TANDEM_RETURN_IF_ERROR(kc::PagedAttention(a, stream_));
  TANDEM_RETURN_IF_ERROR(MatMul(w.wo, attn_, T, x_, c.hidden_size, /*accumulate=*/true));

  TANDEM_RETURN_IF_ERROR(kc::RmsNorm(x_, w.ffn_norm, T, c.hidden_size, c.rms_eps, h_, stream_));
  for (const MatrixPart& p : w.gate_up) {
    TANDEM_RETURN_IF_ERROR(MatMul(p.m, h_, T, gu_ + p.offset, 2 * c.ffn_size, false));
  }
  TANDEM_RETURN_IF_ERROR(kc::SiluMul(gu_, T, c.ffn_size, act_, stream_));
  return MatMul(w.down, act_, T, x_, c.hidden_size, /*accumulate=*/true);
}

CudaExecutor::Geometry CudaExecutor::Layout(int64_t T, int64_t S, int64_t L, int64_t max_blocks,
                                            int64_t max_pos) const {
  const ModelConfig& c = config_;
  Geometry g;
  g.T = T, g.S = S, g.L = L, g.max_blocks = max_blocks, g.max_pos = max_pos;
  g.off_tokens = 0;
  g.off_pos = Align(g.off_tokens + T * 4);
  g.off_seq = Align(g.off_pos + T * 4);
  g.off_logits = Align(g.off_seq + T * 4);
  g.off_tables = Align(g.off_logits + L * 4);
  g.off_slots = Align(g.off_tables + S * max_blocks * 4);
  g.meta_bytes = g.off_slots + T * 8;
  g.attn_ws_floats = kc::PagedAttentionWorkspaceFloats(T, c.num_heads, c.head_dim, max_pos);
  for (int64_t floats : ActivationFloats(c, T, L, g.attn_ws_floats)) {
    g.acts_bytes += Align(floats * 4);
  }
  return g;
}

void CudaExecutor::StageMeta(const ForwardBatch& b, const Geometry& g, char* host) const {
  const int64_t T = b.num_tokens(), S = b.num_seqs();
  auto* tokens = reinterpret_cast<int32_t*>(host + g.off_tokens);
  auto* pos = reinterpret_cast<int32_t*>(host + g.off_pos);
  auto* seq = reinterpret_cast<int32_t*>(host + g.off_seq);
  auto* rows = reinterpret_cast<int32_t*>(host + g.off_logits);
  auto* tables = reinterpret_cast<int32_t*>(host + g.off_tables);
  auto* slots = reinterpret_cast<int64_t*>(host + g.off_slots);
  std::copy(b.token_ids.begin(), b.token_ids.end(), tokens);
  std::copy(b.positions.begin(), b.positions.end(), pos);
  for (int64_t s = 0; s < S; ++s) {
    std::fill(seq + b.query_start[s], seq + b.query_start[s + 1], static_cast<int32_t>(s));
  }
  std::copy(b.logits_indices.begin(), b.logits_indices.end(), rows);
  std::fill(tables, tables + g.S * g.max_blocks, 0);
  for (int64_t s = 0; s < S; ++s) {
    std::copy(b.block_tables[s].begin(), b.block_tables[s].end(), tables + s * g.max_blocks);
  }
  std::copy(b.slot_mapping.begin(), b.slot_mapping.end(), slots);
  // Padding: a sequence of one token at position 0 in the scratch block.
  const int32_t scratch = static_cast<int32_t>(shape_.layout.num_blocks);
  for (int64_t t = T; t < g.T; ++t) {
    tokens[t] = 0;
    pos[t] = 0;
    seq[t] = static_cast<int32_t>(S + (t - T));
    slots[t] = int64_t(scratch) * shape_.layout.block_size;
  }
  for (int64_t s = S; s < g.S; ++s) tables[s * g.max_blocks] = scratch;
  for (int64_t r = static_cast<int64_t>(b.logits_indices.size()); r < g.L; ++r) {
    rows[r] = static_cast<int32_t>(T + (r - static_cast<int64_t>(b.logits_indices.size())));
  }
}

absl::Status CudaExecutor::Enqueue(const Geometry& g, const char* host_meta, char* meta, char* acts,
                                   float* host_logits) {
  const ModelConfig& c = config_;
  const int64_t T = g.T, L = g.L, H = c.hidden_size;
  TANDEM_RETURN_IF_ERROR(kc::CopyToDevice(meta, host_meta, g.meta_bytes, stream_));
  d_slots_ = reinterpret_cast<const int64_t*>(meta + g.off_slots);
  float* views[9];
  const std::array<int64_t, 9> sizes = ActivationFloats(c, T, L, g.attn_ws_floats);
  for (int i = 0; i < 9; ++i) {
    views[i] = reinterpret_cast<float*>(acts);
    acts += Align(sizes[i] * 4);
  }
  x_ = views[0], h_ = views[1], qkv_ = views[2], attn_ = views[3], gu_ = views[4], act_ = views[5];
  float* rows = views[6];
  float* d_logits = views[7];

  kc::DeviceAttentionArgs attn;
  attn.layout = shape_.layout;
  attn.num_heads = c.num_heads;
  attn.scale = 1.f / std::sqrt(float(c.head_dim));
  attn.num_tokens = T;
  attn.d_positions = reinterpret_cast<const int32_t*>(meta + g.off_pos);
  attn.d_token_seq = reinterpret_cast<const int32_t*>(meta + g.off_seq);
  attn.d_block_tables = reinterpret_cast<const int32_t*>(meta + g.off_tables);
  attn.max_blocks_per_seq = g.max_blocks;
  attn.max_position = g.max_pos;
  attn.d_workspace = views[8];
  attn.workspace_floats = g.attn_ws_floats;

  TANDEM_RETURN_IF_ERROR(kc::EmbeddingGather(
      weights_.token_embd, reinterpret_cast<const int32_t*>(meta + g.off_tokens), T, x_, stream_));
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    TANDEM_RETURN_IF_ERROR(RunLayer(layer, T, attn));
  }
  if (L == 0) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(kc::GatherRows(
      x_, H, reinterpret_cast<const int32_t*>(meta + g.off_logits), L, rows, stream_));
  TANDEM_RETURN_IF_ERROR(kc::RmsNorm(rows, weights_.output_norm, L, H, c.rms_eps, rows, stream_));
  TANDEM_RETURN_IF_ERROR(MatMul(weights_.lm_head, rows, L, d_logits, c.vocab_size, false));
  return kc::CopyToHost(host_logits, d_logits, L * c.vocab_size * int64_t(sizeof(float)), stream_);
}

absl::Status CudaExecutor::Forward(const ForwardBatch& b, float* logits) {
  TANDEM_RETURN_IF_ERROR(ValidateForwardBatch(config_, shape_, b));
  if (b.num_tokens() == 0) return absl::OkStatus();
  if (b.num_tokens() > 65535)
    return absl::InvalidArgumentError("cuda executor: more than 65535 tokens in a step");
  return Run(b, logits);
}

absl::Status CudaExecutor::Run(const ForwardBatch& b, float* logits) {
  if (use_graphs_) {
    TANDEM_ASSIGN_OR_RETURN(const bool done, ForwardGraph(b, logits));
    if (done) return absl::OkStatus();
  }
  return ForwardEager(b, logits);
}

absl::Status CudaExecutor::ForwardEager(const ForwardBatch& b, float* logits) {
  int64_t max_blocks = 1, max_pos = 0;
  for (const auto& table : b.block_tables) max_blocks = std::max<int64_t>(max_blocks, table.size());
  for (int32_t p : b.positions) max_pos = std::max<int64_t>(max_pos, p);
  const Geometry g = Layout(b.num_tokens(), b.num_seqs(),
                            static_cast<int64_t>(b.logits_indices.size()), max_blocks, max_pos);
  TANDEM_ASSIGN_OR_RETURN(char* host, staging_.Get(g.meta_bytes));
  StageMeta(b, g, host);
  TANDEM_ASSIGN_OR_RETURN(char* meta, meta_.Get(g.meta_bytes));
  TANDEM_ASSIGN_OR_RETURN(char* acts, acts_.Get(g.acts_bytes));
  TANDEM_RETURN_IF_ERROR(
      gemm_ws_.Get(kc::MatMulWorkspaceBytes(std::max(g.T, g.L), weights_.max_cols)).status());
  TANDEM_RETURN_IF_ERROR(Enqueue(g, host, meta, acts, logits));
  return kc::StreamSync(stream_);
}

absl::StatusOr<bool> CudaExecutor::ForwardGraph(const ForwardBatch& b, float* logits) {
  const int64_t T = b.num_tokens(), S = b.num_seqs();
  if (T != S || static_cast<int64_t>(b.logits_indices.size()) != S || T > kMaxGraphTokens) {
    return false;
  }
  for (int64_t i = 0; i < S; ++i) {
    if (b.logits_indices[i] != i) return false;
  }
  int64_t P = 1;
  while (P < T) P *= 2;
  // Graphs hold no cuBLAS call: every matrix product of the step on the Gemv.
  const kc::GemmContext probe{nullptr, nullptr, 0, batch_invariant_};
  if (!kc::MatMulUsesGemv(probe, P)) return false;
  // Context bucket: a power of two of attention splits, at least the batch's.
  int64_t max_pos = 0;
  for (int32_t p : b.positions) max_pos = std::max<int64_t>(max_pos, p);
  const int64_t bs = shape_.layout.block_size;
  const int64_t capacity = shape_.layout.num_blocks * bs;  // longest context the cache holds
  const int64_t max_splits = (capacity - 1) / kc::kAttentionSplit + 1;
  int64_t splits = 1;
  while (splits * kc::kAttentionSplit <= max_pos) splits *= 2;
  splits = std::min(splits, max_splits);
  const auto blocks_for = [&](int64_t sp) { return (sp * kc::kAttentionSplit + bs - 1) / bs; };
  const Geometry g = Layout(P, P, P, blocks_for(splits), splits * kc::kAttentionSplit - 1);

  // Buffers for the largest graph, once: every graph keeps its addresses.
  const int64_t logits_bytes = kMaxGraphTokens * config_.vocab_size * 4;
  if (graph_host_.bytes() == 0) {
    const Geometry big = Layout(kMaxGraphTokens, kMaxGraphTokens, kMaxGraphTokens,
                                blocks_for(max_splits), max_splits * kc::kAttentionSplit - 1);
    TANDEM_RETURN_IF_ERROR(graph_host_.Get(Align(big.meta_bytes) + logits_bytes).status());
    TANDEM_RETURN_IF_ERROR(graph_meta_.Get(big.meta_bytes).status());
    TANDEM_RETURN_IF_ERROR(graph_acts_.Get(big.acts_bytes).status());
  }
  TANDEM_ASSIGN_OR_RETURN(char* host, graph_host_.Get(0));
  TANDEM_ASSIGN_OR_RETURN(char* meta, graph_meta_.Get(0));
  TANDEM_ASSIGN_OR_RETURN(char* acts, graph_acts_.Get(0));
  float* host_logits = reinterpret_cast<float*>(host + graph_host_.bytes() - logits_bytes);
  StageMeta(b, g, host);
  void*& exec = graphs_[GraphKey{P, splits}];
  if (exec == nullptr) {
    TANDEM_RETURN_IF_ERROR(kc::BeginCapture(stream_));
    const absl::Status enq = Enqueue(g, host, meta, acts, host_logits);
    absl::StatusOr<void*> captured = kc::EndCapture(stream_);
    if (!enq.ok() || !captured.ok()) {
      if (captured.ok()) kc::DestroyGraph(*captured);
      graphs_.erase(GraphKey{P, splits});
      use_graphs_ = false;  // this device or driver cannot: eager from now on
      std::fprintf(stderr, "[cuda] graph capture failed, decode steps run eagerly: %s\n",
                   (!enq.ok() ? enq : captured.status()).ToString().c_str());
      return false;
    }
    exec = *captured;
  }
  TANDEM_RETURN_IF_ERROR(kc::LaunchGraph(exec, stream_));
  TANDEM_RETURN_IF_ERROR(kc::StreamSync(stream_));
  std::copy(host_logits, host_logits + T * config_.vocab_size, logits);
  return true;
}

absl::Status CudaExecutor::Warmup() {
  const int64_t bs = shape_.layout.block_size;
  const int32_t scratch = static_cast<int32_t>(shape_.layout.num_blocks);
  std::vector<float> logits;
  for (int64_t T : {16, 8, 4, 2, 1}) {
    ForwardBatch b;
    b.query_start.push_back(0);
    for (int64_t t = 0; t < T; ++t) {
      b.token_ids.push_back(0);
      b.positions.push_back(0);
      b.slot_mapping.push_back(int64_t(scratch) * bs);
      b.query_start.push_back(static_cast<int32_t>(t + 1));
      b.context_lens.push_back(1);
      b.block_tables.push_back({scratch});
      b.logits_indices.push_back(static_cast<int32_t>(t));
    }
    logits.resize(T * config_.vocab_size);
    TANDEM_RETURN_IF_ERROR(Run(b, logits.data()));
  }
  return absl::OkStatus();
}

absl::StatusOr<CudaExecutor::SlotIo> CudaExecutor::UploadSlots(absl::Span<const int64_t> slots,
                                                               bool with_buffer) {
  TANDEM_RETURN_IF_ERROR(ValidateSlots(shape_, slots));
  const int64_t n = static_cast<int64_t>(slots.size());
  SlotIo io;
  io.n = n;
  io.data_bytes = n * shape_.interchange_bytes_per_token();
  if (n == 0) return io;
  TANDEM_ASSIGN_OR_RETURN(char* host, staging_.Get(n * 8));
  std::copy(slots.begin(), slots.end(), reinterpret_cast<int64_t*>(host));
  TANDEM_ASSIGN_OR_RETURN(char* d, kv_io_.Get(Align(n * 8) + (with_buffer ? io.data_bytes : 0)));
  TANDEM_RETURN_IF_ERROR(kc::CopyToDevice(d, host, n * 8, stream_));
  io.slots = reinterpret_cast<int64_t*>(d);
  if (with_buffer) io.buf = d + Align(n * 8);
  return io;
}

absl::Status CudaExecutor::ReadKv(absl::Span<const int64_t> slots, char* dst) {
  TANDEM_ASSIGN_OR_RETURN(const SlotIo io, UploadSlots(slots));
  if (io.n == 0) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(kc::GatherSlots(kv_, io.slots, io.n, io.buf, stream_));
  TANDEM_RETURN_IF_ERROR(kc::CopyToHost(dst, io.buf, io.data_bytes, stream_));
  return kc::StreamSync(stream_);
}

absl::Status CudaExecutor::WriteKv(absl::Span<const int64_t> slots, const char* src) {
  TANDEM_ASSIGN_OR_RETURN(const SlotIo io, UploadSlots(slots));
  if (io.n == 0) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(kc::CopyToDevice(io.buf, src, io.data_bytes, stream_));
  TANDEM_RETURN_IF_ERROR(kc::ScatterSlots(kv_, io.slots, io.n, io.buf, stream_));
  return kc::StreamSync(stream_);
}

absl::StatusOr<std::shared_ptr<KvDeviceBytes>> CudaExecutor::AllocKvDevice(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError("negative KV buffer size");
  TANDEM_RETURN_IF_ERROR(kc::SetDevice(device_index_));
  TANDEM_ASSIGN_OR_RETURN(void* d, kc::Malloc(std::max<int64_t>(bytes, 1)));
  // cudaFree synchronizes the device: never on the thread that drops the
  // buffer (the engine thread, when a push failed early).
  return std::make_shared<KvDeviceBytes>(d, bytes, kv_memory_domain(),
                                         [](void* p) { FreeInBackground([p] { kc::Free(p); }); });
}

// The interchange bytes stay on the device: the gather / scatter kernels of
// ReadKv / WriteKv on the caller's buffer, no host copy.
absl::Status CudaExecutor::ReadKvDevice(absl::Span<const int64_t> slots, void* dst) {
  TANDEM_ASSIGN_OR_RETURN(const SlotIo io, UploadSlots(slots, /*with_buffer=*/false));
  if (io.n == 0) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(kc::GatherSlots(kv_, io.slots, io.n, dst, stream_));
  return kc::StreamSync(stream_);
}

absl::Status CudaExecutor::WriteKvDevice(absl::Span<const int64_t> slots, const void* src) {
  TANDEM_ASSIGN_OR_RETURN(const SlotIo io, UploadSlots(slots, /*with_buffer=*/false));
  if (io.n == 0) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(kc::ScatterSlots(kv_, io.slots, io.n, src, stream_));
  return kc::StreamSync(stream_);
}

}  // namespace

absl::Status CheckDevice(int device_index) {
  std::string error;
  const int n = kc::DeviceCount(&error);
  if (!error.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device cuda: no CUDA device is visible (cudaGetDeviceCount: ", error, ")"));
  }
  if (n == 0) {
    return absl::FailedPreconditionError(
        "--device cuda: no CUDA device is visible (cudaGetDeviceCount: 0 devices)");
  }
  if (device_index < 0 || device_index >= n) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device cuda: device ", device_index, " is not visible (", n, " devices)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Executor>> MakeCudaExecutor(const LlamaModel* model,
                                                           const ExecutorOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("null model");
  TANDEM_RETURN_IF_ERROR(CheckDevice(options.device_index));
  return CudaExecutor::Create(model->config(), options,
                              [model](kc::Stream stream) { return UploadWeights(*model, stream); });
}

absl::StatusOr<std::unique_ptr<Executor>> MakeSyntheticCudaExecutor(const ModelConfig& config,
                                                                    gguf::TensorType matrix_type,
                                                                    const ExecutorOptions& options,
                                                                    uint64_t seed) {
  TANDEM_RETURN_IF_ERROR(config.Validate());
  TANDEM_RETURN_IF_ERROR(CheckDevice(options.device_index));
  return CudaExecutor::Create(config, options, [&](kc::Stream stream) {
    return SyntheticWeights(config, matrix_type, seed, stream);
  });
}

}  // namespace tandem::engine::cuda
