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
#endif

// Dot product of n floats with the canonical order above.
inline float DotF32(const float* a, const float* b, int64_t n) {
#if TANDEM_KERNELS_AVX512
  __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t i = 0;
  int c = 0;
  for (; i + 16 <= n; i += 16, c ^= 1) {
    acc[c] = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc[c]);
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    acc[c] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i),
                             acc[c]);
  }
  return Reduce16(_mm512_add_ps(acc[0], acc[1]));
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
  __m512 acc[4][2];
  for (auto& a : acc) a[0] = a[1] = _mm512_setzero_ps();
  int64_t i = 0;
  int c = 0;
  for (; i + 16 <= n; i += 16, c ^= 1) {
    const __m512 xv = _mm512_loadu_ps(x + i);
    for (int r = 0; r < 4; ++r) acc[r][c] = _mm512_fmadd_ps(_mm512_loadu_ps(w[r] + i), xv, acc[r][c]);
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    const __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
    for (int r = 0; r < 4; ++r) {
      acc[r][c] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w[r] + i), xv, acc[r][c]);
    }
  }
  for (int r = 0; r < 4; ++r) out[r] = Reduce16(_mm512_add_ps(acc[r][0], acc[r][1]));
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

// Dequantizes one row of `n` elements (SIMD for F16, Q8_0, Q4_0, Q4_1; other
// dequantizable types through kernels/quant.h).
void DequantizeRowFast(gguf::TensorType type, const void* src, float* dst, int64_t n);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_KERNELS_CPU_SIMD_H_
