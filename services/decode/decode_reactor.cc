#include "services/decode/decode_reactor.h"

#include <chrono>
#include <utility>

#include "services/common/convert.h"
#include "services/common/engine_metrics.h"
#include "services/common/grpc_status.h"

namespace tandem::decode {
namespace {

grpc::Status EndedStatus(const grpc::ServerContextBase& context) {
  if (context.deadline() <= std::chrono::system_clock::now()) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded mid-decode");
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
}

}  // namespace

DecodeReactor::DecodeReactor(DecodeServiceImpl* service, grpc::CallbackServerContext* context)
    : EngineStreamReactor(&service->runtime_->engine()),
      service_(service),
      context_(context),
      active_(&service->active_rpcs_) {}

void DecodeReactor::FinishEarly(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  finished_ = true;
  CountError(status);
  Finish(status);
}

void DecodeReactor::CountError(const grpc::Status& status) {
  if (status.ok()) return;
  service_->runtime_->metrics()
      .RequestErrors(static_cast<absl::StatusCode>(status.error_code()))
      ->Inc();
}

DecodeReactor* DecodeReactor::Start(DecodeServiceImpl* service,
                                    grpc::CallbackServerContext* context,
                                    const tandem::v1::DecodeRequest& request) {
  auto* r = new DecodeReactor(service, context);
  engine::Engine& engine = service->runtime_->engine();
  // Draining: handoffs already leased here still run (their prefill is
  // done); new work goes elsewhere.
  if (service->draining_.load() && request.kv_handle().empty()) {
    r->FinishEarly(DrainingStatus());
    return r;
  }
  absl::StatusOr<engine::SamplingParams> params =
      services::FromProto(request.params(), engine.model().config().vocab_size);
  if (!params.ok()) {
    r->FinishEarly(services::ToGrpcStatus(params.status()));
    return r;
  }
  engine::EngineRequest req;
  req.request_id = request.request_id();
  req.prompt_token_ids.assign(request.prompt_token_ids().begin(), request.prompt_token_ids().end());
  req.params = *std::move(params);
  req.extra_key = request.params().cache_key();
  req.prefix_output_token_ids.assign(request.prefix_output_token_ids().begin(),
                                     request.prefix_output_token_ids().end());
  if (request.first_token_id() >= 0)
    req.prefix_output_token_ids.push_back(request.first_token_id());
  r->prefills_here_ = request.kv_handle().empty();
  if (!request.kv_handle().empty()) {
    absl::StatusOr<std::shared_ptr<const engine::KvExport>> kv =
        service->leases_.Claim(request.kv_handle());
    if (!kv.ok()) {
      r->FinishEarly(services::ToGrpcStatus(kv.status()));
      return r;
    }
    req.import_kv = *std::move(kv);
  }
  req.on_event = [r](const engine::EngineEvent& event) { r->OnEngineEvent(event); };
  r->Ref();  // the engine's, until its FinishEvent
  absl::StatusOr<engine::RequestHandle> handle = engine.Submit(std::move(req));
  if (!handle.ok()) {
    r->Unref();  // no event will come
    r->FinishEarly(services::ToGrpcStatus(handle.status(), context));
    return r;
  }
  bool cancel = false;
  {
    absl::MutexLock lock(&r->mu_);
    r->handle_ = *std::move(handle);
    cancel = r->cancelled_;  // OnCancel came before the handle
  }
  if (cancel) r->CancelEngineRequest();
  return r;
}

void DecodeReactor::OnEngineEvent(const engine::EngineEvent& event) {
  const auto* finish = std::get_if<engine::FinishEvent>(&event);
  {
    absl::MutexLock lock(&mu_);
    if (const auto* tok = std::get_if<engine::TokenEvent>(&event)) {
      if (cancelled_) return;
      tandem::v1::DecodeResponse& out = pending_.emplace_back();
      out.add_token_ids(tok->token_id);
      out.set_text(tok->text);
      if (tok->logprobs.has_value()) services::ToProto(*tok->logprobs, out.add_logprobs());
    } else if (finish != nullptr) {
      metrics::TandemMetrics& m = service_->runtime_->metrics();
      if (finish->reason != engine::FinishReason::kError) {
        m.RequestSuccess(engine::FinishReasonName(finish->reason))->Inc();
      }
      services::ObserveRequest(m, finish->usage, {.prefill = prefills_here_, .decode = true});
      if (cancelled_) {
        status_ = EndedStatus(*context_);
      } else if (finish->reason == engine::FinishReason::kError) {
        status_ = services::ToGrpcStatus(finish->status);
      } else {
        tandem::v1::DecodeResponse& out = last_.emplace();
        out.set_text(finish->text);
        out.set_finish_reason(services::ToProto(finish->reason));
        out.set_num_cached_tokens(static_cast<int32_t>(finish->usage.num_cached_tokens));
        out.set_queue_seconds(finish->usage.queue_time_s);
        status_ = grpc::Status::OK;
      }
    } else {
      return;  // KvChunkEvents: only export requests get them
    }
    PumpLocked();
  }
  if (finish != nullptr) Unref();
}

void DecodeReactor::PumpLocked() {
  if (finished_ || writing_) return;
  if (!pending_.empty() && !cancelled_) {
    response_ = std::move(pending_.front());
    pending_.pop_front();
    writing_ = true;
    StartWrite(&response_);
    return;
  }
  if (!status_.has_value()) return;  // the engine has not finished yet
  finished_ = true;
  CountError(*status_);
  if (last_.has_value()) {
    response_ = std::move(*last_);
    StartWriteAndFinish(&response_, grpc::WriteOptions(), *status_);
  } else {
    Finish(*status_);
  }
}

void DecodeReactor::OnWriteDone(bool ok) {
  bool cancel = false;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok && !cancelled_) {  // the router is gone
      cancelled_ = true;
      pending_.clear();
      cancel = true;
    }
    PumpLocked();
  }
  if (cancel) CancelEngineRequest();
}

void DecodeReactor::OnCancel() {
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return;
    cancelled_ = true;
    pending_.clear();
    // The engine's FinishEvent finishes the RPC (status_ then says why).
    if (last_.has_value()) {
      last_.reset();
      status_ = EndedStatus(*context_);
    }
    PumpLocked();
  }
  CancelEngineRequest();
}

}  // namespace tandem::decode
