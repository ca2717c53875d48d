#include "engine/request_stream.h"

#include <utility>

#include "common/status.h"

namespace tandem::engine {

RequestStream::RequestStream(int64_t id, std::string request_id, EventCallback callback)
    : id_(id), request_id_(std::move(request_id)), callback_(std::move(callback)) {}

std::optional<EngineEvent> RequestStream::Next(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !events_.empty(); };
  if (timeout == absl::InfiniteDuration()) {
    mu_.Await(absl::Condition(&ready));
  } else if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    return std::nullopt;
  }
  EngineEvent event = std::move(events_.front());
  events_.pop_front();
  return event;
}

bool RequestStream::finished() const {
  absl::MutexLock lock(&mu_);
  return finished_;
}

void RequestStream::Push(EngineEvent event) {
  const bool is_finish = std::holds_alternative<FinishEvent>(event);
  {
    absl::MutexLock lock(&mu_);
    TANDEM_CHECK(!finished_);
    finished_ = is_finish;
    if (!callback_) {
      events_.push_back(std::move(event));
      return;
    }
  }
  callback_(event);
}

CollectedOutput Collect(RequestStream& stream, absl::Duration timeout) {
  CollectedOutput out;
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    std::optional<EngineEvent> event = stream.Next(deadline - absl::Now());
    if (!event.has_value()) return out;
    if (auto* token = std::get_if<TokenEvent>(&*event)) {
      out.token_ids.push_back(token->token_id);
      out.text += token->text;
      if (token->logprobs.has_value()) out.logprobs.push_back(token->logprobs->logprob);
    } else if (std::holds_alternative<KvChunkEvent>(*event)) {
      continue;  // only requests that asked for it get these; Collect ignores them
    } else {
      out.finish = std::get<FinishEvent>(std::move(*event));
      out.text += out.finish->text;
      return out;
    }
  }
}

}  // namespace tandem::engine
