// Element types of the paged KV cache (`--kv-cache-dtype`).
//
//   f32   4 bytes, exact.
//   f16   2 bytes, IEEE binary16 (round to nearest even).
//   bf16  2 bytes, bfloat16 (round to nearest even).
//   int8  1 byte + one f32 scale per (token, KV head): q = round(x / s),
//         s = max|x| / 127 over the head's head_dim values, symmetric.
//   fp8   1 byte (OCP e4m3: bias 7, max 448, no inf; NaN never produced)
//         + one f32 scale per (token, KV head): s = max|x| / 448.
//
// Scales are per (token, KV head) rather than per (block, KV head): a row is
// quantized once, when its token is written, and never again; a per-block
// scale would have to grow (and re-quantize the block's earlier tokens) when
// a later token brings a larger value, and a partially filled block shared by
// prefix caching would change under its readers. The price is 4 bytes per
// (token, head, K|V): 720 B/token for SmolLM2 (3.1 % of an int8 row set).
//
// A row of one token, one layer, K (or V) is laid out as
//   [num_kv_heads * head_dim elements][num_kv_heads f32 scales, int8/fp8 only]
// in the interchange layout of engine/kv_export.h; the cache stores elements
// and scales in two arrays with the same per-slot sizes.
//
// Thread safety: all functions are pure and reentrant.
#ifndef TANDEM_KERNELS_KV_DTYPE_H_
#define TANDEM_KERNELS_KV_DTYPE_H_

#include <cstdint>
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

// Bytes of one token's K (or V) row in one layer, scales included.
constexpr int64_t KvRowBytes(KvDtype d, int64_t num_kv_heads, int64_t head_dim) {
  return num_kv_heads * (head_dim * KvElementBytes(d) + (KvHasScales(d) ? 4 : 0));
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
// of `dtype`) and returns the scale to store with them (1 for f32/f16/bf16).
float QuantizeKvHead(KvDtype dtype, const float* x, int64_t head_dim, void* dst);
// dst[i] = value of element i of a head stored as `dtype` with `scale`.
void DequantizeKvHead(KvDtype dtype, const void* src, float scale, int64_t head_dim, float* dst);

}  // namespace tandem::kernels

#endif  // TANDEM_KERNELS_KV_DTYPE_H_
