// LocalBackend: the colocated mode. Requests run on an in-process
// engine::Engine that does both phases (chunked prefill mixed into decode
// steps): the baseline disaggregation is measured against.
//
// Thread safety: thread-safe. The engine and metrics must outlive the backend.
#ifndef TANDEM_SERVICES_ROUTER_LOCAL_BACKEND_H_
#define TANDEM_SERVICES_ROUTER_LOCAL_BACKEND_H_

#include <memory>

#include "common/metrics/tandem_metrics.h"
#include "engine/engine.h"
#include "services/router/backend.h"

namespace tandem::router {

class LocalBackend final : public Backend {
 public:
  // metrics (may be null): the engine's phase="colocated" series, which get
  // each finished request's queue, prefill and decode times.
  LocalBackend(engine::Engine* engine, metrics::TandemMetrics* metrics)
      : engine_(engine), metrics_(metrics) {}
  absl::StatusOr<std::unique_ptr<BackendCall>> Start(const PreparedRequest& request,
                                                     std::shared_ptr<CallQueue> queue) override;
  bool Ready() const override { return true; }

 private:
  engine::Engine* engine_;
  metrics::TandemMetrics* metrics_;
};

}  // namespace tandem::router

#endif  // TANDEM_SERVICES_ROUTER_LOCAL_BACKEND_H_
