// What a worker's streaming reactors (Decode, Prefill) share about their
// engine request: its handle (set after Submit, under mu_), a cancel that
// runs once and never with mu_ held (the engine thread takes mu_ in the
// request's callback), and the reference count that deletes the reactor when
// its last holder lets go: gRPC's OnDone, the engine's callback until its
// FinishEvent, and whatever else the reactor adds with Ref().
#ifndef TANDEM_SERVICES_COMMON_ENGINE_STREAM_REACTOR_H_
#define TANDEM_SERVICES_COMMON_ENGINE_STREAM_REACTOR_H_

#include <atomic>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "engine/engine.h"
#include "engine/request_stream.h"
#include "grpcpp/support/server_callback.h"

namespace tandem::services {

template <typename Response>
class EngineStreamReactor : public grpc::ServerWriteReactor<Response> {
 public:
  void OnDone() override { Unref(); }

 protected:
  explicit EngineStreamReactor(engine::Engine* engine) : engine_(engine) {}
  ~EngineStreamReactor() override = default;

  void Ref() { refs_.fetch_add(1); }
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  // Cancels the engine request once, when it has been submitted.
  void CancelEngineRequest() ABSL_LOCKS_EXCLUDED(mu_) {
    engine::RequestHandle handle;
    {
      absl::MutexLock lock(&mu_);
      if (handle_ == nullptr || engine_cancelled_) return;
      engine_cancelled_ = true;
      handle = handle_;
    }
    if (!handle->finished()) engine_->Cancel(handle);
  }

  absl::Mutex mu_;
  engine::RequestHandle handle_ ABSL_GUARDED_BY(mu_);  // set after Submit
  bool engine_cancelled_ ABSL_GUARDED_BY(mu_) = false;

 private:
  engine::Engine* const engine_;
  std::atomic<int> refs_{1};  // gRPC's OnDone is the first holder
};

}  // namespace tandem::services

#endif  // TANDEM_SERVICES_COMMON_ENGINE_STREAM_REACTOR_H_
