// Internal SIMD helpers for the CPU kernels (not part of the op API).
//
// DotF32 fixes the reduction order of every dot product in Tandem: elements
// are taken in chunks of 16 lanes, chunk c accumulates (fused multiply-add)
// into accumulator c % 2, then acc0 + acc1 is reduced with a fixed tree. The
// order depends only on `n`, so a dot is bit-identical wherever it is called.
#ifndef TANDEM_KERNELS_CPU_SIMD_H_
#define TANDEM_KERNELS_CPU_SIMD_H_

#include <cstdint>

#include "common/gguf/types.h"

#if defined(__AVX512F__)
// GCC 12 warns inside its own AVX-512 intrinsics (the _mm512_undefined_*
// placeholders they pass as merge sources): a known false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define TANDEM_KERNELS_AVX512 1
#endif

namespace tandem::kernels::cpu {

#if TANDEM_KERNELS_AVX512
inline float Reduce16(__m512 v) {
  const __m256 lo = _mm512_castps512_ps256(v);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  const __m256 a = _mm256_add_ps(lo, hi);
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}

inline __mmask16 TailMask(int64_t rem) { return static_cast<__mmask16>((1u << rem) - 1u); }

// exp(x) per lane to about 2 ulp (Cephes polynomial, 2^n by scalef); x is
// clamped to [-87, 88]. Lane-wise, so a value's result never depends on its
// neighbours.
inline __m512 Exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.f)), _mm512_set1_ps(88.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504089f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}
#endif

// Dot product of n floats with the canonical order above.
inline float DotF32(const float* a, const float* b, int64_t n) {
#if TANDEM_KERNELS_AVX512
  // Unrolled by two chunks so the accumulators stay in registers; chunk c
  // still lands in accumulator c % 2.
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
  }
  bool odd = false;
  if (i + 16 <= n) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    i += 16;
    odd = true;
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    if (odd) {
      acc1 =
          _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc1);
    } else {
      acc0 =
          _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc0);
    }
  }
  return Reduce16(_mm512_add_ps(acc0, acc1));
#else
  float acc = 0.f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
#endif
}

// Four dots sharing x: out[r] = DotF32(w[r], x, n), bit-identical to four
// separate DotF32 calls (each row keeps its own two accumulators).
inline void Dot4F32(const float* const w[4], const float* x, int64_t n, float out[4]) {
#if TANDEM_KERNELS_AVX512
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;  // even chunks
  __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0;                   // odd chunks
  const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + 16);
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w0 + i), x0, a0);
    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w1 + i), x0, a1);
    a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w2 + i), x0, a2);
    a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w3 + i), x0, a3);
    b0 = _mm512_fmadd_ps(_mm512_loadu_ps(w0 + i + 16), x1, b0);
    b1 = _mm512_fmadd_ps(_mm512_loadu_ps(w1 + i + 16), x1, b1);
    b2 = _mm512_fmadd_ps(_mm512_loadu_ps(w2 + i + 16), x1, b2);
    b3 = _mm512_fmadd_ps(_mm512_loadu_ps(w3 + i + 16), x1, b3);
  }
  if (i < n) {
    // At most 1.x chunks left: finish each row with the scalar-order helper
    // semantics (chunk parity decides the accumulator).
    bool odd = false;
    if (i + 16 <= n) {
      const __m512 x0 = _mm512_loadu_ps(x + i);
      a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w0 + i), x0, a0);
      a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w1 + i), x0, a1);
      a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w2 + i), x0, a2);
      a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w3 + i), x0, a3);
      i += 16;
      odd = true;
    }
    if (i < n) {
      const __mmask16 m = TailMask(n - i);
      const __m512 xt = _mm512_maskz_loadu_ps(m, x + i);
      if (odd) {
        b0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w0 + i), xt, b0);
        b1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w1 + i), xt, b1);
        b2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w2 + i), xt, b2);
        b3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w3 + i), xt, b3);
      } else {
        a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w0 + i), xt, a0);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w1 + i), xt, a1);
        a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w2 + i), xt, a2);
        a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w3 + i), xt, a3);
      }
    }
  }
  out[0] = Reduce16(_mm512_add_ps(a0, b0));
  out[1] = Reduce16(_mm512_add_ps(a1, b1));
  out[2] = Reduce16(_mm512_add_ps(a2, b2));
  out[3] = Reduce16(_mm512_add_ps(a3, b3));
#else
  for (int r = 0; r < 4; ++r) out[r] = DotF32(w[r], x, n);
#endif
}

// y[i] += a * x[i] for n floats (lane-wise, no cross-element reduction).
inline void AxpyF32(float a, const float* x, int64_t n, float* y) {
  int64_t i = 0;
#if TANDEM_KERNELS_AVX512
  const __m512 av = _mm512_set1_ps(a);
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  }
#endif
  for (; i < n; ++i) y[i] = __builtin_fmaf(a, x[i], y[i]);
}

// DotF32(dequantized row, x, n) without materializing the row, for F32-free
// decode: bit-identical to dequantizing with DequantizeRowFast first (same
// per-element dequant instructions; block b's low/high 16 lanes are chunks
// 2b / 2b+1). Returns false (nothing written) for types without a fused path.
bool FusedRowDot(gguf::TensorType type, const void* row, const float* x, int64_t n, float* out);

// Dequantizes one row of `n` elements (SIMD for F16, Q8_0, Q4_0, Q4_1; other
// dequantizable types through kernels/quant.h).
void DequantizeRowFast(gguf::TensorType type, const void* src, float* dst, int64_t n);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_KERNELS_CPU_SIMD_H_
