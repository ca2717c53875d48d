#include "services/router/local_backend.h"

#include <utility>

#include "services/common/convert.h"
#include "services/common/engine_metrics.h"

namespace tandem::router {
namespace {

class LocalCall final : public BackendCall {
 public:
  LocalCall(engine::Engine* engine, engine::RequestHandle handle)
      : engine_(engine), handle_(std::move(handle)) {}
  // The engine's callback holds the queue, so nothing here needs to wait.
  ~LocalCall() override { Cancel(); }
  void Cancel() override {
    if (!handle_->finished()) engine_->Cancel(handle_);
  }

 private:
  engine::Engine* engine_;
  engine::RequestHandle handle_;
};

}  // namespace

LocalBackend::LocalBackend(engine::Engine* engine, metrics::TandemMetrics* metrics)
    : engine_(engine), metrics_(std::make_shared<MetricsRef>(metrics)) {}

LocalBackend::~LocalBackend() { metrics_->Detach(); }

absl::StatusOr<std::unique_ptr<BackendCall>> LocalBackend::Start(const PreparedRequest& request,
                                                                 std::shared_ptr<CallQueue> queue) {
  engine::EngineRequest req;
  req.request_id = request.request_id;
  req.prompt_token_ids = request.prompt_token_ids;
  req.params = request.params;
  req.extra_key = request.cache_key;
  // Runs on the engine thread: convert and enqueue, never block.
  req.on_event = [queue = std::move(queue), metrics = metrics_](const engine::EngineEvent& event) {
    BackendEvent out;
    if (const auto* token = std::get_if<engine::TokenEvent>(&event)) {
      out.token_ids.push_back(token->token_id);
      out.text = token->text;
      if (token->logprobs.has_value())
        services::ToProto(*token->logprobs, &out.logprobs.emplace_back());
    } else {
      const auto& finish = std::get<engine::FinishEvent>(event);
      metrics->With([&finish](metrics::TandemMetrics& m) {
        services::ObserveRequest(m, finish.usage, {.prefill = true, .decode = true});
        if (finish.reason != engine::FinishReason::kError) {
          m.RequestSuccess(engine::FinishReasonName(finish.reason))->Inc();
        }
      });
      out.finished = true;
      out.text = finish.text;
      out.finish_reason = services::ToProto(finish.reason);
      out.status = finish.status;
      if (finish.reason == engine::FinishReason::kError && out.status.ok()) {
        out.status = absl::InternalError("the engine failed the request");
      }
      out.num_cached_tokens = static_cast<int32_t>(finish.usage.num_cached_tokens);
      out.queue_seconds = finish.usage.queue_time_s;
    }
    queue->Push(std::move(out));
  };
  absl::StatusOr<engine::RequestHandle> handle = engine_->Submit(std::move(req));
  if (!handle.ok()) return handle.status();
  return std::make_unique<LocalCall>(engine_, *std::move(handle));
}

}  // namespace tandem::router
