#include "engine/model_runner.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::engine {

ModelRunner::ModelRunner(Executor* executor, int64_t vocab_size,
                         std::vector<int32_t> eos_token_ids)
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
    if (s.samples) b.logits_indices.push_back(static_cast<int32_t>(b.token_ids.size()) - 1);
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

  const ForwardBatch batch = BuildBatch(output, executor_->kv_shape().layout.block_size);
  logits_.resize(batch.logits_indices.size() * vocab_size_);
  TANDEM_RETURN_IF_ERROR(executor_->Forward(batch, logits_.data()));
  num_computed_tokens_ += batch.num_tokens();
  ++num_steps_;

  sampled.reserve(batch.logits_indices.size());
  int64_t row = 0;
  for (const ScheduledSequence& s : output.scheduled) {
    if (!s.samples) continue;
    const Sequence* seq = s.seq;
    TANDEM_CHECK(seq != nullptr);
    SamplingContext context;
    context.token_ids = seq->token_ids();
    context.num_prompt_tokens = seq->num_prompt_tokens();
    context.eos_token_ids = eos_token_ids_;
    absl::Span<const float> logits(logits_.data() + row * vocab_size_, vocab_size_);
    ++row;
    sampled.push_back(SampledToken{
        s.seq_id, sampler_.Sample(logits, seq->sampling_params(), seq->num_tokens(), context)});
  }
  return sampled;
}

}  // namespace tandem::engine
