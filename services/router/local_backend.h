// LocalBackend: the colocated mode. Requests run on an in-process
// engine::Engine that does both phases (chunked prefill mixed into decode
// steps): the baseline disaggregation is measured against.
//
// Thread safety: thread-safe. The engine must outlive the backend; the
// metrics must outlive the backend, not the engine's requests: the engine
// (which outlives the router) may finish a request after the backend is
// gone, and such a request records nothing.
#ifndef TANDEM_SERVICES_ROUTER_LOCAL_BACKEND_H_
#define TANDEM_SERVICES_ROUTER_LOCAL_BACKEND_H_

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/tandem_metrics.h"
#include "engine/engine.h"
#include "services/router/backend.h"

namespace tandem::router {

class LocalBackend final : public Backend {
 public:
  // metrics (may be null): the engine's phase="colocated" series, which get
  // each finished request's queue, prefill and decode times and finish reason.
  LocalBackend(engine::Engine* engine, metrics::TandemMetrics* metrics);
  ~LocalBackend() override;  // detaches the metrics from requests still running
  absl::StatusOr<std::unique_ptr<BackendCall>> Start(const PreparedRequest& request,
                                                     std::shared_ptr<CallQueue> queue) override;
  bool Ready() const override { return true; }

 private:
  // The metrics as the engine's request callbacks see them: null once the
  // backend is destroyed.
  class MetricsRef {
   public:
    explicit MetricsRef(metrics::TandemMetrics* m) : metrics_(m) {}
    void Detach() {
      absl::MutexLock lock(&mu_);
      metrics_ = nullptr;
    }
    // Runs fn(metrics) unless detached (or null).
    template <typename F>
    void With(F fn) {
      absl::MutexLock lock(&mu_);
      if (metrics_ != nullptr) fn(*metrics_);
    }

   private:
    absl::Mutex mu_;
    metrics::TandemMetrics* metrics_ ABSL_GUARDED_BY(mu_);
  };

  engine::Engine* engine_;
  std::shared_ptr<MetricsRef> metrics_;
};

}  // namespace tandem::router

#endif  // TANDEM_SERVICES_ROUTER_LOCAL_BACKEND_H_
