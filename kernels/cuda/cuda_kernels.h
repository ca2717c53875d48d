// CUDA kernels behind a host API with no CUDA types (kernels.h stays
// backend-neutral, and so does every engine header that includes this one).
// Built only when CMake finds nvcc (TANDEM_CUDA=AUTO or ON).
//
// Conventions of the device API below:
//   - every pointer argument named d_* or documented "device" is device
//     memory; `stream` is a cudaStream_t passed as void* (null: the legacy
//     default stream);
//   - functions enqueue work and return at once; the Status reports launch
//     errors (bad configuration, a sticky error from earlier work), not the
//     outcome of the kernel; call StreamSync to wait;
//   - shapes are int64, offsets into the KV cache are computed in int64;
//   - activations are row-major f32 as in kernels/kernels.h; the KV cache of
//     one layer is [num_blocks, block_size, num_kv_heads, head_dim] elements
//     of its KvDtype (f32, f16 or bf16 here; int8 / fp8 are CPU-only), the
//     same layout as engine::KvCacheStorage.
// Each kernel is tested against the CPU reference of kernels/kernels.h in
// tests/cuda/ (skipped without a device).
//
// Thread safety: all functions are reentrant; a BlasHandle must not be used
// by two threads at once.
#ifndef TANDEM_KERNELS_CUDA_CUDA_KERNELS_H_
#define TANDEM_KERNELS_CUDA_CUDA_KERNELS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/gguf/types.h"
#include "kernels/kernels.h"

namespace tandem::kernels::cuda {

using Stream = void*;  // cudaStream_t

// ---- Devices and memory ----------------------------------------------------

// Number of visible CUDA devices (0 when there is no driver or device).
int DeviceCount();
// Same, with cudaGetDeviceCount's error string in *error when it fails
// (e.g. "no CUDA-capable device is detected"); *error is "" on success.
int DeviceCount(std::string* error);
// "NVIDIA H200, 139.8 GiB, sm_90" (empty on error).
std::string DeviceDescription(int index);
absl::Status SetDevice(int index);

absl::StatusOr<void*> Malloc(int64_t bytes);      // device memory, 256-byte aligned
void Free(void* d_ptr);                           // null is a no-op
absl::StatusOr<void*> MallocHost(int64_t bytes);  // pinned host memory
void FreeHost(void* ptr);
absl::StatusOr<Stream> StreamCreate();
void StreamDestroy(Stream stream);
absl::Status StreamSync(Stream stream);
absl::Status CopyToDevice(void* d_dst, const void* src, int64_t bytes, Stream stream);
absl::Status CopyToHost(void* dst, const void* d_src, int64_t bytes, Stream stream);
absl::Status CopyOnDevice(void* d_dst, const void* d_src, int64_t bytes, Stream stream);
absl::Status Memset(void* d_dst, int value, int64_t bytes, Stream stream);

// CUDA graphs: BeginCapture starts recording `stream`'s work (nothing runs;
// no allocation, synchronization or host-visible copy to pageable memory may
// be enqueued until EndCapture), EndCapture returns the instantiated graph
// (a cudaGraphExec_t as void*; an error ends the capture and returns none),
// LaunchGraph replays it on a stream with the parameters and pointers it
// recorded.
absl::Status BeginCapture(Stream stream);
absl::StatusOr<void*> EndCapture(Stream stream);
absl::Status LaunchGraph(void* exec, Stream stream);
void DestroyGraph(void* exec);  // null is a no-op

// ---- Host-array convenience (tests) ----------------------------------------

// RMSNorm of host arrays on the current device, the CUDA twin of
// kernels::RmsNorm. Unavailable without a device.
absl::Status RmsNorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps,
                     float* y);

// ---- Weights ---------------------------------------------------------------

// A weight matrix in device memory: `rows` rows of `cols` elements, each row
// `row_bytes` bytes in GGUF block layout. Matrix types (MatMul, Gemv):
// Q4_0, Q4_1, Q8_0 (kept quantized) and BF16. Table types (EmbeddingGather)
// additionally F32 and F16. Does not own `data`.
struct DeviceMatrix {
  gguf::TensorType type = gguf::TensorType::kBF16;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_bytes = 0;  // in GGUF layout (also of a planar matrix: its size)
  // Set for the planar layout of Q4_0 / Q4_1 / Q8_0 (RepackPlanar): `data`
  // holds every block's quants (16 or 32 bytes each, aligned: one or two
  // 16-byte loads per block), `scales` the f16 scales (and Q4_1's mins).
  // Matrix products only; tables (EmbeddingGather) stay in GGUF layout.
  const void* scales = nullptr;
};
bool IsMatrixType(gguf::TensorType type);
bool IsTableType(gguf::TensorType type);
// Bytes of the planar form of `w` (Q4_0 / Q4_1 / Q8_0 in GGUF layout), 0 for
// other types (BF16 is read with wide loads as it is).
int64_t PlanarBytes(const DeviceMatrix& w);
// Writes the planar form of `src` at d_dst (PlanarBytes(src), 256-byte
// aligned) and returns the matrix that reads it; the values are unchanged.
absl::StatusOr<DeviceMatrix> RepackPlanar(const DeviceMatrix& src, void* d_dst, Stream stream);

// out[t, :] = dequantized row ids[t] of `table` (device ids, REQUIRES: in range).
absl::Status EmbeddingGather(const DeviceMatrix& table, const int32_t* d_ids, int64_t n,
                             float* d_out, Stream stream);  // [n, cols]

// out[i, :] = x[rows[i], :] (f32 rows of `dim`).
absl::Status GatherRows(const float* d_x, int64_t dim, const int32_t* d_rows, int64_t n,
                        float* d_out, Stream stream);

// ---- Norms and elementwise -------------------------------------------------

// y = x / sqrt(mean(x^2) + eps) * weight per row; y may alias x.
absl::Status RmsNorm(const float* d_x, const float* d_weight, int64_t n, int64_t dim, float eps,
                     float* d_y, Stream stream);
// x += delta, then y = RmsNorm(x) (the residual add fused with the next norm).
absl::Status AddRmsNorm(float* d_x, const float* d_delta, const float* d_weight, int64_t n,
                        int64_t dim, float eps, float* d_y, Stream stream);
// out[t, i] = silu(gu[t, i]) * gu[t, ffn + i]: gate | up stacked per row.
absl::Status SiluMul(const float* d_gu, int64_t n, int64_t ffn, float* d_out, Stream stream);
// out[i] = bf16(x[i]) (round to nearest even), as raw uint16 bits.
absl::Status F32ToBf16(const float* d_x, int64_t n, uint16_t* d_out, Stream stream);

// ---- Matrix products --------------------------------------------------------

// y[t, r] (+)= sum_c w[r, c] * x[t, c] for t < n, r < rows, written at
// y[t * ldy + r]; x is [n, cols] contiguous. Dequantizes each weight block on
// the fly, f32 accumulation. Any n (weights are read once per 8 tokens).
absl::Status Gemv(const DeviceMatrix& w, const float* d_x, int64_t n, float* d_y, int64_t ldy,
                  bool accumulate, Stream stream);
// Gemv on two-level int8 activations (the CPU fast path's precision, about
// 16 bits: kernels/cuda/int8_dot.h): x is quantized per token and 32-column
// block as QuantizeActs(levels = 2) does, and each weight block's
// contribution is bit-equal to kernels::QGemm's; the blocks of a row are
// summed in another order. 16 dp4a per 32 weights and token instead of 32
// dequantized f32 FMAs. Batch invariant. REQUIRES GemvInt8Supports(w):
// planar Q4_0 / Q4_1 / Q8_0 (RepackPlanar) of at most 21,845 columns (one
// token's quantized x in 48 KiB of shared memory).
bool GemvInt8Supports(const DeviceMatrix& w);
absl::Status GemvInt8(const DeviceMatrix& w, const float* d_x, int64_t n, float* d_y, int64_t ldy,
                      bool accumulate, Stream stream);
// Rows [row0, row0 + num_rows) of `w` as bf16 [num_rows, cols] (raw bits).
absl::Status DequantizeToBf16(const DeviceMatrix& w, int64_t row0, int64_t num_rows,
                              uint16_t* d_out, Stream stream);

// cuBLAS handle (cublasHandle_t as void*).
absl::StatusOr<void*> CreateBlasHandle();
void DestroyBlasHandle(void* handle);

// Token counts up to this run on Gemv; above it on the bf16 tensor-core GEMM
// (also for the quantized types: at 16 tokens, dequantizing to bf16 and the
// GEMM take a third of the time of two Gemv passes; bench/gpu_bench --kernels).
constexpr int64_t kGemvMaxTokens = 8;

// Bytes of scratch MatMul needs for n tokens and matrices of up to max_cols
// columns (bf16 activations plus a bounded slice of dequantized weights).
int64_t MatMulWorkspaceBytes(int64_t n, int64_t max_cols);

struct GemmContext {
  void* blas = nullptr;  // from CreateBlasHandle
  void* d_workspace = nullptr;
  int64_t workspace_bytes = 0;  // >= MatMulWorkspaceBytes(n, w.cols)
  // Every n on the Gemv: a token's result does not depend on how many
  // tokens share the call (bit-identical alone and batched), at the cost of
  // reading the weights once per kGemvMaxTokens tokens (slow prefill).
  bool batch_invariant = false;
  // Where MatMul runs a Gemv: GemvInt8 for the matrices it supports (f32
  // Gemv for the others). Batch invariance holds either way.
  bool int8_acts = false;
};
// y[t * ldy + r] (+)= (W x_t)[r]. n <= kGemvMaxTokens or batch_invariant:
// Gemv (exact f32 math on the dequantized weights; GemvInt8 with
// int8_acts); above: x rounded to bf16,
// quantized weights dequantized to bf16 in row slices, cuBLAS bf16 GEMM with
// f32 accumulation (and beta = 1 when accumulating).
absl::Status MatMul(const GemmContext& ctx, const DeviceMatrix& w, const float* d_x, int64_t n,
                    float* d_y, int64_t ldy, bool accumulate, Stream stream);
// Whether MatMul runs `n` tokens on the Gemv (any matrix type).
bool MatMulUsesGemv(const GemmContext& ctx, int64_t n);
// MatMul's tensor-core path for any n > kGemvMaxTokens (benchmarks, tests).
absl::Status BlasMatMul(const GemmContext& ctx, const DeviceMatrix& w, const float* d_x, int64_t n,
                        float* d_y, int64_t ldy, bool accumulate, Stream stream);

// ---- RoPE, the KV cache and attention ---------------------------------------

struct QkvRopeArgs {
  float* d_qkv = nullptr;  // [n, stride]: Q heads at column 0, K at q_dim, V at q_dim + kv_dim
  int64_t num_tokens = 0;
  int64_t stride = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  const float* d_bias = nullptr;         // [q_dim + 2 * kv_dim] or null (added before RoPE)
  const int32_t* d_positions = nullptr;  // [n]
  const int64_t* d_slots = nullptr;      // [n] cache slot of each token
  RopeStyle style = RopeStyle::kAdjacentPairs;
  int64_t rot_dim = 0;
  float freq_base = 10000.f;
  float freq_scale = 1.f;
  const float* d_freq_factors = nullptr;  // [rot_dim / 2] or null
  void* d_k_cache = nullptr;              // one layer, [num_slots, num_kv_heads * head_dim]
  void* d_v_cache = nullptr;
  KvDtype kv_dtype = KvDtype::kF32;  // of the cache: f32, f16 or bf16
};
// Bias, RoPE of Q and K in place (angles as kernels::ref::Rope computes
// them, in double), then K and V stored at their slots, rounded to the
// cache's dtype to nearest even (the bits of kernels::QuantizeKvHead).
// REQUIRES: slots valid; InvalidArgument for int8 / fp8.
absl::Status QkvRopeKvWrite(const QkvRopeArgs& args, Stream stream);

struct DeviceAttentionArgs {
  PagedKvLayout layout;
  int64_t num_heads = 0;  // a multiple of layout.num_kv_heads
  float scale = 1.f;
  int64_t num_tokens = 0;
  const float* d_q = nullptr;  // [num_tokens, q_stride], heads at column 0
  int64_t q_stride = 0;
  const int32_t* d_positions = nullptr;     // [num_tokens] attends to cache positions 0..pos
  const int32_t* d_token_seq = nullptr;     // [num_tokens] sequence index of each token
  const int32_t* d_block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int64_t max_blocks_per_seq = 0;
  int64_t max_position = 0;         // >= every positions[t] (sizes the split grid)
  const void* d_k_cache = nullptr;  // one layer, elements of kv_dtype
  const void* d_v_cache = nullptr;
  KvDtype kv_dtype = KvDtype::kF32;  // f32, f16 or bf16
  float* d_out = nullptr;            // [num_tokens, num_heads * head_dim]
  float* d_workspace = nullptr;
  int64_t workspace_floats = 0;  // >= PagedAttentionWorkspaceFloats(...)
};
// Keys per split of the split-KV attention.
constexpr int64_t kAttentionSplit = 256;
int64_t PagedAttentionWorkspaceFloats(int64_t num_tokens, int64_t num_heads, int64_t head_dim,
                                      int64_t max_position);
// The CUDA twin of kernels::PagedAttention. One CTA per (token, KV head,
// split of kAttentionSplit keys) serves the whole GQA group (up to 8 query
// heads; larger groups take several CTAs), online softmax in f32; a merge
// kernel combines the splits. Decode and prefill tokens alike (each query
// token attends causally to its own position). f16 / bf16 caches are read
// 4 elements (8 bytes) at a time and widened to f32 in registers.
// REQUIRES: head_dim % 4 == 0, head_dim <= 256, block_size > 0, positions and
// tables valid; InvalidArgument for int8 / fp8.
absl::Status PagedAttention(const DeviceAttentionArgs& args, Stream stream);

// A paged KV cache in device memory: [num_layers][K|V][num_slots, row]
// elements of dtype (f32, f16 or bf16) where row = num_kv_heads * head_dim.
struct DeviceKvCache {
  void* d_data = nullptr;
  int64_t num_layers = 0;
  PagedKvLayout layout;
  KvDtype dtype = KvDtype::kF32;
  int64_t row_elements() const { return layout.num_kv_heads * layout.head_dim; }
  int64_t row_bytes() const { return row_elements() * KvElementBytes(dtype); }
  int64_t layer_bytes() const { return layout.num_blocks * layout.block_size * row_bytes(); }
  void* k(int64_t layer) const { return static_cast<char*>(d_data) + 2 * layer * layer_bytes(); }
  void* v(int64_t layer) const {
    return static_cast<char*>(d_data) + (2 * layer + 1) * layer_bytes();
  }
};
// Copies block src to block dst in every layer's K and V. REQUIRES: in range.
absl::Status CopyBlock(const DeviceKvCache& cache, int64_t src, int64_t dst, Stream stream);
// out[i][layer][K|V][row] = the cache rows of slots[i] in their native
// bytes (the interchange layout of engine/kv_export.h); Scatter is the
// inverse. REQUIRES: in range; row_bytes() a multiple of 4.
absl::Status GatherSlots(const DeviceKvCache& cache, const int64_t* d_slots, int64_t n, void* d_out,
                         Stream stream);
absl::Status ScatterSlots(const DeviceKvCache& cache, const int64_t* d_slots, int64_t n,
                          const void* d_in, Stream stream);

// out[t] = the smallest index of the largest value of x[t, :].
absl::Status Argmax(const float* d_x, int64_t n, int64_t dim, int32_t* d_out, Stream stream);

// ---- Benchmarks and synthetic models ----------------------------------------

// Fills `w` with random weights of roughly uniform(-scale, scale) values
// (random quants with scale-sized block scales for the quantized types).
absl::Status FillRandom(const DeviceMatrix& w, float scale, uint64_t seed, Stream stream);
absl::Status FillConstant(float* d_x, int64_t n, float value, Stream stream);
// Device-to-device copy bandwidth (read + write bytes per second, GB/s) of a
// float4 copy kernel over `bytes`, best of `iters` runs.
absl::StatusOr<double> MeasureCopyBandwidthGBs(int64_t bytes, int iters);

// ---- Device memory queries ---------------------------------------------------

// Free and total bytes of device `index` (cudaMemGetInfo, with `index` made
// the current device; the first call on a device creates its context).
absl::Status DeviceMemoryInfo(int index, int64_t* free_bytes, int64_t* total_bytes);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_CUDA_CUDA_KERNELS_H_
