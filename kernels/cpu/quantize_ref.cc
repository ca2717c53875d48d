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

// ---- K-quants (QK_K = 256): the algorithm of ggml's quantize_row_q{4,5,6}_K_ref.

// Round to nearest, ties to even (ggml's nearest_int for |x| < 2^22).
int NearestInt(float x) { return static_cast<int>(std::nearbyintf(x)); }

// Affine fit of 32 values to L in [0, nmax] with x ~ scale * L - min, min >= 0
// (ggml's make_qkx2_quants, squared error weighted by `w`): the plain min/max
// fit, then `nstep + 1` trial scales around it, each refitted by weighted
// least squares; the best one wins.
float FitAffine(int n, int nmax, const float* x, const float* w, uint8_t* L, float* the_min,
                float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0];
  float sum_w = w[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, 0);
    *the_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(std::clamp(NearestInt(iscale * (x[i] - min)), 0, nmax));
    const float diff = scale * L[i] + min - x[i];
    best += w[i] * (diff * diff);
  }
  uint8_t trial[32];
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(NearestInt(iscale * (x[i] - min)), 0, nmax);
      trial[i] = static_cast<uint8_t>(l);
      sum_l += w[i] * l;
      sum_l2 += w[i] * l * l;
      sum_xl += w[i] * l * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det <= 0) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (this_min > 0) {
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    float err = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = this_scale * trial[i] + this_min - x[i];
      err += w[i] * (diff * diff);
    }
    if (err < best) {
      std::copy(trial, trial + n, L);
      best = err;
      scale = this_scale;
      min = this_min;
    }
  }
  *the_min = -min;
  return scale;
}

// Symmetric fit of n values to L in [-nmax, nmax - 1] weighted by x^2
// (ggml's make_qx_quants with rmse_type 1): 19 trial scales around
// max / -nmax, each refitted by least squares. Returns the scale; L is
// stored offset by nmax.
float FitSymmetric(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < 1e-15f) {
    std::fill(L, L + n, 0);
    return 0.f;
  }
  auto fit = [&](float iscale, float* sumlx, float* suml2) {
    *sumlx = *suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(NearestInt(iscale * x[i]), -nmax, nmax - 1);
      const float w = x[i] * x[i];
      *sumlx += w * x[i] * l;
      *suml2 += w * l * l;
    }
  };
  auto assign = [&](float iscale) {
    for (int i = 0; i < n; ++i) {
      L[i] = static_cast<int8_t>(nmax + std::clamp(NearestInt(iscale * x[i]), -nmax, nmax - 1));
    }
  };
  float iscale = -nmax / max;
  float sumlx, suml2;
  fit(iscale, &sumlx, &suml2);
  assign(iscale);
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    fit(iscale, &sumlx, &suml2);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      assign(iscale);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Q4_K / Q5_K share everything but the bit width (nmax 15 / 31) and the
// search grid (ggml: rmin -1 / -0.5, 20 / 15 steps).
void QuantSuperBlockK(const float* x, int nmax, float rmin, int nstep, uint8_t* header,
                      uint8_t* L) {
  float scales[8], mins[8], w[32];
  uint8_t* scales_out = header + 4;
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) w[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = FitAffine(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], rmin, 0.1f, nstep);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  std::memset(scales_out, 0, 12);
  for (int j = 0; j < 8; ++j) {
    const int ls =
        std::min(63, static_cast<int>(static_cast<uint8_t>(NearestInt(inv_scale * scales[j]))));
    const int lm =
        std::min(63, static_cast<int>(static_cast<uint8_t>(NearestInt(inv_min * mins[j]))));
    if (j < 4) {
      scales_out[j] = static_cast<uint8_t>(ls);
      scales_out[j + 4] = static_cast<uint8_t>(lm);
    } else {
      scales_out[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      scales_out[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      scales_out[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  PutHalf(header, max_scale / 63.f);
  PutHalf(header + 2, max_min / 63.f);
  // Requantize against the 6-bit scales actually stored.
  const float d_all = Fp16ToFp32(static_cast<uint16_t>(header[0] | (header[1] << 8)));
  const float dmin_all = Fp16ToFp32(static_cast<uint16_t>(header[2] | (header[3] << 8)));
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    if (j < 4) {
      sc = scales_out[j] & 63;
      m = scales_out[j + 4] & 63;
    } else {
      sc = (scales_out[j + 4] & 0x0F) | ((scales_out[j - 4] >> 6) << 4);
      m = (scales_out[j + 4] >> 4) | ((scales_out[j] >> 6) << 4);
    }
    const float d = d_all * static_cast<float>(sc);
    if (d == 0.0f) continue;
    const float dm = dmin_all * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) {
      L[32 * j + l] =
          static_cast<uint8_t>(std::clamp(NearestInt((x[32 * j + l] + dm) / d), 0, nmax));
    }
  }
}

// Q4_K block: d, dmin, scales[12], qs[128].
void QuantQ4_K(const float* x, uint8_t* b) {
  uint8_t L[kQKK];
  QuantSuperBlockK(x, 15, -1.f, 20, b, L);
  uint8_t* q = b + 16;
  for (int j = 0; j < kQKK; j += 64, q += 32) {
    for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
  }
}

// Q5_K block: d, dmin, scales[12], qh[32], qs[128].
void QuantQ5_K(const float* x, uint8_t* b) {
  uint8_t L[kQKK];
  QuantSuperBlockK(x, 31, -0.5f, 15, b, L);
  uint8_t* qh = b + 16;
  uint8_t* ql = b + 48;
  std::memset(qh, 0, 32);
  for (int n = 0, k = 0; n < kQKK; n += 64, k += 2, ql += 32) {
    for (int j = 0; j < 32; ++j) {
      const int l1 = L[n + j], l2 = L[n + j + 32];
      qh[j] |= static_cast<uint8_t>(((l1 >> 4) << k) | ((l2 >> 4) << (k + 1)));
      ql[j] = static_cast<uint8_t>((l1 & 0xF) | ((l2 & 0xF) << 4));
    }
  }
}

// Q6_K block: ql[128], qh[64], scales[16] (int8), d.
void QuantQ6_K(const float* x, uint8_t* b) {
  int8_t L[kQKK];
  float scales[16];
  float max_scale = 0, max_abs_scale = 0;
  for (int ib = 0; ib < 16; ++ib) {
    scales[ib] = FitSymmetric(16, 32, x + 16 * ib, L + 16 * ib);
    if (std::fabs(scales[ib]) > max_abs_scale) {
      max_abs_scale = std::fabs(scales[ib]);
      max_scale = scales[ib];
    }
  }
  std::memset(b, 0, 210);
  if (max_abs_scale < 1e-15f) return;  // all zero (d = +0)
  auto* sc = reinterpret_cast<int8_t*>(b + 192);
  const float iscale = -128.f / max_scale;
  PutHalf(b + 208, 1 / iscale);
  for (int ib = 0; ib < 16; ++ib) {
    sc[ib] = static_cast<int8_t>(std::min(127, NearestInt(iscale * scales[ib])));
  }
  const float d_all = Fp16ToFp32(static_cast<uint16_t>(b[208] | (b[209] << 8)));
  for (int j = 0; j < 16; ++j) {
    const float d = d_all * static_cast<float>(sc[j]);
    if (d == 0.0f) continue;
    for (int i = 0; i < 16; ++i) {
      L[16 * j + i] = static_cast<int8_t>(std::clamp(NearestInt(x[16 * j + i] / d), -32, 31) + 32);
    }
  }
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  for (int j = 0; j < kQKK; j += 128, ql += 64, qh += 32) {
    for (int l = 0; l < 32; ++l) {
      const int q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
      ql[l] = static_cast<uint8_t>((q1 & 0xF) | ((q3 & 0xF) << 4));
      ql[l + 32] = static_cast<uint8_t>((q2 & 0xF) | ((q4 & 0xF) << 4));
      qh[l] =
          static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
    }
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
    case TensorType::kQ4_K:
    case TensorType::kQ5_K:
    case TensorType::kQ6_K:
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
  int block = kQK;
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
    case TensorType::kQ4_K:
      block_fn = QuantQ4_K, type_size = 144, block = kQKK;
      break;
    case TensorType::kQ5_K:
      block_fn = QuantQ5_K, type_size = 176, block = kQKK;
      break;
    case TensorType::kQ6_K:
      block_fn = QuantQ6_K, type_size = 210, block = kQKK;
      break;
    default:
      TANDEM_CHECK(false);
  }
  TANDEM_CHECK(n % block == 0);
  for (int64_t i = 0; i < n / block; ++i) block_fn(src + i * block, out + i * type_size);
}

}  // namespace tandem::kernels
