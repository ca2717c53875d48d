#include "engine/executor.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/cpu_executor.h"
#include "engine/llama_model.h"
#include "engine/memory_size.h"
#if defined(TANDEM_HAVE_CUDA_EXECUTOR)
#include "engine/cuda/cuda_executor.h"
#include "engine/cuda/cuda_memory.h"
#endif

namespace tandem::engine {

bool ParseDevice(std::string_view s, Device* device) {
  if (s == "cpu") {
    *device = Device::kCpu;
  } else if (s == "cuda") {
    *device = Device::kCuda;
  } else {
    return false;
  }
  return true;
}

std::string_view DeviceName(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

absl::Status CheckDeviceAvailable(Device device) {
  if (device == Device::kCpu) return absl::OkStatus();
#if defined(TANDEM_HAVE_CUDA_EXECUTOR)
  return cuda::CheckDevice(0);
#else
  return absl::FailedPreconditionError(
      "--device cuda: this build has no CUDA support (nvcc was not found when it was "
      "configured; rebuild with the CUDA toolkit, cmake -DTANDEM_CUDA=ON)");
#endif
}

absl::Status CheckKvDtypeSupported(Device device, KvDtype dtype) {
  if (device == Device::kCuda && kernels::KvHasScales(dtype)) {
    return absl::FailedPreconditionError(
        absl::StrCat("--kv-cache-dtype ", kernels::KvDtypeName(dtype),
                     ": the CUDA executor holds f32, f16 or bf16 KV caches only (use "
                     "--kv-cache-dtype f32|f16|bf16 with --device cuda)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Executor>> MakeExecutor(const LlamaModel* model,
                                                       const ExecutorOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("null model");
  if (options.device == Device::kCpu) {
    TANDEM_ASSIGN_OR_RETURN(
        std::unique_ptr<CpuExecutor> cpu,
        CpuExecutor::Create(model, options.num_blocks, options.block_size, options.kv_dtype));
    return std::unique_ptr<Executor>(std::move(cpu));
  }
  TANDEM_RETURN_IF_ERROR(CheckDeviceAvailable(options.device));
  TANDEM_RETURN_IF_ERROR(CheckKvDtypeSupported(options.device, options.kv_dtype));
#if defined(TANDEM_HAVE_CUDA_EXECUTOR)
  return cuda::MakeCudaExecutor(model, options);
#else
  return absl::FailedPreconditionError("--device cuda: this build has no CUDA support");
#endif
}

absl::StatusOr<int64_t> FreeMemoryForKv(const LlamaModel* model, const ExecutorOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("null model");
  if (options.device == Device::kCpu) return ReadAvailableMemoryBytes();
  TANDEM_RETURN_IF_ERROR(CheckDeviceAvailable(options.device));
#if defined(TANDEM_HAVE_CUDA_EXECUTOR)
  return cuda::FreeMemoryForKv(*model, options.device_index);
#else
  return absl::FailedPreconditionError("--device cuda: this build has no CUDA support");
#endif
}

absl::Status ValidateSlots(const KvCacheShape& shape, absl::Span<const int64_t> slots) {
  const int64_t n = shape.num_slots();
  for (int64_t slot : slots) {
    if (slot < 0 || slot >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV slot ", slot, " outside the cache's ", n, " slots"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateBlockCopies(const KvCacheShape& shape, absl::Span<const BlockCopy> copies) {
  const int64_t n = shape.layout.num_blocks;
  for (const BlockCopy& c : copies) {
    if (c.src < 0 || c.src >= n || c.dst < 0 || c.dst >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("block copy ", c.src, " -> ", c.dst, " outside the cache's ", n, " blocks"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::engine
