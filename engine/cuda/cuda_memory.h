// What a --kv-cache-memory fraction is a fraction of on a CUDA device: the
// device's free memory less the bytes the model's weights will take there
// (internal to engine/; reached through engine::FreeMemoryForKv). No CUDA
// types.
#ifndef TANDEM_ENGINE_CUDA_CUDA_MEMORY_H_
#define TANDEM_ENGINE_CUDA_CUDA_MEMORY_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/llama_model.h"

namespace tandem::engine::cuda {

// The device bytes UploadWeights(model) allocates, by cuda_weights.cc's
// rules: Q4_0 / Q4_1 / Q8_0 matrices in the planar layout (kc::PlanarBytes,
// Q|K|V and gate|up stacked when their device types and widths match), BF16
// as stored, any other matrix as bf16; the embedding as stored when it is a
// table type (those and F16 / F32), else bf16; the LM head its own matrix,
// also when tied; norms, biases and rope factors as f32. Host arithmetic
// only (no device needed); -1 when a row size is not whole blocks
// (UploadWeights refuses such a model).
int64_t DeviceWeightBytes(const LlamaModel& model);

// cudaMemGetInfo's free bytes on `device_index` less DeviceWeightBytes.
// FailedPrecondition when the device cannot be queried, ResourceExhausted
// (naming both sizes) when the weights alone do not fit.
absl::StatusOr<int64_t> FreeMemoryForKv(const LlamaModel& model, int device_index);

}  // namespace tandem::engine::cuda

#endif  // TANDEM_ENGINE_CUDA_CUDA_MEMORY_H_
