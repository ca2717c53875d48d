// AVX2 QGemm: each 16-row group is two 8-lane halves (bytes 0-31 and 32-63
// of every 64-byte quant register). Quant products come from pmaddubsw
// (u8 x s8 -> i16 pairs) widened by pmaddwd; Q8_0 weights go through the
// sign trick (|w| x sign(x, w)) so no i16 sum saturates. Integer sums are
// exact, and the f32 steps per (token, row) are those of ref::QGemm, so the
// results are bit-identical to the AVX-512 and scalar paths.
//
// Compiled with -mavx2 -mfma -mf16c (kernels/CMakeLists.txt).
#include "kernels/cpu/qgemm_impl.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace tandem::kernels::cpu {
namespace {

constexpr int kTile = 4;

inline __m256i Bcast(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Exact sum over registers [j0, j1) of w (8 rows x 4 columns each, small
// unsigned quants) times x (s8): pmaddubsw pairs added in i16 kGroup
// registers at a time, then widened. A pair is at most 2 x qmax x 127 and
// kGroup pairs stay below 2^15 (4-bit: 8 x 3810, 5-bit: 4 x 7874, 6-bit:
// 2 x 16002), so nothing saturates.
template <int kGroup>
inline __m256i SmallDot(const __m256i* wq, const int8_t* x, int j0, int j1) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i isum = _mm256_setzero_si256();
  for (int j = j0; j < j1; j += kGroup) {
    __m256i s16 = _mm256_maddubs_epi16(wq[j], Bcast(x + 4 * j));
    for (int k = 1; k < kGroup; ++k) {
      s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(wq[j + k], Bcast(x + 4 * (j + k))));
    }
    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(s16, ones));
  }
  return isum;
}

// i16 group size of SmallDot for a quant width.
constexpr int GroupOf(int bits) { return bits == 4 ? 8 : bits == 5 ? 4 : 2; }

// Exact sum over the block of w (8 rows x 32; unsigned, or for Q8_0 the
// signed w - 128 through the sign trick) times x (32, s8).
template <int kBits>
inline __m256i BlockDot(const __m256i* wq, const int8_t* x) {
  if constexpr (kBits != 8) {
    return SmallDot<GroupOf(kBits)>(wq, x, 0, 8);
  } else {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i isum = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      const __m256i xs = _mm256_sign_epi8(Bcast(x + 4 * j), wq[j]);
      isum = _mm256_add_epi32(
          isum, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(wq[j]), xs), ones));
    }
    return isum;
  }
}

// Q6_K (6-bit), the two 16-column halves apart (kF32Halves): wq[0..3] hold
// columns 0-15, wq[4..7] columns 16-31.
inline void HalfDots(const __m256i* wq, const int8_t* x, __m256i* lo, __m256i* hi) {
  *lo = SmallDot<GroupOf(6)>(wq, x, 0, 4);
  *hi = SmallDot<GroupOf(6)>(wq, x, 4, 8);
}

// Scale word i (0 or 1) of rows 8h..8h+7 of a chunk as f32 (kernels/qgemm.h):
// sc, the chunk's scale bytes; sup, its super-block scales (K types).
template <ScaleFormat kFmt>
inline __m256 LoadScales(const uint8_t* sc, const float* sup, int h, int i) {
  if constexpr (kFmt == ScaleFormat::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + 32 * i + 16 * h)));
  } else {
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 16 * i + 8 * h));
    const __m256 small = _mm256_cvtepi32_ps(kFmt == ScaleFormat::kF32 ? _mm256_cvtepu8_epi32(v)
                                                                      : _mm256_cvtepi8_epi32(v));
    const int word = kFmt == ScaleFormat::kF32 ? i : 0;  // Q6_K: one d for both halves
    return _mm256_mul_ps(_mm256_loadu_ps(sup + 16 * word + 8 * h), small);
  }
}

// Bytes 32h..32h+31 of the chunk's 8 quant registers (kernels/qgemm.h):
// nibbles, plus for 5- / 6-bit types each plane's 32 mask bits spread to
// bytes (byte i takes mask byte i / 8, keeps bit i % 8, compares to 0xFF).
template <int kBits>
inline void Unpack(const uint8_t* c, int h, __m256i* wq) {
  if constexpr (kBits == 8) {
    for (int j = 0; j < 8; ++j) {
      wq[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * j + 32 * h));
    }
    return;
  }
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int j = 0; j < 4; ++j) {
    const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * j + 32 * h));
    wq[j] = _mm256_and_si256(p, low4);
    wq[4 + j] = _mm256_and_si256(_mm256_srli_epi16(p, 4), low4);
  }
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
  for (int p = 0; p < kBits - 4; ++p) {
    const __m256i add = _mm256_set1_epi8(static_cast<char>(16 << p));
    for (int j = 0; j < 8; ++j) {
      int32_t m;
      std::memcpy(&m, c + 256 + 64 * p + 8 * j + 4 * h, 4);
      const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(m), spread);
      const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
      wq[j] = _mm256_add_epi8(wq[j], _mm256_and_si256(set, add));
    }
  }
}

template <int kBits, bool kHasMin, ScaleFormat kFmt, bool kTwo, int kNt>
void Tile(const PackedWeight& w, const QuantizedActs& a, int64_t g, int64_t t0, int h, float* y,
          int64_t ldy, bool accumulate) {
  const int64_t nb = w.num_blocks(), cb = w.chunk_bytes();
  const int32_t ioff = w.offset();
  const __m256i flip = _mm256_set1_epi8(char(0x80));
  __m256 acc[kNt];
  for (int t = 0; t < kNt; ++t) acc[t] = _mm256_setzero_ps();
  const uint8_t* c = w.chunk(g, 0);
  const int64_t i0 = a.Index(t0, 0);
  const int8_t* xq = a.qs.data() + i0 * kQBlock;
  const int8_t* xq2 = kTwo ? a.qs2.data() + i0 * kQBlock : nullptr;
  const float* xd = a.d.data() + i0;
  const float* xsd = a.sd.data() + i0;
  const int32_t* xs = a.s.data() + i0;
  const int32_t* xs_lo = a.s_lo.data() + i0;
  constexpr int64_t kStep = kActTile * kQBlock;
  for (int64_t b = 0; b < nb; ++b, c += cb) {
    __m256i wq[8];
    Unpack<kBits>(c, h, wq);
    if constexpr (kBits == 8) {                                           // Q8_0
      for (int j = 0; j < 8; ++j) wq[j] = _mm256_xor_si256(wq[j], flip);  // back to s8
    }
    const uint8_t* sc = c + kBits * 64;
    const float* sup = w.super_scales(g, b);
    const __m256 dv = LoadScales<kFmt>(sc, sup, h, 0);
    __m256 mv = _mm256_setzero_ps();
    if constexpr (kHasMin || kFmt == ScaleFormat::kF32Halves) {
      mv = LoadScales<kFmt>(sc, sup, h, 1);  // M, or D_hi
    }
    if constexpr (kFmt == ScaleFormat::kF32Halves) {
      static_assert(kBits == 6);
      for (int t = 0; t < kNt; ++t) {
        const int64_t k = b * kActTile + t;
        const int64_t off = b * kStep + t * kQBlock;
        const __m256 dx = _mm256_set1_ps(xd[k]);
        const __m256 ddx_lo = _mm256_mul_ps(dv, dx), ddx_hi = _mm256_mul_ps(mv, dx);
        __m256i lo, hi;
        HalfDots(wq, xq + off, &lo, &hi);
        if constexpr (kTwo) {
          __m256i lo2, hi2;
          HalfDots(wq, xq2 + off, &lo2, &hi2);
          lo = _mm256_add_epi32(_mm256_slli_epi32(lo, 8), lo2);
          hi = _mm256_add_epi32(_mm256_slli_epi32(hi, 8), hi2);
        }
        lo = _mm256_sub_epi32(lo, _mm256_set1_epi32(32 * xs_lo[k]));
        hi = _mm256_sub_epi32(hi, _mm256_set1_epi32(32 * (xs[k] - xs_lo[k])));
        const __m256 fhi = _mm256_mul_ps(_mm256_cvtepi32_ps(hi), ddx_hi);
        acc[t] = _mm256_add_ps(acc[t], _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), ddx_lo, fhi));
      }
      continue;
    }
#pragma GCC unroll 8
    for (int t = 0; t < kNt; ++t) {
      const int64_t k = b * kActTile + t;
      const int64_t off = b * kStep + t * kQBlock;
      const __m256 ddx = _mm256_mul_ps(dv, _mm256_set1_ps(xd[k]));
      __m256i is = BlockDot<kBits>(wq, xq + off);
      if constexpr (kTwo) {
        is = _mm256_add_epi32(_mm256_slli_epi32(is, 8), BlockDot<kBits>(wq, xq2 + off));
      }
      // Q8_0 (8-bit) is already the signed sum (u - 128) x.
      if constexpr (kHasMin) {
        acc[t] = _mm256_fmadd_ps(mv, _mm256_set1_ps(xsd[k]), acc[t]);
      } else if constexpr (kBits != 8) {
        is = _mm256_sub_epi32(is, _mm256_set1_epi32(ioff * xs[k]));
      }
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), ddx, acc[t]);
    }
  }
  const int64_t r0 = g * kGroupRows + 8 * h;
  const int64_t valid = std::min<int64_t>(8, w.rows() - r0);
  for (int t = 0; t < kNt; ++t) {
    float* out = y + (t0 + t) * ldy + r0;
    alignas(32) float v[8];
    _mm256_store_ps(v, acc[t]);
    for (int64_t i = 0; i < valid; ++i) out[i] = accumulate ? out[i] + v[i] : v[i];
  }
}

template <int kBits, bool kHasMin, ScaleFormat kFmt, bool kTwo>
void GemmT(const PackedWeight& w, const QuantizedActs& a, int64_t g0, int64_t g1, float* y,
           int64_t ldy, bool accumulate) {
  for (int64_t g = g0; g < g1; ++g) {
    for (int h = 0; h < 2 && g * kGroupRows + 8 * h < w.rows(); ++h) {
      int64_t t = 0;
      for (; t + kTile <= a.n; t += kTile) {
        Tile<kBits, kHasMin, kFmt, kTwo, kTile>(w, a, g, t, h, y, ldy, accumulate);
      }
      switch (a.n - t) {
        case 3:
          Tile<kBits, kHasMin, kFmt, kTwo, 3>(w, a, g, t, h, y, ldy, accumulate);
          break;
        case 2:
          Tile<kBits, kHasMin, kFmt, kTwo, 2>(w, a, g, t, h, y, ldy, accumulate);
          break;
        case 1:
          Tile<kBits, kHasMin, kFmt, kTwo, 1>(w, a, g, t, h, y, ldy, accumulate);
          break;
        default:
          break;
      }
    }
  }
}

template <bool kTwo>
void GemmL(const PackedWeight& w, const QuantizedActs& a, int64_t g0, int64_t g1, float* y,
           int64_t ldy, bool accumulate) {
  constexpr ScaleFormat kF16 = ScaleFormat::kF16, kF32 = ScaleFormat::kF32;
  switch (w.scale_format()) {
    case ScaleFormat::kF32:  // Q4_K (4-bit), Q5_K (5-bit)
      (w.bits() == 4 ? GemmT<4, true, kF32, kTwo> : GemmT<5, true, kF32, kTwo>)(w, a, g0, g1, y,
                                                                                ldy, accumulate);
      return;
    case ScaleFormat::kF32Halves:  // Q6_K: quants <= 63, no i16 overflow
      GemmT<6, false, ScaleFormat::kF32Halves, kTwo>(w, a, g0, g1, y, ldy, accumulate);
      return;
    case ScaleFormat::kF16:
      break;
  }
  if (w.bits() == 4) {
    (w.has_min() ? GemmT<4, true, kF16, kTwo> : GemmT<4, false, kF16, kTwo>)(w, a, g0, g1, y, ldy,
                                                                             accumulate);
  } else if (w.bits() == 5) {  // Q5_0, Q5_1
    (w.has_min() ? GemmT<5, true, kF16, kTwo> : GemmT<5, false, kF16, kTwo>)(w, a, g0, g1, y, ldy,
                                                                             accumulate);
  } else {  // Q8_0
    GemmT<8, false, kF16, kTwo>(w, a, g0, g1, y, ldy, accumulate);
  }
}

void Gemm(const PackedWeight& w, const QuantizedActs& a, int64_t g0, int64_t g1, float* y,
          int64_t ldy, bool accumulate) {
  (a.levels == 2 ? GemmL<true> : GemmL<false>)(w, a, g0, g1, y, ldy, accumulate);
}

inline int32_t SumI32(__m256i v) {  // exact in any order
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)));
}

// QuantizeBlockRef on 4 x 8 lanes (lane-wise, so the quants are the
// reference's): stores q[32], the quants as floats in qf[4], returns the sum
// of all 32 and the sum of q[0..15] in *lo.
inline int32_t QuantizeBlock(const __m256* x, float id, int8_t* q, __m256* qf, int32_t* lo) {
  const __m256 lim = _mm256_set1_ps(127.f), nlim = _mm256_set1_ps(-127.f);
  const __m256 iv = _mm256_set1_ps(id);
  __m256i qi[4];
  for (int i = 0; i < 4; ++i) {
    const __m256 v =
        _mm256_round_ps(_mm256_mul_ps(x[i], iv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    qf[i] = _mm256_min_ps(lim, _mm256_max_ps(nlim, v));
    qi[i] = _mm256_cvtps_epi32(qf[i]);
  }
  // i32 -> i8 (in range, no saturation). The packs work per 128-bit lane,
  // leaving the 4-quant dwords in the order 0, 2, 4, 6, 1, 3, 5, 7.
  const __m256i b8 =
      _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(b8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  const __m256i lo_v = _mm256_add_epi32(qi[0], qi[1]);
  *lo = SumI32(lo_v);
  return SumI32(_mm256_add_epi32(lo_v, _mm256_add_epi32(qi[2], qi[3])));
}

// QuantizeRowRef with 8-lane vectors; every value is the reference's (max
// and integer sums are exact in any order, the rest is lane-wise).
void QuantizeRow(const float* x, int64_t cols, const ActRow& o) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t b = 0; b < cols / 32; ++b) {
    const int64_t k = b * kActTile;
    __m256 xv[4];
    for (int i = 0; i < 4; ++i) xv[i] = _mm256_loadu_ps(x + b * 32 + 8 * i);
    float amax = o.row_amax;
    if (amax < 0.f) {
      const __m256 m = _mm256_max_ps(
          _mm256_max_ps(_mm256_and_ps(xv[0], absmask), _mm256_and_ps(xv[1], absmask)),
          _mm256_max_ps(_mm256_and_ps(xv[2], absmask), _mm256_and_ps(xv[3], absmask)));
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    }
    const float dx = amax / 127.f;
    const float id = dx != 0.f ? 1.f / dx : 0.f;
    __m256 qf[4];
    int32_t lo, lo2 = 0, sum2 = 0;
    const int32_t sum = QuantizeBlock(xv, id, o.q + k * kQBlock, qf, &lo);
    if (o.q2 != nullptr) {
      const __m256 ndx = _mm256_set1_ps(-dx);
      __m256 r[4];
      for (int i = 0; i < 4; ++i) r[i] = _mm256_fmadd_ps(ndx, qf[i], xv[i]);
      sum2 = QuantizeBlock(r, id * 256.f, o.q2 + k * kQBlock, qf, &lo2);
    }
    StoreActBlock(o, k, dx, sum, lo, o.q2 != nullptr, sum2, lo2);
  }
}

// cpu::Exp16 (simd.h, the AVX-512 path's exp) step for step on 8 lanes, so
// SiLU gives the same bits on both: 2^n is built in the exponent field
// (n in [-126, 127] after the clamp: a normal float), and p * 2^n rounds
// exactly as AVX-512's scalef(p, n).
inline __m256 Exp(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.f)), _mm256_set1_ps(88.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504089f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.f);
  // 16 at a time with the same scalar tail as the AVX-512 path.
  for (const int64_t vec = n / 16 * 16; i < vec; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = Exp(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

const QGemmImpl kImpl = {"avx2", Gemm, QuantizeRow, SiluMul};

}  // namespace

const QGemmImpl* Avx2Impl() { return &kImpl; }

}  // namespace tandem::kernels::cpu

#else

namespace tandem::kernels::cpu {
const QGemmImpl* Avx2Impl() { return nullptr; }
}  // namespace tandem::kernels::cpu

#endif
