// KV cache block copies, slot gathers / scatters (interchange layout), argmax.
#include <cfloat>

#include "kernels/cuda/common.cuh"

namespace tandem::kernels::cuda {
namespace {

// The cache is moved in 4-byte words whatever its dtype (a row of f16 /
// bf16 is head_dim * kv_heads * 2 bytes with head_dim % 4 == 0).

// grid (chunks of the block, 2 * num_layers)
__global__ void CopyBlockKernel(uint32_t* data, int64_t layer_words, int64_t block_words,
                                int64_t src, int64_t dst) {
  uint32_t* base = data + int64_t(blockIdx.y) * layer_words;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < block_words;
       i += int64_t(gridDim.x) * blockDim.x) {
    base[dst * block_words + i] = base[src * block_words + i];
  }
}

// grid (n, 2 * num_layers): token i, layer l = y / 2, K or V = y % 2.
template <bool kGather>
__global__ void SlotsKernel(uint32_t* cache, int64_t layer_words, int64_t row, const int64_t* slots,
                            uint32_t* buf) {
  const int64_t i = blockIdx.x, lkv = blockIdx.y;
  uint32_t* c = cache + lkv * layer_words + slots[i] * row;
  uint32_t* b = buf + (i * gridDim.y + lkv) * row;
  for (int64_t d = threadIdx.x; d < row; d += blockDim.x) {
    if (kGather) {
      b[d] = c[d];
    } else {
      c[d] = b[d];
    }
  }
}

constexpr int kArgmaxThreads = 256;

__global__ void ArgmaxKernel(const float* x, int64_t dim, int32_t* out) {
  __shared__ float best_v[kArgmaxThreads];
  __shared__ int64_t best_i[kArgmaxThreads];
  const float* row = x + blockIdx.x * dim;
  float bv = -INFINITY;
  int64_t bi = dim;  // larger than any index: loses every tie
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    if (row[i] > bv || (row[i] == bv && i < bi)) {
      bv = row[i];
      bi = i;
    }
  }
  best_v[threadIdx.x] = bv;
  best_i[threadIdx.x] = bi;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float ov = best_v[threadIdx.x + s];
      const int64_t oi = best_i[threadIdx.x + s];
      if (ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x])) {
        best_v[threadIdx.x] = ov;
        best_i[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int32_t>(best_i[0] < dim ? best_i[0] : 0);
}

}  // namespace

namespace {
absl::Status CheckWords(const DeviceKvCache& cache) {
  if (cache.row_bytes() % 4 != 0) {
    return absl::InvalidArgumentError("cuda KV cache: row bytes not a multiple of 4");
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status CopyBlock(const DeviceKvCache& cache, int64_t src, int64_t dst, Stream stream) {
  if (absl::Status st = CheckWords(cache); !st.ok()) return st;
  const int64_t block_words = cache.layout.block_size * cache.row_bytes() / 4;
  const unsigned chunks = static_cast<unsigned>(Min64(Blocks(block_words, 256), 64));
  CopyBlockKernel<<<dim3(chunks, static_cast<unsigned>(2 * cache.num_layers)), 256, 0,
                    AsStream(stream)>>>(static_cast<uint32_t*>(cache.d_data),
                                        cache.layer_bytes() / 4, block_words, src, dst);
  return LaunchStatus("CopyBlock");
}

absl::Status GatherSlots(const DeviceKvCache& cache, const int64_t* d_slots, int64_t n, void* d_out,
                         Stream stream) {
  if (n == 0) return absl::OkStatus();
  if (absl::Status st = CheckWords(cache); !st.ok()) return st;
  SlotsKernel<true><<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(2 * cache.num_layers)),
                      128, 0, AsStream(stream)>>>(static_cast<uint32_t*>(cache.d_data),
                                                  cache.layer_bytes() / 4, cache.row_bytes() / 4,
                                                  d_slots, static_cast<uint32_t*>(d_out));
  return LaunchStatus("GatherSlots");
}

absl::Status ScatterSlots(const DeviceKvCache& cache, const int64_t* d_slots, int64_t n,
                          const void* d_in, Stream stream) {
  if (n == 0) return absl::OkStatus();
  if (absl::Status st = CheckWords(cache); !st.ok()) return st;
  SlotsKernel<false><<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(2 * cache.num_layers)),
                       128, 0, AsStream(stream)>>>(
      static_cast<uint32_t*>(cache.d_data), cache.layer_bytes() / 4, cache.row_bytes() / 4, d_slots,
      static_cast<uint32_t*>(const_cast<void*>(d_in)));
  return LaunchStatus("ScatterSlots");
}

absl::Status Argmax(const float* d_x, int64_t n, int64_t dim, int32_t* d_out, Stream stream) {
  if (n == 0) return absl::OkStatus();
  ArgmaxKernel<<<static_cast<unsigned>(n), kArgmaxThreads, 0, AsStream(stream)>>>(d_x, dim, d_out);
  return LaunchStatus("Argmax");
}

}  // namespace tandem::kernels::cuda
