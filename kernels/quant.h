// Scalar reference (de)quantization of ggml block formats.
//
// Block layouts are ggml's (QK = 32 for the legacy quants, QK_K = 256 with
// 12-byte packed 6-bit scales for the K-quants). These are the references the
// SIMD and CUDA paths are tested against; the results match gguf-py's
// gguf.quants bit for bit (tests/kernels/quant_test.cc).
//
// Thread safety: all functions are pure and reentrant.
#ifndef TANDEM_KERNELS_QUANT_H_
#define TANDEM_KERNELS_QUANT_H_

#include <cstdint>

#include "common/gguf/types.h"

namespace tandem::kernels {

// Weights per block: kQK for the legacy quants (Q4_0 .. Q8_0), kQKK (QK_K)
// per super-block of the K-quants.
inline constexpr int kQK = 32;
inline constexpr int kQKK = 256;

// IEEE binary16 <-> binary32. Fp32ToFp16 rounds to nearest even, overflows to
// inf and keeps NaN a (quiet) NaN; Fp16ToFp32 is exact.
float Fp16ToFp32(uint16_t h);
uint16_t Fp32ToFp16(float f);
// bfloat16 -> f32 (exact) and f32 -> bfloat16 (round to nearest even, NaN
// quieted; same as ggml_compute_fp32_to_bf16).
float Bf16ToFp32(uint16_t h);
uint16_t Fp32ToBf16(float f);

// Turns `n` elements (n a multiple of the type's block size) stored at `src`
// (RowBytes(type, n) bytes, any alignment) into f32 at `dst`.
// Types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K,
// Q6_K (exactly those with TypeTraits::dequantizable). REQUIRES: a
// dequantizable type (TANDEM_CHECK otherwise; validate untrusted types with
// GetTypeTraits first).
void DequantizeRow(gguf::TensorType type, const void* src, float* dst, int64_t n);

// True for the types QuantizeRow accepts.
bool IsQuantizable(gguf::TensorType type);

// Reference quantizers with the same rounding as ggml's quantize_row_*_ref:
// F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, and the K-quants Q4_K, Q5_K,
// Q6_K (ggml's make_qkx2_quants / make_qx_quants search: per 32- or
// 16-element sub-block scale (and min), 6- or 8-bit sub-block scales under an
// f16 super-block scale; n a multiple of 256). Writes RowBytes(type, n)
// bytes to `dst`. REQUIRES: IsQuantizable(type), n a multiple of the block
// size (TANDEM_CHECK).
void QuantizeRow(gguf::TensorType type, const float* src, void* dst, int64_t n);

}  // namespace tandem::kernels

#endif  // TANDEM_KERNELS_QUANT_H_
