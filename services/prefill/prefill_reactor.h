// PrefillReactor: one PrefillWorker.Prefill call on gRPC's callback API.
//
// Start() checks the request and submits it to the engine (with
// stream_kv_export when the call names a decode worker) on the gRPC thread
// that delivered the call; a failure finishes the RPC at once with the same
// status as before. Then no thread waits for the call: the engine request's
// callback (the engine thread) hands each KvChunkEvent to the KvPushPipe
// (its own thread pushes it to the decode worker) and writes the first token
// the moment it is sampled; the FinishEvent and the pipe's on_done decide the
// last message (kv_landed) or the error, exactly as the sync handler did:
// a push that fails mid-prefill cancels the engine request and ends the RPC
// with the transfer's error (ABORTED when the decode side went away).
// A client cancel, deadline or failed write cancels the engine request and
// the push; the RPC ends CANCELLED or DEADLINE_EXCEEDED once the engine has
// finished the request.
//
// The RPC is finished only after the push's thread has ended (it uses the
// call's context); a push still running then is cancelled first.
//
// Lifetime: the reactor deletes itself once gRPC is done with it (OnDone),
// the engine has delivered the FinishEvent and the pipe's thread (if it
// started) has ended; it counts as an active RPC (drain) until then.
//
// Thread safety: reactions, engine events and the pipe's on_done may run
// concurrently; state is guarded by mu_. Engine::Cancel and
// KvPushPipe::Cancel never run with mu_ held.
#ifndef TANDEM_SERVICES_PREFILL_PREFILL_REACTOR_H_
#define TANDEM_SERVICES_PREFILL_PREFILL_REACTOR_H_

#include <atomic>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "engine/request_stream.h"
#include "grpcpp/support/server_callback.h"
#include "services/common/engine_stream_reactor.h"
#include "services/common/worker_host.h"
#include "services/prefill/prefill_server.h"
#include "services/transfer/kv_push_pipe.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::prefill {

class PrefillReactor final : public services::EngineStreamReactor<tandem::v1::PrefillResponse> {
 public:
  // The reactor for one call (never null); see above.
  static PrefillReactor* Start(PrefillServiceImpl* service, grpc::CallbackServerContext* context,
                               const tandem::v1::PrefillRequest& request);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;

 private:
  PrefillReactor(PrefillServiceImpl* service, grpc::CallbackServerContext* context,
                 const tandem::v1::PrefillRequest& request);

  ~PrefillReactor() override = default;

  void FinishEarly(const grpc::Status& status);
  void OnEngineEvent(const engine::EngineEvent& event);  // the engine thread
  void OnPipeDone();                                     // the pipe's thread
  // Writes the first token, or ends the RPC when everything it needs is
  // there. Returns true when the engine request must be cancelled.
  bool DecideLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DecideLocked once the engine has finished the request: an error, a
  // request the first token ended, or the transfer's outcome.
  void DecideFinishedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pipe closed and its result read: the last message (kv_landed with
  // the transfer's numbers) or the transfer's error.
  void FinishAfterTransferLocked(tandem::v1::PrefillResponse last)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishLastLocked(tandem::v1::PrefillResponse last) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the RPC with the decided outcome once the pipe's thread has ended.
  void TryFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Client gone: cancel the engine request and the push (once).
  void CancelAll();

  PrefillServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  const std::string decode_address_;
  const bool has_prefix_outputs_;  // a migration replay's delivered tokens
  services::ActiveRpc active_;
  // References (EngineStreamReactor): gRPC's OnDone, the engine's callback
  // until its FinishEvent, and the pipe's thread until on_done.
  bool push_ = false;                           // set in Start
  std::unique_ptr<transfer::KvPushPipe> pipe_;  // set in Start

  std::optional<tandem::v1::PrefillResponse> first_ ABSL_GUARDED_BY(mu_);  // not yet written
  std::optional<absl::Time> first_sent_ ABSL_GUARDED_BY(mu_);
  int64_t overlapped_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool pipe_started_ ABSL_GUARDED_BY(mu_) = false;
  bool pipe_closed_ ABSL_GUARDED_BY(mu_) = false;
  bool pipe_done_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<engine::FinishEvent> finish_ ABSL_GUARDED_BY(mu_);
  tandem::v1::PrefillResponse response_ ABSL_GUARDED_BY(mu_);  // the write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;        // client gone
  bool push_failed_ ABSL_GUARDED_BY(mu_) = false;      // stopped computing: the push failed
  bool finish_recorded_ ABSL_GUARDED_BY(mu_) = false;  // the finish metrics
  // The decided outcome: the last message (OK) or the status.
  std::optional<tandem::v1::PrefillResponse> final_last_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::Status> final_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::prefill

#endif  // TANDEM_SERVICES_PREFILL_PREFILL_REACTOR_H_
