#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/cuda_kernels.h"

namespace tandem::kernels::cuda {
namespace {

// One block per row; a fixed-shape tree reduction so the result does not
// depend on scheduling.
__global__ void RmsNormKernel(const float* x, const float* w, int64_t dim, float eps, float* y) {
  extern __shared__ float partial[];
  const float* row = x + blockIdx.x * dim;
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum += row[i] * row[i];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float scale = rsqrtf(partial[0] / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    y[blockIdx.x * dim + i] = row[i] * scale * w[i];
  }
}

absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

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
  if (e == cudaSuccess) {
    constexpr int kThreads = 256;
    RmsNormKernel<<<static_cast<unsigned>(n), kThreads, kThreads * sizeof(float)>>>(dx, dw, dim,
                                                                                  eps, dy);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpy(y, dy, bytes, cudaMemcpyDeviceToHost);
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dy);
  return e == cudaSuccess ? absl::OkStatus() : CudaError(e, "RmsNorm");
}

}  // namespace tandem::kernels::cuda
