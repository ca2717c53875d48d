// Runs one sequence through a LlamaModel with its own paged KV cache and an
// identity block table (block i holds positions [16 i, 16 i + 16)). For
// `tandem generate`, tools and tests; the serving engine uses a scheduler and
// a block allocator instead.
//
// Thread safety: none (one caller). The model must outlive the runner.
#ifndef TANDEM_ENGINE_SINGLE_SEQUENCE_RUNNER_H_
#define TANDEM_ENGINE_SINGLE_SEQUENCE_RUNNER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/kv_cache.h"
#include "engine/llama_model.h"

namespace tandem::engine {

class SingleSequenceRunner {
 public:
  // max_tokens: prompt + generated tokens the cache holds (capped at the
  // model's context length). prefill_chunk: tokens per Forward during Prefill.
  // kv_dtype: element type of its KV cache.
  static absl::StatusOr<std::unique_ptr<SingleSequenceRunner>> Create(
      const LlamaModel* model, int64_t max_tokens, int64_t prefill_chunk = 256,
      KvDtype kv_dtype = KvDtype::kF32);

  // Appends `tokens` to the sequence (in chunks) and returns the logits
  // [vocab_size] of the last one. InvalidArgument if empty, out of vocab or
  // over capacity (the sequence is then unchanged only for validation errors
  // found before any compute).
  absl::StatusOr<std::vector<float>> Prefill(absl::Span<const int32_t> tokens);

  // Appends one token; returns the logits [vocab_size] that follow it.
  absl::StatusOr<std::vector<float>> DecodeStep(int32_t token) { return Prefill({&token, 1}); }

  // Forgets the sequence (the cache is reused).
  void Reset() { num_tokens_ = 0; }

  int64_t num_tokens() const { return num_tokens_; }  // tokens in the cache
  int64_t capacity() const { return capacity_; }

 private:
  SingleSequenceRunner(const LlamaModel* model, std::unique_ptr<KvCacheStorage> cache,
                       int64_t capacity, int64_t prefill_chunk);

  const LlamaModel* model_;
  std::unique_ptr<KvCacheStorage> cache_;
  int64_t capacity_;
  int64_t prefill_chunk_;
  int64_t num_tokens_ = 0;
  std::vector<int32_t> block_table_;  // identity
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_SINGLE_SEQUENCE_RUNNER_H_
