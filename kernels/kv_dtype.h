// Element types of the paged KV cache (`--kv-cache-dtype`).
//
//   f32   4 bytes, exact.
//   f16   2 bytes, IEEE binary16 (round to nearest even).
//   bf16  2 bytes, bfloat16 (round to nearest even).
//   int8  1 byte + a one-byte scale per (token, KV head): q = round(x / s),
//         s = max|x| / 127 over the head's head_dim values rounded up to a
//         KvScale, symmetric.
//   fp8   1 byte (OCP e4m3: bias 7, max 448, no inf; NaN never produced)
//         + a one-byte scale per (token, KV head): s = max|x| / 448 rounded
//         up to a KvScale.
//
// KvScale is an unsigned float of one byte, "ue5m3": 5 exponent bits (bias
// 15), 3 mantissa bits, no subnormals, code c = value 2^(c/8 - 15) x
// (1 + (c%8)/8), so 2^-15 (code 0) .. 1.75 x 2^16 (code 254); code 255 is
// NaN (a head with a non-finite value, so the corruption is not hidden). A
// scale is rounded up to the next code, at most 12.5 % (one mantissa step),
// so no value is clamped; for int8 that costs the quantization step at most
// the same 12.5 % (6 % on average), for fp8 only below its normal range.
// One byte instead of an f32 puts int8 / fp8 at 256 / 65 = 3.94x fewer
// bytes per token than f32 at head_dim 64 (3.76x with f32 scales).
//
// Scales are per (token, KV head) rather than per (block, KV head): a row is
// quantized once, when its token is written, and never again; a per-block
// scale would have to grow (and re-quantize the block's earlier tokens) when
// a later token brings a larger value, so a token's stored K/V would depend
// on the tokens written after it in its block: on how a prompt was chunked
// and on rejected speculative drafts, which breaks bit-identical batching
// and lossless speculation. The price is one byte per (token, head, K|V):
// 180 B/token for SmolLM2 (1.6 % of an int8 row set).
//
// A row of one token, one layer, K (or V) is laid out as
//   [num_kv_heads * head_dim elements][num_kv_heads KvScale bytes, int8/fp8 only]
// in the interchange layout of engine/kv_export.h; the cache stores elements
// and scales in two arrays with the same per-slot sizes.
//
// Thread safety: all functions are pure and reentrant.
#ifndef TANDEM_KERNELS_KV_DTYPE_H_
#define TANDEM_KERNELS_KV_DTYPE_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace tandem::kernels {

enum class KvDtype : int { kF32 = 0, kF16, kBf16, kInt8, kFp8 };

// "f32" / "f16" / "bf16" / "int8" / "fp8"; false on anything else.
bool ParseKvDtype(std::string_view s, KvDtype* dtype);
const char* KvDtypeName(KvDtype dtype);
// "f32|f16|bf16|int8|fp8" (flag help and errors).
std::string KvDtypeChoices();

// Bytes of one stored element.
constexpr int64_t KvElementBytes(KvDtype d) {
  switch (d) {
    case KvDtype::kF32:
      return 4;
    case KvDtype::kF16:
    case KvDtype::kBf16:
      return 2;
    case KvDtype::kInt8:
    case KvDtype::kFp8:
      return 1;
  }
  return 4;
}
// True for the dtypes with a per-(token, head) scale.
constexpr bool KvHasScales(KvDtype d) { return d == KvDtype::kInt8 || d == KvDtype::kFp8; }

// The one-byte scale of an int8 / fp8 head (ue5m3, above).
using KvScale = uint8_t;
inline constexpr int64_t kKvScaleBytes = sizeof(KvScale);
inline constexpr KvScale kKvScaleOne = 15 << 3;  // 1.0
inline constexpr KvScale kKvScaleNan = 0xff;
// The code's value: exact (every code is an f32), NaN for kKvScaleNan.
// (memcpy, not std::bit_cast: nvcc compiles this header as C++17.)
inline float KvScaleToFp32(KvScale c) {
  const uint32_t bits = c == kKvScaleNan ? 0x7fc00000u : (uint32_t(c) << 20) + (112u << 23);
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
// The smallest code whose value is >= s (s finite and >= 0): 0 for s <=
// 2^-15, the largest finite code (1.75 x 2^16) above it; NaN -> kKvScaleNan.
inline KvScale KvScaleCeil(float s) {
  if (s != s) return kKvScaleNan;
  if (!(s > 0x1p-15f)) return 0;
  if (!(s <= 0x1.cp16f)) return kKvScaleNan - 1;
  // s's bits less 2^-15's, rounded up to the 3-bit mantissa: f32 bits are
  // monotonic, and a carry out of the mantissa moves to the next exponent.
  uint32_t bits;
  std::memcpy(&bits, &s, sizeof bits);
  return KvScale((bits - (112u << 23) + 0xfffffu) >> 20);
}

// Bytes of one token's K (or V) row in one layer, scales included.
constexpr int64_t KvRowBytes(KvDtype d, int64_t num_kv_heads, int64_t head_dim) {
  return num_kv_heads * (head_dim * KvElementBytes(d) + (KvHasScales(d) ? kKvScaleBytes : 0));
}
// Bytes one token occupies in the whole cache: 2 (K and V) x layers x row.
constexpr int64_t KvBytesPerToken(KvDtype d, int64_t num_layers, int64_t num_kv_heads,
                                  int64_t head_dim) {
  return 2 * num_layers * KvRowBytes(d, num_kv_heads, head_dim);
}

// OCP FP8 e4m3 <-> f32. Fp32ToFp8E4m3 rounds to nearest even and saturates
// to +-448 (NaN -> 0); Fp8E4m3ToFp32 is exact (0x7f / 0xff, the NaN codes,
// decode as +-480 and are never produced).
float Fp8E4m3ToFp32(uint8_t b);
uint8_t Fp32ToFp8E4m3(float f);

// Quantizes the `head_dim` values of one head into `dst` (head_dim elements
// of `dtype`) and returns the scale to store with them (kKvScaleOne for
// f32/f16/bf16).
KvScale QuantizeKvHead(KvDtype dtype, const float* x, int64_t head_dim, void* dst);
// dst[i] = value of element i of a head stored as `dtype` with `scale`.
void DequantizeKvHead(KvDtype dtype, const void* src, KvScale scale, int64_t head_dim, float* dst);

}  // namespace tandem::kernels

#endif  // TANDEM_KERNELS_KV_DTYPE_H_
