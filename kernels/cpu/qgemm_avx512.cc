// AVX-512 VNNI QGemm: one zmm lane per row of a 16-row group, vpdpbusd over
// 4 quants per lane (kernels/qgemm.h has the layout and the determinism
// rule). Up to kTile tokens share each unpacked weight register (register
// blocking); for every (token, row) the f32 sequence is the one of
// ref::QGemm, so the tile width never changes a result.
//
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma -mf16c
// (kernels/CMakeLists.txt); only called when CPUID reports them.
#include "kernels/cpu/qgemm_impl.h"
#include "kernels/cpu/qgemm_unpack_avx512.h"
// Only its AVX-512 helpers (Exp16, TransposeReduce16) are used here.
#include "kernels/cpu/simd.h"

#if defined(__x86_64__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
// GCC 12 false positive inside its own AVX-512 headers (see simd.h).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace tandem::kernels::cpu {
namespace {

constexpr int kTile = 8;
constexpr int64_t kPrefetchBlocks = 8;

// acc += w . broadcast(4 bytes at p), with the broadcast folded into
// vpdpbusd's memory operand ({1to16}): one uop instead of a separate
// vpbroadcastd (GCC 12 does not fold it from the intrinsics).
inline __m512i Dp(__m512i acc, __m512i w, const int8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0"
      : "+v"(acc)
      : "v"(w), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}

// init + sum over the block of w (16 rows x 32, unsigned) times x (32, s8).
// (Integer sums are exact in any order; the pairing only shortens the
// dependency chains.)
inline __m512i BlockDot(const __m512i* wq, const int8_t* x, __m512i init) {
  __m512i s0 = Dp(init, wq[0], x);
  __m512i s1 = Dp(_mm512_setzero_si512(), wq[1], x + 4);
  s0 = Dp(s0, wq[2], x + 8);
  s1 = Dp(s1, wq[3], x + 12);
  s0 = Dp(s0, wq[4], x + 16);
  s1 = Dp(s1, wq[5], x + 20);
  s0 = Dp(s0, wq[6], x + 24);
  s1 = Dp(s1, wq[7], x + 28);
  return _mm512_add_epi32(s0, s1);
}

// The two 16-column halves apart (kF32Halves): wq[0..3] hold columns 0-15,
// wq[4..7] columns 16-31, in both quant widths.
inline void HalfDots(const __m512i* wq, const int8_t* x, __m512i* lo, __m512i* hi) {
  *lo = Dp(Dp(Dp(Dp(*lo, wq[0], x), wq[1], x + 4), wq[2], x + 8), wq[3], x + 12);
  *hi = Dp(Dp(Dp(Dp(*hi, wq[4], x + 16), wq[5], x + 20), wq[6], x + 24), wq[7], x + 28);
}

template <int kBits, bool kHasMin, ScaleFormat kFmt, bool kTwo, int kNt>
void Tile(const PackedWeight& w, const QuantizedActs& a, int64_t g, int64_t t0, float* y,
          int64_t ldy, bool accumulate) {
  const int64_t nb = w.num_blocks(), cb = w.chunk_bytes();
  const int32_t ioff = w.offset();
  __m512 acc[kNt];
#pragma GCC unroll 8
  for (int t = 0; t < kNt; ++t) acc[t] = _mm512_setzero_ps();
  const uint8_t* c = w.chunk(g, 0);
  // Token t of the tile, block b: quants at xq + t * 32, scales at xd[t].
  const int64_t i0 = a.Index(t0, 0);
  const int8_t* xq = a.qs.data() + i0 * kQBlock;
  const int8_t* xq2 = kTwo ? a.qs2.data() + i0 * kQBlock : nullptr;
  const float* xd = a.d.data() + i0;
  const float* xsd = a.sd.data() + i0;
  const int32_t* xs = a.s.data() + i0;
  const int32_t* xs_lo = a.s_lo.data() + i0;
  constexpr int64_t kStep = kActTile * kQBlock;
  for (int64_t b = 0; b < nb; ++b, c += cb) {
    // Small batches stream the weights once: fetch kPrefetchBlocks chunks
    // ahead (the stream runs on into the next group, usually the same
    // thread's). The hardware prefetcher alone leaves the loads stalled.
    for (int64_t off = 0; off < cb; off += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(c + kPrefetchBlocks * cb + off), _MM_HINT_T0);
    }
    __m512i wq[8];
    UnpackChunk<kBits>(c, wq);
    __m512 dv, mv;  // mv: M, or D_hi
    ChunkScales<kFmt, kHasMin>(c + kBits * 64, w.super_scales(g, b), &dv, &mv);
    if constexpr (kFmt == ScaleFormat::kF32Halves) {
#pragma GCC unroll 8
      for (int t = 0; t < kNt; ++t) {
        const int64_t k = b * kActTile + t;
        const __m512 dx = _mm512_set1_ps(xd[k]);
        const __m512 ddx_lo = _mm512_mul_ps(dv, dx), ddx_hi = _mm512_mul_ps(mv, dx);
        const int64_t off = b * kStep + t * kQBlock;
        __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
        HalfDots(wq, xq + off, &lo, &hi);
        if constexpr (kTwo) {
          __m512i lo2 = _mm512_setzero_si512(), hi2 = _mm512_setzero_si512();
          HalfDots(wq, xq2 + off, &lo2, &hi2);
          lo = _mm512_add_epi32(_mm512_slli_epi32(lo, 8), lo2);
          hi = _mm512_add_epi32(_mm512_slli_epi32(hi, 8), hi2);
        }
        lo = _mm512_sub_epi32(lo, _mm512_set1_epi32(32 * xs_lo[k]));
        hi = _mm512_sub_epi32(hi, _mm512_set1_epi32(32 * (xs[k] - xs_lo[k])));
        const __m512 fhi = _mm512_mul_ps(_mm512_cvtepi32_ps(hi), ddx_hi);
        acc[t] = _mm512_add_ps(acc[t], _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), ddx_lo, fhi));
      }
      continue;
    }
#pragma GCC unroll 8
    for (int t = 0; t < kNt; ++t) {
      const int64_t k = b * kActTile + t;
      const __m512 ddx = _mm512_mul_ps(dv, _mm512_set1_ps(xd[k]));
      const int64_t off = b * kStep + t * kQBlock;
      __m512i is = BlockDot(wq, xq + off, _mm512_setzero_si512());
      if constexpr (kTwo) is = BlockDot(wq, xq2 + off, _mm512_slli_epi32(is, 8));
      if constexpr (kHasMin) {
        acc[t] = _mm512_fmadd_ps(mv, _mm512_set1_ps(xsd[k]), acc[t]);
      } else {
        is = _mm512_sub_epi32(is, _mm512_set1_epi32(ioff * xs[k]));
      }
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), ddx, acc[t]);
    }
  }
  const int64_t valid = std::min<int64_t>(kGroupRows, w.rows() - g * kGroupRows);
  const __mmask16 m = static_cast<__mmask16>((1u << valid) - 1u);
  for (int t = 0; t < kNt; ++t) {
    float* out = y + (t0 + t) * ldy + g * kGroupRows;
    __m512 v = acc[t];
    if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, out), v);
    _mm512_mask_storeu_ps(out, m, v);
  }
}

template <int kBits, bool kHasMin, ScaleFormat kFmt, bool kTwo>
void GemmT(const PackedWeight& w, const QuantizedActs& a, int64_t g0, int64_t g1, float* y,
           int64_t ldy, bool accumulate) {
  for (int64_t g = g0; g < g1; ++g) {
    int64_t t = 0;
    for (; t + kTile <= a.n; t += kTile) {
      Tile<kBits, kHasMin, kFmt, kTwo, kTile>(w, a, g, t, y, ldy, accumulate);
    }
    switch (a.n - t) {
      case 7:
        Tile<kBits, kHasMin, kFmt, kTwo, 7>(w, a, g, t, y, ldy, accumulate);
        break;
      case 6:
        Tile<kBits, kHasMin, kFmt, kTwo, 6>(w, a, g, t, y, ldy, accumulate);
        break;
      case 5:
        Tile<kBits, kHasMin, kFmt, kTwo, 5>(w, a, g, t, y, ldy, accumulate);
        break;
      case 4:
        Tile<kBits, kHasMin, kFmt, kTwo, 4>(w, a, g, t, y, ldy, accumulate);
        break;
      case 3:
        Tile<kBits, kHasMin, kFmt, kTwo, 3>(w, a, g, t, y, ldy, accumulate);
        break;
      case 2:
        Tile<kBits, kHasMin, kFmt, kTwo, 2>(w, a, g, t, y, ldy, accumulate);
        break;
      case 1:
        Tile<kBits, kHasMin, kFmt, kTwo, 1>(w, a, g, t, y, ldy, accumulate);
        break;
      default:
        break;
    }
  }
}

// GemmT for w's quant width (4, 5, 6 or 8 bits; Q6_K is the only 6-bit type
// and the only kF32Halves one).
template <bool kHasMin, ScaleFormat kFmt, bool kTwo>
void GemmB(const PackedWeight& w, const QuantizedActs& a, int64_t g0, int64_t g1, float* y,
           int64_t ldy, bool accumulate) {
  switch (w.bits()) {
    case 4:
      GemmT<4, kHasMin, kFmt, kTwo>(w, a, g0, g1, y, ldy, accumulate);
      return;
    case 5:
      GemmT<5, kHasMin, kFmt, kTwo>(w, a, g0, g1, y, ldy, accumulate);
      return;
    default:
      GemmT<8, kHasMin, kFmt, kTwo>(w, a, g0, g1, y, ldy, accumulate);
      return;
  }
}

template <bool kTwo>
void GemmL(const PackedWeight& w, const QuantizedActs& a, int64_t g0, int64_t g1, float* y,
           int64_t ldy, bool accumulate) {
  constexpr ScaleFormat kF16 = ScaleFormat::kF16, kF32 = ScaleFormat::kF32;
  switch (w.scale_format()) {
    case ScaleFormat::kF32:  // Q4_K, Q5_K
      GemmB<true, kF32, kTwo>(w, a, g0, g1, y, ldy, accumulate);
      return;
    case ScaleFormat::kF32Halves:  // Q6_K
      GemmT<6, false, ScaleFormat::kF32Halves, kTwo>(w, a, g0, g1, y, ldy, accumulate);
      return;
    case ScaleFormat::kF16:
      break;
  }
  (w.has_min() ? GemmB<true, kF16, kTwo> : GemmB<false, kF16, kTwo>)(w, a, g0, g1, y, ldy,
                                                                     accumulate);
}

void Gemm(const PackedWeight& w, const QuantizedActs& a, int64_t g0, int64_t g1, float* y,
          int64_t ldy, bool accumulate) {
  (a.levels == 2 ? GemmL<true> : GemmL<false>)(w, a, g0, g1, y, ldy, accumulate);
}

inline __m512 MaxF32(__m512 a, __m512 b) { return _mm512_max_ps(a, b); }
// int32 lanes carried in __m512 registers.
inline __m512 AddI32(__m512 a, __m512 b) {
  return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
}

// QuantizeBlockRef on 2 x 16 lanes: lane-wise, so the quants are
// bit-identical to the reference. The sums are left as int32 vectors (in
// __m512 registers): *lo holds q[0..15], *all q[0..15] + q[16..31].
inline void QuantizeBlock(__m512 x0, __m512 x1, __m512 iv, int8_t* q, __m512* q0f, __m512* q1f,
                          __m512* lo, __m512* all) {
  const __m512 lim = _mm512_set1_ps(127.f), nlim = _mm512_set1_ps(-127.f);
  auto quant = [&](__m512 v) {
    v = _mm512_roundscale_ps(_mm512_mul_ps(v, iv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_min_ps(lim, _mm512_max_ps(nlim, v));
  };
  *q0f = quant(x0);
  *q1f = quant(x1);
  const __m512i q0 = _mm512_cvtps_epi32(*q0f), q1 = _mm512_cvtps_epi32(*q1f);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(q0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(q1));
  *lo = _mm512_castsi512_ps(q0);
  *all = _mm512_castsi512_ps(_mm512_add_epi32(q0, q1));
}

// QuantizeRowRef, 16 blocks at a time: their max|x| and quant sums are
// reduced together (TransposeReduce16); every value is the reference's
// (max and integer sums are exact in any order, dx and 1 / dx the same
// IEEE divisions lane-wise).
void QuantizeRow(const float* x, int64_t cols, const ActRow& o) {
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const bool two = o.q2 != nullptr;
  const int64_t nb = cols / 32;
  for (int64_t b0 = 0; b0 < nb; b0 += 16) {
    const int n = int(std::min<int64_t>(16, nb - b0));
    const float* xb = x + b0 * 32;
    __m512 amax = _mm512_set1_ps(o.row_amax);
    if (o.row_amax < 0.f) {
      __m512 m[16];
      for (int i = 0; i < 16; ++i) {
        m[i] = i < n ? _mm512_max_ps(_mm512_and_ps(_mm512_loadu_ps(xb + 32 * i), absmask),
                                     _mm512_and_ps(_mm512_loadu_ps(xb + 32 * i + 16), absmask))
                     : _mm512_setzero_ps();
      }
      amax = TransposeReduce16(m, n, MaxF32);
    }
    const __m512 dxv = _mm512_div_ps(amax, _mm512_set1_ps(127.f));
    const __mmask16 nz = _mm512_cmp_ps_mask(dxv, _mm512_setzero_ps(), _CMP_NEQ_OQ);
    const __m512 idv = _mm512_maskz_div_ps(nz, _mm512_set1_ps(1.f), dxv);
    alignas(64) float dxs[16], ids[16];
    _mm512_store_ps(dxs, dxv);
    _mm512_store_ps(ids, idv);
    // [level][block]: the lane-wise sums of q[0..15] and of all 32 quants.
    __m512 lo[2][16], all[2][16];
    for (int i = 0; i < 16; ++i) {
      if (i < n) {
        const int64_t k = (b0 + i) * kActTile;
        const __m512 x0 = _mm512_loadu_ps(xb + 32 * i), x1 = _mm512_loadu_ps(xb + 32 * i + 16);
        __m512 q0f, q1f;
        QuantizeBlock(x0, x1, _mm512_set1_ps(ids[i]), o.q + k * kQBlock, &q0f, &q1f, &lo[0][i],
                      &all[0][i]);
        if (two) {
          const __m512 ndx = _mm512_set1_ps(-dxs[i]);
          const __m512 r0 = _mm512_fmadd_ps(ndx, q0f, x0), r1 = _mm512_fmadd_ps(ndx, q1f, x1);
          QuantizeBlock(r0, r1, _mm512_set1_ps(ids[i] * 256.f), o.q2 + k * kQBlock, &q0f, &q1f,
                        &lo[1][i], &all[1][i]);
        }
      } else {
        lo[0][i] = all[0][i] = lo[1][i] = all[1][i] = _mm512_setzero_ps();
      }
    }
    alignas(64) int32_t lo1[16], all1[16], lo2[16], all2[16];  // written as f32 bits
    _mm512_store_ps(lo1, TransposeReduce16(lo[0], n, AddI32));
    _mm512_store_ps(all1, TransposeReduce16(all[0], n, AddI32));
    if (two) {
      _mm512_store_ps(lo2, TransposeReduce16(lo[1], n, AddI32));
      _mm512_store_ps(all2, TransposeReduce16(all[1], n, AddI32));
    }
    for (int i = 0; i < n; ++i) {
      StoreActBlock(o, (b0 + i) * kActTile, dxs[i], all1[i], lo1[i], two, two ? all2[i] : 0,
                    two ? lo2[i] : 0);
    }
  }
}

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
  const __m512 one = _mm512_set1_ps(1.f);
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 e = Exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(s, _mm512_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

const QGemmImpl kImpl = {"avx512vnni", Gemm, QuantizeRow, SiluMul};

}  // namespace

const QGemmImpl* Avx512VnniImpl() { return &kImpl; }

}  // namespace tandem::kernels::cpu

#else

namespace tandem::kernels::cpu {
const QGemmImpl* Avx512VnniImpl() { return nullptr; }
}  // namespace tandem::kernels::cpu

#endif
