// KvPushPipe: one streamed KV handoff that the thread producing the pieces
// (the Prefill call, reading engine events) never waits on: it hands each
// piece over and goes on to send the first token to the router at once.
// When the transport has an asynchronous stream (KvTransport::OpenAsync: the
// host transport's PushKv on gRPC's callback API) no thread waits on the
// wire at all; otherwise (NCCL) the pipe drives the stream from a thread of
// its own, one per handoff in flight.
//
//   KvPushPipe pipe(transport, target, compat, plan, deadline);
//   pipe.Push(chunk.bytes);          // per KvChunkEvent, in order (starts the push)
//   ... absl::StatusOr<KvSendResult> r = pipe.Finish();   // all pushed: wait for the receiver
//   or pipe.Cancel();                // drop the handoff (the receiver frees its reservation)
//
// The handoff opens at the first Push (the receiver checks the header and
// reserves the whole size) and each piece is written as it comes.
// Bytes handed over but not yet written are bounded by the request's own
// K/V (what a one-piece export held); bytes on the wire by gRPC flow control.
// Once the handoff failed, failed() is true and Push drops its bytes, so the
// producer can stop early; Finish returns the error.
//
// Without waiting (the Prefill reactor): give `on_done` at construction;
// it runs once the handoff has ended (accepted, failed or cancelled), on the
// pipe's thread or the transport's callback thread, never inside Push /
// Close / Cancel. Then Close() instead of Finish(): it returns at once, and
// TryResult() holds the result after on_done ran. The pipe may be destroyed
// from on_done itself; destroyed elsewhere, it cancels the handoff and waits
// until on_done has returned.
//
// Thread safety: Push, Finish, Close and Cancel are called by one producer
// at a time; failed() and TryResult() from any thread.
#ifndef TANDEM_SERVICES_TRANSFER_KV_PUSH_PIPE_H_
#define TANDEM_SERVICES_TRANSFER_KV_PUSH_PIPE_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/transfer/kv_transport.h"

namespace tandem::transfer {

class KvPushPipe {
 public:
  KvPushPipe(KvTransport* transport, KvTransferTarget target, tandem::v1::KvCompatibility compat,
             KvSendPlan plan, absl::Time deadline, std::function<void()> on_done = nullptr);
  ~KvPushPipe();  // Cancel() unless finished

  KvPushPipe(const KvPushPipe&) = delete;
  KvPushPipe& operator=(const KvPushPipe&) = delete;

  // The next piece. Opens the handoff at the first call.
  void Push(std::string bytes);
  // The next piece in device memory of the transport's
  // device_memory_domain() (KvSendStream::WriteDevice); a transport without
  // one (the host transport's asynchronous stream) fails the handoff.
  void PushDevice(std::shared_ptr<const engine::KvDeviceBytes> piece);
  // Every piece was pushed: waits until the receiver accepted them all (or
  // the handoff failed) and returns the result. Call at most once.
  absl::StatusOr<KvSendResult> Finish();
  // Every piece was pushed; returns at once (see on_done). Without a piece
  // the result is FailedPrecondition at once and on_done does not run.
  // Returns whether the handoff is open (on_done will come).
  bool Close();
  // The result once the handoff has ended, else nullopt.
  std::optional<absl::StatusOr<KvSendResult>> TryResult();
  // Ends the handoff (idempotent): the receiver drops it.
  void Cancel();

  bool failed() const { return async_state_->failed.load(); }

 private:
  // What the asynchronous stream's callback shares with the pipe: the
  // callback may outlive neither, so it holds this, not the pipe.
  struct AsyncState {
    absl::Mutex mu;
    std::optional<absl::StatusOr<KvSendResult>> result ABSL_GUARDED_BY(mu);
    bool callback_returned ABSL_GUARDED_BY(mu) = false;
    std::thread::id callback_thread ABSL_GUARDED_BY(mu);
    std::atomic<bool> failed{false};  // both modes: the handoff failed
    std::function<void()> on_done;
  };

  void Run();
  bool OpenAsync();  // at the first Push: false when the transport has no async stream
  void CancelAsync();
  void WaitAsyncDone();  // from the destructor

  KvTransport* const transport_;
  const KvTransferTarget target_;
  const tandem::v1::KvCompatibility compat_;
  const KvSendPlan plan_;
  const absl::Time deadline_;
  const std::function<void()> on_done_;
  std::thread thread_;
  bool finished_ = false;  // producer thread only

  absl::Mutex mu_;
  struct Piece {
    std::string bytes;
    std::shared_ptr<const engine::KvDeviceBytes> device;  // instead of bytes
  };
  void Enqueue(Piece piece);
  std::deque<Piece> pieces_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;  // no more pieces
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  KvSendStream* stream_ ABSL_GUARDED_BY(mu_) = nullptr;  // for Cancel
  std::optional<absl::StatusOr<KvSendResult>> result_ ABSL_GUARDED_BY(mu_);

  // Asynchronous mode (set at the first Push, producer thread only).
  bool opened_ = false;
  std::shared_ptr<AsyncState> async_state_;
  std::shared_ptr<KvAsyncSendStream> async_;
};

}  // namespace tandem::transfer

#endif  // TANDEM_SERVICES_TRANSFER_KV_PUSH_PIPE_H_
