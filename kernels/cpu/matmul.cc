// Dispatched MatMul and EmbeddingLookup.
//
// Rows are processed in tiles of kTileRows: a tile is dequantized once into a
// per-thread f32 buffer and then applied to every token, four rows at a time
// (Dot4F32); for one or two tokens, quantized rows are instead dequantized in
// registers and dotted directly (FusedRowDot, same bits). Each (token, row) dot uses the canonical
// DotF32 order, so y does not depend on n, on the other tokens, or on how rows are split over
// threads.
#include <algorithm>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace tandem::kernels {
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

void MatMulTiles(const WeightView& w, const float* x, int64_t n, float* y, int64_t tile_begin,
                 int64_t tile_end) {
  const bool direct = w.type == gguf::TensorType::kF32;
  if (n <= kMaxFusedTokens && HasFusedPath(w.type)) {
    for (int64_t r = tile_begin * kTileRows; r < std::min(w.rows, tile_end * kTileRows); ++r) {
      for (int64_t t = 0; t < n; ++t) {
        cpu::FusedRowDot(w.type, w.row(r), x + t * w.cols, w.cols, y + t * w.rows + r);
      }
    }
    return;
  }
  std::vector<float> buf(direct ? 0 : kTileRows * w.cols);
  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    const int64_t r0 = tile * kTileRows;
    const int64_t nr = std::min(kTileRows, w.rows - r0);
    const float* rows[kTileRows];
    for (int64_t i = 0; i < nr; ++i) {
      if (direct) {
        rows[i] = reinterpret_cast<const float*>(w.row(r0 + i));
      } else {
        cpu::DequantizeRowFast(w.type, w.row(r0 + i), buf.data() + i * w.cols, w.cols);
        rows[i] = buf.data() + i * w.cols;
      }
    }
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = x + t * w.cols;
      float* yt = y + t * w.rows + r0;
      int64_t i = 0;
      for (; i + 4 <= nr; i += 4) cpu::Dot4F32(rows + i, xt, w.cols, yt + i);
      for (; i < nr; ++i) yt[i] = cpu::DotF32(rows[i], xt, w.cols);
    }
  }
}

}  // namespace

void MatMul(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool* pool) {
  if (n <= 0 || w.rows <= 0) return;
  const int64_t num_tiles = (w.rows + kTileRows - 1) / kTileRows;
  ThreadPool::Run(
      pool, num_tiles, [&](int64_t begin, int64_t end) { MatMulTiles(w, x, n, y, begin, end); }, 4);
}

void EmbeddingLookup(const WeightView& table, const int32_t* ids, int64_t n, float* out) {
  for (int64_t t = 0; t < n; ++t) {
    cpu::DequantizeRowFast(table.type, table.row(ids[t]), out + t * table.cols, table.cols);
  }
}

}  // namespace tandem::kernels
