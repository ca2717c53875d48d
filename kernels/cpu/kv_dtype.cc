// KV cache element types: names, FP8 e4m3, per-head quantization.
#include "kernels/kv_dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/simd.h"
#include "kernels/cpu/variant.h"
#include "kernels/quant.h"

namespace tandem::kernels {

#if TANDEM_KERNELS_VARIANT_PRIMARY
namespace {
constexpr const char* kNames[] = {"f32", "f16", "bf16", "int8", "fp8"};
}  // namespace

bool ParseKvDtype(std::string_view s, KvDtype* dtype) {
  for (int i = 0; i < 5; ++i) {
    if (s == kNames[i]) {
      *dtype = static_cast<KvDtype>(i);
      return true;
    }
  }
  return false;
}

const char* KvDtypeName(KvDtype dtype) {
  const int i = static_cast<int>(dtype);
  return i >= 0 && i < 5 ? kNames[i] : "?";
}

std::string KvDtypeChoices() { return "f32|f16|bf16|int8|fp8"; }

float Fp8E4m3ToFp32(uint8_t b) {
  const int e = (b >> 3) & 0xf, m = b & 7;
  const float a = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(1.f + m / 8.f, e - 7);
  return (b & 0x80) ? -a : a;
}

uint8_t Fp32ToFp8E4m3(float f) {
  if (std::isnan(f)) return 0;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  if (a >= 448.f) return sign | 0x7e;
  if (a < 0.015625f) {  // below the smallest normal 2^-6: subnormal steps of 2^-9
    // 8 (a carry into the smallest normal) is encoded correctly as 0x08.
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.f));
  }
  // Round the f32 mantissa to 3 bits, to nearest even, on the bits: a carry
  // out of the mantissa increments the exponent, as it should.
  uint32_t u;
  std::memcpy(&u, &a, 4);
  u += 0x7ffffu + ((u >> 20) & 1u);
  const int bits = std::min<int>(((int(u >> 23) - 127 + 7) << 3) | int((u >> 20) & 7u), 0x7e);
  return sign | static_cast<uint8_t>(bits);
}

#endif  // TANDEM_KERNELS_VARIANT_PRIMARY

TANDEM_KERNELS_VARIANT_BEGIN

namespace {
// fp8's relative step does not depend on the scale (above its subnormals),
// so among the codes of one octave from the round-up `first` this picks the
// one that stores the head's largest value most exactly (the first of
// equals): a head's largest |value| is the one that weighs most in its dot
// products.
KvScale Fp8ScaleForMax(float amax, KvScale first) {
  KvScale best = first;
  float best_err = INFINITY;
  for (int c = first; c < first + 8 && c < kKvScaleNan; ++c) {
    const float v = amax * (1.f / KvScaleToFp32(KvScale(c)));
    const float err = std::fabs(Fp8E4m3ToFp32(Fp32ToFp8E4m3(v)) - v) / v;
    if (err < best_err) best = KvScale(c), best_err = err;
    if (err == 0.f) break;
  }
  return best;
}

// d[i] = Fp32ToFp8E4m3(x[i] * inv), 16 lanes at a time on AVX-512 (the same
// rounding, bit for bit).
void QuantizeFp8Row(const float* x, int64_t n, float inv, uint8_t* d) {
  int64_t i = 0;
#if TANDEM_KERNELS_AVX512
  const __m512 vinv = _mm512_set1_ps(inv);
  for (; i + 16 <= n; i += 16) {
    const __m512 y = _mm512_mul_ps(_mm512_loadu_ps(x + i), vinv);
    const __m512i sign = _mm512_srli_epi32(
        _mm512_and_si512(_mm512_castps_si512(y), _mm512_set1_epi32(INT32_MIN)), 24);
    const __m512 a = _mm512_min_ps(_mm512_abs_ps(y), _mm512_set1_ps(448.f));
    const __m512i u = _mm512_castps_si512(a);
    const __m512i r = _mm512_add_epi32(
        u, _mm512_add_epi32(_mm512_set1_epi32(0x7ffff),
                            _mm512_and_si512(_mm512_srli_epi32(u, 20), _mm512_set1_epi32(1))));
    __m512i normal = _mm512_or_si512(
        _mm512_slli_epi32(_mm512_sub_epi32(_mm512_srli_epi32(r, 23), _mm512_set1_epi32(120)), 3),
        _mm512_and_si512(_mm512_srli_epi32(r, 20), _mm512_set1_epi32(7)));
    normal = _mm512_min_epi32(normal, _mm512_set1_epi32(0x7e));
    const __m512i sub = _mm512_cvt_roundps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(512.f)),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __mmask16 tiny = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.015625f), _CMP_LT_OQ);
    const __m512i code = _mm512_or_si512(_mm512_mask_mov_epi32(normal, tiny, sub), sign);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm512_cvtepi32_epi8(code));
  }
#endif
  for (; i < n; ++i) d[i] = Fp32ToFp8E4m3(x[i] * inv);
}
}  // namespace

KvScale QuantizeKvHead(KvDtype dtype, const float* x, int64_t n, void* dst) {
  switch (dtype) {
    case KvDtype::kF32:
      std::memcpy(dst, x, n * sizeof(float));
      return kKvScaleOne;
    case KvDtype::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      int64_t i = 0;
#if TANDEM_KERNELS_AVX512
      // vcvtps2ph rounds to nearest even and overflows to inf, as Fp32ToFp16.
      for (; i + 16 <= n; i += 16) {
        _mm256_storeu_si256(
            reinterpret_cast<__m256i*>(d + i),
            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
#endif
      for (; i < n; ++i) d[i] = Fp32ToFp16(x[i]);
      return kKvScaleOne;
    }
    case KvDtype::kBf16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = Fp32ToBf16(x[i]);
      return kKvScaleOne;
    }
    case KvDtype::kInt8:
    case KvDtype::kFp8: {
      // std::max drops a NaN, so x * 0 (NaN for NaN and +-inf) marks them.
      float amax = 0.f, poison = 0.f;
      for (int64_t i = 0; i < n; ++i) {
        amax = std::max(amax, std::fabs(x[i]));
        poison += x[i] * 0.f;
      }
      if (poison != 0.f) amax = NAN;
      if (!(amax > 0.f) || !std::isfinite(amax)) {
        // All zero (or a non-finite row, which no finite scale can hold):
        // stored as zeros with the smallest scale for zero rows, NaN
        // otherwise so the corruption is not hidden.
        std::memset(dst, 0, static_cast<size_t>(std::max<int64_t>(n, 0)));
        return amax > 0.f || std::isnan(amax) ? kKvScaleNan : KvScale{0};
      }
      // The scale rounded up to its stored code, and the values divided by
      // what is stored (times its reciprocal), so none goes past the range.
      KvScale code = KvScaleCeil(amax / (dtype == KvDtype::kInt8 ? 127.f : 448.f));
      if (dtype == KvDtype::kFp8) code = Fp8ScaleForMax(amax, code);
      const float inv = 1.f / KvScaleToFp32(code);
      if (dtype == KvDtype::kInt8) {
        auto* d = static_cast<int8_t*>(dst);
        for (int64_t i = 0; i < n; ++i) {
          d[i] = static_cast<int8_t>(std::clamp(std::nearbyint(x[i] * inv), -127.f, 127.f));
        }
        return code;
      }
      QuantizeFp8Row(x, n, inv, static_cast<uint8_t*>(dst));
      return code;
    }
  }
  return kKvScaleOne;
}

void DequantizeKvHead(KvDtype dtype, const void* src, KvScale scale_code, int64_t n, float* dst) {
  const float scale = KvScaleToFp32(scale_code);
  switch (dtype) {
    case KvDtype::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case KvDtype::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = Fp16ToFp32(static_cast<const uint16_t*>(src)[i]);
      return;
    case KvDtype::kBf16:
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFp32(static_cast<const uint16_t*>(src)[i]);
      return;
    case KvDtype::kInt8:
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<const int8_t*>(src)[i] * scale;
      return;
    case KvDtype::kFp8:
      for (int64_t i = 0; i < n; ++i) {
        dst[i] = Fp8E4m3ToFp32(static_cast<const uint8_t*>(src)[i]) * scale;
      }
      return;
  }
}

TANDEM_KERNELS_VARIANT_END
}  // namespace tandem::kernels
