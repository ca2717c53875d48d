// Quantized matrix kernels: repacked weights x int8 activations.
//
// A PackedWeight holds a Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 matrix repacked
// once at load into row groups of kGroupRows (16) rows: for every 32-column
// block a group stores its quants interleaved so that one 64-byte register
// holds 4 consecutive quants of each of the 16 rows (the operand layout of
// AVX-512 VNNI `vpdpbusd`, and of two AVX2 `pmaddubsw` halves), then the 16
// row scales d (f16) and, for Q4_1 / Q5_1, the 16 mins m (f16). Every weight
// is stored unsigned, w = d * q + m with q in [0, 15] (4-bit types) or
// [0, 255] (Q5_x and Q8_0, expanded to 8 bits); types without a min use
// m = -offset * d (offset 8, 16 or 128). Rows past `rows` are zero padding.
//
// Activations are quantized on the fly to int8 per 32-column block (the
// Q8_0 rule: dx = max|x| / 127, q = round-to-nearest-even(x / dx)), with the
// block sum kept, so one block's dot product is
//   dot_b = float(sum_i q_i qx_i) * (d * dx) + m * (dx * sum_i qx_i)
// computed exactly in integers up to that one f32 expression. With two
// levels (the default for the model), the residual r = x - dx * qx is
// quantized again on the grid e = dx / 256 (qx2 = round(r / e), |qx2| <=
// 127), so x ~ e * (256 qx + qx2): about 16-bit activations for twice the
// integer work, no extra weight bytes and the same f32 steps, with
//   isum = (sum_i q_i qx_i) * 256 + sum_i q_i qx2_i   (exact int32)
//   d_x = e, sd = e * (256 sum(qx) + sum(qx2)).
//
// Determinism: y[t, r] = sum over blocks b in increasing order of dot_b,
// accumulated in f32 (acc = acc + dot_b), the same instruction sequence for
// every ISA path's lane, whatever the number of tokens, which tokens share a
// register tile and how row groups are split over threads. The scalar
// reference (ref::QGemm) computes the same expression, so every path is
// bit-identical to it (tests/kernels/qgemm_test.cc).
//
// Thread safety: PackedWeight is immutable after Pack; all functions are
// reentrant. `pool` may be null.
#ifndef TANDEM_KERNELS_QGEMM_H_
#define TANDEM_KERNELS_QGEMM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/kernels.h"

namespace tandem::kernels {

inline constexpr int64_t kGroupRows = 16;
inline constexpr int64_t kQBlock = 32;

// True for the weight types PackWeight accepts.
bool IsPackable(gguf::TensorType type);

class PackedWeight {
 public:
  PackedWeight() = default;

  // Repacks `w` (REQUIRES: IsPackable(w.type), cols % 32 == 0). Several views
  // of the same type and cols may be stacked into one matrix (rows
  // concatenated in order), e.g. Q|K|V or gate|up. With `storage` (64-byte
  // aligned, PackedBytes(...) bytes, outliving the result) the packed data
  // goes there; otherwise it is owned.
  static PackedWeight Pack(const WeightView* views, int num_views, ThreadPool* pool,
                           uint8_t* storage = nullptr);
  static PackedWeight Pack(const WeightView& w, ThreadPool* pool) { return Pack(&w, 1, pool); }
  // Bytes Pack(views, num_views) needs.
  static int64_t PackedBytes(const WeightView* views, int num_views);

  bool empty() const { return rows_ == 0; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t num_groups() const { return (rows_ + kGroupRows - 1) / kGroupRows; }
  int64_t num_blocks() const { return cols_ / kQBlock; }
  int bits() const { return bits_; }                    // 4 or 8
  bool has_min() const { return has_min_; }             // Q4_1 / Q5_1
  float offset() const { return offset_; }              // m = -offset * d when !has_min
  int64_t chunk_bytes() const { return chunk_bytes_; }  // one group x one block
  int64_t bytes() const { return num_groups() * num_blocks() * chunk_bytes_; }
  gguf::TensorType source_type() const { return type_; }
  // Group g, block b: quants (bits * 64 B), then d[16] f16, then m[16] f16.
  const uint8_t* chunk(int64_t g, int64_t b) const {
    return data_ + (g * num_blocks() + b) * chunk_bytes_;
  }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  gguf::TensorType type_ = gguf::TensorType::kF32;
  int64_t rows_ = 0, cols_ = 0, chunk_bytes_ = 0;
  int bits_ = 0;
  bool has_min_ = false;
  float offset_ = 0.f;
  std::unique_ptr<uint8_t[], Free> owned_;
  uint8_t* data_ = nullptr;  // 64-byte aligned: owned_ or caller storage
};

// int8 activations of n tokens, stored in tiles of kActTile tokens so that a
// register tile reads one block of all its tokens from one place:
// qs [ceil(n / 8), cols / 32, 8, 32], d / sd / s [ceil(n / 8), cols / 32, 8].
inline constexpr int64_t kActTile = 8;
struct QuantizedActs {
  int64_t n = 0, cols = 0;
  int levels = 1;           // 1 (int8) or 2 (int8 + int8 residual)
  std::vector<int8_t> qs;   // level 1 quants
  std::vector<int8_t> qs2;  // level 2 quants (levels == 2)
  std::vector<float> d;     // dx (one level) or e = dx / 256 (two levels)
  std::vector<float> sd;    // d * s
  std::vector<int32_t> s;   // sum(qx) or 256 sum(qx) + sum(qx2)

  void Resize(int64_t num_tokens, int64_t num_cols, int num_levels);
  int64_t num_blocks() const { return cols / kQBlock; }
  // Slot of (token t, block b) in d / sd / s; quants at qs + 32 * Index.
  int64_t Index(int64_t t, int64_t b) const {
    return ((t / kActTile) * num_blocks() + b) * kActTile + t % kActTile;
  }
  const int8_t* q(int64_t t, int64_t b) const { return qs.data() + Index(t, b) * kQBlock; }
  const int8_t* q2(int64_t t, int64_t b) const { return qs2.data() + Index(t, b) * kQBlock; }
};

// Activation precision used by LlamaModel's fast path.
inline constexpr int kDefaultActLevels = 2;

// Quantizes x [n, cols] (cols % 32 == 0) into `out` with 1 or 2 levels.
// These three split tokens over `pool` (may be null); each token's result
// is computed by one thread alone, so the split changes nothing.
void QuantizeActs(const float* x, int64_t n, int64_t cols, QuantizedActs* out, int levels = 1,
                  ThreadPool* pool = nullptr);

// Fused: y = RmsNorm(x) * weight (as kernels::RmsNorm) quantized into `out`.
void RmsNormQuantize(const float* x, const float* weight, int64_t n, int64_t dim, float eps,
                     QuantizedActs* out, int levels = 1, ThreadPool* pool = nullptr);

// Fused SwiGLU: out = quantized silu(gu[t, :ffn]) * gu[t, ffn:] where gu is
// the [n, 2 * ffn] output of a stacked gate|up matmul.
void SiluMulQuantize(const float* gu, int64_t n, int64_t ffn, QuantizedActs* out, int levels = 1,
                     ThreadPool* pool = nullptr);

// y[t, r] (= or +=, see `accumulate`) dot of packed row r and token t, for
// t < acts.n. ldy: row stride of y (>= w.rows()). With accumulate, y[t, r] =
// y[t, r] + dot (fused residual add).
void QGemm(const PackedWeight& w, const QuantizedActs& acts, float* y, int64_t ldy, bool accumulate,
           ThreadPool* pool);

// Which SIMD path QGemm / QuantizeActs use: "amx" (AMX-INT8 tiles for >= 8
// tokens, AVX-512 VNNI otherwise), "avx512vnni", "avx2" or "scalar" (from
// CPUID; TANDEM_KERNEL_ISA=avx512vnni|avx2|scalar forces a lesser one).
std::string QGemmIsa();
// For tests: force a path ("amx", "avx512vnni", "avx2", "scalar"); false if
// the CPU (or OS) lacks it. Not thread-safe against concurrent QGemm calls.
bool SetQGemmIsaForTesting(const std::string& isa);

namespace ref {
void QuantizeActs(const float* x, int64_t n, int64_t cols, QuantizedActs* out, int levels = 1);
void QGemm(const PackedWeight& w, const QuantizedActs& acts, float* y, int64_t ldy,
           bool accumulate);
}  // namespace ref

}  // namespace tandem::kernels

#endif  // TANDEM_KERNELS_QGEMM_H_
