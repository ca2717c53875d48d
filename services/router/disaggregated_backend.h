// DisaggregatedBackend: one request = PrefillWorker.Prefill on a prefill
// worker (which streams the prompt's KV to the chosen decode worker under
// kv_handle while it computes it, sends the first token as soon as it is
// sampled, then a kv_landed message), then DecodeWorker.Decode on that
// decode worker (which adopts the leased KV and streams the rest).
//
// The first token is queued for the client the moment the Prefill stream
// delivers it (the router's TTFT: queue + prefill, no transfer); the Decode
// call starts once the KV has landed. Where the prompt is prefilled is
// decided per request (Options::remote_prefill_min_tokens): short prompts,
// or prompts mostly in the decode worker's prefix cache, skip the prefill
// worker and the handoff (tandem_router_prefill_decisions_total{where}). On every path that does
// not end in a clean Decode finish (prefill error, cancel, deadline, decode error, first token
// already final) the router sends DecodeWorker.ReleaseKv(kv_handle), which is idempotent (and
// refuses a push that arrives after it), so no lease outlives the request even before its expiry.
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
// No thread per call: each call is a state machine on gRPC's callback client
// API (a ClientReadReactor per Prefill / Decode stream, ReleaseKv as a unary
// callback). A step runs on a gRPC callback thread when the previous RPC
// ends, and never blocks, so thousands of open streams cost no threads
// (tests/integration/many_streams_test.cc). Cancel() TryCancels the RPC in
// flight. Destroying the BackendCall cancels and returns at once; the call
// winds down (ReleaseKv included) on its own, and the backend's destructor
// waits until every call has ended (docs/architecture.md, "Threads").
//
// Thread safety: thread-safe.
#ifndef TANDEM_SERVICES_ROUTER_DISAGGREGATED_BACKEND_H_
#define TANDEM_SERVICES_ROUTER_DISAGGREGATED_BACKEND_H_

#include <atomic>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/tandem_metrics.h"
#include "services/router/backend.h"
#include "services/router/worker_pool.h"

namespace tandem::router {

// Below this many uncached prompt tokens a handoff costs more than it saves
// (docs/architecture.md, "Where a prompt is prefilled").
inline constexpr int64_t kDefaultRemotePrefillMinTokens = 64;

// Calls still running (the backend's destructor waits for none).
class LiveCalls {
 public:
  void Add();
  void Done();
  void WaitNone();

 private:
  absl::Mutex mu_;
  int n_ ABSL_GUARDED_BY(mu_) = 0;
};

class DisaggregatedBackend final : public Backend {
 public:
  struct Options {
    int migration_limit = 3;  // re-dispatches per request (0 = none)
    // The pd-decider: a prompt with fewer tokens than this that the chosen
    // decode worker does not already hold in its prefix cache (as far as the
    // router knows: the block hashes it sent there) is prefilled on that
    // decode worker, with no KV handoff; 0 = always on a prefill worker.
    int64_t remote_prefill_min_tokens = kDefaultRemotePrefillMinTokens;
    metrics::TandemMetrics* metrics = nullptr;  // router phase; may be null
  };
  // `pool` (and options.metrics) must outlive the backend and every call.
  explicit DisaggregatedBackend(WorkerPool* pool) : DisaggregatedBackend(pool, Options()) {}
  DisaggregatedBackend(WorkerPool* pool, Options options) : pool_(pool), options_(options) {}
  ~DisaggregatedBackend() override;  // waits until every call has ended
  absl::StatusOr<std::unique_ptr<BackendCall>> Start(const PreparedRequest& request,
                                                     std::shared_ptr<CallQueue> queue) override;
  bool Ready() const override;

 private:
  WorkerPool* pool_;
  const Options options_;
  std::atomic<uint64_t> next_handle_{1};
  // Shared with the calls: the last one may still be leaving it.
  const std::shared_ptr<LiveCalls> live_ = std::make_shared<LiveCalls>();
};

}  // namespace tandem::router

#endif  // TANDEM_SERVICES_ROUTER_DISAGGREGATED_BACKEND_H_
