// f16 / bf16 conversions and the reference quantizers (ggml's
// quantize_row_*_ref rounding: truncation of x*id + 8.5 etc., roundf for
// Q8_0). FP contraction stays off so results match ggml and gguf-py exactly.
#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "common/status.h"
#include "kernels/quant.h"

// No FMA contraction: results must round like ggml's reference.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace tandem::kernels {
namespace {

using gguf::TensorType;

constexpr int kQK = 32;

void PutHalf(uint8_t* p, float f) {
  const uint16_t h = Fp32ToFp16(f);
  std::memcpy(p, &h, 2);
}

// The value of largest magnitude (the first one on ties), sign kept.
float SignedAbsMax(const float* x) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void MinMax(const float* x, float* min, float* max) {
  *min = FLT_MAX;
  *max = -FLT_MAX;
  for (int j = 0; j < kQK; ++j) {
    *min = std::min(*min, x[j]);
    *max = std::max(*max, x[j]);
  }
}

void QuantQ4_0(const float* x, uint8_t* b) {
  const float d = SignedAbsMax(x) / -8;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  PutHalf(b, d);
  for (int j = 0; j < kQK / 2; ++j) {
    const int x0 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
    const int x1 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f)));
    b[2 + j] = static_cast<uint8_t>(x0 | (x1 << 4));
  }
}

void QuantQ4_1(const float* x, uint8_t* b) {
  float min, max;
  MinMax(x, &min, &max);
  const float d = (max - min) / 15;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  PutHalf(b, d);
  PutHalf(b + 2, min);
  for (int j = 0; j < kQK / 2; ++j) {
    const int x0 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - min) * id + 0.5f)));
    const int x1 =
        std::min(15, static_cast<int>(static_cast<int8_t>((x[j + 16] - min) * id + 0.5f)));
    b[4 + j] = static_cast<uint8_t>(x0 | (x1 << 4));
  }
}

void QuantQ5_0(const float* x, uint8_t* b) {
  const float d = SignedAbsMax(x) / -16;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  PutHalf(b, d);
  uint32_t qh = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    const int x0 = std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f)));
    const int x1 = std::min(31, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 16.5f)));
    b[6 + j] = static_cast<uint8_t>((x0 & 0x0F) | ((x1 & 0x0F) << 4));
    qh |= static_cast<uint32_t>((x0 & 0x10) >> 4) << j;
    qh |= static_cast<uint32_t>((x1 & 0x10) >> 4) << (j + 16);
  }
  std::memcpy(b + 2, &qh, 4);
}

void QuantQ5_1(const float* x, uint8_t* b) {
  float min, max;
  MinMax(x, &min, &max);
  const float d = (max - min) / 31;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  PutHalf(b, d);
  PutHalf(b + 2, min);
  uint32_t qh = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    const int x0 = std::min(31, static_cast<int>(static_cast<uint8_t>((x[j] - min) * id + 0.5f)));
    const int x1 =
        std::min(31, static_cast<int>(static_cast<uint8_t>((x[j + 16] - min) * id + 0.5f)));
    b[8 + j] = static_cast<uint8_t>((x0 & 0x0F) | ((x1 & 0x0F) << 4));
    qh |= static_cast<uint32_t>((x0 & 0x10) >> 4) << j;
    qh |= static_cast<uint32_t>((x1 & 0x10) >> 4) << (j + 16);
  }
  std::memcpy(b + 4, &qh, 4);
}

void QuantQ8_0(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  PutHalf(b, d);
  for (int j = 0; j < kQK; ++j) {
    b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(x[j] * id)));
  }
}

}  // namespace

float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in f32.
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign != 0 ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t Fp32ToFp16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t abs = x & 0x7FFFFFFF;
  if (abs > 0x7F800000) return sign | 0x7E00 | static_cast<uint16_t>((abs >> 13) & 0x3FF);
  // 65520 = halfway between the largest half (65504) and 2^16 rounds to inf.
  if (abs >= 0x477FF000) return sign | 0x7C00;
  const uint32_t e = abs >> 23;
  if (abs < 0x38800000) {      // below 2^-14: a half subnormal (or zero)
    if (e < 102) return sign;  // below 2^-25: rounds to zero
    const uint32_t mant = (abs & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - e;  // value / 2^-24 = mant >> shift
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  uint32_t h = (abs - 0x38000000) >> 13;  // rebias 127 -> 15, keep 10 mantissa bits
  const uint32_t rem = abs & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;  // a carry into the exponent is right
  return sign | static_cast<uint16_t>(h);
}

float Bf16ToFp32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t Fp32ToBf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((x >> 16) | 64);  // quiet NaN
  return static_cast<uint16_t>((x + (0x7FFF + ((x >> 16) & 1))) >> 16);
}

bool IsQuantizable(TensorType type) {
  switch (type) {
    case TensorType::kF32:
    case TensorType::kF16:
    case TensorType::kBF16:
    case TensorType::kQ4_0:
    case TensorType::kQ4_1:
    case TensorType::kQ5_0:
    case TensorType::kQ5_1:
    case TensorType::kQ8_0:
      return true;
    default:
      return false;
  }
}

void QuantizeRow(TensorType type, const float* src, void* dst, int64_t n) {
  TANDEM_CHECK(IsQuantizable(type));
  TANDEM_CHECK(n >= 0);
  auto* out = static_cast<uint8_t*>(dst);
  void (*block_fn)(const float*, uint8_t*) = nullptr;
  int type_size = 0;
  switch (type) {
    case TensorType::kF32:
      std::memcpy(out, src, static_cast<size_t>(n) * 4);
      return;
    case TensorType::kF16:
      for (int64_t i = 0; i < n; ++i) PutHalf(out + 2 * i, src[i]);
      return;
    case TensorType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = Fp32ToBf16(src[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case TensorType::kQ4_0:
      block_fn = QuantQ4_0, type_size = 18;
      break;
    case TensorType::kQ4_1:
      block_fn = QuantQ4_1, type_size = 20;
      break;
    case TensorType::kQ5_0:
      block_fn = QuantQ5_0, type_size = 22;
      break;
    case TensorType::kQ5_1:
      block_fn = QuantQ5_1, type_size = 24;
      break;
    case TensorType::kQ8_0:
      block_fn = QuantQ8_0, type_size = 34;
      break;
    default:
      TANDEM_CHECK(false);
  }
  TANDEM_CHECK(n % kQK == 0);
  for (int64_t i = 0; i < n / kQK; ++i) block_fn(src + i * kQK, out + i * type_size);
}

}  // namespace tandem::kernels
