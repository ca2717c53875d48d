// Quantized matrix kernels: repacked weights x int8 activations.
//
// A PackedWeight holds a Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q5_K /
// Q6_K matrix repacked once at load into row groups of kGroupRows (16) rows:
// for every 32-column block a group stores its quants interleaved so that
// one 64-byte register holds 4 consecutive quants of each of the 16 rows
// (the operand layout of AVX-512 VNNI `vpdpbusd`, of two AVX2 `pmaddubsw`
// halves and of AMX's B tile), then the 16 row scales. Every weight is
// stored unsigned, q in [0, 2^bits): 8-bit types (Q8_0) as bytes, the
// others as 4-bit nibbles plus bit planes:
//
//  - register j (0..7) holds columns 4j..4j+3, its byte i = 4 r + c % 4
//    the quant of row r, column c = 4j + i % 4;
//  - 4-bit (Q4_0, Q4_1, Q4_K): 256 bytes, byte i of 64-byte word j % 4
//    holds register j's byte i in its low (j < 4) or high (j >= 4) nibble;
//  - 5-bit (Q5_0, Q5_1, Q5_K) and 6-bit (Q6_K): those 256 bytes, then one
//    64-byte plane per high bit (bit 4: plane 0, bit 5: plane 1), plane p
//    holding register j's bit 4 + p as a 64-bit mask (bit i = byte i) at
//    256 + 64 p + 8 j: one masked byte add per register and plane restores
//    the quant (AVX-512 `vpaddb` under a k-mask), and a 5-bit type reads
//    5/8 of the bytes an 8-bit expansion would (decode is bandwidth-bound).
//
// The scales follow at byte bits * 64. Rows past `rows` are
// zero padding. The scales come in three formats (ScaleFormat):
//
//  - kF16 (legacy types): d[16] f16 and, for Q4_1 / Q5_1, m[16] f16;
//    w = d * q + m, types without a min use m = -offset * d (offset 8, 16
//    or 128).
//  - kF32 (Q4_K, Q5_K): the chunk holds sc[16] u8 and m[16] u8, the
//    block's 6-bit sub-block scale and min; the super-block (8 blocks,
//    256 columns) holds d[16] f32 and nmin[16] f32 = -dmin once for its 8
//    chunks (super_scales). The kernels form D = d * sc and M = nmin * m
//    in f32: both products are exact (11-bit f16 mantissa x 6-bit integer),
//    so the packed matrix is exactly the one DequantizeRow describes:
//    w = D * q + M with the same D and M (DequantizeRow then rounds
//    D * q - dmin * m once to f32; the kernel never forms w).
//  - kF32Halves (Q6_K): the chunk holds sc_lo[16] s8 for columns 0-15 and
//    sc_hi[16] s8 for columns 16-31, the super-block d[16] f32; D_lo =
//    d * sc_lo and D_hi = d * sc_hi (exact in f32); w = D * (q - 32), q in
//    [0, 63].
//  The K types thus read 32 scale bytes per chunk plus 128 (64 for Q6_K)
//  per 8 chunks: Q4_K 4.75 bits per weight, Q5_K 5.75, Q6_K 6.63 (the
//  GGUF blocks: 4.5, 5.5, 6.56); decode reads every byte once per token.
//
// Activations are quantized on the fly to int8 per 32-column block (the
// Q8_0 rule: dx = max|x| / 127, q = round-to-nearest-even(x / dx)), with the
// block sum s = sum_i qx_i kept, so one block adds (kF16 / kF32) to the
// row's f32 accumulator acc, exactly in integers up to these f32 steps:
//   with a min:    acc = fma(float(sum_i q_i qx_i), d * dx, fma(m, dx * s, acc))
//   without (offset o = 8, 16, 128: the quant is q - o):
//                  acc = fma(float(sum_i q_i qx_i - o * s), d * dx, acc)
// (the offset applied in integers: AMX multiplies by the signed q - o, the
// other paths subtract o * s from the unsigned dot). With two levels (the
// default for the model), the residual r = x - dx * qx is
// quantized again on the grid e = dx / 256 (qx2 = round(r / e), |qx2| <=
// 127), so x ~ e * (256 qx + qx2): about 16-bit activations for twice the
// integer work, no extra weight bytes and the same f32 steps, with
//   isum = (sum_i q_i qx_i) * 256 + sum_i q_i qx2_i   (exact int32)
//   dx -> e, s = 256 sum(qx) + sum(qx2), sd = e * s (stored, for the min).
// kF32Halves sums the two 16-column halves apart, with the offset applied
// in integers (s_lo: the activation sum of columns 0-15, as s):
//   lo = isum_lo - 32 s_lo, hi = isum_hi - 32 (s - s_lo)   (exact int32)
//   acc = acc + fma(float(lo), D_lo * d_x, float(hi) * (D_hi * d_x)).
// The only rounding beyond the activation quantization is that of these f32
// steps (float(isum) is exact below 2^24; two-level Q5_K / Q6_K / Q8_0 sums
// can exceed it and then round once, the same way on every path).
//
// F16 / BF16 / F32 weights are not packed: they stay on the exact f32 path
// (kernels::MatMul), since an int8 repack would be a lossy requantization.
//
// Determinism: y[t, r] = acc after the blocks b in increasing order, from
// acc = 0 (then y = acc, or y + acc with accumulate), the same steps for
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

// How a packed chunk stores its row scales (see the top of this file).
enum class ScaleFormat { kF16, kF32, kF32Halves };

class PackedWeight {
 public:
  PackedWeight() = default;

  // Repacks `w` (REQUIRES: IsPackable(w.type), cols a multiple of the type's
  // block size: 32, or 256 for the K types). Several views
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
  int bits() const { return bits_; }         // 4, 5, 6 or 8 (see above)
  bool has_min() const { return has_min_; }  // Q4_1 / Q5_1 / Q4_K / Q5_K
  // The quant's offset o when !has_min (weight d * (q - o)): 8, 16 or 128;
  // 32 for Q6_K (kF32Halves); 0 with a min.
  int32_t offset() const { return offset_; }
  ScaleFormat scale_format() const { return scales_; }
  int64_t chunk_bytes() const { return chunk_bytes_; }  // one group x one block
  // All of it: the chunks, then (K types) the super-block scales.
  int64_t bytes() const { return super_offset() + num_groups() * num_super() * super_bytes_; }
  gguf::TensorType source_type() const { return type_; }
  // Group g, block b: quants (bits * 64 B, see PackedQuantAt), then the scales: d[16] f16,
  // m[16] f16 (kF16); sc[16], m[16] u8 (kF32); sc_lo[16], sc_hi[16] s8
  // (kF32Halves). PackedScaleAt reads them as f32.
  const uint8_t* chunk(int64_t g, int64_t b) const {
    return data_ + (g * num_blocks() + b) * chunk_bytes_;
  }
  // K types: the f32 super-block scales of group g's block b (d[16], then
  // nmin[16] for kF32; d[16] for kF32Halves), shared by blocks 8s..8s+7
  // and stored by group in block order after the chunks. Null for kF16.
  const float* super_scales(int64_t g, int64_t b) const {
    if (super_bytes_ == 0) return nullptr;
    return reinterpret_cast<const float*>(data_ + super_offset() +
                                          (g * num_super() + b / kSuperBlocks) * super_bytes_);
  }
  static constexpr int64_t kSuperBlocks = 8;  // 32-column blocks per K super-block

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  int64_t num_super() const { return num_blocks() / kSuperBlocks; }
  int64_t super_offset() const { return num_groups() * num_blocks() * chunk_bytes_; }
  gguf::TensorType type_ = gguf::TensorType::kF32;
  int64_t rows_ = 0, cols_ = 0, chunk_bytes_ = 0;
  int64_t super_bytes_ = 0;  // per group and super-block (K types)
  int bits_ = 0;
  bool has_min_ = false;
  int32_t offset_ = 0;
  ScaleFormat scales_ = ScaleFormat::kF16;
  std::unique_ptr<uint8_t[], Free> owned_;
  uint8_t* data_ = nullptr;  // 64-byte aligned: owned_ or caller storage
};

// Unsigned quant of row r (0..15), column k (0..31) in a packed chunk of
// `bits` (the layout above; the scalar reference reads weights this way).
int PackedQuantAt(const uint8_t* chunk, int bits, int r, int k);
// The f32 scale word i (0: d / D / D_lo; 1: m / M / D_hi) of row r (0..15)
// of group g, block b (the formats above; the scalar reference reads
// scales this way).
float PackedScaleAt(const PackedWeight& w, int64_t g, int64_t b, int i, int r);

// int8 activations of n tokens, stored in tiles of kActTile tokens so that a
// register tile reads one block of all its tokens from one place:
// qs [ceil(n / 16), cols / 32, 16, 32], d / sd / s / s_lo [ceil(n / 16),
// cols / 32, 16] (16: the rows of an AMX A tile).
inline constexpr int64_t kActTile = 16;
struct QuantizedActs {
  int64_t n = 0, cols = 0;
  int levels = 1;             // 1 (int8) or 2 (int8 + int8 residual)
  std::vector<int8_t> qs;     // level 1 quants
  std::vector<int8_t> qs2;    // level 2 quants (levels == 2)
  std::vector<float> d;       // dx (one level) or e = dx / 256 (two levels)
  std::vector<float> sd;      // d * s
  std::vector<int32_t> s;     // sum(qx) or 256 sum(qx) + sum(qx2)
  std::vector<int32_t> s_lo;  // as s, over the block's columns 0-15 only

  void Resize(int64_t num_tokens, int64_t num_cols, int num_levels);
  int64_t num_blocks() const { return cols / kQBlock; }
  // Slot of (token t, block b) in d / sd / s / s_lo; quants at qs + 32 * Index.
  int64_t Index(int64_t t, int64_t b) const {
    return ((t / kActTile) * num_blocks() + b) * kActTile + t % kActTile;
  }
  const int8_t* q(int64_t t, int64_t b) const { return qs.data() + Index(t, b) * kQBlock; }
  const int8_t* q2(int64_t t, int64_t b) const { return qs2.data() + Index(t, b) * kQBlock; }
};

// Activation precision used by LlamaModel's fast path.
inline constexpr int kDefaultActLevels = 2;

// The activation scale's granularity. kPerBlock: each 32-column block has
// its own dx = max|x_block| / 127 (the Q8_0 rule above). kPerToken: one
// dx = max|x_t| / 127 over the token's whole row, stored in every block's
// slot (SmoothQuant's per-token int8 activations; an outlier channel coarsens
// the whole row, which is what the smoothing scales are for). The blocks'
// d / s / sd keep their meaning, so QGemm is the same for both.
enum class ActScale { kPerBlock, kPerToken };

// Quantizes x [n, cols] (cols % 32 == 0) into `out` with 1 or 2 levels.
// These three split tokens over `pool` (may be null); each token's result
// is computed by one thread alone, so the split changes nothing.
void QuantizeActs(const float* x, int64_t n, int64_t cols, QuantizedActs* out, int levels = 1,
                  ThreadPool* pool = nullptr, ActScale scale = ActScale::kPerBlock);

// Fused: y = RmsNorm(x) * weight (as kernels::RmsNorm) quantized into `out`.
void RmsNormQuantize(const float* x, const float* weight, int64_t n, int64_t dim, float eps,
                     QuantizedActs* out, int levels = 1, ThreadPool* pool = nullptr,
                     ActScale scale = ActScale::kPerBlock);

// Fused SwiGLU: out = quantized silu(gu[t, :ffn]) * gu[t, ffn:] where gu is
// the [n, 2 * ffn] output of a stacked gate|up matmul.
void SiluMulQuantize(const float* gu, int64_t n, int64_t ffn, QuantizedActs* out, int levels = 1,
                     ThreadPool* pool = nullptr, ActScale scale = ActScale::kPerBlock);

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
void QuantizeActs(const float* x, int64_t n, int64_t cols, QuantizedActs* out, int levels = 1,
                  ActScale scale = ActScale::kPerBlock);
void QGemm(const PackedWeight& w, const QuantizedActs& acts, float* y, int64_t ldy,
           bool accumulate);
}  // namespace ref

}  // namespace tandem::kernels

#endif  // TANDEM_KERNELS_QGEMM_H_
