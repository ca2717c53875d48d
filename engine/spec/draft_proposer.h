// Draft-model proposals for speculative decoding (`--spec-method draft`): a
// second, smaller (or lower-precision) model with the target's vocabulary
// proposes k tokens per step for each sequence in its decode phase.
//
// The proposer owns the draft model's executor and its own paged KV cache
// (a KvCacheManager of its own, prefix caching off), and per sequence the
// token ids whose K/V it holds. Propose(), once per engine step for every
// sequence that wants drafts, batched across them:
//   1. rollback: the draft's K/V is valid for the longest prefix of what it
//      computed that equals the sequence's tokens (rejected drafts and the
//      correction token fall out here); at most num_tokens - 1 of them, so
//      the last token is always run to produce logits;
//   2. catch-up: tokens the draft has not seen (the prompt on the first
//      proposal, after a preemption everything, else the last token and the
//      accepted drafts) run as prefill chunks of at most max_batch_tokens
//      tokens per forward, all sequences together, until every sequence is
//      caught up; the last chunk of each gives logits for draft 1;
//   3. k - 1 single-token steps, batched across the sequences still
//      drafting, each feeding the previous draft.
// Each draft is chosen with the request's own sampling transforms
// (penalties over the history including the earlier drafts, logit_bias,
// min_tokens masking, temperature, top-k, min-p, top-p: the Sampler's
// processed distribution q), greedy by argmax, sampled from q by inverse CDF
// in id order with CounterUniform(seed ^ kDraftSalt, position), so drafts,
// like the target's draws, depend only on (params, history, position) and
// never on the batch. For sampled requests q is returned with the drafts (the
// rejection sampler needs q(x) / p(x)); for greedy ones it is not.
//
// Release() frees a sequence's draft K/V (the Scheduler calls it when a
// sequence finishes, is cancelled or preempted). When the draft cache is
// full, sequences not in the current request set are evicted (they catch up
// later); a sequence that still does not fit gets no drafts this step.
//
// Thread safety: none; the engine thread owns it. The model is not owned and
// must outlive the proposer.
#ifndef TANDEM_ENGINE_SPEC_DRAFT_PROPOSER_H_
#define TANDEM_ENGINE_SPEC_DRAFT_PROPOSER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/executor.h"
#include "engine/kv_cache_manager.h"
#include "engine/llama_model.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"

namespace tandem::engine::spec {

// XORed into the request seed for the draft's own random draws.
inline constexpr uint64_t kDraftSalt = 0xbb67ae8584caa73bULL;

struct DraftProposerOptions {
  Device device = Device::kCpu;
  int64_t num_blocks = 0;  // of the draft's KV cache; >= 1
  int32_t block_size = 16;
  KvDtype kv_dtype = KvDtype::kF16;
  int64_t max_batch_tokens = 512;      // catch-up tokens per forward at most
  std::vector<int32_t> eos_token_ids;  // min_tokens masking, as the target's
};

class DraftProposer final : public BatchProposer {
 public:
  // REQUIRES: model non-null. Errors from the executor (device, dtype).
  static absl::StatusOr<std::unique_ptr<DraftProposer>> Create(const LlamaModel* model,
                                                               const DraftProposerOptions& options);

  std::vector<Proposal> Propose(absl::Span<const Request> requests) override;
  void Release(SeqId seq_id) override;

  // Sequences holding draft state / draft KV blocks in use (leak checks).
  int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }
  int64_t num_used_blocks() const { return kv_->num_blocks() - kv_->num_free_blocks(); }
  // Tokens the draft model has run (catch-up and drafting steps).
  int64_t num_forward_tokens() const { return num_forward_tokens_; }
  // KV integrity and, when `idle`, no sequence and no block held.
  absl::Status CheckIntegrity(bool idle) const;
  const std::string& description() const { return description_; }

 private:
  struct SeqState {
    std::vector<int32_t> tokens;  // ids whose K/V the draft holds, positions [0, size)
    int64_t num_verified = 0;     // leading tokens known to be the sequence's own
  };
  // One sequence's work in a Propose() call.
  struct Work;

  DraftProposer(const LlamaModel* model, const DraftProposerOptions& options);
  // Rolls back and allocates for `w`; false when the draft cache cannot hold it.
  bool Prepare(Work* w, absl::Span<const Request> requests);
  // Runs the scheduled chunks; rows of *logits for those with `samples`.
  absl::Status Run(const SchedulerOutput& out, std::vector<float>* logits);
  // Propose's two phases: the catch-up of every sequence's history, chunked
  // like prefill (the chunk reaching a sequence's end gives its first
  // draft), then drafts 2 .. k, one token per sequence and forward.
  absl::Status CatchUp(std::vector<Work>& work, std::vector<float>* logits);
  absl::Status DraftSteps(std::vector<Work>& work, std::vector<float>* logits);
  // Chooses the next draft of `w` from its logits row.
  void Choose(Work* w, absl::Span<const float> logits);

  DraftProposerOptions options_;
  int64_t vocab_size_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<KvCacheManager> kv_;
  absl::node_hash_map<SeqId, SeqState> seqs_;  // pointer-stable (Work::state)
  Sampler sampler_;
  std::vector<float> processed_;
  std::vector<int32_t> ids_;
  std::vector<double> probs_;
  int64_t num_forward_tokens_ = 0;
  std::string description_;
};

}  // namespace tandem::engine::spec

#endif  // TANDEM_ENGINE_SPEC_DRAFT_PROPOSER_H_
