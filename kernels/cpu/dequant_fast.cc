#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "kernels/cpu/simd.h"
#include "kernels/cpu/variant.h"
#include "kernels/quant.h"

namespace tandem::kernels {
TANDEM_KERNELS_VARIANT_BEGIN
namespace cpu {
using namespace ::tandem::kernels::cpu;  // simd.h, from a variant's namespace
namespace {

inline float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return Fp16ToFp32(h);
#endif
}

#if TANDEM_KERNELS_AVX512
void DequantQ8_0(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 34, dst += 32) {
    const __m512 d = _mm512_set1_ps(Half(src));
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 18));
    _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d));
    _mm512_storeu_ps(dst + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d));
  }
}

// Q4_0 (18 B: d, 16 B nibbles) and Q4_1 (20 B: d, m, 16 B nibbles): element j
// is the low nibble of byte j, element j + 16 the high nibble.
template <bool kHasMin>
void DequantQ4(const uint8_t* src, float* dst, int64_t n) {
  constexpr int kBlockBytes = kHasMin ? 20 : 18;
  constexpr int kQsOffset = kHasMin ? 4 : 2;
  const __m128i mask = _mm_set1_epi8(0x0F);
  for (int64_t b = 0; b < n / 32; ++b, src += kBlockBytes, dst += 32) {
    const __m512 d = _mm512_set1_ps(Half(src));
    [[maybe_unused]] const __m512 m = _mm512_set1_ps(kHasMin ? Half(src + 2) : 0.f);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + kQsOffset));
    const __m128i lo = _mm_and_si128(q, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    const __m512 flo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo));
    const __m512 fhi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi));
    if constexpr (kHasMin) {
      _mm512_storeu_ps(dst, _mm512_fmadd_ps(flo, d, m));
      _mm512_storeu_ps(dst + 16, _mm512_fmadd_ps(fhi, d, m));
    } else {
      // (q - 8) * d exactly as the scalar reference computes it.
      const __m512 eight = _mm512_set1_ps(8.f);
      _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_sub_ps(flo, eight), d));
      _mm512_storeu_ps(dst + 16, _mm512_mul_ps(_mm512_sub_ps(fhi, eight), d));
    }
  }
}

void DequantF16(const uint8_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(
        dst + i,
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * i))));
  }
  for (; i < n; ++i) dst[i] = Half(src + 2 * i);
}
// bf16 -> f32 is the 16 bits shifted up (exact).
void DequantBf16(const uint8_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * i));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
  if (i < n) DequantizeRow(gguf::TensorType::kBF16, src + 2 * i, dst + i, n - i);
}

template <gguf::TensorType kType>
float FusedDot(const uint8_t* src, const float* x, int64_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  const __m128i mask = _mm_set1_epi8(0x0F);
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    __m512 lo, hi;
    if constexpr (kType == gguf::TensorType::kQ8_0) {
      const __m512 d = _mm512_set1_ps(Half(src));
      const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2));
      const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 18));
      lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d);
      hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d);
      src += 34;
    } else {
      constexpr bool kHasMin = kType == gguf::TensorType::kQ4_1;
      const __m512 d = _mm512_set1_ps(Half(src));
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + (kHasMin ? 4 : 2)));
      const __m512 flo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q, mask)));
      const __m512 fhi =
          _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), mask)));
      if constexpr (kHasMin) {
        const __m512 m = _mm512_set1_ps(Half(src + 2));
        lo = _mm512_fmadd_ps(flo, d, m);
        hi = _mm512_fmadd_ps(fhi, d, m);
      } else {
        const __m512 eight = _mm512_set1_ps(8.f);
        lo = _mm512_mul_ps(_mm512_sub_ps(flo, eight), d);
        hi = _mm512_mul_ps(_mm512_sub_ps(fhi, eight), d);
      }
      src += kHasMin ? 20 : 18;
    }
    acc0 = _mm512_fmadd_ps(lo, _mm512_loadu_ps(x), acc0);
    acc1 = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + 16), acc1);
  }
  return Reduce16(_mm512_add_ps(acc0, acc1));
}
#else
// Without AVX-512 (exact either way): f16 eight at a time with F16C, bf16
// by the shift, which the compiler vectorizes.
void DequantF16(const uint8_t* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(
        dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i))));
  }
#endif
  for (; i < n; ++i) dst[i] = Half(src + 2 * i);
}

void DequantBf16(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    const uint32_t u = uint32_t(h) << 16;
    std::memcpy(dst + i, &u, 4);
  }
}
#endif

}  // namespace

bool FusedRowDot(gguf::TensorType type, const void* row, const float* x, int64_t n, float* out) {
#if TANDEM_KERNELS_AVX512
  const auto* p = static_cast<const uint8_t*>(row);
  switch (type) {
    case gguf::TensorType::kQ8_0:
      *out = FusedDot<gguf::TensorType::kQ8_0>(p, x, n);
      return true;
    case gguf::TensorType::kQ4_0:
      *out = FusedDot<gguf::TensorType::kQ4_0>(p, x, n);
      return true;
    case gguf::TensorType::kQ4_1:
      *out = FusedDot<gguf::TensorType::kQ4_1>(p, x, n);
      return true;
    default:
      return false;
  }
#else
  return false;
#endif
}

void DequantizeRowFast(gguf::TensorType type, const void* src, float* dst, int64_t n) {
  [[maybe_unused]] const auto* p = static_cast<const uint8_t*>(src);
  switch (type) {
    case gguf::TensorType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case gguf::TensorType::kF16:
      DequantF16(p, dst, n);
      return;
    case gguf::TensorType::kBF16:
      DequantBf16(p, dst, n);
      return;
#if TANDEM_KERNELS_AVX512
    case gguf::TensorType::kQ8_0:
      DequantQ8_0(p, dst, n);
      return;
    case gguf::TensorType::kQ4_0:
      DequantQ4<false>(p, dst, n);
      return;
    case gguf::TensorType::kQ4_1:
      DequantQ4<true>(p, dst, n);
      return;
#endif
    default:
      DequantizeRow(type, src, dst, n);
  }
}

}  // namespace cpu
TANDEM_KERNELS_VARIANT_END
}  // namespace tandem::kernels
