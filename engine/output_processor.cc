#include "engine/output_processor.h"

#include <utility>

#include "common/status.h"
#include "engine/stop_checker.h"

namespace tandem::engine {
OutputProcessor::OutputProcessor(const tokenizer::Tokenizer* tokenizer, const StopParams& stop,
                                 absl::Span<const int32_t> eos_token_ids, int64_t max_output_tokens)
    : checker_(std::make_unique<StopChecker>(stop, eos_token_ids)),
      max_output_tokens_(max_output_tokens) {
  TANDEM_CHECK(max_output_tokens_ >= 1);
  if (tokenizer != nullptr) {
    detokenizer_.emplace(*tokenizer, tokenizer::DetokenizerOptions{/*skip_special=*/true,
                                                                   /*continuation=*/true});
  }
}

OutputProcessor::~OutputProcessor() = default;

TokenOutcome OutputProcessor::Process(int32_t token_id) {
  ++num_tokens_;
  const std::string delta = detokenizer_.has_value() ? detokenizer_->Push(token_id) : "";
  StopUpdate update = checker_->Update(token_id, delta);
  TokenOutcome outcome;
  outcome.text = std::move(update.text);
  if (update.finish.has_value()) {
    outcome.finish = update.finish;
  } else if (num_tokens_ >= max_output_tokens_) {
    outcome.finish = FinishReason::kLength;
    outcome.text += checker_->Flush();
  }
  // An incomplete character at the end comes out as U+FFFD, as Decode would.
  // (A stop string's match and what follows it are dropped.)
  if (outcome.finish.has_value() && update.stop_string.empty() && detokenizer_.has_value()) {
    outcome.text += detokenizer_->Flush();
  }
  return outcome;
}

std::string OutputProcessor::Flush() {
  std::string text = checker_->Flush();
  if (detokenizer_.has_value()) text += detokenizer_->Flush();
  return text;
}

}  // namespace tandem::engine
