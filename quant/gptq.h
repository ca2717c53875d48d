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
// Act-order (GPTQ's desc_act): columns are quantized in decreasing order of
// their input energy diag(H), so the loudest inputs are rounded first and
// their error is spread over the quieter columns still to come. ggml blocks
// are runs of consecutive columns, which act-order visits out of order, so
// with it the block scales are static (AutoGPTQ's static_groups): each
// block's grid is chosen from the original weights before any feedback.
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
  double damp = 0.01;      // fraction of mean(diag H) added to the diagonal
  bool act_order = false;  // columns by decreasing diag(H), static block scales
};

// Act-order: the columns by decreasing diag(h) (ties in column order).
std::vector<int64_t> ActOrder(const std::vector<double>& h, int64_t cols);

// h with rows and columns permuted: out[i][j] = h[perm[i]][perm[j]].
std::vector<double> PermuteGram(const std::vector<double>& h, const std::vector<int64_t>& perm);

// H = X^T X: [cols, cols] from x [tokens, cols].
std::vector<double> Gram(const float* x, int64_t tokens, int64_t cols, ThreadPool* pool);

// U with H^-1 = U^T U (U upper triangular, row-major [cols, cols]), after
// damping; zero-energy columns of `w` [rows, cols] are zeroed. Retries with
// 10x the damping when H is not positive definite; Internal after 4 tries.
absl::StatusOr<std::vector<float>> InverseCholeskyUpper(std::vector<double> h, int64_t cols,
                                                        double damp, ThreadPool* pool);

// Quantizes w [rows, cols] in place (w ends as the dequantized result) and
// writes the rows' blocks to `out` (rows * RowBytes(type, cols) bytes).
// With an empty `order` columns go in order with dynamic block scales; with
// a permutation (ActOrder) in that order with static block scales, and u
// must come from the Gram matrix permuted the same way (PermuteGram).
// REQUIRES: HasGrid(type), cols a multiple of BlockSize(type), u from
// InverseCholeskyUpper of this input.
void GptqQuantize(gguf::TensorType type, const std::vector<float>& u, float* w, int64_t rows,
                  int64_t cols, ThreadPool* pool, std::string* out,
                  const std::vector<int64_t>& order = {});

}  // namespace tandem::quant

#endif  // TANDEM_QUANT_GPTQ_H_
