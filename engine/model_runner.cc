#include "engine/model_runner.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/spec/rejection_sampler.h"

namespace tandem::engine {

ModelRunner::ModelRunner(Executor* executor, int64_t vocab_size, std::vector<int32_t> eos_token_ids)
    : executor_(executor), vocab_size_(vocab_size), eos_token_ids_(std::move(eos_token_ids)) {
  TANDEM_CHECK(executor_ != nullptr && vocab_size_ > 0);
}

ForwardBatch ModelRunner::BuildBatch(const SchedulerOutput& output, int64_t block_size) {
  ForwardBatch b;
  b.token_ids.reserve(output.num_batched_tokens);
  b.positions.reserve(output.num_batched_tokens);
  b.slot_mapping.reserve(output.num_batched_tokens);
  b.query_start.reserve(output.scheduled.size() + 1);
  b.query_start.push_back(0);
  for (const ScheduledSequence& s : output.scheduled) {
    TANDEM_CHECK(static_cast<int64_t>(s.token_ids.size()) == s.num_tokens);
    const int64_t end = s.start_position + s.num_tokens;
    TANDEM_CHECK(static_cast<int64_t>(s.block_table.size()) * block_size >= end);
    for (int64_t i = 0; i < s.num_tokens; ++i) {
      const int64_t p = s.start_position + i;
      b.token_ids.push_back(s.token_ids[i]);
      b.positions.push_back(static_cast<int32_t>(p));
      b.slot_mapping.push_back(int64_t{s.block_table[p / block_size]} * block_size +
                               p % block_size);
    }
    if (s.samples) {
      const int32_t end_row = static_cast<int32_t>(b.token_ids.size());
      for (int64_t i = s.num_spec_tokens; i >= 0; --i) {
        b.logits_indices.push_back(end_row - 1 - static_cast<int32_t>(i));
      }
    }
    b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
    b.context_lens.push_back(static_cast<int32_t>(end));
    b.block_tables.push_back(s.block_table);
  }
  return b;
}

absl::StatusOr<std::vector<SampledToken>> ModelRunner::Execute(const SchedulerOutput& output) {
  TANDEM_RETURN_IF_ERROR(executor_->CopyBlocks(output.block_copies));
  std::vector<SampledToken> sampled;
  if (output.scheduled.empty()) return sampled;

  ForwardBatch batch = BuildBatch(output, executor_->kv_shape().layout.block_size);
  batch.abort = abort_;
  logits_.resize(batch.logits_indices.size() * vocab_size_);
  TANDEM_RETURN_IF_ERROR(executor_->Forward(batch, logits_.data()));
  num_computed_tokens_ += batch.num_tokens();
  ++num_steps_;

  sampled.reserve(output.scheduled.size());
  int64_t row = 0;
  std::vector<int32_t> history;
  for (const ScheduledSequence& s : output.scheduled) {
    if (!s.samples) continue;
    const Sequence* seq = s.seq;
    TANDEM_CHECK(seq != nullptr);
    SamplingContext context;
    context.token_ids = seq->token_ids();
    context.num_prompt_tokens = seq->num_prompt_tokens();
    context.eos_token_ids = eos_token_ids_;
    SampledToken out;
    out.seq_id = s.seq_id;
    out.num_drafts = s.num_spec_tokens;
    const int64_t first_row = row;
    row += s.num_spec_tokens + 1;
    if (s.num_spec_tokens > 0 && !s.draft_probs.empty() &&
        seq->sampling_params().temperature > 0.0) {
      VerifySampled(s, first_row, context, &out);
      sampled.push_back(std::move(out));
      continue;
    }
    if (s.num_spec_tokens > 0) {
      history.assign(seq->token_ids().begin(), seq->token_ids().end());
    }
    for (int64_t i = 0;; ++i) {
      absl::Span<const float> logits(logits_.data() + (first_row + i) * vocab_size_, vocab_size_);
      if (i > 0) context.token_ids = history;
      SampleResult r =
          sampler_.Sample(logits, seq->sampling_params(), seq->num_tokens() + i, context);
      const int64_t draft_index = static_cast<int64_t>(s.token_ids.size()) - s.num_spec_tokens + i;
      if (i < s.num_spec_tokens && r.token_id == s.token_ids[draft_index]) {
        history.push_back(r.token_id);
        out.accepted.push_back(std::move(r));
        continue;
      }
      out.result = std::move(r);
      break;
    }
    sampled.push_back(std::move(out));
  }
  return sampled;
}

void ModelRunner::VerifySampled(const ScheduledSequence& s, int64_t first_row,
                                const SamplingContext& context, SampledToken* out) {
  const SamplingParams& params = s.seq->sampling_params();
  const int64_t k = s.num_spec_tokens;
  TANDEM_CHECK(static_cast<int64_t>(s.draft_probs.size()) == k * vocab_size_);
  const absl::Span<const int32_t> drafts =
      absl::MakeConstSpan(s.token_ids).subspan(s.token_ids.size() - k);
  const absl::Span<const float> rows(logits_.data() + first_row * vocab_size_,
                                     (k + 1) * vocab_size_);
  spec::ProcessDraftLogits(rows, vocab_size_, params, context, drafts, &processed_);
  spec::TargetProbs(processed_, vocab_size_, params, &sampler_, &target_probs_);
  draft_probs_.assign(s.draft_probs.begin(), s.draft_probs.end());
  const spec::VerifyResult v = spec::RejectionSample(
      target_probs_, vocab_size_, drafts, draft_probs_, params.seed, s.seq->num_tokens());
  for (size_t i = 0; i < v.token_ids.size(); ++i) {
    SampleResult r;
    r.token_id = v.token_ids[i];
    if (params.num_logprobs.has_value()) {
      sampler_.Logprobs(absl::MakeConstSpan(processed_).subspan(i * vocab_size_, vocab_size_),
                        *params.num_logprobs, &r);
    }
    if (static_cast<int>(i) < v.num_accepted) {
      out->accepted.push_back(std::move(r));
    } else {
      out->result = std::move(r);
    }
  }
}

}  // namespace tandem::engine
