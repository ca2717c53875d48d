// A Llama-family model's weights in device memory (internal to engine/cuda).
//
// Q4_0 / Q4_1 / Q8_0 matrices are uploaded as they are (GGUF block layout);
// every other matrix type is dequantized on the host and uploaded as bf16.
// Q|K|V (and gate|up) are stacked into one matrix when their device types
// match, so one MatMul produces the whole row. Norms, biases and rope factors
// are f32. No CUDA types: device pointers are plain pointers.
//
// Ownership: DeviceWeights owns its device allocations (freed on destruction).
#ifndef TANDEM_ENGINE_CUDA_CUDA_WEIGHTS_H_
#define TANDEM_ENGINE_CUDA_CUDA_WEIGHTS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/llama_model.h"
#include "engine/model_config.h"
#include "kernels/cuda/cuda_kernels.h"

namespace tandem::engine::cuda {

struct DeviceFree {
  void operator()(void* p) const { kernels::cuda::Free(p); }
};
using DevicePtr = std::unique_ptr<void, DeviceFree>;

// A matrix whose output lands at columns [offset, offset + m.rows) of a row.
struct MatrixPart {
  kernels::cuda::DeviceMatrix m;
  int64_t offset = 0;
};

struct DeviceLayer {
  std::vector<MatrixPart> qkv;      // into [T, q_dim + 2 * kv_dim]
  std::vector<MatrixPart> gate_up;  // into [T, 2 * ffn]
  kernels::cuda::DeviceMatrix wo, down;
  float* attn_norm = nullptr;  // [hidden]
  float* ffn_norm = nullptr;   // [hidden]
  float* qkv_bias = nullptr;   // [q_dim + 2 * kv_dim] or null
};

struct DeviceWeights {
  kernels::cuda::DeviceMatrix token_embd;  // table type
  kernels::cuda::DeviceMatrix lm_head;     // matrix type
  float* output_norm = nullptr;
  float* rope_freqs = nullptr;  // [rope_dim / 2] or null
  std::vector<DeviceLayer> layers;
  std::map<std::string, int> device_types;  // "Q4_1 (kept)", "BF16 (from F16)" -> count
  int64_t bytes = 0;
  int64_t max_cols = 0;  // widest matrix input (workspace sizing)
  std::vector<DevicePtr> owned;
};

// Uploads `model`'s weights (synchronously, on `stream`).
// The upload's type rules, shared with cuda_memory.cc's byte count: a
// matrix keeps its type when the matrix products read it (Q4_0 / Q4_1 /
// Q8_0 / BF16), else becomes bf16; a table (the embedding) also keeps F16 /
// F32. Q|K|V and gate|up are stacked into one matrix when every part has the
// same device type and width.
gguf::TensorType DeviceMatrixType(gguf::TensorType stored);
gguf::TensorType DeviceTableType(gguf::TensorType stored);
bool StacksAsOne(const std::vector<const kernels::WeightView*>& parts);

absl::StatusOr<DeviceWeights> UploadWeights(const LlamaModel& model, kernels::cuda::Stream stream);

// Random weights of `config`'s shapes made on the device: matrices (and the
// embedding / LM head) of `matrix_type` (Q4_0, Q4_1, Q8_0 or BF16), norms 1.
absl::StatusOr<DeviceWeights> SyntheticWeights(const ModelConfig& config,
                                               gguf::TensorType matrix_type, uint64_t seed,
                                               kernels::cuda::Stream stream);

}  // namespace tandem::engine::cuda

#endif  // TANDEM_ENGINE_CUDA_CUDA_WEIGHTS_H_
