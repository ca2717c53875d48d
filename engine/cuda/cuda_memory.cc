#include "engine/cuda/cuda_memory.h"

#include <vector>

#include "absl/strings/str_format.h"
#include "common/status.h"
#include "engine/cuda/cuda_weights.h"
#include "kernels/cuda/cuda_kernels.h"

namespace tandem::engine::cuda {
namespace {

namespace kc = kernels::cuda;
using gguf::TensorType;

// rows x the row bytes of `type` (a table, as stored); -1 when cols is not
// whole blocks.
int64_t TableBytes(const kernels::WeightView& v, TensorType type) {
  absl::StatusOr<uint64_t> row = gguf::RowBytes(type, v.cols);
  return row.ok() ? v.rows * static_cast<int64_t>(*row) : -1;
}

// A matrix for the matrix products: planar when quantized (with its
// alignment), else as stored; -1 when cols is not whole blocks.
int64_t MatrixBytes(TensorType type, int64_t rows, int64_t cols) {
  absl::StatusOr<uint64_t> row = gguf::RowBytes(type, cols);
  if (!row.ok()) return -1;
  const kc::DeviceMatrix m{type, nullptr, rows, cols, static_cast<int64_t>(*row)};
  const int64_t planar = kc::PlanarBytes(m);
  return planar > 0 ? planar : rows * m.row_bytes;
}

// Q|K|V or gate|up as the upload stores them (StacksAsOne).
int64_t StackedBytes(const std::vector<const kernels::WeightView*>& views) {
  if (StacksAsOne(views)) {
    int64_t rows = 0;
    for (const auto* v : views) rows += v->rows;
    return MatrixBytes(DeviceMatrixType(views[0]->type), rows, views[0]->cols);
  }
  int64_t total = 0;
  for (const auto* v : views) {
    const int64_t b = MatrixBytes(DeviceMatrixType(v->type), v->rows, v->cols);
    if (b < 0) return -1;
    total += b;
  }
  return total;
}

int64_t FloatBytes(const std::vector<float>& v) {
  return static_cast<int64_t>(v.size() * sizeof(float));
}

double GiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); }

}  // namespace

int64_t DeviceWeightBytes(const LlamaModel& model) {
  const ModelWeights& mw = model.weights();
  // The LM head is its own (planar) matrix, also when tied to the table.
  std::vector<int64_t> parts = {
      TableBytes(mw.token_embd, DeviceTableType(mw.token_embd.type)),
      MatrixBytes(DeviceMatrixType(mw.lm_head.type), mw.lm_head.rows, mw.lm_head.cols),
      FloatBytes(mw.output_norm) + FloatBytes(mw.rope_freqs)};
  for (const LayerWeights& l : mw.layers) {
    parts.push_back(StackedBytes({&l.wq, &l.wk, &l.wv}));
    parts.push_back(StackedBytes({&l.w_gate, &l.w_up}));
    parts.push_back(MatrixBytes(DeviceMatrixType(l.wo.type), l.wo.rows, l.wo.cols));
    parts.push_back(MatrixBytes(DeviceMatrixType(l.w_down.type), l.w_down.rows, l.w_down.cols));
    parts.push_back(FloatBytes(l.attn_norm) + FloatBytes(l.ffn_norm) + FloatBytes(l.bq) +
                    FloatBytes(l.bk) + FloatBytes(l.bv));
  }
  int64_t total = 0;
  for (int64_t p : parts) {
    if (p < 0) return -1;
    total += p;
  }
  return total;
}

absl::StatusOr<int64_t> FreeMemoryForKv(const LlamaModel& model, int device_index) {
  const int64_t weights = DeviceWeightBytes(model);
  if (weights < 0) return absl::InvalidArgumentError("cuda: matrix cols not block aligned");
  int64_t free_bytes = 0, total_bytes = 0;
  if (absl::Status s = kc::DeviceMemoryInfo(device_index, &free_bytes, &total_bytes); !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("--device cuda: device %d: %s", device_index, s.message()));
  }
  if (weights >= free_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the model's weights need %.2f GiB of device memory, cuda:%d has %.2f GiB free "
        "(%.2f GiB in all)",
        GiB(weights), device_index, GiB(free_bytes), GiB(total_bytes)));
  }
  return free_bytes - weights;
}

}  // namespace tandem::engine::cuda
