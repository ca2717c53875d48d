// Dequantize-on-the-fly matrix-vector products for small token counts, and
// the dequantization to bf16 that feeds the tensor-core GEMM.
#include "kernels/cuda/common.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kGemvWarps = 8;   // rows per CTA (one warp per row)
constexpr int kGemvTokens = 8;  // tokens per pass over the weights

// One warp per output row: lane l takes blocks l, l + 32, ... of the row
// (consecutive lanes read consecutive blocks: coalesced), dequantizes each
// once into registers and applies it to up to kTokens tokens. A fixed
// reduction order per row: results do not depend on the token count.
template <int kType, int kTokens>
__global__ void __launch_bounds__(kGemvWarps * 32)
    GemvKernel(const uint8_t* w, int64_t rows, int64_t cols, int64_t row_bytes, const float* x,
               int64_t n, float* y, int64_t ldy, bool accumulate) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = int64_t(blockIdx.x) * kGemvWarps + warp;
  if (r >= rows) return;
  const int64_t t0 = int64_t(blockIdx.y) * kTokens;
  const int nt = static_cast<int>(Min64(kTokens, n - t0));
  const uint8_t* row = w + r * row_bytes;
  const bool vec = (cols % 4) == 0;  // x rows 16-byte aligned
  float acc[kTokens];
#pragma unroll
  for (int t = 0; t < kTokens; ++t) acc[t] = 0.f;
  const int64_t nblk = (cols + kQK - 1) / kQK;
  for (int64_t b = lane; b < nblk; b += 32) {
    float wv[kQK];
    LoadBlock32<kType>(row, b, cols, wv);
    const int64_t c0 = b * kQK;
    const bool full = vec && c0 + kQK <= cols;
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
      if (t >= nt) break;
      const float* xt = x + (t0 + t) * cols + c0;
      float s = 0.f;
      if (full) {
#pragma unroll
        for (int j = 0; j < kQK; j += 4) {
          const float4 xv = *reinterpret_cast<const float4*>(xt + j);
          s += wv[j] * xv.x + wv[j + 1] * xv.y + wv[j + 2] * xv.z + wv[j + 3] * xv.w;
        }
      } else {
        for (int j = 0; j < kQK && c0 + j < cols; ++j) s += wv[j] * xt[j];
      }
      acc[t] += s;
    }
  }
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    if (t >= nt) break;
    const float s = WarpSum(acc[t]);
    if (lane == 0) {
      float* out = y + (t0 + t) * ldy + r;
      *out = accumulate ? *out + s : s;
    }
  }
}

template <int kType>
__global__ void DequantBf16Kernel(const uint8_t* w, int64_t cols, int64_t row_bytes, int64_t row0,
                                  int64_t num_rows, uint16_t* out) {
  const int64_t nblk = (cols + kQK - 1) / kQK;
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= num_rows * nblk) return;
  const int64_t r = i / nblk, b = i % nblk;
  float v[kQK];
  LoadBlock32<kType>(w + (row0 + r) * row_bytes, b, cols, v);
  uint16_t* dst = out + r * cols + b * kQK;
  for (int j = 0; j < kQK && b * kQK + j < cols; ++j) dst[j] = FloatToBf16(v[j]);
}

template <int kType, int kTokens>
void LaunchGemv(const DeviceMatrix& w, const float* x, int64_t n, float* y, int64_t ldy,
                bool accumulate, cudaStream_t s) {
  const dim3 grid(Blocks(w.rows, kGemvWarps), Blocks(n, kTokens));
  GemvKernel<kType, kTokens><<<grid, kGemvWarps * 32, 0, s>>>(
      static_cast<const uint8_t*>(w.data), w.rows, w.cols, w.row_bytes, x, n, y, ldy, accumulate);
}

}  // namespace

absl::Status Gemv(const DeviceMatrix& w, const float* d_x, int64_t n, float* d_y, int64_t ldy,
                  bool accumulate, Stream stream) {
  if (n == 0 || w.rows == 0) return absl::OkStatus();
  if (n > int64_t(kGemvTokens) * 65535) return absl::InvalidArgumentError("cuda Gemv: n too large");
  const cudaStream_t s = AsStream(stream);
  const bool ok = DispatchType(w.type, /*tables_too=*/false, [&](auto type_tag) {
    constexpr int kType = decltype(type_tag)::value;
    if (n == 1) {
      LaunchGemv<kType, 1>(w, d_x, n, d_y, ldy, accumulate, s);
    } else if (n == 2) {
      LaunchGemv<kType, 2>(w, d_x, n, d_y, ldy, accumulate, s);
    } else if (n <= 4) {
      LaunchGemv<kType, 4>(w, d_x, n, d_y, ldy, accumulate, s);
    } else {
      LaunchGemv<kType, kGemvTokens>(w, d_x, n, d_y, ldy, accumulate, s);
    }
  });
  if (!ok) return absl::InvalidArgumentError("cuda Gemv: unsupported matrix type");
  return LaunchStatus("Gemv");
}

absl::Status DequantizeToBf16(const DeviceMatrix& w, int64_t row0, int64_t num_rows,
                              uint16_t* d_out, Stream stream) {
  if (num_rows == 0) return absl::OkStatus();
  const int64_t nblk = (w.cols + kQK - 1) / kQK;
  const bool ok = DispatchType(w.type, /*tables_too=*/true, [&](auto type_tag) {
    constexpr int kType = decltype(type_tag)::value;
    DequantBf16Kernel<kType><<<Blocks(num_rows * nblk, 256), 256, 0, AsStream(stream)>>>(
        static_cast<const uint8_t*>(w.data), w.cols, w.row_bytes, row0, num_rows, d_out);
  });
  if (!ok) return absl::InvalidArgumentError("cuda DequantizeToBf16: unsupported type");
  return LaunchStatus("DequantizeToBf16");
}

}  // namespace tandem::kernels::cuda
