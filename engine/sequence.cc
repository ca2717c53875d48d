#include "engine/sequence.h"

#include <utility>

#include "common/status.h"

namespace tandem::engine {

std::string_view SequenceStatusName(SequenceStatus status) {
  switch (status) {
    case SequenceStatus::kWaiting:
      return "WAITING";
    case SequenceStatus::kRunning:
      return "RUNNING";
    case SequenceStatus::kPreempted:
      return "PREEMPTED";
    case SequenceStatus::kFinishedStopped:
      return "FINISHED_STOPPED";
    case SequenceStatus::kFinishedLength:
      return "FINISHED_LENGTH";
    case SequenceStatus::kFinishedAborted:
      return "FINISHED_ABORTED";
  }
  return "UNKNOWN";
}

bool IsFinished(SequenceStatus status) {
  return status == SequenceStatus::kFinishedStopped || status == SequenceStatus::kFinishedLength ||
         status == SequenceStatus::kFinishedAborted;
}

SequenceStatus FinishedStatus(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEos:
    case FinishReason::kStop:
      return SequenceStatus::kFinishedStopped;
    case FinishReason::kLength:
      return SequenceStatus::kFinishedLength;
    case FinishReason::kCancelled:
    case FinishReason::kError:
      break;
  }
  return SequenceStatus::kFinishedAborted;
}

Sequence::Sequence(SeqId id, std::vector<int32_t> prompt_token_ids, SamplingParams params,
                   uint64_t extra_key)
    : id_(id),
      token_ids_(std::move(prompt_token_ids)),
      num_prompt_tokens_(static_cast<int64_t>(token_ids_.size())),
      params_(std::move(params)),
      extra_key_(extra_key) {}

}  // namespace tandem::engine
