// Devices, memory, streams and cuBLAS handles behind the void* API.
#include <cublas_v2.h>

#include <cstdio>

#include "kernels/cuda/common.cuh"

namespace tandem::kernels::cuda {

int DeviceCount(std::string* error) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error so later calls are not poisoned
    if (error != nullptr) *error = cudaGetErrorString(e);
    return 0;
  }
  if (error != nullptr) error->clear();
  return n;
}

int DeviceCount() { return DeviceCount(nullptr); }

std::string DeviceDescription(int index) {
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, index) != cudaSuccess) return "";
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%s, %.1f GiB, sm_%d%d, %d SMs", p.name,
                p.totalGlobalMem / 1073741824.0, p.major, p.minor, p.multiProcessorCount);
  return buf;
}

absl::Status SetDevice(int index) { return CudaStatus(cudaSetDevice(index), "cudaSetDevice"); }

absl::Status DeviceMemoryInfo(int index, int64_t* free_bytes, int64_t* total_bytes) {
  if (absl::Status s = SetDevice(index); !s.ok()) {
    (void)cudaGetLastError();
    return s;
  }
  size_t free_b = 0, total_b = 0;
  const cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaStatus(e, "cudaMemGetInfo");
  }
  *free_bytes = static_cast<int64_t>(free_b);
  *total_bytes = static_cast<int64_t>(total_b);
  return absl::OkStatus();
}

absl::StatusOr<void*> Malloc(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError("cuda Malloc: negative size");
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(bytes > 0 ? bytes : 1));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::ResourceExhaustedError(std::string("cuda: cudaMalloc of ") +
                                        std::to_string(bytes) + " bytes: " + cudaGetErrorString(e));
  }
  return p;
}

void Free(void* d_ptr) {
  if (d_ptr != nullptr) cudaFree(d_ptr);
}

absl::StatusOr<void*> MallocHost(int64_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMallocHost(&p, static_cast<size_t>(bytes > 0 ? bytes : 1));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::ResourceExhaustedError(std::string("cuda: cudaMallocHost: ") +
                                        cudaGetErrorString(e));
  }
  return p;
}

void FreeHost(void* ptr) {
  if (ptr != nullptr) cudaFreeHost(ptr);
}

absl::StatusOr<Stream> StreamCreate() {
  cudaStream_t s = nullptr;
  const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) return CudaStatus(e, "cudaStreamCreate");
  return static_cast<Stream>(s);
}

void StreamDestroy(Stream stream) {
  if (stream != nullptr) cudaStreamDestroy(AsStream(stream));
}

absl::Status StreamSync(Stream stream) {
  return CudaStatus(cudaStreamSynchronize(AsStream(stream)), "stream synchronize");
}

absl::Status CopyToDevice(void* d_dst, const void* src, int64_t bytes, Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(cudaMemcpyAsync(d_dst, src, bytes, cudaMemcpyHostToDevice, AsStream(stream)),
                    "copy to device");
}

absl::Status CopyToHost(void* dst, const void* d_src, int64_t bytes, Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(cudaMemcpyAsync(dst, d_src, bytes, cudaMemcpyDeviceToHost, AsStream(stream)),
                    "copy to host");
}

absl::Status CopyOnDevice(void* d_dst, const void* d_src, int64_t bytes, Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(
      cudaMemcpyAsync(d_dst, d_src, bytes, cudaMemcpyDeviceToDevice, AsStream(stream)),
      "copy on device");
}

absl::Status Memset(void* d_dst, int value, int64_t bytes, Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(cudaMemsetAsync(d_dst, value, bytes, AsStream(stream)), "memset");
}

absl::StatusOr<void*> CreateBlasHandle() {
  cublasHandle_t h = nullptr;
  const cublasStatus_t st = cublasCreate(&h);
  if (st != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError(std::string("cublasCreate: ") + cublasGetStatusString(st));
  }
  return static_cast<void*>(h);
}

void DestroyBlasHandle(void* handle) {
  if (handle != nullptr) cublasDestroy(static_cast<cublasHandle_t>(handle));
}

bool IsMatrixType(gguf::TensorType type) {
  return type == gguf::TensorType::kQ4_0 || type == gguf::TensorType::kQ4_1 ||
         type == gguf::TensorType::kQ8_0 || type == gguf::TensorType::kBF16;
}

bool IsTableType(gguf::TensorType type) {
  return IsMatrixType(type) || type == gguf::TensorType::kF16 || type == gguf::TensorType::kF32;
}

}  // namespace tandem::kernels::cuda
