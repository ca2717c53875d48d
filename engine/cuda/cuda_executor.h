// The CUDA executor's entry points, for engine/executor.cc only. Defined in
// engine/cuda/cuda_executor.cc, compiled into tandem_engine when CMake finds
// nvcc (TANDEM_HAVE_CUDA_EXECUTOR). No CUDA type appears here.
#ifndef TANDEM_ENGINE_CUDA_CUDA_EXECUTOR_H_
#define TANDEM_ENGINE_CUDA_CUDA_EXECUTOR_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/executor.h"

namespace tandem::engine::cuda {

// OK when device `device_index` exists; FailedPrecondition naming the cause.
absl::Status CheckDevice(int device_index);

// Uploads `model`'s weights and allocates the KV cache on the device.
absl::StatusOr<std::unique_ptr<Executor>> MakeCudaExecutor(const LlamaModel* model,
                                                           const ExecutorOptions& options);

}  // namespace tandem::engine::cuda

#endif  // TANDEM_ENGINE_CUDA_CUDA_EXECUTOR_H_
