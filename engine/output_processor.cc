#include "engine/output_processor.h"

#include <utility>

#include "common/status.h"
#include "engine/stop_checker.h"

namespace tandem::engine {
namespace {

RequestFinishReason ToRequestReason(StopReason reason) {
  switch (reason) {
    case StopReason::kEos:
      return RequestFinishReason::kEos;
    case StopReason::kStopToken:
    case StopReason::kStopString:
      return RequestFinishReason::kStop;
    case StopReason::kLength:
    case StopReason::kNone:
      break;
  }
  return RequestFinishReason::kLength;
}

}  // namespace

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
  if (update.finish_reason != StopReason::kNone) {
    outcome.finish = ToRequestReason(update.finish_reason);
  } else if (num_tokens_ >= max_output_tokens_) {
    outcome.finish = RequestFinishReason::kLength;
    outcome.text += checker_->Flush();
  }
  // An incomplete character at the end comes out as U+FFFD, as Decode would.
  if (outcome.finish.has_value() && update.finish_reason != StopReason::kStopString &&
      detokenizer_.has_value()) {
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
