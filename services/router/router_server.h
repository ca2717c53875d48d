// RouterServer: the router process's servers in one object. A gRPC server
// with tandem.v1.Generation, tandem.v1.WorkerRegistry, grpc.health.v1.Health
// (SERVING while the backend is ready) and server reflection; a /metrics
// HTTP server; and the backend: LocalBackend on an in-process engine
// (colocated) or DisaggregatedBackend on a WorkerPool (static workers from
// flags + those that Register).
//
//   RouterServer::Options o; o.tokenizer = ...; o.local_engine = engine.get();
//   auto router = RouterServer::Start(std::move(o));  // binds; port 0 = ephemeral
//   ... (*router)->port() ...
//   (*router)->Shutdown();
//
// Thread safety: port()/pool()/Shutdown() from any thread; Shutdown is
// idempotent. The tokenizer and local engine must outlive the server.
#ifndef TANDEM_SERVICES_ROUTER_ROUTER_SERVER_H_
#define TANDEM_SERVICES_ROUTER_ROUTER_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/metrics/http_server.h"
#include "common/metrics/tandem_metrics.h"
#include "engine/engine.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "services/common/engine_metrics.h"
#include "services/common/tls.h"
#include "services/router/backend.h"
#include "services/router/disaggregated_backend.h"
#include "services/router/generation_service.h"
#include "services/router/worker_pool.h"

namespace tandem::router {

class RouterServer {
 public:
  struct Options {
    std::string host = "0.0.0.0";
    int port = 50051;       // 0 = ephemeral
    int metrics_port = -1;  // -1 = no /metrics server; 0 = ephemeral
    std::string metrics_host = "0.0.0.0";
    const tokenizer::Tokenizer* tokenizer = nullptr;  // required
    ModelLimits limits;
    ExpectedModel model_shape;
    std::string model_name;
    std::string architecture;
    int64_t kv_bytes_per_token = 0;
    int max_inflight = 256;
    int64_t max_inflight_tokens = 1 << 20;  // prompt + max_tokens of admitted calls
    // Colocated when set; else disaggregated over these + registered workers.
    engine::Engine* local_engine = nullptr;
    std::vector<std::string> static_prefill;
    std::vector<std::string> static_decode;
    absl::Duration health_interval = absl::Seconds(1);
    // Tests: use this backend instead (not owned).
    Backend* backend_override = nullptr;
    // Disaggregated: re-dispatches of a request after worker failures.
    int migration_limit = 3;
    // Disaggregated: prompts with fewer uncached tokens on the chosen decode
    // worker are prefilled there (DisaggregatedBackend::Options).
    int64_t remote_prefill_min_tokens = kDefaultRemotePrefillMinTokens;
    // TLS of the one gRPC port (clients, WorkerRegistry) and of the
    // channels to workers (docs/security.md). Empty = plaintext.
    services::TlsOptions tls;
    // Non-empty: tandem.v1.Generation calls need `authorization: Bearer <key>`.
    std::vector<std::string> api_keys;
  };

  static absl::StatusOr<std::unique_ptr<RouterServer>> Start(Options options);
  ~RouterServer();  // Shutdown()

  int port() const { return port_; }
  int metrics_port() const { return metrics_server_ ? metrics_server_->port() : -1; }
  WorkerPool* pool() { return pool_.get(); }  // null when colocated
  // The Generation service, shared with the HTTP front door (services/http/).
  GenerationServiceImpl* generation() { return generation_.get(); }
  bool Ready() const { return backend_->Ready(); }
  // Drain: health NOT_SERVING, new Generate calls UNAVAILABLE, and waits for
  // the calls in flight to finish, at most `timeout`; true when none is left.
  bool Drain(absl::Duration timeout);
  // Health NOT_SERVING, then stops the servers (in-flight streams get up to
  // `grace` to finish) and the health poll.
  void Shutdown(absl::Duration grace = absl::Seconds(2));

 private:
  RouterServer() = default;
  // Start's steps: the backend (a test's, colocated, or the worker pool and
  // the disaggregated backend), the gRPC services, the gRPC server, the
  // health thread (SERVING exactly while the backend can take requests).
  absl::Status MakeBackend(const services::ChannelSecurity& channel_security);
  void MakeServices();
  absl::Status StartGrpc(const std::shared_ptr<grpc::ServerCredentials>& creds);
  void StartHealthThread();

  Options options_;
  metrics::MetricsRegistry registry_;
  std::unique_ptr<metrics::TandemMetrics> metrics_;
  // Colocated: the in-process engine's series (phase="colocated").
  std::unique_ptr<metrics::TandemMetrics> colocated_metrics_;
  std::unique_ptr<services::EngineMetricsExporter> engine_exporter_;
  std::unique_ptr<metrics::MetricsHttpServer> metrics_server_;
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<Backend> owned_backend_;
  Backend* backend_ = nullptr;
  std::unique_ptr<GenerationServiceImpl> generation_;
  std::unique_ptr<grpc::Service> registry_service_;
  std::unique_ptr<grpc::Server> server_;
  std::thread health_thread_;
  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> draining_{false};
  int port_ = 0;
};

// Server-wide gRPC settings shared by every Tandem server: message sizes and
// keepalive suited to long streams.
void ApplyServerDefaults(grpc::ServerBuilder* builder, int max_threads);

}  // namespace tandem::router

#endif  // TANDEM_SERVICES_ROUTER_ROUTER_SERVER_H_
