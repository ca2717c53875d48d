// Runs one scheduled step on an Executor: SchedulerOutput -> ForwardBatch ->
// Executor::Forward -> one sampled token per sampling sequence.
//
// Execute():
//   1. has the executor perform the step's copy-on-write block copies, in
//      order, before anything reads or writes the cache;
//   2. flattens the scheduled chunks of every sequence into one ForwardBatch
//      from what the SchedulerOutput carries (no call back into the
//      scheduler or block manager): the chunk's token ids, their positions,
//      cache slots from the sequence's block table, context_len =
//      start_position + num_tokens, and one logits row (the chunk's last
//      token) only for sequences with `samples`;
//   3. runs Forward, then samples on the host each sampling sequence with its own
//      SamplingParams at position = num_tokens() (the index the new token will
//      occupy), so the counter-based RNG draws the same number on a replay
//      (after preemption, or with another batch composition).
//
// Speculative decoding: a sequence scheduled with k draft tokens gets logits
// rows for its last k + 1 positions. Position i is sampled exactly as plain
// decoding would sample it (same processed distribution, same (seed,
// position) draw, the drafts before it as history); draft i + 1 is accepted
// when it equals that sample, and the first mismatch (or the bonus position
// after k accepted drafts) gives the sampled token. For a draft that is a
// single proposed token (q one-hot: n-gram drafts) this is the rejection
// sampler's rule exactly (accept with p(d); else sample from p without d,
// renormalized), and since the forward pass is batch-invariant, the output
// is token-for-token the output without speculation, sampled or greedy.
// Drafts sampled from a draft model's distribution q (ScheduledSequence::
// draft_probs, sampled requests) are verified by the rejection sampler
// (engine/spec/rejection_sampler.h): accept with min(1, p/q), else a draw
// from norm(max(0, p - q)), a bonus draw from p after k accepted; p is the
// processed distribution plain sampling draws from and the draws are keyed
// by (seed, position), so the output has the distribution of plain sampling
// and does not depend on the batch. Greedy drafts of any source verify by
// argmax, token-identical to plain greedy decoding.
//
// Thread safety: none; the engine thread owns the runner. The executor is not
// owned and must outlive the runner.
#ifndef TANDEM_ENGINE_MODEL_RUNNER_H_
#define TANDEM_ENGINE_MODEL_RUNNER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/executor.h"
#include "engine/forward_batch.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"

namespace tandem::engine {

// The tokens sampled for one sequence this step: the accepted draft tokens
// (speculative decoding) and then one sampled token.
struct SampledToken {
  SeqId seq_id = 0;
  std::vector<SampleResult> accepted;  // verified drafts, in order
  SampleResult result;                 // token_id, and logprobs when the params ask for them
  int64_t num_drafts = 0;              // drafts proposed for this sequence this step
};

class ModelRunner {
 public:
  // eos_token_ids: the model's end-of-generation ids (min_tokens masking).
  // REQUIRES: executor non-null, vocab_size > 0.
  ModelRunner(Executor* executor, int64_t vocab_size, std::vector<int32_t> eos_token_ids);

  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // Runs `output` (the latest Schedule(); its `seq` pointers must be valid).
  // Returns one SampledToken per scheduled sequence with `samples`, in
  // scheduled order. An error from the executor (invalid batch, device
  // failure) is returned as is; the cache may then be partly written.
  absl::StatusOr<std::vector<SampledToken>> Execute(const SchedulerOutput& output);

  // A flag that, once true, aborts the running step between layers (the
  // executor returns Cancelled). Not owned; null = never.
  void set_abort_flag(const std::atomic<bool>* abort) { abort_ = abort; }

  // Builds the batch Execute() would run (exposed for tests).
  static ForwardBatch BuildBatch(const SchedulerOutput& output, int64_t block_size);

  // Tokens run through Forward so far (sum of num_batched_tokens), steps run.
  int64_t num_computed_tokens() const { return num_computed_tokens_; }
  int64_t num_steps() const { return num_steps_; }

 private:
  // Rejection sampling of drafts with a distribution q (sampled requests).
  void VerifySampled(const ScheduledSequence& s, int64_t first_row, const SamplingContext& context,
                     SampledToken* out);

  Executor* executor_;
  const std::atomic<bool>* abort_ = nullptr;
  int64_t vocab_size_;
  std::vector<int32_t> eos_token_ids_;
  Sampler sampler_;
  std::vector<float> logits_;         // [num sampling sequences, vocab]
  std::vector<float> processed_;      // [k + 1, vocab] VerifySampled scratch
  std::vector<double> target_probs_;  // [k + 1, vocab]
  std::vector<double> draft_probs_;   // [k, vocab]
  int64_t num_computed_tokens_ = 0;
  int64_t num_steps_ = 0;
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_MODEL_RUNNER_H_
