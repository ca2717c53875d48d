// A packed chunk's quants as 8 byte registers (the layout of kernels/qgemm.h),
// shared by the AVX-512 VNNI and AMX translation units (internal; include
// only from TUs compiled with -mavx512f -mavx512bw).
#ifndef TANDEM_KERNELS_CPU_QGEMM_UNPACK_AVX512_H_
#define TANDEM_KERNELS_CPU_QGEMM_UNPACK_AVX512_H_

#if defined(__x86_64__) && defined(__AVX512BW__)
#include <immintrin.h>

#include <cstdint>
#include <cstring>

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

}  // namespace tandem::kernels::cpu

#endif  // __x86_64__ && __AVX512BW__
#endif  // TANDEM_KERNELS_CPU_QGEMM_UNPACK_AVX512_H_
