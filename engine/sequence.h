// One generation request as the scheduler sees it.
//
// A Sequence holds its prompt and output token ids and how many of them are
// in the KV cache (num_computed_tokens). One rule drives scheduling: each step
// schedules tokens so num_computed_tokens catches up with num_tokens();
// prefill, chunked prefill and decode are the same rule. After preemption by
// recompute num_computed_tokens drops to 0 and the output so far is kept: it
// is recomputed with the prompt. The block table lives in KvCacheManager under
// id().
//
// Thread safety: none; owned by the Scheduler on the engine thread.
#ifndef TANDEM_ENGINE_SEQUENCE_H_
#define TANDEM_ENGINE_SEQUENCE_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "engine/finish_reason.h"
#include "engine/kv_cache_manager.h"
#include "engine/sampler.h"

namespace tandem::engine {

enum class SequenceStatus {
  kWaiting,
  kRunning,
  kPreempted,        // back in the waiting queue, to be recomputed
  kFinishedStopped,  // stop token / stop string
  kFinishedLength,   // max_tokens or context length
  kFinishedAborted,  // cancelled or failed
};

std::string_view SequenceStatusName(SequenceStatus status);
bool IsFinished(SequenceStatus status);
SequenceStatus FinishedStatus(FinishReason reason);

class Sequence {
 public:
  // extra_key: prefix-cache namespace (cache salt / adapter), see block_hash.h.
  Sequence(SeqId id, std::vector<int32_t> prompt_token_ids, SamplingParams params,
           uint64_t extra_key = 0);

  SeqId id() const { return id_; }
  const SamplingParams& sampling_params() const { return params_; }
  uint64_t extra_key() const { return extra_key_; }

  // Prompt then output: [num_tokens()].
  absl::Span<const int32_t> token_ids() const { return token_ids_; }
  absl::Span<const int32_t> prompt_token_ids() const {
    return absl::MakeConstSpan(token_ids_).subspan(0, num_prompt_tokens_);
  }
  absl::Span<const int32_t> output_token_ids() const {
    return absl::MakeConstSpan(token_ids_).subspan(num_prompt_tokens_);
  }
  int64_t num_tokens() const { return static_cast<int64_t>(token_ids_.size()); }
  int64_t num_prompt_tokens() const { return num_prompt_tokens_; }
  int64_t num_output_tokens() const { return num_tokens() - num_prompt_tokens_; }
  int32_t last_token_id() const { return token_ids_.back(); }

  // Tokens whose K/V are in the cache; <= num_tokens().
  int64_t num_computed_tokens() const { return num_computed_tokens_; }
  // Of those, tokens taken from the prefix cache when last admitted.
  int64_t num_cached_tokens() const { return num_cached_tokens_; }
  // Tokens still to compute before the next token can be sampled.
  int64_t num_uncomputed_tokens() const { return num_tokens() - num_computed_tokens_; }

  SequenceStatus status() const { return status_; }
  bool is_finished() const { return IsFinished(status_); }
  // Admission order (set by the Scheduler): lower arrived earlier.
  int64_t arrival() const { return arrival_; }
  int64_t num_preemptions() const { return num_preemptions_; }
  // Leading tokens whose K/V the caller supplies at admission instead of
  // computing them (a KV handoff); the scheduler reports them as a KvImport
  // when it admits the sequence and clears this (a preempted sequence
  // recomputes). < num_tokens().
  int64_t num_imported_tokens() const { return num_imported_tokens_; }
  void set_num_imported_tokens(int64_t n) { num_imported_tokens_ = n; }

  // Mutators used by the Scheduler.
  void AppendToken(int32_t token_id) { token_ids_.push_back(token_id); }
  void set_num_computed_tokens(int64_t n) { num_computed_tokens_ = n; }
  void set_num_cached_tokens(int64_t n) { num_cached_tokens_ = n; }
  void set_status(SequenceStatus status) { status_ = status; }
  void set_arrival(int64_t arrival) { arrival_ = arrival; }
  void count_preemption() { ++num_preemptions_; }

  // Speculative decoding back-off (Scheduler): steps to skip proposing, and
  // consecutive drafts with nothing accepted.
  int64_t spec_skip_steps() const { return spec_skip_steps_; }
  int64_t spec_misses() const { return spec_misses_; }
  void set_spec_backoff(int64_t skip_steps, int64_t misses) {
    spec_skip_steps_ = skip_steps;
    spec_misses_ = misses;
  }
  // Running mean of drafts accepted per verification (adaptive k); starts
  // optimistic so the first drafts are full length.
  double spec_accept_ema() const { return spec_accept_ema_; }
  void set_spec_accept_ema(double v) { spec_accept_ema_ = v; }

 private:
  SeqId id_;
  std::vector<int32_t> token_ids_;
  int64_t num_prompt_tokens_;
  SamplingParams params_;
  uint64_t extra_key_;
  int64_t num_computed_tokens_ = 0;
  int64_t num_cached_tokens_ = 0;
  SequenceStatus status_ = SequenceStatus::kWaiting;
  int64_t arrival_ = 0;
  int64_t num_preemptions_ = 0;
  int64_t num_imported_tokens_ = 0;
  int64_t spec_skip_steps_ = 0;
  int64_t spec_misses_ = 0;
  double spec_accept_ema_ = 1e9;
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_SEQUENCE_H_
