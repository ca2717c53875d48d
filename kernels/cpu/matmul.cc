// Dispatched MatMul and EmbeddingLookup.
//
// Rows are split over threads in tiles of kTileRows. For one or two tokens,
// f32 / f16 / bf16 rows are read in place four at a time (Dot4Rows, f16 /
// bf16 widened in registers) and quantized rows with a fused path are
// dequantized in registers and dotted directly (FusedRowDot, same bits).
// For more tokens (prefill, and every matmul of --kernels reference), rows
// are dequantized once into a per-thread f32 buffer and the tokens run
// against them: from kGemmMinTokens on, kGemmRows rows at a time and 4 rows
// x up to 6 tokens per DotTile4; below it, kTileRows rows and one token per
// Dot4Rows (GemmRows).
// Each (token, row) dot uses the canonical DotF32 order, so y does not depend
// on n, on the other tokens, or on how rows are split over threads.
#include <algorithm>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/variant.h"
#include "kernels/kernels.h"

namespace tandem::kernels {
TANDEM_KERNELS_VARIANT_BEGIN
namespace {

constexpr int64_t kTileRows = 8;
// Up to this many tokens, quantized rows are dequantized in registers per
// token (decode is bound by weight bytes); above it, once per tile.
constexpr int64_t kMaxFusedTokens = 2;

bool HasFusedPath(gguf::TensorType t) {
  float unused;
  static const float kZero[32] = {};
  static const uint8_t kBlock[34] = {};
  return cpu::FusedRowDot(t, kBlock, kZero, 0, &unused);
}

// Groups of 4 rows MatMulRowsInPlace fetches ahead.
[[maybe_unused]] constexpr int64_t kPrefetchGroups = 2;  // (AVX-512 / AVX2 builds only)

// y[t, r] for rows [r0, r1) of f32 / f16 / bf16 rows read in place, four at
// a time (a short last group repeats its last row; the copies are dropped).
template <cpu::RowKind kKind>
void MatMulRowsInPlace(const WeightView& w, const float* x, int64_t n, float* y, int64_t r0,
                       int64_t r1) {
  for (int64_t r = r0; r < r1; r += 4) {
#if TANDEM_KERNELS_AVX512 || TANDEM_KERNELS_AVX2
    // The weights stream once: fetch the group kPrefetchGroups ahead into
    // L2 (the hardware prefetcher alone leaves the loads stalled, as in
    // QGemm; into L1, T0, decode of an f16 file measured 10-20% slower on
    // 2 threads of an AMD Zen 4).
    if (r + 4 * kPrefetchGroups < r1) {
      const uint8_t* ahead = w.row(r + 4 * kPrefetchGroups);
      for (int64_t off = 0; off < 4 * w.row_bytes; off += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(ahead + off), _MM_HINT_T1);
      }
    }
#endif
    const void* rows[4];
    for (int64_t i = 0; i < 4; ++i) rows[i] = w.row(std::min(r + i, r1 - 1));
    const int64_t nr = std::min<int64_t>(4, r1 - r);
    int64_t t = 0;
    for (; t + 2 <= n; t += 2) {
      float out0[4], out1[4];
      cpu::Dot4x2Rows<kKind>(rows, x + t * w.cols, x + (t + 1) * w.cols, w.cols, out0, out1);
      for (int64_t i = 0; i < nr; ++i) {
        y[t * w.rows + r + i] = out0[i];
        y[(t + 1) * w.rows + r + i] = out1[i];
      }
    }
    for (; t < n; ++t) {
      float out[4];
      cpu::Dot4Rows<kKind>(rows, x + t * w.cols, w.cols, out);
      for (int64_t i = 0; i < nr; ++i) y[t * w.rows + r + i] = out[i];
    }
  }
}

// Rows dequantized (f32: addressed in place) together for the GEMM path,
// and the tokens one DotTile4 call serves.
constexpr int64_t kGemmRows = 32;
constexpr int kGemmTokens = 6;
// Fewer tokens than this take TileDots (see GemmRows).
constexpr int64_t kGemmMinTokens = 5;

template <int kT>
void DotTile(const float* const w[4], const float* x, int64_t cols, float* y, int64_t ldy, int nr) {
  const float* xs[kT];
  for (int t = 0; t < kT; ++t) xs[t] = x + t * cols;
  cpu::DotTile4<kT>(w, xs, cols, y, ldy, nr);
}

// Every token against rows[0..nr) (f32), four rows at a time (a short last
// group repeats its last row; the copies are dropped).
void TileDots(const float* const* rows, int64_t nr, const float* x, int64_t n, int64_t cols,
              float* y, int64_t ldy) {
  for (int64_t g = 0; g < nr; g += 4) {
    const void* w4[4];
    for (int64_t i = 0; i < 4; ++i) w4[i] = rows[std::min(g + i, nr - 1)];
    for (int64_t t = 0; t < n; ++t) {
      float out[4];
      cpu::Dot4Rows<cpu::RowKind::kF32>(w4, x + t * cols, cols, out);
      for (int64_t i = 0; i < std::min<int64_t>(4, nr - g); ++i) y[t * ldy + g + i] = out[i];
    }
  }
}

using DotTileFn = void (*)(const float* const*, const float*, int64_t, float*, int64_t, int);
// kDotTiles[k - 1] serves k tokens.
constexpr DotTileFn kDotTiles[kGemmTokens] = {DotTile<1>, DotTile<2>, DotTile<3>,
                                              DotTile<4>, DotTile<5>, DotTile<6>};

// y[t, r] for every token and rows [r0, r1): kGemmRows rows at a time, each
// block of kGemmTokens tokens (about 14-37 KB, kept in L1 / L2) against all
// of them, four rows per DotTile4.
// A few tokens (batched decode, speculative verification) instead take
// kTileRows rows at a time (the buffer stays in L1) and one token at a time
// against them, four rows per Dot4Rows (TileDots): kernels_bench, F16 3072 x
// 576, 2 threads: 3 tokens 157-164 us against DotTile4's 179-186, 4 tokens
// 195 against 215-221; from 5 tokens DotTile4 wins (169 against 229-230).
void GemmRows(const WeightView& w, const float* x, int64_t n, float* y, int64_t r0, int64_t r1) {
  const bool direct = w.type == gguf::TensorType::kF32;
  const bool few = n < kGemmMinTokens;
  const int64_t block = few ? kTileRows : kGemmRows;
  std::vector<float> buf(direct ? 0 : block * w.cols);
  for (int64_t s0 = r0; s0 < r1; s0 += block) {
    const int64_t ns = std::min(block, r1 - s0);
    const float* rows[kGemmRows];
    for (int64_t i = 0; i < ns; ++i) {
      if (direct) {
        rows[i] = reinterpret_cast<const float*>(w.row(s0 + i));
      } else {
        cpu::DequantizeRowFast(w.type, w.row(s0 + i), buf.data() + i * w.cols, w.cols);
        rows[i] = buf.data() + i * w.cols;
      }
    }
    if (few) {
      TileDots(rows, ns, x, n, w.cols, y + s0, w.rows);
      continue;
    }
    for (int64_t t = 0; t < n; t += kGemmTokens) {
      const int64_t nt = std::min<int64_t>(kGemmTokens, n - t);
      const float* xt = x + t * w.cols;
      for (int64_t g = 0; g < ns; g += 4) {
        // A short last group repeats its last row; the copies are dropped.
        const float* w4[4];
        for (int64_t i = 0; i < 4; ++i) w4[i] = rows[std::min(g + i, ns - 1)];
        const int nr = static_cast<int>(std::min<int64_t>(4, ns - g));
        float* yt = y + t * w.rows + s0 + g;
        kDotTiles[nt - 1](w4, xt, w.cols, yt, w.rows, nr);
      }
    }
  }
}

void MatMulTiles(const WeightView& w, const float* x, int64_t n, float* y, int64_t tile_begin,
                 int64_t tile_end) {
  const bool direct = w.type == gguf::TensorType::kF32;
  const int64_t r0 = tile_begin * kTileRows, r1 = std::min(w.rows, tile_end * kTileRows);
  if (n <= kMaxFusedTokens) {
#if TANDEM_KERNELS_AVX512 || TANDEM_KERNELS_AVX2
    // Decode is bound by the weight bytes: f16 / bf16 rows are widened in
    // registers, never written out.
    if (w.type == gguf::TensorType::kF16) {
      MatMulRowsInPlace<cpu::RowKind::kF16>(w, x, n, y, r0, r1);
      return;
    }
    if (w.type == gguf::TensorType::kBF16) {
      MatMulRowsInPlace<cpu::RowKind::kBf16>(w, x, n, y, r0, r1);
      return;
    }
#endif
    if (direct) {
      MatMulRowsInPlace<cpu::RowKind::kF32>(w, x, n, y, r0, r1);
      return;
    }
    if (HasFusedPath(w.type)) {
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t t = 0; t < n; ++t) {
          cpu::FusedRowDot(w.type, w.row(r), x + t * w.cols, w.cols, y + t * w.rows + r);
        }
      }
      return;
    }
  }
  GemmRows(w, x, n, y, r0, r1);
}

}  // namespace

void MatMul(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool* pool) {
  if (w.rows <= 0) return;
  MatMulShared(&w, &y, 1, x, n, pool);  // one matrix: the same tiles and split
}

void MatMulShared(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n,
                  ThreadPool* pool) {
  if (n <= 0) return;
  constexpr int kMaxShared = 8;
  TANDEM_CHECK(count > 0 && count <= kMaxShared);
  int64_t first[kMaxShared + 1] = {0};  // matrix i owns global tiles [first[i], first[i + 1])
  for (int i = 0; i < count; ++i) {
    TANDEM_CHECK(ws[i].cols == ws[0].cols);
    first[i + 1] = first[i] + (ws[i].rows + kTileRows - 1) / kTileRows;
  }
  ThreadPool::Run(
      pool, first[count],
      [&](int64_t begin, int64_t end) {
        for (int i = 0; i < count; ++i) {
          const int64_t b = std::max(begin, first[i]), e = std::min(end, first[i + 1]);
          if (b < e) MatMulTiles(ws[i], x, n, ys[i], b - first[i], e - first[i]);
        }
      },
      4);
}

void EmbeddingLookup(const WeightView& table, const int32_t* ids, int64_t n, float* out) {
  for (int64_t t = 0; t < n; ++t) {
    cpu::DequantizeRowFast(table.type, table.row(ids[t]), out + t * table.cols, table.cols);
  }
}

TANDEM_KERNELS_VARIANT_END
}  // namespace tandem::kernels
