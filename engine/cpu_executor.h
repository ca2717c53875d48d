// The CPU executor: today's LlamaModel::Forward over a host KvCacheStorage.
// Behaviour and speed are those of the engine before the executor seam
// (the same kernels, the same thread pool, the same f32 cache layout).
#ifndef TANDEM_ENGINE_CPU_EXECUTOR_H_
#define TANDEM_ENGINE_CPU_EXECUTOR_H_

#include <memory>
#include <string>

#include "engine/executor.h"
#include "engine/kv_cache.h"
#include "engine/llama_model.h"

namespace tandem::engine {

class CpuExecutor final : public Executor {
 public:
  // A cache of num_blocks x block_size tokens shaped for `model` (not owned).
  static absl::StatusOr<std::unique_ptr<CpuExecutor>> Create(const LlamaModel* model,
                                                             int64_t num_blocks, int64_t block_size,
                                                             KvDtype kv_dtype = KvDtype::kF32);

  Device device() const override { return Device::kCpu; }
  std::string Describe() const override;
  const KvCacheShape& kv_shape() const override { return shape_; }
  int64_t kv_cache_bytes() const override { return cache_->total_bytes(); }
  absl::Status CopyBlocks(absl::Span<const BlockCopy> copies) override;
  absl::Status Forward(const ForwardBatch& batch, float* logits) override;
  absl::Status ReadKv(absl::Span<const int64_t> slots, char* dst) override;
  absl::Status WriteKv(absl::Span<const int64_t> slots, const char* src) override;
  // The CPU's own memory is host memory: "cpu", new[] / delete[], and the
  // device forms are ReadKv / WriteKv.
  std::string kv_memory_domain() const override { return "cpu"; }
  absl::StatusOr<std::shared_ptr<KvDeviceBytes>> AllocKvDevice(int64_t bytes) override;
  absl::Status ReadKvDevice(absl::Span<const int64_t> slots, void* dst) override {
    return ReadKv(slots, static_cast<char*>(dst));
  }
  absl::Status WriteKvDevice(absl::Span<const int64_t> slots, const void* src) override {
    return WriteKv(slots, static_cast<const char*>(src));
  }

  // The host cache (tests, references).
  KvCacheStorage& cache() { return *cache_; }
  const KvCacheStorage& cache() const { return *cache_; }

 private:
  CpuExecutor(const LlamaModel* model, std::unique_ptr<KvCacheStorage> cache)
      : model_(model), cache_(std::move(cache)), shape_(cache_->shape()) {}

  const LlamaModel* model_;
  std::unique_ptr<KvCacheStorage> cache_;
  KvCacheShape shape_;
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_CPU_EXECUTOR_H_
