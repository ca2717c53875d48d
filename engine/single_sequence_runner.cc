#include "engine/single_sequence_runner.h"

#include <algorithm>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::engine {

absl::StatusOr<std::unique_ptr<SingleSequenceRunner>> SingleSequenceRunner::Create(
    const LlamaModel* model, int64_t max_tokens, int64_t prefill_chunk, KvDtype kv_dtype) {
  if (model == nullptr) return absl::InvalidArgumentError("null model");
  if (max_tokens < 1 || prefill_chunk < 1) {
    return absl::InvalidArgumentError("max_tokens and prefill_chunk must be positive");
  }
  const int64_t capacity = std::min(max_tokens, model->config().context_length);
  const int64_t bs = KvCacheStorage::kDefaultBlockSize;
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<KvCacheStorage> cache,
                          model->MakeKvCache((capacity + bs - 1) / bs, bs, kv_dtype));
  return std::unique_ptr<SingleSequenceRunner>(
      new SingleSequenceRunner(model, std::move(cache), capacity, prefill_chunk));
}

SingleSequenceRunner::SingleSequenceRunner(const LlamaModel* model,
                                           std::unique_ptr<KvCacheStorage> cache, int64_t capacity,
                                           int64_t prefill_chunk)
    : model_(model),
      cache_(std::move(cache)),
      capacity_(capacity),
      prefill_chunk_(prefill_chunk),
      block_table_(cache_->num_blocks()) {
  std::iota(block_table_.begin(), block_table_.end(), 0);
}

absl::StatusOr<std::vector<float>> SingleSequenceRunner::Prefill(absl::Span<const int32_t> tokens) {
  if (tokens.empty()) return absl::InvalidArgumentError("no tokens");
  if (num_tokens_ + int64_t(tokens.size()) > capacity_) {
    return absl::InvalidArgumentError(absl::StrCat("sequence of ", num_tokens_ + tokens.size(),
                                                   " tokens exceeds capacity ", capacity_));
  }
  const int64_t vocab = model_->config().vocab_size;
  for (int32_t id : tokens) {
    if (id < 0 || id >= vocab) return absl::InvalidArgumentError(absl::StrCat("bad token ", id));
  }
  std::vector<float> logits(vocab);
  const int64_t bs = cache_->block_size();
  for (size_t begin = 0; begin < tokens.size(); begin += prefill_chunk_) {
    const size_t end = std::min(tokens.size(), begin + size_t(prefill_chunk_));
    ForwardBatch b;
    for (size_t i = begin; i < end; ++i) {
      const int32_t pos = static_cast<int32_t>(num_tokens_ + (i - begin));
      b.token_ids.push_back(tokens[i]);
      b.positions.push_back(pos);
      b.slot_mapping.push_back(int64_t(block_table_[pos / bs]) * bs + pos % bs);
    }
    const int32_t n = static_cast<int32_t>(end - begin);
    b.query_start = {0, n};
    b.context_lens = {static_cast<int32_t>(num_tokens_ + n)};
    b.block_tables = {block_table_};
    if (end == tokens.size()) b.logits_indices = {n - 1};
    TANDEM_RETURN_IF_ERROR(model_->Forward(b, cache_.get(), logits.data()));
    num_tokens_ += n;
  }
  return logits;
}

}  // namespace tandem::engine
