#include "services/router/generate_reactor.h"

#include <chrono>
#include <utility>

#include "services/common/grpc_status.h"

namespace tandem::router {

using tandem::v1::GenerateResponse;

GenerateReactor::GenerateReactor(GenerationServiceImpl* service,
                                 grpc::CallbackServerContext* context)
    : service_(service), context_(context) {
  service_->ReactorStarted();
}

GenerateReactor::~GenerateReactor() {
  call_.reset();                // the AdmittedCall gives its slots back to the service
  service_->ReactorFinished();  // the last touch of the service
}

GenerateReactor* GenerateReactor::Start(GenerationServiceImpl* service,
                                        grpc::CallbackServerContext* context,
                                        const tandem::v1::GenerateRequest& request) {
  auto* reactor = new GenerateReactor(service, context);
  grpc::Status auth = service->Authenticate(context);
  absl::StatusOr<std::unique_ptr<GenerationServiceImpl::AdmittedCall>> call =
      auth.ok() ? service->Admit(request) : absl::UnauthenticatedError("");
  if (!auth.ok() || !call.ok()) {
    absl::MutexLock lock(&reactor->mu_);
    reactor->finished_ = true;
    // RESOURCE_EXHAUSTED also gets RetryInfo details and the retry-after-ms trailer.
    reactor->Finish(
        auth.ok() ? services::ToGrpcStatus(call.status(), context, service->options().retry_after)
                  : auth);
    return reactor;
  }
  reactor->Begin(*std::move(call));
  return reactor;
}

void GenerateReactor::Begin(std::unique_ptr<GenerationServiceImpl::AdmittedCall> call) {
  call_ = std::move(call);
  {
    absl::MutexLock lock(&mu_);
    stream_.emplace(call_.get());
  }
  absl::Time deadline = absl::InfiniteFuture();
  const auto chrono_deadline = context_->deadline();
  if (chrono_deadline < std::chrono::system_clock::now() + std::chrono::hours(24 * 365)) {
    deadline = absl::FromChrono(chrono_deadline);
  }
  // Finish cleanly (DEADLINE) a little before the client's deadline fires.
  const absl::Time finish_by = FinishBy(call_->start(), deadline);
  if (finish_by != absl::InfiniteFuture()) {
    refs_.fetch_add(1);
    alarm_set_ = true;
    deadline_alarm_.Set(absl::ToChronoTime(finish_by), [this](bool fired) { OnDeadline(fired); });
  }
  // From here every backend push writes (Pump); this also writes what is
  // already queued.
  call_->queue().SetNotify([this] { Pump(); });
}

void GenerateReactor::Pump() {
  absl::MutexLock lock(&mu_);
  PumpLocked();
}

void GenerateReactor::PumpLocked() {
  if (finished_ || writing_) return;
  CallStream::Step step = stream_->Next();
  switch (step.kind) {
    case CallStream::Step::kNone:
      return;
    case CallStream::Step::kError:
      FinishWithErrorLocked(step.status);
      return;
    case CallStream::Step::kFinal:
      FinishWithLocked(std::move(step.response));
      return;
    case CallStream::Step::kToken:
      response_ = std::move(step.response);
      writing_ = true;
      StartWrite(&response_);
      return;
  }
}

void GenerateReactor::FinishWithErrorLocked(const absl::Status& status) {
  finished_ = true;
  Finish(services::ToGrpcStatus(status, context_, service_->options().retry_after));
}

void GenerateReactor::FinishWithLocked(GenerateResponse final) {
  response_ = std::move(final);
  finished_ = true;
  StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
}

void GenerateReactor::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (finished_) return;
    if (ok) {
      PumpLocked();
      return;
    }
  }
  CancelStream("the client stream closed");
}

void GenerateReactor::OnCancel() { CancelStream("cancelled by the client"); }

void GenerateReactor::CancelStream(const char* why) {
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;  // nothing else writes from here
  }
  call_->CancelForClient();  // the workers free the request's KV
  absl::MutexLock lock(&mu_);
  Finish(services::ToGrpcStatus(absl::CancelledError(why)));
}

void GenerateReactor::OnDeadline(bool fired) {
  if (fired) {
    bool cancel = false;
    {
      absl::MutexLock lock(&mu_);
      if (!finished_) {
        stream_->FinishAtDeadline();
        cancel = true;
      }
    }
    if (cancel) {
      call_->call().Cancel();
      Pump();  // the DEADLINE final message, now or after the write in flight
    }
  }
  Unref();
}

void GenerateReactor::OnDone() {
  // No notification runs or starts after this, and the alarm's callback has
  // run or will run with fired = false.
  if (call_ != nullptr) call_->queue().ClearNotify();
  if (alarm_set_) deadline_alarm_.Cancel();
  Unref();
}

void GenerateReactor::Unref() {
  if (refs_.fetch_sub(1) == 1) delete this;
}

}  // namespace tandem::router
