// GPTQ (Frantar et al., 2022) for ggml block formats.
//
// For a matrix W [rows, cols] whose input has the Gram matrix H = X^T X
// (X: calibration inputs [tokens, cols]), every row is quantized column by
// column; each column's rounding error, divided by the pivot of the upper
// Cholesky factor U of H^-1 (H damped by damp * mean(diag H)), is fed back
// into the row's remaining columns along U's row. Scales are per block
// ("group scales"): when a row reaches a block's first column, the block's
// scales come from the reference quantizer run on the block's current
// (error-updated) values, and the block's integers are then chosen one
// column at a time on that grid (quant/block_grid.h). Columns with zero
// input energy are zeroed (dead inputs).
//
// Thread safety: the functions are reentrant; the pool splits rows.
#ifndef TANDEM_QUANT_GPTQ_H_
#define TANDEM_QUANT_GPTQ_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/gguf/types.h"
#include "common/thread_pool.h"

namespace tandem::quant {

struct GptqOptions {
  double damp = 0.01;  // fraction of mean(diag H) added to the diagonal
};

// H = X^T X: [cols, cols] from x [tokens, cols].
std::vector<double> Gram(const float* x, int64_t tokens, int64_t cols, ThreadPool* pool);

// U with H^-1 = U^T U (U upper triangular, row-major [cols, cols]), after
// damping; zero-energy columns of `w` [rows, cols] are zeroed. Retries with
// 10x the damping when H is not positive definite; Internal after 4 tries.
absl::StatusOr<std::vector<float>> InverseCholeskyUpper(std::vector<double> h, int64_t cols,
                                                        double damp, ThreadPool* pool);

// Quantizes w [rows, cols] in place (w ends as the dequantized result) and
// writes the rows' blocks to `out` (rows * RowBytes(type, cols) bytes).
// REQUIRES: HasGrid(type), cols a multiple of BlockSize(type), u from
// InverseCholeskyUpper of this input.
void GptqQuantize(gguf::TensorType type, const std::vector<float>& u, float* w, int64_t rows,
                  int64_t cols, ThreadPool* pool, std::string* out);

}  // namespace tandem::quant

#endif  // TANDEM_QUANT_GPTQ_H_
