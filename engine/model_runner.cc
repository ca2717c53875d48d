#include "engine/model_runner.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::engine {

ModelRunner::ModelRunner(const LlamaModel* model, KvCacheStorage* cache,
                         std::vector<int32_t> eos_token_ids)
    : model_(model), cache_(cache), eos_token_ids_(std::move(eos_token_ids)) {
  TANDEM_CHECK(model_ != nullptr && cache_ != nullptr);
}

ForwardBatch ModelRunner::BuildBatch(const SchedulerOutput& output, const Scheduler& scheduler,
                                     const KvCacheManager& kv) const {
  ForwardBatch b;
  b.token_ids.reserve(output.num_batched_tokens);
  b.positions.reserve(output.num_batched_tokens);
  b.slot_mapping.reserve(output.num_batched_tokens);
  b.query_start.reserve(output.scheduled.size() + 1);
  b.query_start.push_back(0);
  for (const ScheduledSequence& s : output.scheduled) {
    const Sequence* seq = scheduler.Find(s.seq_id);
    TANDEM_CHECK(seq != nullptr);
    TANDEM_CHECK(s.start_position + s.num_tokens <= seq->num_tokens());
    absl::Span<const int32_t> tokens = seq->token_ids();
    for (int64_t p = s.start_position; p < s.start_position + s.num_tokens; ++p) {
      b.token_ids.push_back(tokens[p]);
      b.positions.push_back(static_cast<int32_t>(p));
      b.slot_mapping.push_back(kv.Slot(s.seq_id, p));
    }
    if (s.samples) b.logits_indices.push_back(static_cast<int32_t>(b.token_ids.size()) - 1);
    b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
    b.context_lens.push_back(static_cast<int32_t>(s.start_position + s.num_tokens));
    absl::Span<const int32_t> table = kv.block_table(s.seq_id);
    b.block_tables.emplace_back(table.begin(), table.end());
  }
  return b;
}

absl::StatusOr<std::vector<SampledToken>> ModelRunner::Execute(const SchedulerOutput& output,
                                                               const Scheduler& scheduler,
                                                               const KvCacheManager& kv) {
  for (const BlockCopy& copy : output.block_copies) cache_->CopyBlock(copy.src, copy.dst);
  std::vector<SampledToken> sampled;
  if (output.scheduled.empty()) return sampled;

  const ForwardBatch batch = BuildBatch(output, scheduler, kv);
  const int64_t vocab = model_->config().vocab_size;
  logits_.resize(batch.logits_indices.size() * vocab);
  TANDEM_RETURN_IF_ERROR(model_->Forward(batch, cache_, logits_.data()));
  num_computed_tokens_ += batch.num_tokens();
  ++num_steps_;

  sampled.reserve(batch.logits_indices.size());
  int64_t row = 0;
  for (const ScheduledSequence& s : output.scheduled) {
    if (!s.samples) continue;
    const Sequence* seq = scheduler.Find(s.seq_id);
    SamplingContext context;
    context.token_ids = seq->token_ids();
    context.num_prompt_tokens = seq->num_prompt_tokens();
    context.eos_token_ids = eos_token_ids_;
    absl::Span<const float> logits(logits_.data() + row * vocab, vocab);
    ++row;
    sampled.push_back(SampledToken{
        s.seq_id, sampler_.Sample(logits, seq->sampling_params(), seq->num_tokens(), context)});
  }
  return sampled;
}

}  // namespace tandem::engine
