// The prefill worker: PrefillWorker service on its own engine (prefill-only:
// EngineRequest::export_kv), plus health, reflection, /metrics and router
// registration (services/common/worker_host.h).
//
//   WorkerServerConfig config;            // listen_address "127.0.0.1:0", model_path, ...
//   auto server = PrefillServer::Start(config);
//   (*server)->port();
//   (*server)->Shutdown();
//
// Prefill(request) -> stream of PrefillResponse: runs the prompt (chunked
// prefill, prefix cache) with the engine streaming its K/V
// (EngineRequest::stream_kv_export); each chunk a step computes is pushed to
// request.decode_address under request.kv_handle through the KvTransport on
// a sender thread (transfer::KvPushPipe), so the push overlaps the rest of
// the prefill. The first token goes to the router as soon as it is sampled
// (first message: TTFT = queue + prefill), then, once the decode worker
// accepted every byte, a second message with kv_landed. When the first token
// ends the request (EOS, stop, max_tokens 1) the second message carries
// finish_reason instead and the push is cancelled; with an empty
// decode_address nothing is pushed. The RPC deadline bounds the whole call;
// cancel / deadline cancel the engine request and the push. Errors (after
// the first message when they happen later): INVALID_ARGUMENT (params /
// prompt), RESOURCE_EXHAUSTED (+ retry-after-ms trailer), a failed transfer
// (ABORTED naming the decode worker when the transport or receiver failed;
// the receiver's RESOURCE_EXHAUSTED / FAILED_PRECONDITION / INVALID_ARGUMENT
// as they are), CANCELLED / DEADLINE_EXCEEDED, UNAVAILABLE while draining.
// prefix_output_token_ids (migration replay) are computed with the prompt;
// the K/V sent covers both, and the token returned is the next output. When
// they already end the request, first_token_id is -1 and finish_reason set
// (one message). Cancelling the call mid-transfer cancels the push (child
// call), so the decode worker drops the partial handoff at once.
//
// Thread safety: all methods thread-safe.
#ifndef TANDEM_SERVICES_PREFILL_PREFILL_SERVER_H_
#define TANDEM_SERVICES_PREFILL_PREFILL_SERVER_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/common/worker_host.h"
#include "services/common/worker_runtime.h"
#include "services/transfer/kv_transport.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::prefill {

// Prefill is on gRPC's callback API (prefill_reactor.h: no thread per
// stream, woken by the engine and the push); GetStats is sync.
class PrefillServiceImpl final : public tandem::v1::PrefillWorker::WithCallbackMethod_Prefill<
                                     tandem::v1::PrefillWorker::Service> {
 public:
  // runtime, transport: not owned.
  PrefillServiceImpl(services::WorkerRuntime* runtime, transfer::KvTransport* transport);

  grpc::ServerWriteReactor<tandem::v1::PrefillResponse>* Prefill(
      grpc::CallbackServerContext* context, const tandem::v1::PrefillRequest* request) override;
  grpc::Status GetStats(grpc::ServerContext* context, const tandem::v1::WorkerStatsRequest* request,
                        tandem::v1::WorkerStats* response) override;

  void set_draining(bool draining) { draining_.store(draining); }
  int active_rpcs() const { return active_rpcs_.load(); }
  const std::atomic<int>& active_rpcs_counter() const { return active_rpcs_; }

 private:
  friend class PrefillReactor;
  services::WorkerRuntime* runtime_;
  transfer::KvTransport* transport_;
  std::atomic<bool> draining_{false};
  std::atomic<int> active_rpcs_{0};
};

class PrefillServer {
 public:
  static absl::StatusOr<std::unique_ptr<PrefillServer>> Start(
      const services::WorkerServerConfig& config);
  ~PrefillServer();  // Shutdown()

  int port() const { return host_->port(); }
  const std::string& address() const { return host_->address(); }
  int metrics_port() const { return runtime_->metrics_port(); }
  engine::Engine& engine() { return runtime_->engine(); }
  // Drain: new Prefill calls get UNAVAILABLE (health NOT_SERVING, router
  // told at once); waits for the calls in flight, at most `timeout`; true
  // when none is left.
  bool Drain(absl::Duration timeout);
  // Health NOT_SERVING, stop the server, then the engine. Idempotent.
  void Shutdown();

 private:
  PrefillServer() = default;
  std::unique_ptr<services::WorkerRuntime> runtime_;
  std::unique_ptr<transfer::KvTransport> transport_;
  std::unique_ptr<PrefillServiceImpl> service_;
  std::unique_ptr<services::WorkerHost> host_;
};

}  // namespace tandem::prefill

#endif  // TANDEM_SERVICES_PREFILL_PREFILL_SERVER_H_
