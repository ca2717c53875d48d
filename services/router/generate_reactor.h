// GenerateReactor: one tandem.v1.Generation/Generate call on gRPC's callback
// API.
//
// Start() authenticates and admits the call (GenerationServiceImpl::Admit)
// on the gRPC thread that delivered it; a refusal finishes the RPC at once
// with the same status, RetryInfo and retry-after-ms trailer as before. An
// admitted call then costs no thread: the reactor registers itself as its
// CallQueue's notifier, so the backend's push (the engine thread for the
// colocated backend, a call thread for the disaggregated one) writes the
// next message (CallStream::Next, shared with the HTTP server); OnWriteDone
// writes the one after. At most one write is in
// flight; events queue in the CallQueue meanwhile. A grpc::Alarm at the
// deadline margin (FinishBy) ends the stream with FINISH_REASON_DEADLINE;
// OnCancel (client cancel, deadline, connection loss) and a failed write
// cancel the backend call (the workers free the KV) and finish CANCELLED.
//
// Lifetime: the reactor deletes itself once gRPC is done with it (OnDone)
// and the alarm's callback has run (Alarm::Cancel runs it with ok = false);
// the AdmittedCall, and with it the in-flight slots, goes then.
//
// Thread safety: reactions and notifications may run concurrently on any
// threads; state is guarded by mu_. gRPC and backend calls (StartWrite,
// Finish, BackendCall::Cancel) never run with a CallQueue lock held, and
// BackendCall::Cancel never with mu_ held.
#ifndef TANDEM_SERVICES_ROUTER_GENERATE_REACTOR_H_
#define TANDEM_SERVICES_ROUTER_GENERATE_REACTOR_H_

#include <atomic>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/alarm.h"
#include "grpcpp/support/server_callback.h"
#include "services/router/generation_service.h"
#include "tandem/v1/generation.pb.h"

namespace tandem::router {

class GenerateReactor final : public grpc::ServerWriteReactor<tandem::v1::GenerateResponse> {
 public:
  // The reactor for one call (never null); see above.
  static GenerateReactor* Start(GenerationServiceImpl* service,
                                grpc::CallbackServerContext* context,
                                const tandem::v1::GenerateRequest& request);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  GenerateReactor(GenerationServiceImpl* service, grpc::CallbackServerContext* context);
  ~GenerateReactor() override;

  // Streams `call`: notifier, deadline alarm.
  void Begin(std::unique_ptr<GenerationServiceImpl::AdmittedCall> call);
  // Writes the next message (or finishes) unless a write is in flight.
  void Pump();
  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the RPC with a non-OK status (with the retry hints).
  void FinishWithErrorLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `final` (the last message) and finishes OK.
  void FinishWithLocked(tandem::v1::GenerateResponse final) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the stream for a client that is gone: cancels the backend call.
  void CancelStream(const char* why);
  void OnDeadline(bool fired);
  void Unref();

  GenerationServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  // Set once in Begin, before any reaction or notification can see it.
  std::unique_ptr<GenerationServiceImpl::AdmittedCall> call_;
  grpc::Alarm deadline_alarm_;
  bool alarm_set_ = false;  // set in Begin
  // gRPC's OnDone, plus one while the deadline alarm's callback is pending.
  std::atomic<int> refs_{1};

  absl::Mutex mu_;
  std::optional<CallStream> stream_ ABSL_GUARDED_BY(mu_);       // the call's messages
  tandem::v1::GenerateResponse response_ ABSL_GUARDED_BY(mu_);  // the write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish or StartWriteAndFinish called
};

}  // namespace tandem::router

#endif  // TANDEM_SERVICES_ROUTER_GENERATE_REACTOR_H_
