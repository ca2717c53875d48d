// MatMul: Gemv for a few tokens, cuBLAS bf16 GEMM (f32 accumulate) above.
#include <cublas_v2.h>

#include <algorithm>

#include "kernels/cuda/common.cuh"

namespace tandem::kernels::cuda {
namespace {

// Dequantized weight slices are at most this big (the LM head of a large
// vocabulary would otherwise need a full bf16 copy).
constexpr int64_t kWeightSliceBytes = int64_t(64) << 20;

absl::Status BlasStatus(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(std::string("cublas: ") + what + ": " + cublasGetStatusString(st));
}

}  // namespace

int64_t MatMulWorkspaceBytes(int64_t n, int64_t max_cols) {
  if (n <= kGemvMaxTokens) return 0;
  return Align256(n * max_cols * 2) + std::max<int64_t>(kWeightSliceBytes, Align256(max_cols * 2));
}

bool MatMulUsesGemv(const GemmContext& ctx, int64_t n) {
  return n <= kGemvMaxTokens || ctx.batch_invariant;
}

absl::Status MatMul(const GemmContext& ctx, const DeviceMatrix& w, const float* d_x, int64_t n,
                    float* d_y, int64_t ldy, bool accumulate, Stream stream) {
  if (MatMulUsesGemv(ctx, n)) {
    if (ctx.int8_acts && GemvInt8Supports(w)) {
      return GemvInt8(w, d_x, n, d_y, ldy, accumulate, stream);
    }
    return Gemv(w, d_x, n, d_y, ldy, accumulate, stream);
  }
  return BlasMatMul(ctx, w, d_x, n, d_y, ldy, accumulate, stream);
}

absl::Status BlasMatMul(const GemmContext& ctx, const DeviceMatrix& w, const float* d_x, int64_t n,
                        float* d_y, int64_t ldy, bool accumulate, Stream stream) {
  if (n == 0 || w.rows == 0) return absl::OkStatus();
  if (ctx.blas == nullptr) return absl::FailedPreconditionError("cuda MatMul: no cuBLAS handle");
  if (ctx.workspace_bytes < MatMulWorkspaceBytes(n, w.cols)) {
    return absl::InvalidArgumentError("cuda MatMul: workspace too small");
  }
  if (n > INT32_MAX || w.rows > INT32_MAX || w.cols > INT32_MAX || ldy > INT32_MAX) {
    return absl::InvalidArgumentError("cuda MatMul: shape beyond cuBLAS int range");
  }
  auto* handle = static_cast<cublasHandle_t>(ctx.blas);
  absl::Status st = BlasStatus(cublasSetStream(handle, AsStream(stream)), "set stream");
  if (!st.ok()) return st;
  // Activations to bf16 at the start of the workspace, weights after them.
  auto* xb = static_cast<uint16_t*>(ctx.d_workspace);
  st = F32ToBf16(d_x, n * w.cols, xb, stream);
  if (!st.ok()) return st;
  uint16_t* wb =
      reinterpret_cast<uint16_t*>(static_cast<char*>(ctx.d_workspace) + Align256(n * w.cols * 2));
  const int64_t slice_rows =
      w.type == gguf::TensorType::kBF16
          ? w.rows
          : std::max<int64_t>(1, (ctx.workspace_bytes - Align256(n * w.cols * 2)) / (w.cols * 2));
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  for (int64_t r0 = 0; r0 < w.rows; r0 += slice_rows) {
    const int64_t m = std::min(slice_rows, w.rows - r0);
    const void* a = nullptr;
    if (w.type == gguf::TensorType::kBF16) {
      a = static_cast<const char*>(w.data) + r0 * w.row_bytes;
    } else {
      st = DequantizeToBf16(w, r0, m, wb, stream);
      if (!st.ok()) return st;
      a = wb;
    }
    // Column-major view: Y^T[rows, n] (ld ldy) = W[cols, rows]^T * X^T[cols, n].
    st = BlasStatus(
        cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, int(m), int(n), int(w.cols), &alpha, a,
                     CUDA_R_16BF, int(w.cols), xb, CUDA_R_16BF, int(w.cols), &beta, d_y + r0,
                     CUDA_R_32F, int(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
