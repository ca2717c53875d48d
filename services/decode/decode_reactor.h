// DecodeReactor: one DecodeWorker.Decode call on gRPC's callback API.
//
// Start() checks the request, claims the lease and submits the engine
// request on the gRPC thread that delivered the call; a failure finishes the
// RPC at once with the same status as before. Then no thread waits: the
// engine request's callback (engine/request_stream.h, on the engine thread)
// queues each token message and writes it unless a write is in flight;
// OnWriteDone writes the next. The FinishEvent gives the last message (or
// the error status). A client cancel, deadline or failed write cancels the
// engine request (its blocks are freed); the RPC then ends, once the engine
// has finished the request, CANCELLED or DEADLINE_EXCEEDED.
//
// Lifetime: the reactor deletes itself once gRPC is done with it (OnDone)
// and the engine has delivered the FinishEvent; it counts as an active RPC
// (drain) until then.
//
// Thread safety: reactions and engine events may run concurrently; state is
// guarded by mu_. Engine::Cancel never runs with mu_ held (the engine thread
// takes mu_ in the callback).
#ifndef TANDEM_SERVICES_DECODE_DECODE_REACTOR_H_
#define TANDEM_SERVICES_DECODE_DECODE_REACTOR_H_

#include <atomic>
#include <deque>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "engine/request_stream.h"
#include "grpcpp/support/server_callback.h"
#include "services/common/engine_stream_reactor.h"
#include "services/common/worker_host.h"
#include "services/decode/decode_server.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::decode {

class DecodeReactor final : public services::EngineStreamReactor<tandem::v1::DecodeResponse> {
 public:
  // The reactor for one call (never null); see above.
  static DecodeReactor* Start(DecodeServiceImpl* service, grpc::CallbackServerContext* context,
                              const tandem::v1::DecodeRequest& request);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;

 private:
  DecodeReactor(DecodeServiceImpl* service, grpc::CallbackServerContext* context);
  ~DecodeReactor() override = default;

  // Finishes at once with `status` (nothing was submitted).
  void FinishEarly(const grpc::Status& status);
  // tandem_request_errors_total{code} for a call ending with `status` (not OK).
  void CountError(const grpc::Status& status);
  // On the engine thread.
  void OnEngineEvent(const engine::EngineEvent& event);
  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  DecodeServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  services::ActiveRpc active_;
  // No KV handoff: this worker computes the prompt (the router's local
  // prefill, or a migration replay). Set before Submit.
  bool prefills_here_ = false;
  std::deque<tandem::v1::DecodeResponse> pending_ ABSL_GUARDED_BY(mu_);
  tandem::v1::DecodeResponse response_ ABSL_GUARDED_BY(mu_);  // the write in flight
  // The FinishEvent's outcome: the last message (OK) or the error status.
  std::optional<tandem::v1::DecodeResponse> last_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::Status> status_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;   // Finish / StartWriteAndFinish called
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;  // client gone: write nothing more
};

}  // namespace tandem::decode

#endif  // TANDEM_SERVICES_DECODE_DECODE_REACTOR_H_
