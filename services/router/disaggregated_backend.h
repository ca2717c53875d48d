// DisaggregatedBackend: one request = PrefillWorker.Prefill on a prefill
// worker (which pushes the prompt's KV to the chosen decode worker under
// kv_handle and returns the first token), then DecodeWorker.Decode on that
// decode worker (which adopts the leased KV and streams the rest).
//
// The first token is queued for the client the moment Prefill returns (the
// router's TTFT). On every path that does not end in a clean Decode finish
// (prefill error, cancel, deadline, decode error, first token already final)
// the router sends DecodeWorker.ReleaseKv(kv_handle), which is idempotent, so
// no lease outlives the request even before its expiry.
//
// Each call runs on its own thread (bounded by the router's admission
// limit); Cancel() TryCancels the RPC in flight.
//
// Thread safety: thread-safe.
#ifndef TANDEM_SERVICES_ROUTER_DISAGGREGATED_BACKEND_H_
#define TANDEM_SERVICES_ROUTER_DISAGGREGATED_BACKEND_H_

#include <atomic>
#include <memory>

#include "services/router/backend.h"
#include "services/router/worker_pool.h"

namespace tandem::router {

class DisaggregatedBackend final : public Backend {
 public:
  // `pool` must outlive the backend and every call.
  explicit DisaggregatedBackend(WorkerPool* pool) : pool_(pool) {}
  absl::StatusOr<std::unique_ptr<BackendCall>> Start(const PreparedRequest& request,
                                                     std::shared_ptr<CallQueue> queue) override;
  bool Ready() const override;

 private:
  WorkerPool* pool_;
  std::atomic<uint64_t> next_handle_{1};
};

}  // namespace tandem::router

#endif  // TANDEM_SERVICES_ROUTER_DISAGGREGATED_BACKEND_H_
