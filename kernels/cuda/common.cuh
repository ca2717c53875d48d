// Device helpers shared by the .cu files of kernels/cuda (internal).
#ifndef TANDEM_KERNELS_CUDA_COMMON_CUH_
#define TANDEM_KERNELS_CUDA_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_kernels.h"

namespace tandem::kernels::cuda {

inline absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}
// After a <<<...>>> launch: the launch error (bad config), if any.
inline absl::Status LaunchStatus(const char* what) { return CudaStatus(cudaGetLastError(), what); }
inline cudaStream_t AsStream(Stream s) { return static_cast<cudaStream_t>(s); }
__host__ __device__ __forceinline__ int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }
// Device buffers carved at 256-byte boundaries.
inline int64_t Align256(int64_t b) { return (b + 255) / 256 * 256; }
inline unsigned Blocks(int64_t n, int64_t per) {
  return static_cast<unsigned>((n + per - 1) / per);
}

// GGUF legacy quant block sizes (32 elements).
constexpr int kQK = 32;
constexpr int kTypeF32 = 0, kTypeF16 = 1, kTypeQ4_0 = 2, kTypeQ4_1 = 3, kTypeQ8_0 = 8,
              kTypeBF16 = 30;

__device__ __forceinline__ float HalfToFloat(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}
__device__ __forceinline__ float Bf16ToFloat(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}
__device__ __forceinline__ uint16_t FloatToBf16(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
// KV cache elements (KvDtype f32 / f16 / bf16): the storage type of each,
// the rounding of a store (to nearest even, as kernels::QuantizeKvHead) and
// a load of 4 consecutive elements (16 bytes for f32, 8 for f16 / bf16;
// REQUIRES: p 16- resp. 8-byte aligned) widened to f32.
struct KvF32 {
  using T = float;
  static __device__ __forceinline__ T From(float x) { return x; }
  static __device__ __forceinline__ float4 Load4(const T* p) {
    return *reinterpret_cast<const float4*>(p);
  }
};
struct KvF16 {
  using T = uint16_t;
  static __device__ __forceinline__ T From(float x) { return __half_as_ushort(__float2half_rn(x)); }
  static __device__ __forceinline__ float4 Load4(const T* p) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    return make_float4(HalfToFloat(uint16_t(u.x & 0xffffu)), HalfToFloat(uint16_t(u.x >> 16)),
                       HalfToFloat(uint16_t(u.y & 0xffffu)), HalfToFloat(uint16_t(u.y >> 16)));
  }
};
struct KvBf16 {
  using T = uint16_t;
  static __device__ __forceinline__ T From(float x) { return FloatToBf16(x); }
  static __device__ __forceinline__ float4 Load4(const T* p) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                       __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
  }
};
// Calls f(KvF32{}), f(KvF16{}) or f(KvBf16{}) for the dtype; InvalidArgument
// for int8 / fp8 (CPU-only: their per-head scales have no device path).
template <typename F>
absl::Status DispatchKvDtype(KvDtype dtype, const char* what, F&& f) {
  switch (dtype) {
    case KvDtype::kF32:
      return f(KvF32{});
    case KvDtype::kF16:
      return f(KvF16{});
    case KvDtype::kBf16:
      return f(KvBf16{});
    default:
      return absl::InvalidArgumentError(std::string(what) + ": the KV cache dtype " +
                                        KvDtypeName(dtype) + " has no CUDA kernels");
  }
}

__device__ __forceinline__ uint16_t Ld16(const uint8_t* p) {
  return *reinterpret_cast<const uint16_t*>(p);
}
__device__ __forceinline__ uint32_t Ld32(const uint8_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// Elements [32 * blk, 32 * blk + 32) of a row in GGUF layout, as f32 (the
// same values kernels::DequantizeRow produces). Elements at or past `cols`
// (only possible for the unquantized types) read as 0.
// Alignment: Q4_0 / Q8_0 blocks are 2-byte aligned, Q4_1 4-byte aligned
// (rows start at multiples of the block bytes in 256-byte aligned buffers).
template <int kType>
__device__ __forceinline__ void LoadBlock32(const uint8_t* row, int64_t blk, int64_t cols,
                                            float* w) {
  if constexpr (kType == kTypeQ4_0) {
    const uint8_t* b = row + blk * 18;
    const float d = HalfToFloat(Ld16(b));
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint16_t q = Ld16(b + 2 + 2 * j);
      const int q0 = q & 0xFF, q1 = q >> 8;
      w[2 * j] = static_cast<float>((q0 & 0x0F) - 8) * d;
      w[2 * j + 1] = static_cast<float>((q1 & 0x0F) - 8) * d;
      w[2 * j + 16] = static_cast<float>((q0 >> 4) - 8) * d;
      w[2 * j + 17] = static_cast<float>((q1 >> 4) - 8) * d;
    }
  } else if constexpr (kType == kTypeQ4_1) {
    const uint8_t* b = row + blk * 20;
    const uint32_t dm = Ld32(b);
    const float d = HalfToFloat(dm & 0xFFFF), m = HalfToFloat(dm >> 16);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t q = Ld32(b + 4 + 4 * j);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int qb = (q >> (8 * k)) & 0xFF;
        // _rn intrinsics: no FMA contraction, the same rounding as the CPU.
        w[4 * j + k] = __fadd_rn(__fmul_rn(static_cast<float>(qb & 0x0F), d), m);
        w[4 * j + k + 16] = __fadd_rn(__fmul_rn(static_cast<float>(qb >> 4), d), m);
      }
    }
  } else if constexpr (kType == kTypeQ8_0) {
    const uint8_t* b = row + blk * 34;
    const float d = HalfToFloat(Ld16(b));
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint16_t q = Ld16(b + 2 + 2 * j);
      w[2 * j] = static_cast<float>(static_cast<int8_t>(q & 0xFF)) * d;
      w[2 * j + 1] = static_cast<float>(static_cast<int8_t>(q >> 8)) * d;
    }
  } else {
    const int64_t c0 = blk * kQK;
#pragma unroll
    for (int j = 0; j < kQK; ++j) {
      const int64_t c = c0 + j;
      float v = 0.f;
      if (c < cols) {
        if constexpr (kType == kTypeBF16) {
          v = Bf16ToFloat(reinterpret_cast<const uint16_t*>(row)[c]);
        } else if constexpr (kType == kTypeF16) {
          v = HalfToFloat(reinterpret_cast<const uint16_t*>(row)[c]);
        } else {
          v = reinterpret_cast<const float*>(row)[c];
        }
      }
      w[j] = v;
    }
  }
}

// ---- Matrix blocks for the matrix products (Gemv, DequantizeToBf16) -------
//
// Two layouts of a quantized matrix on the device:
//  - GGUF: blocks of 18 (Q4_0), 20 (Q4_1) or 34 (Q8_0) bytes, read as raw
//    blocks of 32 weights with 2- or 4-byte loads (RawBlock, LoadRaw,
//    Expand; the tests' and tables' layout);
//  - planar (DeviceMatrix::scales set, RepackPlanar): the quants of every
//    block, row by row, 16 bytes (Q4_0, Q4_1: weights 2i and 2i + 1 in byte
//    i, low nibble first) or 32 (Q8_0), then the scales (f16 d, or
//    d | m << 16 for Q4_1). Eight consecutive weights are one 4- or 8-byte
//    load (Raw8, LoadRaw8, Expand8), so a warp reading 256 consecutive
//    weights reads consecutive bytes of the matrix and of x.
// BF16 has one layout: blocks of four 16-byte loads, or Raw8 of one.
template <int kType>
struct RawBlock {
  static constexpr int kWords = kType == kTypeQ8_0 ? 8 : kType == kTypeBF16 ? 16 : 4;
  uint32_t q[kWords];
  uint32_t s;
};
__host__ __device__ constexpr int PlanarQuantBytes(int type) { return type == kTypeQ8_0 ? 32 : 16; }
__host__ __device__ constexpr int PlanarScaleBytes(int type) { return type == kTypeQ4_1 ? 4 : 2; }

// Matrix view for the kernels: data in GGUF layout, or planar when scales.
struct MatView {
  const uint8_t* data;
  const uint8_t* scales;  // null: GGUF layout
  int64_t rows, cols, row_bytes, nblk;
};
inline MatView ViewOf(const DeviceMatrix& m) {
  return {static_cast<const uint8_t*>(m.data),
          static_cast<const uint8_t*>(m.scales),
          m.rows,
          m.cols,
          m.row_bytes,
          (m.cols + kQK - 1) / kQK};
}

template <int kType>
__device__ __forceinline__ void LoadRaw(const MatView& m, int64_t r, int64_t b,
                                        RawBlock<kType>& raw) {
  if constexpr (kType == kTypeBF16) {
    const uint8_t* p = m.data + r * m.row_bytes + b * 64;
    if ((b + 1) * kQK <= m.cols && (m.row_bytes & 15) == 0) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint4 v = reinterpret_cast<const uint4*>(p)[i];
        raw.q[4 * i] = v.x, raw.q[4 * i + 1] = v.y, raw.q[4 * i + 2] = v.z, raw.q[4 * i + 3] = v.w;
      }
    } else {  // a partial last block (or unaligned rows): zeros past cols
#pragma unroll
      for (int j = 0; j < kQK; j += 2) {
        const int64_t c = b * kQK + j;
        const uint32_t lo = c < m.cols ? Ld16(p + 2 * j) : 0u;
        const uint32_t hi = c + 1 < m.cols ? Ld16(p + 2 * j + 2) : 0u;
        raw.q[j / 2] = lo | (hi << 16);
      }
    }
  } else {
    constexpr int kBytes = kType == kTypeQ4_0 ? 18 : kType == kTypeQ4_1 ? 20 : 34;
    const uint8_t* p = m.data + r * m.row_bytes + b * kBytes;
    if constexpr (kType == kTypeQ4_1) {  // 4-byte aligned
      raw.s = Ld32(p);
#pragma unroll
      for (int k = 0; k < 4; ++k) raw.q[k] = Ld32(p + 4 + 4 * k);
    } else {  // 2-byte aligned
      raw.s = Ld16(p);
#pragma unroll
      for (int k = 0; k < RawBlock<kType>::kWords; ++k) {
        raw.q[k] = uint32_t(Ld16(p + 2 + 4 * k)) | (uint32_t(Ld16(p + 4 + 4 * k)) << 16);
      }
    }
  }
}

// The 32 weights of a raw block as f32 (bit-equal to LoadBlock32).
template <int kType>
__device__ __forceinline__ void Expand(const RawBlock<kType>& raw, float* w) {
  if constexpr (kType == kTypeBF16) {
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      w[2 * k] = __uint_as_float(raw.q[k] << 16);
      w[2 * k + 1] = __uint_as_float(raw.q[k] & 0xFFFF0000u);
    }
  } else if constexpr (kType == kTypeQ8_0) {
    const float d = HalfToFloat(raw.s & 0xFFFF);
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      w[j] = static_cast<float>(static_cast<int8_t>((raw.q[j / 4] >> (8 * (j % 4))) & 0xFF)) * d;
    }
  } else {
    const float d = HalfToFloat(raw.s & 0xFFFF);
    const float m = kType == kTypeQ4_1 ? HalfToFloat(raw.s >> 16) : 0.f;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int qb = (raw.q[j / 4] >> (8 * (j % 4))) & 0xFF;
      if constexpr (kType == kTypeQ4_1) {
        // _rn intrinsics: no FMA contraction, the same rounding as the CPU.
        w[j] = __fadd_rn(__fmul_rn(static_cast<float>(qb & 0x0F), d), m);
        w[j + 16] = __fadd_rn(__fmul_rn(static_cast<float>(qb >> 4), d), m);
      } else {
        w[j] = static_cast<float>((qb & 0x0F) - 8) * d;
        w[j + 16] = static_cast<float>((qb >> 4) - 8) * d;
      }
    }
  }
}

// Eight consecutive weights [e0, e0 + 8) of row r (e0 % 8 == 0, e0 + 8 <=
// cols) of a planar Q4_0 / Q4_1 / Q8_0 matrix or a BF16 one with cols % 8 == 0.
template <int kType>
struct Raw8 {
  static constexpr int kWords = kType == kTypeBF16 ? 4 : kType == kTypeQ8_0 ? 2 : 1;
  uint32_t q[kWords];
  uint32_t s;
};

template <int kType>
__device__ __forceinline__ void LoadRaw8(const MatView& m, int64_t r, int64_t e0,
                                         Raw8<kType>& raw) {
  if constexpr (kType == kTypeBF16) {
    const uint4 v = *reinterpret_cast<const uint4*>(m.data + r * m.row_bytes + e0 * 2);
    raw.q[0] = v.x, raw.q[1] = v.y, raw.q[2] = v.z, raw.q[3] = v.w;
  } else {
    const int64_t blk = r * m.nblk + e0 / kQK;
    if constexpr (kType == kTypeQ8_0) {
      const uint2 v = *reinterpret_cast<const uint2*>(m.data + blk * 32 + e0 % kQK);
      raw.q[0] = v.x, raw.q[1] = v.y;
      raw.s = Ld16(m.scales + blk * 2);
    } else {
      raw.q[0] = Ld32(m.data + blk * 16 + (e0 % kQK) / 2);
      raw.s = kType == kTypeQ4_1 ? Ld32(m.scales + blk * 4) : Ld16(m.scales + blk * 2);
    }
  }
}

// Small integers as floats without an int-to-float conversion (a slow
// instruction on the GPU: one per weight would bound the Gemv): the float
// with bits 0x4B000000 | v is exactly 2^23 + v for 0 <= v < 2^23.
__device__ __forceinline__ float SmallIntToFloat(uint32_t v, float minus) {
  return __int_as_float(0x4B000000u | v) - minus;  // exact: v + 2^23 - minus
}

// The eight weights of a Raw8 as f32 (bit-equal to LoadBlock32's values).
template <int kType>
__device__ __forceinline__ void Expand8(const Raw8<kType>& raw, float* w) {
  if constexpr (kType == kTypeBF16) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[2 * k] = __uint_as_float(raw.q[k] << 16);
      w[2 * k + 1] = __uint_as_float(raw.q[k] & 0xFFFF0000u);
    }
  } else if constexpr (kType == kTypeQ8_0) {
    const float d = HalfToFloat(raw.s & 0xFFFF);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      // int8 q as (q + 128) - 128, exactly.
      const uint32_t b = ((raw.q[j / 4] >> (8 * (j % 4))) & 0xFF) ^ 0x80u;
      w[j] = SmallIntToFloat(b, 8388608.f + 128.f) * d;
    }
  } else {
    const float d = HalfToFloat(raw.s & 0xFFFF);
    const float mn = kType == kTypeQ4_1 ? HalfToFloat(raw.s >> 16) : 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t q = (raw.q[0] >> (4 * j)) & 0x0F;
      if constexpr (kType == kTypeQ4_1) {
        // _rn intrinsics: no FMA contraction, the same rounding as the CPU.
        w[j] = __fadd_rn(__fmul_rn(SmallIntToFloat(q, 8388608.f), d), mn);
      } else {
        w[j] = SmallIntToFloat(q, 8388608.f + 8.f) * d;
      }
    }
  }
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

// Calls f(std::integral_constant<int, kType>{}) for a runtime GGUF type;
// false when the type has no device loader.
template <typename F>
bool DispatchType(gguf::TensorType type, bool tables_too, F&& f) {
  switch (type) {
    case gguf::TensorType::kQ4_0:
      f(std::integral_constant<int, kTypeQ4_0>{});
      return true;
    case gguf::TensorType::kQ4_1:
      f(std::integral_constant<int, kTypeQ4_1>{});
      return true;
    case gguf::TensorType::kQ8_0:
      f(std::integral_constant<int, kTypeQ8_0>{});
      return true;
    case gguf::TensorType::kBF16:
      f(std::integral_constant<int, kTypeBF16>{});
      return true;
    case gguf::TensorType::kF16:
      if (!tables_too) return false;
      f(std::integral_constant<int, kTypeF16>{});
      return true;
    case gguf::TensorType::kF32:
      if (!tables_too) return false;
      f(std::integral_constant<int, kTypeF32>{});
      return true;
    default:
      return false;
  }
}

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_CUDA_COMMON_CUH_
