// Internal SIMD helpers for the CPU kernels (not part of the op API).
//
// DotF32 fixes the reduction order of every dot product in Tandem: elements
// are taken in chunks of 16 lanes, chunk c accumulates (fused multiply-add)
// into accumulator c % 2, then acc0 + acc1 is reduced with a fixed tree. The
// order depends only on `n`, so a dot is bit-identical wherever it is called.
#ifndef TANDEM_KERNELS_CPU_SIMD_H_
#define TANDEM_KERNELS_CPU_SIMD_H_

#include <cstdint>
#include <cstring>

#include "common/gguf/types.h"
#include "kernels/cpu/variant.h"

#if defined(__AVX512F__)
// GCC 12 warns inside its own AVX-512 intrinsics (the _mm512_undefined_*
// placeholders they pass as merge sources, `__m512 __Y = __Y`): a known
// false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#define TANDEM_KERNELS_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
// 8-lane forms of DotF32 and of the f16 / bf16 row loads, same bits.
#define TANDEM_KERNELS_AVX2 1
#endif

namespace tandem::kernels::cpu {

TANDEM_KERNELS_ABI_BEGIN  // per-ISA symbols (kernels/cpu/variant.h)
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

// Reduce16 of 16 vectors at once, bit-identical: the same adds in the same
// tree (lanes i + i+8, then i + i+4, i + i+2, i + i+1), done on transposed
// pairs, 45 operations where 16 Reduce16 take about 130. Lane 4q + e of the
// result is Reduce16(v[4e + q]).
inline __m512 Reduce16x16(const __m512* v) {
  __m512 u[8], w[4];
  for (int k = 0; k < 8; ++k) {  // lanes 0-7: v[2k] lo + hi; 8-15: v[2k + 1]'s
    u[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  for (int m = 0; m < 4; ++m) {  // quarter q: v[4m + q]'s 4 partial sums
    w[m] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * m], u[2 * m + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(u[2 * m], u[2 * m + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  // Quarter q of r[p]: 2 sums of v[8p + q], then 2 of v[8p + 4 + q].
  const __m512 r0 = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 r1 = _mm512_add_ps(_mm512_shuffle_ps(w[2], w[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_ps(w[2], w[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_ps(r0, r1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(r0, r1, _MM_SHUFFLE(3, 1, 3, 1)));
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

// Lane i < n of the result = v[i] reduced over its 16 lanes by `op` (exact
// in any order: f32 max of |x|, or int32 add on the bits; zero must be
// neutral): a transpose-reduce, about 3 operations per vector where a
// separate horizontal reduction takes 8 in a dependent chain. Merges that
// only involve v[n..15] are skipped (their lanes are not used).
template <typename Op>
inline __m512 TransposeReduce16(const __m512* v, int n, Op op) {
  const __m512 z = _mm512_setzero_ps();
  __m512 s[8], t[4], u[2];
  for (int i = 0; i < 8; ++i) {
    s[i] = 2 * i < n ? op(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                          _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]))
                     : z;
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(s[2 * i]), y = _mm512_castps_pd(s[2 * i + 1]);
    t[i] = 4 * i < n ? op(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                          _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)))
                     : z;
  }
  for (int i = 0; i < 2; ++i) {
    u[i] = 8 * i < n ? op(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)))
                     : z;
  }
  return op(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
            _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
#endif

// Reduce16's tree on 16 floats (lanes i + i+8, then i + i+4, i + i+2,
// i + i+1): the same sum as Reduce16 of a vector holding them.
inline float Reduce16Lanes(const float* v) {
  float w[8];
  for (int l = 0; l < 8; ++l) w[l] = v[l] + v[l + 8];
  for (int l = 0; l < 4; ++l) w[l] += w[l + 4];
  for (int l = 0; l < 2; ++l) w[l] += w[l + 2];
  return w[0] + w[1];
}

// Weight rows as stored: f32, or f16 / bf16 widened to f32 on load (exact).
enum class RowKind { kF32, kF16, kBf16 };

#if TANDEM_KERNELS_AVX2
// The 8-lane form of TailMask: lanes [0, rem) set (none when rem <= 0, all
// from 8), for _mm256_maskload_ps.
inline __m256i TailMask8(int64_t rem) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(rem)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// 8 weights of a row from element i as f32.
template <RowKind kKind>
inline __m256 LoadRow8(const void* row, int64_t i) {
  if constexpr (kKind == RowKind::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(row) + i);
  } else {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + i));
    if constexpr (kKind == RowKind::kF16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// Weights i .. i+15 (the first `rem` of them, the other lanes +0) as two
// 8-lane halves, as a zero-masked 16-lane load gives them.
template <RowKind kKind>
inline void LoadRowTail8(const void* row, int64_t i, int64_t rem, __m256* lo, __m256* hi) {
  if constexpr (kKind == RowKind::kF32) {
    const float* p = static_cast<const float*>(row) + i;
    *lo = _mm256_maskload_ps(p, TailMask8(rem));
    *hi = _mm256_maskload_ps(p + 8, TailMask8(rem - 8));
  } else {
    uint16_t tmp[16] = {};
    std::memcpy(tmp, static_cast<const uint16_t*>(row) + i, rem * sizeof(uint16_t));
    *lo = LoadRow8<kKind>(tmp, 0);
    *hi = LoadRow8<kKind>(tmp, 8);
  }
}

// Reduce16 of the 16 lanes a + b (lanes 0-7 in a_lo + b_lo, 8-15 in a_hi +
// b_hi), in its tree: i + i+8, then i + i+4, i + i+2, i + i+1.
inline float Reduce16Halves(__m256 a_lo, __m256 a_hi, __m256 b_lo, __m256 b_hi) {
  const __m256 v = _mm256_add_ps(_mm256_add_ps(a_lo, b_lo), _mm256_add_ps(a_hi, b_hi));
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

// DotF32(w as f32, x, n) with 8-lane registers: the AVX-512 lanes as two
// halves (lanes 0-7, 8-15) of each accumulator, the same FMAs and
// Reduce16's tree, so the same bits; f16 / bf16 rows widened in registers.
template <RowKind kKind>
inline float DotRow8(const void* w, const float* x, int64_t n) {
  __m256 a0l = _mm256_setzero_ps(), a0h = a0l, a1l = a0l, a1h = a0l;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0l = _mm256_fmadd_ps(LoadRow8<kKind>(w, i), _mm256_loadu_ps(x + i), a0l);
    a0h = _mm256_fmadd_ps(LoadRow8<kKind>(w, i + 8), _mm256_loadu_ps(x + i + 8), a0h);
    a1l = _mm256_fmadd_ps(LoadRow8<kKind>(w, i + 16), _mm256_loadu_ps(x + i + 16), a1l);
    a1h = _mm256_fmadd_ps(LoadRow8<kKind>(w, i + 24), _mm256_loadu_ps(x + i + 24), a1h);
  }
  bool odd = false;
  if (i + 16 <= n) {
    a0l = _mm256_fmadd_ps(LoadRow8<kKind>(w, i), _mm256_loadu_ps(x + i), a0l);
    a0h = _mm256_fmadd_ps(LoadRow8<kKind>(w, i + 8), _mm256_loadu_ps(x + i + 8), a0h);
    i += 16;
    odd = true;
  }
  if (i < n) {
    __m256 wl, wh, xl, xh;
    LoadRowTail8<kKind>(w, i, n - i, &wl, &wh);
    LoadRowTail8<RowKind::kF32>(x, i, n - i, &xl, &xh);
    __m256& tl = odd ? a1l : a0l;
    __m256& th = odd ? a1h : a0h;
    tl = _mm256_fmadd_ps(wl, xl, tl);
    th = _mm256_fmadd_ps(wh, xh, th);
  }
  return Reduce16Halves(a0l, a0h, a1l, a1h);
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
#elif TANDEM_KERNELS_AVX2
  return DotRow8<RowKind::kF32>(a, b, n);
#else
  // The same lanes, fused multiply-adds and tree, one float at a time (a
  // base build on a CPU without AVX-512 gives the AVX-512 build's bits).
  // Past n a lane adds 0 * 0, as the masked loads do.
  float acc[2][16] = {};
  for (int64_t c = 0; 16 * c < n; ++c) {
    for (int64_t l = 0; l < 16; ++l) {
      const int64_t i = 16 * c + l;
      acc[c % 2][l] = i < n ? __builtin_fmaf(a[i], b[i], acc[c % 2][l])
                            : __builtin_fmaf(0.f, 0.f, acc[c % 2][l]);
    }
  }
  float v[16];
  for (int l = 0; l < 16; ++l) v[l] = acc[0][l] + acc[1][l];
  return Reduce16Lanes(v);
#endif
}

#if TANDEM_KERNELS_AVX512
// 16 weights of a row from element i as f32.
template <RowKind kKind>
inline __m512 LoadRow16(const void* row, int64_t i) {
  if constexpr (kKind == RowKind::kF32) {
    return _mm512_loadu_ps(static_cast<const float*>(row) + i);
  } else {
    const __m256i h =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(row) + i));
    if constexpr (kKind == RowKind::kF16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// The first `rem` (< 16) weights from element i, the other lanes +0 (as a
// zero-masked load).
template <RowKind kKind>
inline __m512 LoadRowTail(const void* row, int64_t i, int64_t rem) {
  if constexpr (kKind == RowKind::kF32) {
    return _mm512_maskz_loadu_ps(TailMask(rem), static_cast<const float*>(row) + i);
  } else {
    uint16_t tmp[16] = {};
    std::memcpy(tmp, static_cast<const uint16_t*>(row) + i, rem * sizeof(uint16_t));
    return LoadRow16<kKind>(tmp, 0);
  }
}
#endif

// Four dots sharing x: out[r] = DotF32(w[r] as f32, x, n), bit-identical to
// four separate DotF32 calls on the widened rows (each row keeps its own two
// accumulators; f16 / bf16 rows are widened in registers).
template <RowKind kKind>
inline void Dot4Rows(const void* const w[4], const float* x, int64_t n, float out[4]) {
#if TANDEM_KERNELS_AVX512
  __m512 a[4], b[4];  // even / odd chunks
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) a[r] = b[r] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + 16);
    // In registers, not folded into each FMA (see Dot4x2Rows): with a
    // run-time n GCC folds them, and f16 rows then decode at a third of
    // the speed.
    asm("" : "+v"(x0), "+v"(x1));
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      a[r] = _mm512_fmadd_ps(LoadRow16<kKind>(w[r], i), x0, a[r]);
      b[r] = _mm512_fmadd_ps(LoadRow16<kKind>(w[r], i + 16), x1, b[r]);
    }
  }
  // At most 1.x chunks left: chunk parity decides the accumulator.
  bool odd = false;
  if (i + 16 <= n) {
    const __m512 x0 = _mm512_loadu_ps(x + i);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) a[r] = _mm512_fmadd_ps(LoadRow16<kKind>(w[r], i), x0, a[r]);
    i += 16;
    odd = true;
  }
  if (i < n) {
    const __m512 xt = _mm512_maskz_loadu_ps(TailMask(n - i), x + i);
    // (Two loops, no selected reference: the accumulators stay in registers.)
    if (odd) {
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {
        b[r] = _mm512_fmadd_ps(LoadRowTail<kKind>(w[r], i, n - i), xt, b[r]);
      }
    } else {
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {
        a[r] = _mm512_fmadd_ps(LoadRowTail<kKind>(w[r], i, n - i), xt, a[r]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) out[r] = Reduce16(_mm512_add_ps(a[r], b[r]));
#elif TANDEM_KERNELS_AVX2
  for (int r = 0; r < 4; ++r) out[r] = DotRow8<kKind>(w[r], x, n);
#else
  static_assert(kKind == RowKind::kF32, "f16 / bf16 rows need an AVX-512 or AVX2 build");
  for (int r = 0; r < 4; ++r) out[r] = DotF32(static_cast<const float*>(w[r]), x, n);
#endif
}

// Dot4Rows for two tokens at once: out0[r] = DotF32(w[r], x0, n), out1[r] =
// DotF32(w[r], x1, n), bit-identical (16 accumulators, each row's weights
// loaded once for both tokens).
template <RowKind kKind>
inline void Dot4x2Rows(const void* const w[4], const float* x0, const float* x1, int64_t n,
                       float out0[4], float out1[4]) {
#if TANDEM_KERNELS_AVX512
  __m512 a0[4], b0[4], a1[4], b1[4];  // token 0 / 1, even / odd chunks
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) a0[r] = b0[r] = a1[r] = b1[r] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 x00 = _mm512_loadu_ps(x0 + i), x01 = _mm512_loadu_ps(x0 + i + 16);
    __m512 x10 = _mm512_loadu_ps(x1 + i), x11 = _mm512_loadu_ps(x1 + i + 16);
    // Keeps the activations in registers: GCC would otherwise fold them into
    // every FMA as memory operands (24 loads per 16 FMAs instead of 12).
    asm("" : "+v"(x00), "+v"(x01), "+v"(x10), "+v"(x11));
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const __m512 w0 = LoadRow16<kKind>(w[r], i), w1 = LoadRow16<kKind>(w[r], i + 16);
      a0[r] = _mm512_fmadd_ps(w0, x00, a0[r]);
      a1[r] = _mm512_fmadd_ps(w0, x10, a1[r]);
      b0[r] = _mm512_fmadd_ps(w1, x01, b0[r]);
      b1[r] = _mm512_fmadd_ps(w1, x11, b1[r]);
    }
  }
  bool odd = false;
  if (i + 16 <= n) {
    const __m512 x00 = _mm512_loadu_ps(x0 + i), x10 = _mm512_loadu_ps(x1 + i);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const __m512 w0 = LoadRow16<kKind>(w[r], i);
      a0[r] = _mm512_fmadd_ps(w0, x00, a0[r]);
      a1[r] = _mm512_fmadd_ps(w0, x10, a1[r]);
    }
    i += 16;
    odd = true;
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    const __m512 xt0 = _mm512_maskz_loadu_ps(m, x0 + i), xt1 = _mm512_maskz_loadu_ps(m, x1 + i);
    if (odd) {
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {
        const __m512 wt = LoadRowTail<kKind>(w[r], i, n - i);
        b0[r] = _mm512_fmadd_ps(wt, xt0, b0[r]);
        b1[r] = _mm512_fmadd_ps(wt, xt1, b1[r]);
      }
    } else {
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {
        const __m512 wt = LoadRowTail<kKind>(w[r], i, n - i);
        a0[r] = _mm512_fmadd_ps(wt, xt0, a0[r]);
        a1[r] = _mm512_fmadd_ps(wt, xt1, a1[r]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
    out0[r] = Reduce16(_mm512_add_ps(a0[r], b0[r]));
    out1[r] = Reduce16(_mm512_add_ps(a1[r], b1[r]));
  }
#else
  Dot4Rows<kKind>(w, x0, n, out0);
  Dot4Rows<kKind>(w, x1, n, out1);
#endif
}

#if TANDEM_KERNELS_AVX2
// One pass of the 8-lane DotTile4: the chunks of one parity (DotF32's
// accumulator c % 2), one 8-lane half of each (lanes 0-7 or 8-15), 4 rows x
// kN (<= 3) tokens, 4 * kN accumulators; a partial last chunk is read
// masked (past n: 0 * 0 added, as the AVX-512 masked loads do). part[r][t]
// gets the 8 lanes.
template <int kN>
inline void DotTilePass8(const float* const w[4], const float* const* x, int64_t n, int parity,
                         int half, float (*part)[3][16]) {
  const int64_t full = n / 16, rem = n - 16 * full;
  __m256 acc[4][kN];
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
#pragma GCC unroll 3
    for (int t = 0; t < kN; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  for (int64_t c = parity; c < full; c += 2) {
    const int64_t i = 16 * c + 8 * half;
    __m256 xv[kN];
#pragma GCC unroll 3
    for (int t = 0; t < kN; ++t) xv[t] = _mm256_loadu_ps(x[t] + i);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const __m256 wv = _mm256_loadu_ps(w[r] + i);
#pragma GCC unroll 3
      for (int t = 0; t < kN; ++t) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
  if (rem > 0 && full % 2 == parity) {
    const int64_t i = 16 * full + 8 * half;
    const __m256i m = TailMask8(rem - 8 * half);
    __m256 xv[kN];
#pragma GCC unroll 3
    for (int t = 0; t < kN; ++t) xv[t] = _mm256_maskload_ps(x[t] + i, m);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const __m256 wv = _mm256_maskload_ps(w[r] + i, m);
#pragma GCC unroll 3
      for (int t = 0; t < kN; ++t) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
#pragma GCC unroll 3
    for (int t = 0; t < kN; ++t) _mm256_storeu_ps(part[r][t] + 8 * half, acc[r][t]);
  }
}

// DotTile4 for tokens [kT0, kT) with 8-lane registers, 3 tokens at a time:
// four passes (parity x half) hold the AVX-512 accumulators' lanes, then
// each output is Reduce16's tree of even + odd.
template <int kT, int kT0 = 0>
inline void DotTile4Avx2(const float* const w[4], const float* const x[kT], int64_t n, float* out,
                         int64_t ldo, int nr) {
  constexpr int kN = kT - kT0 < 3 ? kT - kT0 : 3;
  float even[4][3][16], odd[4][3][16];
  for (int half = 0; half < 2; ++half) {
    DotTilePass8<kN>(w, x + kT0, n, 0, half, even);
    DotTilePass8<kN>(w, x + kT0, n, 1, half, odd);
  }
  for (int t = 0; t < kN; ++t) {
    for (int r = 0; r < nr; ++r) {
      out[(kT0 + t) * ldo + r] =
          Reduce16Halves(_mm256_loadu_ps(even[r][t]), _mm256_loadu_ps(even[r][t] + 8),
                         _mm256_loadu_ps(odd[r][t]), _mm256_loadu_ps(odd[r][t] + 8));
    }
  }
  if constexpr (kT0 + 3 < kT) DotTile4Avx2<kT, kT0 + 3>(w, x, n, out, ldo, nr);
}
#endif

// The GEMM form of DotF32 for 4 f32 rows x kT tokens: out[t * ldo + r] =
// DotF32(w[r], x[t], n) for r < nr, bit-identical. DotF32 sends chunk c to
// accumulator c % 2 and adds the two at the end, so the even chunks run in
// one pass and the odd chunks in a second, each with 4 x kT accumulators in
// registers: per chunk 4 + kT loads feed 4 * kT FMAs (Dot4Rows: 5 loads per
// 4 FMAs, which bounds prefill of f32 / f16 / bf16 weights on the loads).
template <int kT>
inline void DotTile4(const float* const w[4], const float* const x[kT], int64_t n, float* out,
                     int64_t ldo, int nr) {
#if TANDEM_KERNELS_AVX512
  const int64_t full = n / 16;  // chunks [0, full) are whole; chunk `full` is the tail, if any
  const int64_t rem = n - 16 * full;
  __m512 even[4][kT];
  for (int pass = 0; pass < 2; ++pass) {
    __m512 acc[4][kT];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
#pragma GCC unroll 8
      for (int t = 0; t < kT; ++t) acc[r][t] = _mm512_setzero_ps();
    }
    for (int64_t c = pass; c < full; c += 2) {
      const int64_t i = 16 * c;
      __m512 wv[4];
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) wv[r] = _mm512_loadu_ps(w[r] + i);
#pragma GCC unroll 8
      for (int t = 0; t < kT; ++t) {
        __m512 xv = _mm512_loadu_ps(x[t] + i);
        asm("" : "+v"(xv));  // one load per token, not one per FMA
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
      }
    }
    if (rem > 0 && full % 2 == pass) {
      const int64_t i = 16 * full;
      const __mmask16 m = TailMask(rem);
      __m512 wv[4];
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) wv[r] = _mm512_maskz_loadu_ps(m, w[r] + i);
#pragma GCC unroll 8
      for (int t = 0; t < kT; ++t) {
        const __m512 xv = _mm512_maskz_loadu_ps(m, x[t] + i);
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
      }
    }
    if (pass == 0) {
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {
#pragma GCC unroll 8
        for (int t = 0; t < kT; ++t) even[r][t] = acc[r][t];
      }
      continue;
    }
    // Output j = 4t + r, reduced 16 at a time (constant indices only: a
    // run-time one, r < nr, would make GCC keep the accumulators in memory
    // and store all of them every iteration).
    constexpr int kGroups = (4 * kT + 15) / 16;
    __m512 sum[16 * kGroups];
#pragma GCC unroll 32
    for (int j = 0; j < 16 * kGroups; ++j) {
      sum[j] =
          j < 4 * kT ? _mm512_add_ps(even[j % 4][j / 4], acc[j % 4][j / 4]) : _mm512_setzero_ps();
    }
    alignas(64) float red[16 * kGroups];  // red[16g + 4q + e] = output 16g + 4e + q
#pragma GCC unroll 2
    for (int g = 0; g < kGroups; ++g) _mm512_store_ps(red + 16 * g, Reduce16x16(sum + 16 * g));
    for (int t = 0; t < kT; ++t) {
      for (int r = 0; r < nr; ++r) {
        const int j = 4 * t + r, b = j % 16;
        out[t * ldo + r] = red[j - b + 4 * (b % 4) + b / 4];
      }
    }
  }
#elif TANDEM_KERNELS_AVX2
  DotTile4Avx2<kT>(w, x, n, out, ldo, nr);
#else
  for (int t = 0; t < kT; ++t) {
    for (int r = 0; r < nr; ++r) out[t * ldo + r] = DotF32(w[r], x[t], n);
  }
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

TANDEM_KERNELS_ABI_END

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
