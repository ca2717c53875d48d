// GenerationServiceImpl: the public tandem.v1.Generation service.
//
// Generate: validate + tokenize (validate.h) -> admission (in-flight bounds
// by requests and by tokens, prompt + max_tokens: RESOURCE_EXHAUSTED with a
// RetryInfo detail and a retry-after-ms trailer, services/common/grpc_status.h;
// backend not ready: UNAVAILABLE) -> Backend::Start -> forward events as they come, then one
// final message (finish reason, usage, timings).
//
// Deadlines: when the client's deadline is near (deadline - margin, margin =
// 10% of the request's budget clamped to [20 ms, 200 ms]) the request is
// cancelled on the workers and the stream ends with a final message whose
// finish_reason is DEADLINE and status OK, so the client sees a clean finish
// instead of DEADLINE_EXCEEDED. If the client cancels (or goes away), the
// backend call is cancelled (workers free the KV) and the RPC ends CANCELLED.
//
// Threading: Generate is on gRPC's callback API: one GenerateReactor per call
// (generate_reactor.h), woken by its CallQueue when the backend pushes an
// event and by an alarm at the deadline; no thread waits for a stream, so an
// idle or slow stream costs memory, not a thread. Tokenize and GetModelInfo
// stay on the sync API (short, bounded by the server's ResourceQuota). The
// HTTP server (services/http/) is woken the same way: both turn the queued
// events into messages with CallStream (below).
//
// Thread safety: thread-safe. Everything passed in Options must outlive it.
#ifndef TANDEM_SERVICES_ROUTER_GENERATION_SERVICE_H_
#define TANDEM_SERVICES_ROUTER_GENERATION_SERVICE_H_

#include <atomic>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/tandem_metrics.h"
#include "common/tokenizer/tokenizer.h"
#include "services/common/api_key.h"
#include "services/router/backend.h"
#include "services/router/validate.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace tandem::router {

// Turns one call's BackendEvents into GenerateResponses and records the
// router's per-request metrics (TTFT, inter-token latency, e2e, queue time,
// success by finish reason) as it goes; used by CallStream. Not thread-safe:
// one consumer at a time.
class GenerateResponseBuilder {
 public:
  GenerateResponseBuilder(const PreparedRequest& request, absl::Time start,
                          metrics::TandemMetrics* metrics)
      : request_(request), start_(start), metrics_(metrics) {}
  // A token message for `event` (moved from); counts its tokens.
  tandem::v1::GenerateResponse Token(BackendEvent& event);
  // The final message: finish reason, usage, timings.
  tandem::v1::GenerateResponse Final(tandem::v1::FinishReason reason, const std::string& tail,
                                     int32_t num_cached_tokens, double backend_queue_s);

 private:
  const PreparedRequest& request_;
  const absl::Time start_;
  metrics::TandemMetrics* const metrics_;
  int64_t num_tokens_ = 0;
  absl::Time first_token_time_, last_token_time_;
};

// When a call with client deadline `deadline` (InfiniteFuture = none) that
// started at `start` is finished with FINISH_REASON_DEADLINE.
absl::Time FinishBy(absl::Time start, absl::Time deadline);

class GenerationServiceImpl final
    : public tandem::v1::Generation::WithCallbackMethod_Generate<tandem::v1::Generation::Service> {
 public:
  struct Options {
    const tokenizer::Tokenizer* tokenizer = nullptr;  // required
    ModelLimits limits;
    std::string model_name;
    std::string architecture;
    int64_t kv_bytes_per_token = 0;
    Backend* backend = nullptr;                 // required
    metrics::TandemMetrics* metrics = nullptr;  // optional
    int max_inflight = 256;                     // Generate calls at once
    // Sum over admitted calls of prompt tokens + max_tokens; a single call
    // above it is INVALID_ARGUMENT (it could never be admitted).
    int64_t max_inflight_tokens = 1 << 20;
    absl::Duration retry_after = absl::Seconds(1);  // hint with RESOURCE_EXHAUSTED
    // Enabled: every RPC of this service needs `authorization: Bearer <key>`
    // (UNAUTHENTICATED otherwise, counted in the request-error metric).
    services::ApiKeySet api_keys;
  };
  explicit GenerationServiceImpl(Options options);

  grpc::ServerWriteReactor<tandem::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const tandem::v1::GenerateRequest* request) override;
  grpc::Status Tokenize(grpc::ServerContext* context, const tandem::v1::TokenizeRequest* request,
                        tandem::v1::TokenizeResponse* response) override;
  grpc::Status GetModelInfo(grpc::ServerContext* context,
                            const tandem::v1::GetModelInfoRequest* request,
                            tandem::v1::ModelInfo* response) override;

  // One admitted call (both encodings: gRPC here, HTTP in services/http/):
  // validated, counted against the in-flight bounds and started on the
  // backend. Destroying it cancels the backend call if still running, then
  // gives its in-flight slots back.
  class AdmittedCall {
   public:
    ~AdmittedCall();
    const PreparedRequest& request() const { return request_; }
    absl::Time start() const { return start_; }
    CallQueue& queue() const { return *queue_; }
    BackendCall& call() const { return *call_; }
    // The client is gone (cancel, disconnect, failed write): cancels the
    // backend call (the workers free the KV) and counts CANCELLED.
    // Thread-safe; never blocks.
    void CancelForClient() const;

   private:
    friend class GenerationServiceImpl;
    friend class CallStream;
    GenerationServiceImpl* service_ = nullptr;
    PreparedRequest request_;
    absl::Time start_;
    int64_t cost_ = 0;
    std::shared_ptr<CallQueue> queue_;
    std::unique_ptr<BackendCall> call_;
  };

  // Drain check, PrepareRequest, admission (in-flight bounds), backend
  // readiness and Start. Errors are counted in the request-error metric;
  // RESOURCE_EXHAUSTED messages end with the retry hint (options().retry_after).
  // The caller authenticates first.
  absl::StatusOr<std::unique_ptr<AdmittedCall>> Admit(const tandem::v1::GenerateRequest& request);
  // The API-key check on an `authorization` header value (null = absent);
  // a failure is counted like the gRPC one.
  absl::Status AuthenticateHeader(const std::string* authorization);

  const Options& options() const { return options_; }
  bool draining() const { return draining_.load(); }
  int num_inflight() const { return inflight_.load(); }
  // Drain: new Generate calls get UNAVAILABLE; those in flight go on.
  void StartDraining() { draining_.store(true); }
  int64_t num_inflight_tokens() const { return inflight_tokens_.load(); }
  // Blocks until every Generate reactor is deleted. A reactor can outlive the
  // gRPC server's Shutdown (its deadline alarm's callback runs after OnDone),
  // and its AdmittedCall touches this service: the owner waits here after
  // the server's Shutdown and before destroying the service.
  void WaitForReactors();

 private:
  friend class GenerateReactor;
  friend class CallStream;
  // A reactor's lifetime, counted for WaitForReactors.
  void ReactorStarted();
  void ReactorFinished();
  // Counts `status` in the request-error metric; a backend's
  // RESOURCE_EXHAUSTED gets the router's retry hint in its message.
  absl::Status Fail(const absl::Status& status);
  // OK, or UNAUTHENTICATED (counted) when the API key is missing / wrong.
  grpc::Status Authenticate(const grpc::ServerContextBase* context);

  const Options options_;
  std::atomic<int> inflight_{0};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> inflight_tokens_{0};
  absl::Mutex reactors_mu_;
  int live_reactors_ ABSL_GUARDED_BY(reactors_mu_) = 0;
};

// One admitted call's messages for whoever writes them to its client (the
// gRPC GenerateReactor, the HTTP server's connection), both woken by the
// call's CallQueue notifier: Next() turns the next queued event into the
// next message, never waiting. Not thread-safe: one consumer at a time (the
// reactor's mutex, the connection's strand); `call` outlives it.
class CallStream {
 public:
  struct Step {
    enum Kind {
      kNone,   // nothing queued yet: wait for the next notification
      kToken,  // `response` is a token message
      kFinal,  // `response` is the final message (finish reason, usage, timings)
      kError,  // the call failed: `status` (counted; RESOURCE_EXHAUSTED with the retry hint)
    };
    Kind kind = kNone;
    tandem::v1::GenerateResponse response;
    absl::Status status;
  };
  explicit CallStream(GenerationServiceImpl::AdmittedCall* call);
  // The next message; after kFinal or kError, kNone forever.
  Step Next();
  // The deadline margin is reached (FinishBy): Next() returns the
  // FINISH_REASON_DEADLINE final message. The caller cancels the backend call.
  void FinishAtDeadline() { deadline_hit_ = true; }

 private:
  GenerationServiceImpl::AdmittedCall* const call_;
  GenerateResponseBuilder builder_;
  bool deadline_hit_ = false;
  bool done_ = false;
};

// `s` with every invalid UTF-8 sequence replaced by U+FFFD.
std::string SanitizeUtf8(std::string_view s);

}  // namespace tandem::router

#endif  // TANDEM_SERVICES_ROUTER_GENERATION_SERVICE_H_
