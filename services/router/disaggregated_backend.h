// DisaggregatedBackend: one request = PrefillWorker.Prefill on a prefill
// worker (which pushes the prompt's KV to the chosen decode worker under
// kv_handle and returns the first token), then DecodeWorker.Decode on that
// decode worker (which adopts the leased KV and streams the rest).
//
// The first token is queued for the client the moment Prefill returns (the
// router's TTFT). On every path that does not end in a clean Decode finish
// (prefill error, cancel, deadline, decode error, first token already final)
// the router sends DecodeWorker.ReleaseKv(kv_handle), which is idempotent
// (and refuses a push that arrives after it), so no lease outlives the
// request even before its expiry.
//
// Migration (docs/faults.md): when a worker fails mid-request (its RPC
// breaks: connection reset, UNAVAILABLE, a stream that ends without a
// finish; or the pool's health polls declare it failed while the call waits
// on it), the call is re-dispatched, up to `migration_limit` times:
//  - the prefill worker failed: another prefill worker (and a fresh decode
//    pick) runs it again;
//  - the push to the decode worker failed (ABORTED from Prefill), or the
//    decode stream broke: the prompt plus every token already delivered to
//    the client is replayed (prefix_output_token_ids) through a prefill
//    worker to another decode worker, or by decode-side prefill when no
//    prefill worker is healthy. The engine's sampling is keyed by seed and
//    position, so the stream continues with the tokens it would have
//    produced anyway; none is lost or repeated.
// Workers a request failed on are avoided for its later attempts while
// others are healthy. Client errors (INVALID_ARGUMENT, RESOURCE_EXHAUSTED,
// FAILED_PRECONDITION) end the request as they are; past the limit it ends
// UNAVAILABLE naming the last failure. Counted in
// tandem_request_migrations_total{reason} and
// tandem_migration_recovery_seconds.
//
// Each call runs on its own thread (bounded by the router's admission
// limit); Cancel() TryCancels the RPC in flight.
//
// Thread safety: thread-safe.
#ifndef TANDEM_SERVICES_ROUTER_DISAGGREGATED_BACKEND_H_
#define TANDEM_SERVICES_ROUTER_DISAGGREGATED_BACKEND_H_

#include <atomic>
#include <memory>

#include "common/metrics/tandem_metrics.h"
#include "services/router/backend.h"
#include "services/router/worker_pool.h"

namespace tandem::router {

class DisaggregatedBackend final : public Backend {
 public:
  struct Options {
    int migration_limit = 3;                   // re-dispatches per request (0 = none)
    metrics::TandemMetrics* metrics = nullptr;  // router phase; may be null
  };
  // `pool` (and options.metrics) must outlive the backend and every call.
  explicit DisaggregatedBackend(WorkerPool* pool) : DisaggregatedBackend(pool, Options()) {}
  DisaggregatedBackend(WorkerPool* pool, Options options) : pool_(pool), options_(options) {}
  absl::StatusOr<std::unique_ptr<BackendCall>> Start(const PreparedRequest& request,
                                                     std::shared_ptr<CallQueue> queue) override;
  bool Ready() const override;

 private:
  WorkerPool* pool_;
  const Options options_;
  std::atomic<uint64_t> next_handle_{1};
};

}  // namespace tandem::router

#endif  // TANDEM_SERVICES_ROUTER_DISAGGREGATED_BACKEND_H_
