// Random weights for synthetic models and the HBM copy-bandwidth probe.
#include <algorithm>

#include "kernels/cuda/common.cuh"

namespace tandem::kernels::cuda {
namespace {

__device__ __forceinline__ uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__device__ __forceinline__ float Uniform(uint64_t h) {  // [-1, 1)
  return static_cast<float>(h >> 40) * (2.f / 16777216.f) - 1.f;
}

// One thread per 32-element block (or per element group for bf16).
__global__ void FillBlocksKernel(uint8_t* p, int64_t num_blocks, int type, float scale,
                                 uint64_t seed) {
  const int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (b >= num_blocks) return;
  uint64_t h = Mix(seed ^ (uint64_t(b) * 0xD1B54A32D192ED03ull));
  if (type == kTypeBF16) {
    uint16_t* w = reinterpret_cast<uint16_t*>(p) + b * kQK;
    for (int j = 0; j < kQK; ++j) {
      h = Mix(h);
      w[j] = FloatToBf16(Uniform(h) * scale);
    }
    return;
  }
  const int bytes = type == kTypeQ4_0 ? 18 : type == kTypeQ4_1 ? 20 : 34;
  uint8_t* blk = p + b * bytes;
  // Q4: |q - 8| <= 8, so d = scale / 8 keeps values within about +-scale.
  const float d = type == kTypeQ8_0 ? scale / 127.f : scale / 8.f;
  const uint16_t dh = __half_as_ushort(__float2half(d));
  blk[0] = dh & 0xFF;
  blk[1] = dh >> 8;
  int q0 = 2;
  if (type == kTypeQ4_1) {
    const uint16_t mh = __half_as_ushort(__float2half(-scale));
    blk[2] = mh & 0xFF;
    blk[3] = mh >> 8;
    q0 = 4;
  }
  for (int j = q0; j < bytes; ++j) {
    h = Mix(h);
    blk[j] = static_cast<uint8_t>(h >> 56);
  }
}

__global__ void FillConstantKernel(float* x, int64_t n, float v) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = v;
}

__global__ void CopyKernel(const float4* src, float4* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

}  // namespace

absl::Status FillRandom(const DeviceMatrix& w, float scale, uint64_t seed, Stream stream) {
  int type = 0;
  switch (w.type) {
    case gguf::TensorType::kQ4_0:
      type = kTypeQ4_0;
      break;
    case gguf::TensorType::kQ4_1:
      type = kTypeQ4_1;
      break;
    case gguf::TensorType::kQ8_0:
      type = kTypeQ8_0;
      break;
    case gguf::TensorType::kBF16:
      type = kTypeBF16;
      break;
    default:
      return absl::InvalidArgumentError("cuda FillRandom: unsupported type");
  }
  if (w.cols % kQK != 0) return absl::InvalidArgumentError("cuda FillRandom: cols % 32 != 0");
  const int64_t blocks = w.rows * (w.cols / kQK);
  FillBlocksKernel<<<Blocks(blocks, 256), 256, 0, AsStream(stream)>>>(
      static_cast<uint8_t*>(const_cast<void*>(w.data)), blocks, type, scale, seed);
  return LaunchStatus("FillRandom");
}

absl::Status FillConstant(float* d_x, int64_t n, float value, Stream stream) {
  if (n == 0) return absl::OkStatus();
  FillConstantKernel<<<Blocks(n, 256), 256, 0, AsStream(stream)>>>(d_x, n, value);
  return LaunchStatus("FillConstant");
}

absl::StatusOr<double> MeasureCopyBandwidthGBs(int64_t bytes, int iters) {
  const int64_t n4 = bytes / 16;
  if (n4 <= 0 || iters <= 0) return absl::InvalidArgumentError("bandwidth probe: empty");
  void *src = nullptr, *dst = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaError_t e = cudaMalloc(&src, n4 * 16);
  if (e == cudaSuccess) e = cudaMalloc(&dst, n4 * 16);
  if (e == cudaSuccess) e = cudaMemset(src, 0, n4 * 16);
  if (e == cudaSuccess) e = cudaEventCreate(&start);
  if (e == cudaSuccess) e = cudaEventCreate(&stop);
  int sms = 0;
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float best_ms = 1e30f;
  for (int it = 0; e == cudaSuccess && it <= iters; ++it) {  // run 0 warms up
    cudaEventRecord(start);
    CopyKernel<<<sms * 8, 512>>>(static_cast<const float4*>(src), static_cast<float4*>(dst), n4);
    cudaEventRecord(stop);
    e = cudaEventSynchronize(stop);
    float ms = 0.f;
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, start, stop);
    if (it > 0) best_ms = std::min(best_ms, ms);
  }
  if (start != nullptr) cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  cudaFree(src);
  cudaFree(dst);
  if (e != cudaSuccess) return CudaStatus(e, "bandwidth probe");
  return 2.0 * double(n4 * 16) / (best_ms * 1e-3) / 1e9;
}

}  // namespace tandem::kernels::cuda
