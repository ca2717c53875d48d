// Where the router's requests run. Two implementations behind one interface:
// LocalBackend (an in-process engine::Engine, `tandem serve --colocated`) and
// DisaggregatedBackend (PrefillWorker.Prefill, then DecodeWorker.Decode).
//
// A backend call pushes BackendEvents into a CallQueue: zero or more token
// events, then exactly one finish event. The gRPC Generate reactor and the
// HTTP server's connection are woken by each push (no thread waits), so
// backends never block on the client.
//
// Thread safety: Backend::Start and BackendCall::Cancel are thread-safe;
// CallQueue is thread-safe.
#ifndef TANDEM_SERVICES_ROUTER_BACKEND_H_
#define TANDEM_SERVICES_ROUTER_BACKEND_H_

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/router/validate.h"
#include "tandem/v1/generation.pb.h"

namespace tandem::router {

struct BackendEvent {
  // Token event.
  std::vector<int32_t> token_ids;
  std::string text;  // UTF-8 delta (never a split code point)
  std::vector<tandem::v1::PositionLogprobs> logprobs;
  // Finish event (finished = true): reason, or an error status.
  bool finished = false;
  tandem::v1::FinishReason finish_reason = tandem::v1::FINISH_REASON_UNSPECIFIED;
  absl::Status status;
  int32_t num_cached_tokens = 0;
  double queue_seconds = 0;  // time the request waited in the workers' queues
};

// The events of one call, from the backend to whoever writes the client
// stream (the gRPC reactor, generate_reactor.h; the HTTP server's
// connection, services/http/): SetNotify registers a function that runs
// after every Push, on the pushing thread
// (the engine thread, a gRPC callback thread of the disaggregated backend), without the queue's
// lock held; it then drains the queue with TryPop. It must be quick and never block.
class CallQueue {
 public:
  void Push(BackendEvent event) {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(event));
    if (!notify_) return;
    ++num_notifying_;
    const std::function<void()> notify = notify_;
    mu_.Unlock();
    notify();
    mu_.Lock();
    --num_notifying_;
  }
  // The next event if one is there; never waits.
  std::optional<BackendEvent> TryPop() {
    absl::MutexLock lock(&mu_);
    return PopLocked();
  }
  // Registers `notify` (see above) and runs it once now, on this thread, so
  // events pushed before are not missed.
  void SetNotify(std::function<void()> notify) {
    absl::MutexLock lock(&mu_);
    notify_ = notify;
    ++num_notifying_;
    mu_.Unlock();
    notify();
    mu_.Lock();
    --num_notifying_;
  }
  // Unregisters the notifier and waits until no call of it is running, so
  // whatever it points to may go. REQUIRES: not called from the notifier.
  void ClearNotify() {
    absl::MutexLock lock(&mu_);
    notify_ = nullptr;
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return num_notifying_ == 0; };
    mu_.Await(absl::Condition(&idle));
  }

 private:
  std::optional<BackendEvent> PopLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (events_.empty()) return std::nullopt;
    BackendEvent e = std::move(events_.front());
    events_.pop_front();
    return e;
  }

  absl::Mutex mu_;
  std::deque<BackendEvent> events_ ABSL_GUARDED_BY(mu_);
  std::function<void()> notify_ ABSL_GUARDED_BY(mu_);
  int num_notifying_ ABSL_GUARDED_BY(mu_) = 0;
};

// One running request. Destroying it cancels it (if still running) and
// returns without waiting (it may run on a gRPC callback thread); the backend
// may still push into the queue, which it shares, while it winds down.
class BackendCall {
 public:
  virtual ~BackendCall() = default;
  // Ends the request soon; its finish event follows (CANCELLED). Frees the
  // workers' KV. Idempotent.
  virtual void Cancel() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Starts `request`; events go to `queue` (shared: the backend may push after
  // the handler has gone).
  // Unavailable when no worker can take it; ResourceExhausted when the
  // backend's own queue is full; InvalidArgument from the engine's checks.
  virtual absl::StatusOr<std::unique_ptr<BackendCall>> Start(const PreparedRequest& request,
                                                             std::shared_ptr<CallQueue> queue) = 0;
  // True when the backend can take requests now (health / readiness).
  virtual bool Ready() const = 0;
};

}  // namespace tandem::router

#endif  // TANDEM_SERVICES_ROUTER_BACKEND_H_
