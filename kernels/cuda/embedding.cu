// Embedding rows (any table type) and f32 row gathers.
#include "kernels/cuda/common.cuh"

namespace tandem::kernels::cuda {
namespace {

// One block per token; each thread expands 32-element blocks of the row.
template <int kType>
__global__ void EmbeddingKernel(const uint8_t* table, int64_t cols, int64_t row_bytes,
                                const int32_t* ids, float* out) {
  const uint8_t* row = table + int64_t(ids[blockIdx.x]) * row_bytes;
  float* dst = out + blockIdx.x * cols;
  const int64_t nblk = (cols + kQK - 1) / kQK;
  for (int64_t b = threadIdx.x; b < nblk; b += blockDim.x) {
    float w[kQK];
    LoadBlock32<kType>(row, b, cols, w);
    for (int j = 0; j < kQK && b * kQK + j < cols; ++j) dst[b * kQK + j] = w[j];
  }
}

__global__ void GatherRowsKernel(const float* x, int64_t dim, const int32_t* rows, float* out) {
  const float* src = x + int64_t(rows[blockIdx.x]) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) out[blockIdx.x * dim + i] = src[i];
}

}  // namespace

absl::Status EmbeddingGather(const DeviceMatrix& table, const int32_t* d_ids, int64_t n,
                             float* d_out, Stream stream) {
  if (n == 0) return absl::OkStatus();
  const bool ok = DispatchType(table.type, /*tables_too=*/true, [&](auto type_tag) {
    constexpr int kType = decltype(type_tag)::value;
    EmbeddingKernel<kType><<<static_cast<unsigned>(n), 128, 0, AsStream(stream)>>>(
        static_cast<const uint8_t*>(table.data), table.cols, table.row_bytes, d_ids, d_out);
  });
  if (!ok) return absl::InvalidArgumentError("cuda EmbeddingGather: unsupported table type");
  return LaunchStatus("EmbeddingGather");
}

absl::Status GatherRows(const float* d_x, int64_t dim, const int32_t* d_rows, int64_t n,
                        float* d_out, Stream stream) {
  if (n == 0) return absl::OkStatus();
  GatherRowsKernel<<<static_cast<unsigned>(n), 256, 0, AsStream(stream)>>>(d_x, dim, d_rows, d_out);
  return LaunchStatus("GatherRows");
}

}  // namespace tandem::kernels::cuda
