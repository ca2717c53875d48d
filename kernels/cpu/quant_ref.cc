// Scalar dequantization of the ggml block formats. The arithmetic order
// (scale products first, then q * scale - min) follows ggml's
// dequantize_row_* and gguf-py so results are bit-identical; FP contraction
// is off so no FMA changes the rounding.
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

inline float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return Fp16ToFp32(h);
}

// Low nibbles hold elements [0, 16), high nibbles [16, 32).
void DequantQ4_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
    y[j + kQK / 2] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

void DequantQ4_1(const uint8_t* b, float* y) {
  const float d = Half(b);
  const float m = Half(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
    y[j + kQK / 2] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// qh bit j is the fifth bit of element j.
void DequantQ5_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < kQK / 2; ++j) {
    const int x0 = (qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
    const int x1 = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
    y[j] = static_cast<float>(x0 - 16) * d;
    y[j + kQK / 2] = static_cast<float>(x1 - 16) * d;
  }
}

void DequantQ5_1(const uint8_t* b, float* y) {
  const float d = Half(b);
  const float m = Half(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < kQK / 2; ++j) {
    const int x0 = (qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
    const int x1 = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
    y[j] = static_cast<float>(x0) * d + m;
    y[j + kQK / 2] = static_cast<float>(x1) * d + m;
  }
}

void DequantQ8_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin.
// Element 128*h + 32*s + l uses 2-bit field s of qs[32*h + l] and the scale
// of its 16-element group.
void DequantQ2_K(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = Half(b + 80);
  const float dmin = Half(b + 82);
  for (int i = 0; i < kQKK; ++i) {
    const int h = i / 128, s = (i / 32) % 4, l = i % 32;
    const uint8_t sc = scales[i / 16];
    const float dl = d * static_cast<float>(sc & 0x0F);
    const float ml = dmin * static_cast<float>(sc >> 4);
    const int q = (qs[32 * h + l] >> (2 * s)) & 3;
    y[i] = dl * static_cast<float>(q) - ml;
  }
}

// Q3_K: hmask[32], qs[64], scales[12] (16 6-bit signed scales), d.
// The high bit of element 32*k + l is bit k of hmask[l]; a clear bit means
// subtract 4.
void DequantQ3_K(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = Half(b + 108);
  int8_t scales[16];
  for (int j = 0; j < 16; ++j) {
    const int low = (sc[j % 8] >> (4 * (j / 8))) & 0x0F;
    const int high = (sc[8 + j % 4] >> (2 * (j / 4))) & 0x03;
    scales[j] = static_cast<int8_t>((low | (high << 4)) - 32);
  }
  for (int i = 0; i < kQKK; ++i) {
    const int h = i / 128, s = (i / 32) % 4, l = i % 32;
    const int low = (qs[32 * h + l] >> (2 * s)) & 3;
    const int hbit = (hmask[l] >> (i / 32)) & 1;
    const int q = low - (hbit ? 0 : 4);
    const float dl = d * static_cast<float>(scales[i / 16]);
    y[i] = dl * static_cast<float>(q);
  }
}

// The 12-byte packed scales of Q4_K / Q5_K: 8 (scale, min) pairs of 6 bits.
void ScaleMinK4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q4_K: d, dmin, scales[12], qs[128]. Sub-block j (32 elements) uses the low
// (even j) or high (odd j) nibbles of qs[32*(j/2) .. +32).
void DequantQ4_K(const uint8_t* b, float* y) {
  const float d = Half(b);
  const float dmin = Half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    ScaleMinK4(j, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc);
    const float m1 = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      y[32 * j + l] = d1 * static_cast<float>((q[l] >> shift) & 0x0F) - m1;
    }
  }
}

// Q5_K: d, dmin, scales[12], qh[32], qs[128]; bit j of qh[l] is the fifth bit
// of element 32*j + l.
void DequantQ5_K(const uint8_t* b, float* y) {
  const float d = Half(b);
  const float dmin = Half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    ScaleMinK4(j, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc);
    const float m1 = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      const int v = ((q[l] >> shift) & 0x0F) | (((qh[l] >> j) & 1) << 4);
      y[32 * j + l] = d1 * static_cast<float>(v) - m1;
    }
  }
}

// Q6_K: ql[128], qh[64], scales[16] (int8), d. Element 128*h + 32*s + l takes
// its low nibble from ql[64*h + 32*(s%2) + l] (high nibble when s >= 2) and
// bits 2s..2s+1 of qh[32*h + l].
void DequantQ6_K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = Half(b + 208);
  for (int i = 0; i < kQKK; ++i) {
    const int h = i / 128, s = (i / 32) % 4, l = i % 32;
    const int low = (ql[64 * h + 32 * (s % 2) + l] >> (4 * (s / 2))) & 0x0F;
    const int high = (qh[32 * h + l] >> (2 * s)) & 3;
    const int q = (low | (high << 4)) - 32;
    const float dl = d * static_cast<float>(scales[i / 16]);
    y[i] = dl * static_cast<float>(q);
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

void ForEachBlock(BlockFn fn, int block_size, int type_size, const uint8_t* src, float* dst,
                  int64_t n) {
  TANDEM_CHECK(n % block_size == 0);
  for (int64_t i = 0; i < n / block_size; ++i) fn(src + i * type_size, dst + i * block_size);
}

}  // namespace

void DequantizeRow(TensorType type, const void* src, float* dst, int64_t n) {
  TANDEM_CHECK(n >= 0);
  const auto* p = static_cast<const uint8_t*>(src);
  switch (type) {
    case TensorType::kF32:
      std::memcpy(dst, p, static_cast<size_t>(n) * 4);
      return;
    case TensorType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = Half(p + 2 * i);
      return;
    case TensorType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = Bf16ToFp32(h);
      }
      return;
    case TensorType::kQ4_0:
      return ForEachBlock(DequantQ4_0, kQK, 18, p, dst, n);
    case TensorType::kQ4_1:
      return ForEachBlock(DequantQ4_1, kQK, 20, p, dst, n);
    case TensorType::kQ5_0:
      return ForEachBlock(DequantQ5_0, kQK, 22, p, dst, n);
    case TensorType::kQ5_1:
      return ForEachBlock(DequantQ5_1, kQK, 24, p, dst, n);
    case TensorType::kQ8_0:
      return ForEachBlock(DequantQ8_0, kQK, 34, p, dst, n);
    case TensorType::kQ2_K:
      return ForEachBlock(DequantQ2_K, kQKK, 84, p, dst, n);
    case TensorType::kQ3_K:
      return ForEachBlock(DequantQ3_K, kQKK, 110, p, dst, n);
    case TensorType::kQ4_K:
      return ForEachBlock(DequantQ4_K, kQKK, 144, p, dst, n);
    case TensorType::kQ5_K:
      return ForEachBlock(DequantQ5_K, kQKK, 176, p, dst, n);
    case TensorType::kQ6_K:
      return ForEachBlock(DequantQ6_K, kQKK, 210, p, dst, n);
    default:
      break;
  }
  TANDEM_CHECK(false && "DequantizeRow: type is not dequantizable");
}

}  // namespace tandem::kernels
