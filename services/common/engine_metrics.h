// Prometheus series fed by one engine: EngineMetricsExporter turns
// EngineStats deltas and per-step records into TandemMetrics (shared by the
// prefill and decode workers and by the router's colocated engine), and
// ObserveRequest records one finished request's per-phase latencies.
//
// Thread safety: EngineMetricsExporter is thread-safe (Update may run on a
// refresh thread and on /metrics scrapes at once). The engine and metrics
// must outlive it.
#ifndef TANDEM_SERVICES_COMMON_ENGINE_METRICS_H_
#define TANDEM_SERVICES_COMMON_ENGINE_METRICS_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/tandem_metrics.h"
#include "engine/engine.h"
#include "engine/request_stream.h"

namespace tandem::services {

class EngineMetricsExporter {
 public:
  EngineMetricsExporter(engine::Engine* engine, metrics::TandemMetrics* metrics);
  // Gauges from the engine's stats now; counters by what changed since the
  // last call; one tandem_iteration_tokens / tandem_batch_size /
  // tandem_engine_step_seconds sample per engine step run since the last call.
  void Update();

 private:
  engine::Engine* const engine_;
  metrics::TandemMetrics* const metrics_;
  absl::Mutex mu_;
  engine::EngineStats last_ ABSL_GUARDED_BY(mu_);
};

// Which parts of a request ran on the engine that reports it.
struct RequestPhases {
  bool prefill = false;  // it computed the prompt (a prefill worker, colocated, local prefill)
  bool decode = false;   // it generated the tokens after the first
};

// On a request's finish: queue time always; with phases.prefill the prompt
// tokens and the prefill time (first scheduled step to first token); with
// phases.decode the decode time (first to last token of this engine) and one
// inter-token latency sample per gap between its consecutive tokens.
void ObserveRequest(metrics::TandemMetrics& m, const engine::Usage& usage, RequestPhases phases);

}  // namespace tandem::services

#endif  // TANDEM_SERVICES_COMMON_ENGINE_METRICS_H_
