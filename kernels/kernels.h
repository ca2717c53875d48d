// Backend-neutral op API for the model forward pass.
//
// Every op here has a scalar reference in namespace tandem::kernels::ref
// (kernels/cpu/ref_*.cc) with the same signature; the dispatched versions in
// tandem::kernels may use SIMD and threads and are tested against the
// references on random inputs (tests/kernels/kernels_test.cc).
//
// Determinism: every output element is computed by exactly one thread with a
// reduction order that depends only on the op's shape parameters (cols,
// head_dim, context length), never on the number of tokens in the batch, on
// which other tokens are in it, or on the thread count. A request's logits are
// therefore bit-identical alone or batched.
//
// Layout: all activations are row-major f32. Weights are GGUF tensors in
// ggml order: a matrix of `rows` rows of `cols` contiguous elements.
//
// Thread safety: ops are reentrant; `pool` may be null (run inline).
#ifndef TANDEM_KERNELS_KERNELS_H_
#define TANDEM_KERNELS_KERNELS_H_

#include <cstdint>
#include <string>

#include "common/gguf/types.h"
#include "kernels/kv_dtype.h"

namespace tandem {
class ThreadPool;
}  // namespace tandem

namespace tandem::kernels {

// A (possibly quantized) weight matrix. Does not own `data`.
struct WeightView {
  gguf::TensorType type = gguf::TensorType::kF32;
  const void* data = nullptr;  // rows * row_bytes bytes
  int64_t rows = 0;            // output features (ggml shape[1])
  int64_t cols = 0;            // input features, contiguous (ggml shape[0])
  int64_t row_bytes = 0;       // bytes of one row: gguf::RowBytes(type, cols)

  const uint8_t* row(int64_t r) const { return static_cast<const uint8_t*>(data) + r * row_bytes; }
};

// y[t, r] = sum_c w[r, c] * x[t, c]. Each weight row (or block of rows) is
// dequantized once and applied to all n tokens.
void MatMul(const WeightView& w,  // [rows, cols]
            const float* x,       // [n, cols]
            int64_t n,
            float* y,  // [n, rows]
            ThreadPool* pool);

// MatMul of `count` matrices that share x (same cols; types may differ),
// e.g. q / k / v or gate / up, split over the pool as one job: ys[i] is
// bit-identical to MatMul(ws[i], x, n, ys[i], pool), for one pool dispatch
// instead of `count` (decode of an unpacked model is dispatch-bound).
void MatMulShared(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n,
                  ThreadPool* pool);

// out[t, :] = dequantized row ids[t] of `table`. REQUIRES: 0 <= ids[t] < rows.
void EmbeddingLookup(const WeightView& table,  // [vocab, dim]
                     const int32_t* ids,       // [n]
                     int64_t n,
                     float* out);  // [n, dim]

// y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * weight. y may alias x.
void RmsNorm(const float* x,       // [n, dim]
             const float* weight,  // [dim]
             int64_t n, int64_t dim, float eps,
             float* y);  // [n, dim]

enum class RopeStyle {
  kAdjacentPairs,  // ggml "normal": rotates (x[2i], x[2i+1]) (GGUF llama, Q/K pre-permuted)
  kNeox,           // rotates (x[i], x[i + rot_dim/2]) (qwen2, HF layout)
};

struct RopeParams {
  RopeStyle style = RopeStyle::kAdjacentPairs;
  int64_t rot_dim = 0;        // leading dims of each head that rotate; even, <= head_dim
  float freq_base = 10000.f;  // theta_i = pos * freq_scale * base^(-2i/rot_dim) / factor_i
  float freq_scale = 1.f;     // 1 / linear scaling factor
  const float* freq_factors = nullptr;  // [rot_dim / 2] or null (GGUF rope_freqs.weight)
};

// Rotates every head of every token in place by its position.
void Rope(float* x,                  // [n, num_heads, head_dim]
          const int32_t* positions,  // [n]
          int64_t n, int64_t num_heads, int64_t head_dim, const RopeParams& params);

// Rope of q and k with the same positions, the angles computed once per
// token: bit-identical to Rope(q, ...) then Rope(k, ...).
void RopeQK(float* q,  // [n, num_heads, head_dim]
            float* k,  // [n, num_kv_heads, head_dim]
            const int32_t* positions, int64_t n, int64_t num_heads, int64_t num_kv_heads,
            int64_t head_dim, const RopeParams& params);

// The (cos, sin) of every rotated pair of each token's position, the values
// Rope computes: cs[t * rot_dim + 2 i] = cos(theta_i(positions[t])), + 1 its
// sin. A forward pass computes them once for all its layers.
void RopeAngles(const int32_t* positions,  // [n]
                int64_t n, const RopeParams& params,
                float* cs);  // [n, rot_dim]

// RopeQK with the angles from RopeAngles: bit-identical to RopeQK.
void RopeQKAngles(float* q,         // [n, num_heads, head_dim]
                  float* k,         // [n, num_kv_heads, head_dim]
                  const float* cs,  // [n, rot_dim] from RopeAngles
                  int64_t n, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                  const RopeParams& params);

// out[i] = silu(gate[i]) * up[i] (SwiGLU). out may alias gate or up.
void SiluMul(const float* gate,  // [n]
             const float* up,    // [n]
             int64_t n,
             float* out);  // [n]

// out[i] = a[i] + b[i]. out may alias a or b.
void Add(const float* a, const float* b, int64_t n, float* out);  // all [n]

// x[t, :] = softmax(x[t, :]) in place.
void Softmax(float* x,  // [n, dim]
             int64_t n, int64_t dim);

// Paged KV cache geometry shared by the write path and attention.
struct PagedKvLayout {
  int64_t num_blocks = 0;
  int64_t block_size = 0;  // tokens per block
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
};

// One layer's K and V cache in any KvDtype (kernels/kv_dtype.h). Elements:
// [num_blocks, block_size, num_kv_heads, head_dim] of dtype; scales (int8 /
// fp8 only, else null): [num_blocks, block_size, num_kv_heads] KvScale
// bytes, the value of element i of a head being element[i] x
// KvScaleToFp32(scale).
struct KvCacheView {
  KvDtype dtype = KvDtype::kF32;
  void* k = nullptr;
  void* v = nullptr;
  KvScale* k_scale = nullptr;
  KvScale* v_scale = nullptr;
};

// Stores the K and V of each token at cache slot slot_mapping[t]
// (slot = block_id * block_size + offset), quantized to cache.dtype per
// (token, KV head) (QuantizeKvHead). REQUIRES: slots in range.
void WriteKv(const PagedKvLayout& layout,
             const float* k,               // [n, num_kv_heads, head_dim]
             const float* v,               // [n, num_kv_heads, head_dim]
             const int64_t* slot_mapping,  // [n]
             int64_t n, const KvCacheView& cache);
// The f32 cache form of the same.
void WriteKv(const PagedKvLayout& layout,
             const float* k,               // [n, num_kv_heads, head_dim]
             const float* v,               // [n, num_kv_heads, head_dim]
             const int64_t* slot_mapping,  // [n]
             int64_t n,
             float* k_cache,   // [num_blocks, block_size, num_kv_heads, head_dim]
             float* v_cache);  // same

struct PagedAttentionArgs {
  PagedKvLayout layout;
  int64_t num_heads = 0;  // query heads; a multiple of layout.num_kv_heads
  float scale = 1.f;      // usually 1 / sqrt(head_dim)
  int64_t num_seqs = 0;
  const int32_t* query_start = nullptr;   // [num_seqs + 1] token ranges of each sequence
  const int32_t* positions = nullptr;     // [num_tokens] each query attends to 0..position
  const int32_t* context_lens = nullptr;  // [num_seqs] tokens cached for the sequence
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int64_t max_blocks_per_seq = 0;
};

// out[t, h, :] = sum_j softmax_j(scale * q[t,h] . K[j]) V[j] over cache
// positions j = 0..positions[t] of t's sequence (read through its block
// table), kv head h / (num_heads / num_kv_heads). REQUIRES (caller validated):
// positions[t] < context_lens[seq], every needed block table entry in range.
void PagedAttention(const PagedAttentionArgs& args,
                    const float* q,        // [num_tokens, num_heads, head_dim]
                    const float* k_cache,  // [num_blocks, block_size, num_kv_heads, head_dim]
                    const float* v_cache,  // same
                    float* out,            // [num_tokens, num_heads, head_dim]
                    ThreadPool* pool);
// The same over a cache of any dtype, read directly (each K/V row converted
// inside the dot products and weighted sums; int8/fp8 scales applied to the
// score and to the softmax weight). Bit-identical to the f32 form for kF32.
void PagedAttention(const PagedAttentionArgs& args, const float* q, const KvCacheView& cache,
                    float* out, ThreadPool* pool);

// Scalar references with the same contracts (single-threaded, no SIMD).
// Which build of the kernels above runs: "avx512", "avx2" or "base" (on
// x86-64 every binary carries all three, kernels/cpu/variant.h; elsewhere
// "base").
std::string SimdKernelsVariant();
// Tests: use `variant` from now on; false (nothing changed) when the CPU
// cannot run it or the build does not have it.
bool SetSimdKernelsVariantForTesting(const std::string& variant);

namespace ref {
void MatMul(const WeightView& w, const float* x, int64_t n, float* y);
void EmbeddingLookup(const WeightView& table, const int32_t* ids, int64_t n, float* out);
void RmsNorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* y);
void Rope(float* x, const int32_t* positions, int64_t n, int64_t num_heads, int64_t head_dim,
          const RopeParams& params);
void RopeQK(float* q, float* k, const int32_t* positions, int64_t n, int64_t num_heads,
            int64_t num_kv_heads, int64_t head_dim, const RopeParams& params);
void SiluMul(const float* gate, const float* up, int64_t n, float* out);
void Add(const float* a, const float* b, int64_t n, float* out);
void Softmax(float* x, int64_t n, int64_t dim);
void WriteKv(const PagedKvLayout& layout, const float* k, const float* v,
             const int64_t* slot_mapping, int64_t n, float* k_cache, float* v_cache);
void PagedAttention(const PagedAttentionArgs& args, const float* q, const float* k_cache,
                    const float* v_cache, float* out);
// Dequantizes each head (DequantizeKvHead) and attends in double.
void WriteKv(const PagedKvLayout& layout, const float* k, const float* v,
             const int64_t* slot_mapping, int64_t n, const KvCacheView& cache);
void PagedAttention(const PagedAttentionArgs& args, const float* q, const KvCacheView& cache,
                    float* out);
}  // namespace ref

}  // namespace tandem::kernels

#endif  // TANDEM_KERNELS_KERNELS_H_
