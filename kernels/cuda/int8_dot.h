// Two-level int8 activations for the CUDA Gemv (GemvInt8), as code that
// compiles both for the device (nvcc) and for the host (the tests check it
// there against the CPU's QGemm without a GPU).
//
// The arithmetic is the CPU fast path's (kernels/qgemm.h), step for step:
//  - a token's 32-column block x is quantized like QuantizeActs with two
//    levels: dx = max|x| / 127, qx = rne(x / dx) clamped to +-127, the
//    residual r = fma(-dx, qx, x) again on the grid e = dx / 256
//    (qx2 = rne(r * 256 / dx)), so x ~ e * (256 qx + qx2); with
//    s = 256 sum(qx) + sum(qx2);
//  - one weight block gives the exact int32 isum = 256 dot(q, qx) +
//    dot(q, qx2) (16 dp4a on the GPU), then one f32 step:
//      Q4_0: acc = fma(float(isum - 8 s), d * e, acc)
//      Q4_1: acc = fma(float(isum), d * e, fma(m, e * float(s), acc))
//      Q8_0: acc = fma(float(isum), d * e, acc)
//    (d, m: the block's f16 scale and min as f32).
// So every block's contribution is bit-equal to the CPU's for the same
// weights and x; only the order in which the blocks of a row are summed
// differs (the GPU sums lane-strided partials, then a butterfly).
//
// Quant order: a planar Q4 block (kernels/cuda/common.cuh) holds weights
// 8k + 2i and 8k + 2i + 1 in the low and high nibble of byte i of word k,
// so `word & 0x0F0F0F0F` is the even weights of word k and
// `(word >> 4) & 0x0F0F0F0F` the odd ones: the activation quants are stored
// in that order (word 2k: x[8k], x[8k+2], x[8k+4], x[8k+6]; word 2k + 1: the
// odd ones). Q8_0 keeps the natural order.
#ifndef TANDEM_KERNELS_CUDA_INT8_DOT_H_
#define TANDEM_KERNELS_CUDA_INT8_DOT_H_

#include <cmath>
#include <cstdint>

#include "kernels/quant.h"

#if defined(__CUDACC__)
#define TANDEM_HD __host__ __device__ __forceinline__
#define TANDEM_UNROLL _Pragma("unroll")
#else
#define TANDEM_HD inline
#define TANDEM_UNROLL
#endif

namespace tandem::kernels::cuda::i8 {

// The GGUF type ids of the planar types (kernels/cuda/common.cuh's kType*).
constexpr int kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8;

// Bytes of shared memory per token and 32-column block: both levels' quants
// (64) plus e (f32) and s (int32).
constexpr int kBytesPerBlock = 64 + 8;

// f32 steps with exactly one rounding each (no contraction on either side:
// the device uses the _rn intrinsics, the host build is ISO C++ with
// -ffp-contract=off).
TANDEM_HD float MulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TANDEM_HD float DivRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
TANDEM_HD float Fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
TANDEM_HD float RoundEven(float v) {
#if defined(__CUDA_ARCH__)
  return rintf(v);
#else
  return std::nearbyint(v);  // the default rounding mode: to nearest even
#endif
}
TANDEM_HD float HalfBits(uint32_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
#else
  return Fp16ToFp32(static_cast<uint16_t>(h));
#endif
}
// Four signed byte products summed into c (the dp4a instruction).
TANDEM_HD int32_t Dp4a(uint32_t a, uint32_t b, int32_t c) {
#if defined(__CUDA_ARCH__)
  return __dp4a(static_cast<int>(a), static_cast<int>(b), c);
#else
  for (int k = 0; k < 4; ++k) {
    c += int32_t(int8_t(uint8_t(a >> (8 * k)))) * int32_t(int8_t(uint8_t(b >> (8 * k))));
  }
  return c;
#endif
}

// Where weight j (0..31) of a block sits in the dp4a operand order.
template <int kType>
TANDEM_HD int Slot(int j) {
  if constexpr (kType == kQ8_0) {
    return j;
  } else {
    return 8 * (j / 8) + 4 * (j % 2) + (j % 8) / 2;
  }
}

// One token's 32-column block, two levels, quants in the order of kType.
struct ActBlock {
  uint32_t q1[8];
  uint32_t q2[8];
  float e;    // dx / 256
  int32_t s;  // 256 sum(qx) + sum(qx2)
};

TANDEM_HD float Clamp127(float v) { return fminf(127.f, fmaxf(-127.f, v)); }

// QuantizeActs' two-level rule (kernels/cpu/qgemm_pack.cc QuantizeRowRef).
template <int kType>
TANDEM_HD void QuantizeBlock(const float* x, ActBlock* out) {
  float amax = 0.f;
  TANDEM_UNROLL
  for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(x[i]));
  const float dx = DivRn(amax, 127.f);
  const float id = dx != 0.f ? DivRn(1.f, dx) : 0.f;
  const float id2 = MulRn(id, 256.f);
  int32_t sum1 = 0, sum2 = 0;
  TANDEM_UNROLL
  for (int w = 0; w < 8; ++w) out->q1[w] = out->q2[w] = 0;
  TANDEM_UNROLL
  for (int i = 0; i < 32; ++i) {
    const float v = Clamp127(RoundEven(MulRn(x[i], id)));
    const float r = Fma(-dx, v, x[i]);
    const float v2 = Clamp127(RoundEven(MulRn(r, id2)));
    const int32_t a = static_cast<int32_t>(v), b = static_cast<int32_t>(v2);
    sum1 += a;
    sum2 += b;
    const int p = Slot<kType>(i);
    out->q1[p / 4] |= uint32_t(uint8_t(int8_t(a))) << (8 * (p % 4));
    out->q2[p / 4] |= uint32_t(uint8_t(int8_t(b))) << (8 * (p % 4));
  }
  out->e = MulRn(dx, 1.f / 256.f);
  out->s = sum1 * 256 + sum2;
}

// Quant words of one planar block: 4 (Q4) or 8 (Q8_0).
template <int kType>
constexpr int QuantWords() {
  return kType == kQ8_0 ? 8 : 4;
}

// isum = 256 dot(q, qx) + dot(q, qx2) over one block, exact in int32 (Q4
// quants unsigned 0..15: the offset is applied in BlockStep).
template <int kType>
TANDEM_HD int32_t BlockDot(const uint32_t* wq, const uint32_t* x1, const uint32_t* x2) {
  int32_t i1 = 0, i2 = 0;
  if constexpr (kType == kQ8_0) {
    TANDEM_UNROLL
    for (int k = 0; k < 8; ++k) {
      i1 = Dp4a(wq[k], x1[k], i1);
      i2 = Dp4a(wq[k], x2[k], i2);
    }
  } else {
    TANDEM_UNROLL
    for (int k = 0; k < 4; ++k) {
      const uint32_t lo = wq[k] & 0x0F0F0F0Fu, hi = (wq[k] >> 4) & 0x0F0F0F0Fu;
      i1 = Dp4a(lo, x1[2 * k], i1);
      i1 = Dp4a(hi, x1[2 * k + 1], i1);
      i2 = Dp4a(lo, x2[2 * k], i2);
      i2 = Dp4a(hi, x2[2 * k + 1], i2);
    }
  }
  return i1 * 256 + i2;
}

// acc after one block (see the top of this file). `scale`: the planar
// scale word (f16 d, or d | m << 16 for Q4_1).
template <int kType>
TANDEM_HD float BlockStep(int32_t isum, uint32_t scale, float e, int32_t s, float acc) {
  const float ddx = MulRn(HalfBits(scale & 0xFFFFu), e);
  if constexpr (kType == kQ4_0) {
    return Fma(static_cast<float>(isum - 8 * s), ddx, acc);
  } else if constexpr (kType == kQ4_1) {
    const float sd = MulRn(e, static_cast<float>(s));
    return Fma(static_cast<float>(isum), ddx, Fma(HalfBits(scale >> 16), sd, acc));
  } else {
    return Fma(static_cast<float>(isum), ddx, acc);
  }
}

}  // namespace tandem::kernels::cuda::i8

#endif  // TANDEM_KERNELS_CUDA_INT8_DOT_H_
