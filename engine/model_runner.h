// Runs one scheduled step on the model: SchedulerOutput -> ForwardBatch ->
// LlamaModel::Forward -> one sampled token per sampling sequence.
//
// Execute():
//   1. performs the step's copy-on-write block copies in KvCacheStorage, in
//      order, before anything reads or writes the cache;
//   2. flattens the scheduled chunks of every sequence into one ForwardBatch:
//      token ids [start_position, start_position + num_tokens) of the
//      sequence, their positions, cache slots from the sequence's block table
//      (KvCacheManager), context_len = start_position + num_tokens, and one
//      logits row (the chunk's last token) only for sequences with `samples`;
//   3. runs Forward, then samples each sampling sequence with its own
//      SamplingParams at position = num_tokens() (the index the new token will
//      occupy), so the counter-based RNG draws the same number on a replay
//      (after preemption, or with another batch composition).
//
// Thread safety: none; the engine thread owns the runner. The model, cache,
// scheduler and manager are not owned and must outlive the call.
#ifndef TANDEM_ENGINE_MODEL_RUNNER_H_
#define TANDEM_ENGINE_MODEL_RUNNER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv_cache.h"
#include "engine/kv_cache_manager.h"
#include "engine/llama_model.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"

namespace tandem::engine {

// The token sampled for one sequence this step.
struct SampledToken {
  SeqId seq_id = 0;
  SampleResult result;  // token_id, and logprobs when the params ask for them
};

class ModelRunner {
 public:
  // eos_token_ids: the model's end-of-generation ids (min_tokens masking).
  // REQUIRES: model and cache non-null, cache shaped for the model.
  ModelRunner(const LlamaModel* model, KvCacheStorage* cache, std::vector<int32_t> eos_token_ids);

  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // Runs `output` (the latest Schedule() of `scheduler`, which tracks its
  // sequences' blocks in `kv`). Returns one SampledToken per scheduled
  // sequence with `samples`, in scheduled order. An error from Forward
  // (invalid batch) is returned as is; the cache may then be partly written.
  absl::StatusOr<std::vector<SampledToken>> Execute(const SchedulerOutput& output,
                                                    const Scheduler& scheduler,
                                                    const KvCacheManager& kv);

  // Builds the batch Execute() would run (exposed for tests).
  // REQUIRES: every scheduled sequence is known to `scheduler`.
  ForwardBatch BuildBatch(const SchedulerOutput& output, const Scheduler& scheduler,
                          const KvCacheManager& kv) const;

  // Tokens run through Forward so far (sum of num_batched_tokens), steps run.
  int64_t num_computed_tokens() const { return num_computed_tokens_; }
  int64_t num_steps() const { return num_steps_; }

 private:
  const LlamaModel* model_;
  KvCacheStorage* cache_;
  std::vector<int32_t> eos_token_ids_;
  Sampler sampler_;
  std::vector<float> logits_;  // [num sampling sequences, vocab]
  int64_t num_computed_tokens_ = 0;
  int64_t num_steps_ = 0;
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_MODEL_RUNNER_H_
