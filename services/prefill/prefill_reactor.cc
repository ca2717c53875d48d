#include "services/prefill/prefill_reactor.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/common/convert.h"
#include "services/common/engine_metrics.h"
#include "services/common/grpc_status.h"

namespace tandem::prefill {
namespace {

bool DeadlinePassed(const grpc::ServerContextBase& context) {
  return context.deadline() <= std::chrono::system_clock::now();
}

// A failed push names the decode worker and, when the failure is the
// transport's or the receiver's going away, is ABORTED: the router then
// knows the prefill worker is fine and the decode side is the suspect.
grpc::Status TransferFailed(const absl::Status& s, const std::string& decode_address,
                            grpc::ServerContextBase* context) {
  const std::string message =
      absl::StrCat("kv transfer to decode worker ", decode_address, ": ", s.message());
  switch (s.code()) {
    case absl::StatusCode::kResourceExhausted:  // the decode worker's KV is full: retry hint
      return services::ToGrpcStatus(absl::Status(s.code(), message), context);
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kCancelled:
      return services::ToGrpcStatus(absl::Status(s.code(), message));
    default:
      return grpc::Status(grpc::StatusCode::ABORTED, message);
  }
}

}  // namespace

PrefillReactor::PrefillReactor(PrefillServiceImpl* service, grpc::CallbackServerContext* context,
                               const tandem::v1::PrefillRequest& request)
    : EngineStreamReactor(&service->runtime_->engine()),
      service_(service),
      context_(context),
      decode_address_(request.decode_address()),
      has_prefix_outputs_(!request.prefix_output_token_ids().empty()),
      active_(&service->active_rpcs_) {}

void PrefillReactor::FinishEarly(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  FinishLocked(status);
}

PrefillReactor* PrefillReactor::Start(PrefillServiceImpl* service,
                                      grpc::CallbackServerContext* context,
                                      const tandem::v1::PrefillRequest& request) {
  auto* r = new PrefillReactor(service, context, request);
  if (service->draining_.load()) {
    r->FinishEarly(
        grpc::Status(grpc::StatusCode::UNAVAILABLE,
                     "this prefill worker is draining (shutting down); retry on another"));
    return r;
  }
  engine::Engine& engine = service->runtime_->engine();
  absl::StatusOr<engine::SamplingParams> params =
      services::FromProto(request.params(), engine.model().config().vocab_size);
  if (!params.ok()) {
    r->FinishEarly(services::ToGrpcStatus(params.status()));
    return r;
  }
  r->push_ = !request.decode_address().empty();
  engine::EngineRequest req;
  req.request_id = request.request_id();
  req.prompt_token_ids.assign(request.prompt_token_ids().begin(), request.prompt_token_ids().end());
  req.params = *std::move(params);
  req.extra_key = request.params().cache_key();
  req.export_kv = true;
  req.stream_kv_export = r->push_;
  // GPU-resident handoff: the transport sends from memory the executor
  // writes (NCCL between CUDA workers), so the chunks stay there.
  // (The host transport's domain is empty, never an engine's.)
  req.kv_export_on_device =
      r->push_ && service->transport_->device_memory_domain() == engine.kv_memory_domain();
  req.prefix_output_token_ids.assign(request.prefix_output_token_ids().begin(),
                                     request.prefix_output_token_ids().end());
  // The handoff covers prompt + replayed outputs (the engine validates them).
  transfer::KvSendPlan plan;
  plan.token_ids = req.prompt_token_ids;
  plan.token_ids.insert(plan.token_ids.end(), req.prefix_output_token_ids.begin(),
                        req.prefix_output_token_ids.end());
  plan.bytes_per_token = engine.kv_bytes_per_token();
  // The push runs on the pipe's thread from the first chunk on; the engine
  // thread writes the first token the moment it is sampled.
  r->pipe_ = std::make_unique<transfer::KvPushPipe>(
      service->transport_,
      transfer::KvTransferTarget{request.decode_address(), request.kv_handle(),
                                 request.request_id(), context},
      service->runtime_->compat(), std::move(plan), absl::FromChrono(context->deadline()),
      [r] { r->OnPipeDone(); });
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
    cancel = r->cancelled_ || r->push_failed_;  // came before the handle
  }
  if (cancel) r->CancelEngineRequest();
  return r;
}

void PrefillReactor::OnEngineEvent(const engine::EngineEvent& event) {
  const bool is_finish = std::holds_alternative<engine::FinishEvent>(event);
  bool cancel = false;
  {
    absl::MutexLock lock(&mu_);
    if (const auto* chunk = std::get_if<engine::KvChunkEvent>(&event)) {
      if (!first_sent_.has_value()) overlapped_bytes_ += chunk->size();
      if (!cancelled_ && !push_failed_ && !finished_) {
        if (!pipe_started_) {
          pipe_started_ = true;
          Ref();  // the pipe's thread, until on_done
        }
        // The event is the engine's temporary (RequestStream::Push hands it
        // over and drops it): take the bytes instead of copying megabytes.
        if (chunk->device != nullptr) {
          pipe_->PushDevice(chunk->device);
        } else {
          pipe_->Push(std::move(const_cast<engine::KvChunkEvent*>(chunk)->bytes));
        }
      }
    } else if (const auto* tok = std::get_if<engine::TokenEvent>(&event)) {
      // TTFT: the token leaves now, whatever the push is doing.
      first_sent_ = absl::Now();
      if (!cancelled_) {
        tandem::v1::PrefillResponse& first = first_.emplace();
        first.set_first_token_id(tok->token_id);
        if (tok->logprobs.has_value()) {
          services::ToProto(*tok->logprobs, first.mutable_first_logprobs());
        }
        first.set_first_text(tok->text);
      }
    } else {
      finish_ = std::get<engine::FinishEvent>(event);
    }
    cancel = DecideLocked();
  }
  if (cancel) CancelEngineRequest();
  if (is_finish) Unref();
}

void PrefillReactor::OnPipeDone() {
  bool cancel = false;
  {
    absl::MutexLock lock(&mu_);
    pipe_done_ = true;
    cancel = DecideLocked();
  }
  if (cancel) CancelEngineRequest();
  Unref();  // may delete the pipe: KvPushPipe allows it from on_done
}

bool PrefillReactor::DecideLocked() {
  if (finished_ || writing_) return false;
  if (final_status_.has_value()) {  // decided; waiting for the pipe's thread
    TryFinishLocked();
    return false;
  }
  if (first_.has_value() && !cancelled_) {
    response_ = *std::move(first_);
    first_.reset();
    writing_ = true;
    StartWrite(&response_);
    return false;
  }
  metrics::TandemMetrics& m = service_->runtime_->metrics();
  if (cancelled_) {
    if (!finish_.has_value()) return false;  // the engine frees the blocks first
    FinishLocked(
        DeadlinePassed(*context_)
            ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded in prefill")
            : grpc::Status(grpc::StatusCode::CANCELLED, "prefill cancelled"));
    return false;
  }
  if (!finish_.has_value()) {
    // The push failed (the receiver refused it, or went away) mid-prefill:
    // stop computing; its error says why (the engine's finish is not waited
    // for).
    if (!pipe_done_ || !pipe_->failed()) return false;
    push_failed_ = true;
    m.kv_transfer_failures->Inc();
    std::optional<absl::StatusOr<transfer::KvSendResult>> failed = pipe_->TryResult();
    FinishLocked(TransferFailed(failed->status(), decode_address_, context_));
    return true;
  }
  DecideFinishedLocked();
  return false;
}

void PrefillReactor::DecideFinishedLocked() {
  metrics::TandemMetrics& m = service_->runtime_->metrics();
  const engine::FinishEvent& finish = *finish_;
  if (finish.reason == engine::FinishReason::kError) {
    FinishLocked(services::ToGrpcStatus(finish.status));
    return;
  }
  const engine::Usage& usage = finish.usage;
  tandem::v1::PrefillResponse last;
  last.set_num_cached_tokens(static_cast<int32_t>(usage.num_cached_tokens));
  last.set_queue_seconds(usage.queue_time_s);
  last.set_first_token_id(-1);  // the token went in the first message
  if (!first_sent_.has_value()) {
    // A migration replay whose delivered tokens already end the request.
    if (!has_prefix_outputs_) {
      FinishLocked(grpc::Status(grpc::StatusCode::INTERNAL, "prefill finished without a token"));
      return;
    }
    last.set_finish_reason(services::ToProto(finish.reason));
    last.set_first_text(finish.text);
    FinishLastLocked(std::move(last));
    return;
  }
  if (!finish_recorded_) {
    finish_recorded_ = true;
    services::ObserveRequest(m, usage, {.prefill = true, .decode = false});
  }
  last.set_prefill_seconds(std::max(0.0, usage.ttft_s - usage.queue_time_s));
  if (!finish.kv_exported) {
    // The first token ended the request: nothing to hand over.
    pipe_->Cancel();
    last.set_finish_reason(services::ToProto(finish.reason));
    last.set_first_text(finish.text);
    FinishLastLocked(std::move(last));
    return;
  }
  if (!push_) {
    FinishLastLocked(std::move(last));
    return;
  }
  FinishAfterTransferLocked(std::move(last));
}

void PrefillReactor::FinishAfterTransferLocked(tandem::v1::PrefillResponse last) {
  metrics::TandemMetrics& m = service_->runtime_->metrics();
  if (!pipe_closed_) {
    pipe_closed_ = true;
    if (!pipe_->Close()) pipe_done_ = true;  // nothing was pushed: the result is there
  }
  if (!pipe_done_) return;  // OnPipeDone comes back here
  std::optional<absl::StatusOr<transfer::KvSendResult>> sent = pipe_->TryResult();
  if (!sent->ok()) {
    m.kv_transfer_failures->Inc();
    if (context_->IsCancelled()) {
      FinishLocked(
          grpc::Status(grpc::StatusCode::CANCELLED, "prefill cancelled during the transfer"));
    } else {
      FinishLocked(TransferFailed(sent->status(), decode_address_, context_));
    }
    return;
  }
  const double after_first = absl::ToDoubleSeconds(absl::Now() - *first_sent_);
  m.kv_transfer_time->Observe((*sent)->seconds);
  m.kv_transfer_bytes->Inc(static_cast<double>((*sent)->num_bytes));
  m.kv_transfer_after_first_token->Observe(after_first);
  m.kv_transfer_overlapped_bytes->Inc(static_cast<double>(overlapped_bytes_));
  last.set_kv_landed(true);
  last.set_transfer_seconds((*sent)->seconds);
  last.set_kv_bytes((*sent)->num_bytes);
  last.set_after_first_token_seconds(after_first);
  FinishLastLocked(std::move(last));
}

void PrefillReactor::FinishLastLocked(tandem::v1::PrefillResponse last) {
  final_last_ = std::move(last);
  final_status_ = grpc::Status::OK;
  TryFinishLocked();
}

void PrefillReactor::FinishLocked(const grpc::Status& status) {
  final_status_ = status;
  TryFinishLocked();
}

void PrefillReactor::TryFinishLocked() {
  if (finished_) return;
  // The push's thread uses this call's context (KvTransferTarget::parent),
  // which gRPC frees after Finish: end the push first; OnPipeDone comes back.
  if (pipe_started_ && !pipe_done_) {
    pipe_->Cancel();
    return;
  }
  finished_ = true;
  if (!final_status_->ok()) {
    service_->runtime_->metrics()
        .RequestErrors(static_cast<absl::StatusCode>(final_status_->error_code()))
        ->Inc();
  }
  if (final_last_.has_value()) {
    response_ = *std::move(final_last_);
    StartWriteAndFinish(&response_, grpc::WriteOptions(), *final_status_);
  } else {
    Finish(*final_status_);
  }
}

void PrefillReactor::OnWriteDone(bool ok) {
  bool cancel_all = false;
  bool cancel_engine = false;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok && !cancelled_) {  // the router is gone
      cancelled_ = true;
      cancel_all = true;
    }
    cancel_engine = DecideLocked();
  }
  if (cancel_all) CancelAll();
  if (cancel_engine) CancelEngineRequest();
}

void PrefillReactor::OnCancel() {
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return;
    cancelled_ = true;
    first_.reset();
    DecideLocked();
  }
  CancelAll();
}

void PrefillReactor::CancelAll() {
  {
    absl::MutexLock lock(&mu_);
    if (pipe_ != nullptr) pipe_->Cancel();  // the receiver drops the partial push
  }
  CancelEngineRequest();
}

}  // namespace tandem::prefill
