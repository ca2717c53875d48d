// AWQ (Lin et al., 2023): activation-aware per-input-channel scales.
//
// For a group of linears sharing one input X (q/k/v, gate/up, o, down), the
// scale of channel c is s_c = mean_t |X_tc| ^ alpha, normalized by
// sqrt(max s * min s); alpha runs over a grid of `grid` points in [0, 1)
// and the one whose quantization error is smallest wins (alpha = 0 is
// s = 1, plain round-to-nearest, so the search never does worse on its
// proxy). The linears are quantized as Q(W diag(s)) and diag(1/s) is folded
// into what produces X (the RMSNorm weight, attn_v's or ffn_up's rows), so
// the model computes the same function before quantization. Then a clip
// search: per stored block, the weights are clamped to r * max|w| for the r
// in {1, 0.95, ...} (clip_grid points down to 1 - max_shrink) with the
// smallest error.
//
// The error is the output error sum_t |(W - W_q) x_t|^2 with X^T X kept
// block-diagonal in 32-channel blocks (the cross-block terms of
// independent rounding errors average out; this keeps the search at
// 32 multiply-adds per weight and grid point instead of one per token).
//
// Thread safety: reentrant; the pool splits rows.
#ifndef TANDEM_QUANT_AWQ_H_
#define TANDEM_QUANT_AWQ_H_

#include <cstdint>
#include <vector>

#include "common/gguf/types.h"
#include "common/thread_pool.h"

namespace tandem::quant {

struct AwqOptions {
  int grid = 20;            // alpha points: 0, 1/grid, ..., (grid-1)/grid
  int clip_grid = 10;       // clip ratios tried per block (1 = no clip search)
  double max_shrink = 0.5;  // the smallest ratio is 1 - max_shrink * (clip_grid-1)/clip_grid
};

// mean |x| per channel and the 32x32 diagonal blocks of X^T X.
struct InputStats {
  int64_t cols = 0;
  std::vector<float> mean_abs;  // [cols]
  std::vector<float> hblocks;   // [cols / 32][32][32]
};
// REQUIRES: cols a multiple of 32.
InputStats ComputeInputStats(const float* x, int64_t tokens, int64_t cols, ThreadPool* pool);

// One linear: w [rows, cols] row-major (not owned), stored as `type`.
struct AwqLinear {
  float* w = nullptr;
  int64_t rows = 0;
  gguf::TensorType type = gguf::TensorType::kQ4_0;
};

// The scales s [cols] of the best alpha (written to *best_alpha), for
// stats.mean_abs as given (average it over channels that must share a
// scale first). Does not modify the linears.
std::vector<float> SearchScales(const InputStats& stats, const std::vector<AwqLinear>& linears,
                                const AwqOptions& options, ThreadPool* pool, float* best_alpha);

// Clamps each stored block of `linear` (already multiplied by diag(s)) to
// its best clip ratio; s: the scales applied (empty = none).
void SearchClip(const InputStats& stats, const std::vector<float>& s, const AwqLinear& linear,
                const AwqOptions& options, ThreadPool* pool);

// The proxy error of quantizing `linear` as is (tests, progress output).
double ProxyError(const InputStats& stats, const AwqLinear& linear, ThreadPool* pool);

}  // namespace tandem::quant

#endif  // TANDEM_QUANT_AWQ_H_
