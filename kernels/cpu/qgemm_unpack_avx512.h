// A packed chunk's quants as 8 byte registers and its scales as f32 (the
// layout of kernels/qgemm.h), shared by the AVX-512 VNNI and AMX translation units (internal;
// include only from TUs compiled with -mavx512f -mavx512bw).
#ifndef TANDEM_KERNELS_CPU_QGEMM_UNPACK_AVX512_H_
#define TANDEM_KERNELS_CPU_QGEMM_UNPACK_AVX512_H_

#if defined(__x86_64__) && defined(__AVX512BW__)
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/qgemm.h"

namespace tandem::kernels::cpu {

// wq[j] = the unsigned quants of columns 4j..4j+3 of the 16 rows, one byte
// each, for a chunk of kBits (4, 5, 6 or 8).
template <int kBits>
inline void UnpackChunk(const uint8_t* c, __m512i* wq) {
  static_assert(kBits == 4 || kBits == 5 || kBits == 6 || kBits == 8);
  if constexpr (kBits == 8) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) wq[j] = _mm512_loadu_si512(c + 64 * j);
  } else {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m512i p = _mm512_loadu_si512(c + 64 * j);
      wq[j] = _mm512_and_si512(p, low4);
      wq[4 + j] = _mm512_and_si512(_mm512_srli_epi16(p, 4), low4);
    }
#pragma GCC unroll 2
    for (int p = 0; p < kBits - 4; ++p) {
      const __m512i bit = _mm512_set1_epi8(static_cast<char>(16 << p));
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        uint64_t m;
        std::memcpy(&m, c + 256 + 64 * p + 8 * j, 8);
        wq[j] = _mm512_mask_add_epi8(wq[j], _cvtu64_mask64(m), wq[j], bit);
      }
    }
  }
}

// The chunk's scale words 0 and 1 of its 16 rows as f32 (kernels/qgemm.h):
// (d, m) for kF16 (m = 0 without a min), (D, M) for kF32, (D_lo, D_hi) for
// kF32Halves. sc: the chunk's scale bytes; sup: PackedWeight::super_scales
// (K types). The K products are exact, the values of PackedScaleAt.
template <ScaleFormat kFmt, bool kHasMin>
inline void ChunkScales(const uint8_t* sc, const float* sup, __m512* dv, __m512* mv) {
  auto small = [&](int i) {  // the 16 small scales of word i as f32
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + 16 * i));
    return _mm512_cvtepi32_ps(kFmt == ScaleFormat::kF32 ? _mm512_cvtepu8_epi32(v)
                                                        : _mm512_cvtepi8_epi32(v));
  };
  if constexpr (kFmt == ScaleFormat::kF16) {
    *dv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc)));
    *mv = kHasMin ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + 32)))
                  : _mm512_setzero_ps();
  } else if constexpr (kFmt == ScaleFormat::kF32) {
    *dv = _mm512_mul_ps(_mm512_loadu_ps(sup), small(0));
    *mv = _mm512_mul_ps(_mm512_loadu_ps(sup + 16), small(1));
  } else {
    const __m512 d = _mm512_loadu_ps(sup);
    *dv = _mm512_mul_ps(d, small(0));
    *mv = _mm512_mul_ps(d, small(1));
  }
}

}  // namespace tandem::kernels::cpu

#endif  // __x86_64__ && __AVX512BW__
#endif  // TANDEM_KERNELS_CPU_QGEMM_UNPACK_AVX512_H_
