// ForwardBatch: the flattened tokens of one engine step, what an Executor
// (engine/executor.h) runs. Plain host vectors, no backend types: the CPU
// executor reads them directly, the CUDA executor uploads them.
#ifndef TANDEM_ENGINE_FORWARD_BATCH_H_
#define TANDEM_ENGINE_FORWARD_BATCH_H_

#include <atomic>
#include <cstdint>
#include <vector>

namespace tandem::engine {

// Flattened tokens of all scheduled sequences.
struct ForwardBatch {
  std::vector<int32_t> token_ids;     // [num_tokens]
  std::vector<int32_t> positions;     // [num_tokens]
  std::vector<int64_t> slot_mapping;  // [num_tokens] cache slot for each token's K/V
  std::vector<int32_t>
      query_start;  // [num_seqs + 1] tokens of seq i: [query_start[i], query_start[i+1])
  std::vector<int32_t> context_lens;  // [num_seqs] tokens in the cache for seq i after this step
  std::vector<std::vector<int32_t>> block_tables;  // [num_seqs][num_blocks_of_seq]
  std::vector<int32_t> logits_indices;             // token rows whose logits are computed
  // Optional, not owned: when it reads true between layers, the executor
  // stops and returns Cancelled (every request in the step was cancelled, so
  // its results would be thrown away). Executors may check it less often.
  const std::atomic<bool>* abort = nullptr;

  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  int64_t num_seqs() const { return static_cast<int64_t>(context_lens.size()); }
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_FORWARD_BATCH_H_
