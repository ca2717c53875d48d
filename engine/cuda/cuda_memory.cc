#include "engine/cuda/cuda_memory.h"

#include "absl/strings/str_format.h"
#include "common/status.h"
#include "kernels/cuda/cuda_kernels.h"

namespace tandem::engine::cuda {
namespace {

namespace kc = kernels::cuda;
using gguf::TensorType;

// rows x the row bytes of `type`; -1 when cols is not whole blocks.
int64_t MatrixBytes(const kernels::WeightView& v, TensorType type) {
  absl::StatusOr<uint64_t> row = gguf::RowBytes(type, v.cols);
  return row.ok() ? v.rows * static_cast<int64_t>(*row) : -1;
}

TensorType MatrixTypeOf(TensorType t) { return kc::IsMatrixType(t) ? t : TensorType::kBF16; }

int64_t FloatBytes(const std::vector<float>& v) {
  return static_cast<int64_t>(v.size() * sizeof(float));
}

double GiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); }

}  // namespace

int64_t DeviceWeightBytes(const LlamaModel& model) {
  const ModelWeights& mw = model.weights();
  const TensorType embd_type =
      kc::IsTableType(mw.token_embd.type) ? mw.token_embd.type : TensorType::kBF16;
  const TensorType head_type = MatrixTypeOf(mw.lm_head.type);
  std::vector<int64_t> parts = {MatrixBytes(mw.token_embd, embd_type)};
  if (mw.lm_head.data != mw.token_embd.data || head_type != embd_type) {
    parts.push_back(MatrixBytes(mw.lm_head, head_type));
  }
  parts.push_back(FloatBytes(mw.output_norm) + FloatBytes(mw.rope_freqs));
  for (const LayerWeights& l : mw.layers) {
    for (const kernels::WeightView* v :
         {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      parts.push_back(MatrixBytes(*v, MatrixTypeOf(v->type)));
    }
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
