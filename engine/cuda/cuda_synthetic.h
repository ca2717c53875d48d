// A CUDA executor over a synthetic model: random weights of a config's
// shapes made directly on the device (benchmarks of models that are not on
// disk, e.g. bench/gpu_bench's Llama-3-8B shape). No CUDA types.
#ifndef TANDEM_ENGINE_CUDA_CUDA_SYNTHETIC_H_
#define TANDEM_ENGINE_CUDA_CUDA_SYNTHETIC_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/gguf/types.h"
#include "engine/executor.h"
#include "engine/model_config.h"

namespace tandem::engine::cuda {

// matrix_type: Q4_0, Q4_1, Q8_0 or BF16. FailedPrecondition without a device.
absl::StatusOr<std::unique_ptr<Executor>> MakeSyntheticCudaExecutor(const ModelConfig& config,
                                                                    gguf::TensorType matrix_type,
                                                                    const ExecutorOptions& options,
                                                                    uint64_t seed);

}  // namespace tandem::engine::cuda

#endif  // TANDEM_ENGINE_CUDA_CUDA_SYNTHETIC_H_
