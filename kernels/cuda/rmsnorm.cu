// RMSNorm (plain and fused with the residual add) and the elementwise ops.
#include "kernels/cuda/common.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kNormThreads = 256;

// Sum over the block with a fixed-shape tree (the result does not depend on
// scheduling). Every thread gets the total.
__device__ float BlockSum(float v, float* partial) {
  partial[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float total = partial[0];
  __syncthreads();
  return total;
}

// One block per row. y may alias x: each element is read and written by the
// same thread.
__global__ void RmsNormKernel(const float* x, const float* w, int64_t dim, float eps, float* y) {
  __shared__ float partial[kNormThreads];
  const float* row = x + blockIdx.x * dim;
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum += row[i] * row[i];
  const float scale = rsqrtf(BlockSum(sum, partial) / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    y[blockIdx.x * dim + i] = row[i] * scale * w[i];
  }
}

__global__ void AddRmsNormKernel(float* x, const float* delta, const float* w, int64_t dim,
                                 float eps, float* y) {
  __shared__ float partial[kNormThreads];
  float* row = x + blockIdx.x * dim;
  const float* d = delta + blockIdx.x * dim;
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = row[i] + d[i];
    row[i] = v;
    sum += v * v;
  }
  const float scale = rsqrtf(BlockSum(sum, partial) / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    y[blockIdx.x * dim + i] = row[i] * scale * w[i];
  }
}

__global__ void SiluMulKernel(const float* gu, int64_t n, int64_t ffn, float* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n * ffn) return;
  const int64_t t = i / ffn, c = i % ffn;
  const float g = gu[t * 2 * ffn + c];
  out[i] = g / (1.f + expf(-g)) * gu[t * 2 * ffn + ffn + c];
}

__global__ void F32ToBf16Kernel(const float* x, int64_t n, uint16_t* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = FloatToBf16(x[i]);
}

}  // namespace

absl::Status RmsNorm(const float* d_x, const float* d_weight, int64_t n, int64_t dim, float eps,
                     float* d_y, Stream stream) {
  if (n == 0) return absl::OkStatus();
  RmsNormKernel<<<static_cast<unsigned>(n), kNormThreads, 0, AsStream(stream)>>>(d_x, d_weight, dim,
                                                                                 eps, d_y);
  return LaunchStatus("RmsNorm");
}

absl::Status AddRmsNorm(float* d_x, const float* d_delta, const float* d_weight, int64_t n,
                        int64_t dim, float eps, float* d_y, Stream stream) {
  if (n == 0) return absl::OkStatus();
  AddRmsNormKernel<<<static_cast<unsigned>(n), kNormThreads, 0, AsStream(stream)>>>(
      d_x, d_delta, d_weight, dim, eps, d_y);
  return LaunchStatus("AddRmsNorm");
}

absl::Status SiluMul(const float* d_gu, int64_t n, int64_t ffn, float* d_out, Stream stream) {
  if (n * ffn == 0) return absl::OkStatus();
  SiluMulKernel<<<Blocks(n * ffn, 256), 256, 0, AsStream(stream)>>>(d_gu, n, ffn, d_out);
  return LaunchStatus("SiluMul");
}

absl::Status F32ToBf16(const float* d_x, int64_t n, uint16_t* d_out, Stream stream) {
  if (n == 0) return absl::OkStatus();
  F32ToBf16Kernel<<<Blocks(n, 256), 256, 0, AsStream(stream)>>>(d_x, n, d_out);
  return LaunchStatus("F32ToBf16");
}

// Host-array convenience: allocate, copy, run, copy back, free.
absl::Status RmsNorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps,
                     float* y) {
  if (DeviceCount() == 0) return absl::UnavailableError("cuda: no device");
  if (n <= 0 || dim <= 0) return absl::InvalidArgumentError("cuda RmsNorm: empty shape");
  const size_t bytes = static_cast<size_t>(n * dim) * sizeof(float);
  float *dx = nullptr, *dw = nullptr, *dy = nullptr;
  cudaError_t e = cudaMalloc(&dx, bytes);
  if (e == cudaSuccess) e = cudaMalloc(&dw, dim * sizeof(float));
  if (e == cudaSuccess) e = cudaMalloc(&dy, bytes);
  if (e == cudaSuccess) e = cudaMemcpy(dx, x, bytes, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemcpy(dw, weight, dim * sizeof(float), cudaMemcpyHostToDevice);
  absl::Status st = CudaStatus(e, "RmsNorm setup");
  if (st.ok()) st = RmsNorm(dx, dw, n, dim, eps, dy, nullptr);
  if (st.ok()) st = CudaStatus(cudaMemcpy(y, dy, bytes, cudaMemcpyDeviceToHost), "RmsNorm");
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dy);
  return st;
}

}  // namespace tandem::kernels::cuda
