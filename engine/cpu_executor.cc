#include "engine/cpu_executor.h"

#include <algorithm>
#include <new>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/status.h"
#include "engine/kv_export.h"

namespace tandem::engine {

absl::StatusOr<std::unique_ptr<CpuExecutor>> CpuExecutor::Create(const LlamaModel* model,
                                                                 int64_t num_blocks,
                                                                 int64_t block_size,
                                                                 KvDtype kv_dtype) {
  if (model == nullptr) return absl::InvalidArgumentError("null model");
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<KvCacheStorage> cache,
                          model->MakeKvCache(num_blocks, block_size, kv_dtype));
  return std::unique_ptr<CpuExecutor>(new CpuExecutor(model, std::move(cache)));
}

std::string CpuExecutor::Describe() const {
  const int threads = model_->pool() != nullptr ? model_->pool()->num_threads() : 1;
  return absl::StrFormat("cpu: %d thread%s, KV cache %s in host memory (%.1f MiB)", threads,
                         threads == 1 ? "" : "s", kernels::KvDtypeName(cache_->dtype()),
                         cache_->total_bytes() / 1048576.0);
}

absl::Status CpuExecutor::CopyBlocks(absl::Span<const BlockCopy> copies) {
  TANDEM_RETURN_IF_ERROR(ValidateBlockCopies(shape_, copies));
  for (const BlockCopy& copy : copies) cache_->CopyBlock(copy.src, copy.dst);
  return absl::OkStatus();
}

absl::Status CpuExecutor::Forward(const ForwardBatch& batch, float* logits) {
  return model_->Forward(batch, cache_.get(), logits);
}

absl::Status CpuExecutor::ReadKv(absl::Span<const int64_t> slots, char* dst) {
  TANDEM_RETURN_IF_ERROR(ValidateSlots(shape_, slots));
  const int64_t bpt = shape_.bytes_per_token();
  for (int64_t slot : slots) {
    cache_->ReadSlot(slot, dst);
    dst += bpt;
  }
  return absl::OkStatus();
}

absl::Status CpuExecutor::WriteKv(absl::Span<const int64_t> slots, const char* src) {
  TANDEM_RETURN_IF_ERROR(ValidateSlots(shape_, slots));
  const int64_t bpt = shape_.bytes_per_token();
  for (int64_t slot : slots) {
    cache_->WriteSlot(slot, src);
    src += bpt;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<KvDeviceBytes>> CpuExecutor::AllocKvDevice(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError("negative KV buffer size");
  char* data = new (std::nothrow) char[std::max<int64_t>(bytes, 1)];
  if (data == nullptr) {
    return absl::ResourceExhaustedError(absl::StrFormat("no host memory for %d KV bytes", bytes));
  }
  return std::make_shared<KvDeviceBytes>(data, bytes, "cpu",
                                         [](void* p) { delete[] static_cast<char*>(p); });
}

}  // namespace tandem::engine
