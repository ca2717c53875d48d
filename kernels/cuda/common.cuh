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
