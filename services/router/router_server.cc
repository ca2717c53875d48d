#include "services/router/router_server.h"

#include "absl/strings/str_format.h"
#include "common/status.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/server_interceptor.h"
#include "services/common/grpc_status.h"
#include "services/common/tls.h"
#include "services/router/disaggregated_backend.h"
#include "services/router/local_backend.h"

namespace tandem::router {
namespace {

constexpr double kHeartbeatSeconds = 5.0;

class RegistryServiceImpl final : public tandem::v1::WorkerRegistry::Service {
 public:
  explicit RegistryServiceImpl(WorkerPool* pool) : pool_(pool) {}
  grpc::Status Register(grpc::ServerContext* context, const tandem::v1::RegisterRequest* request,
                        tandem::v1::RegisterResponse* response) override {
    if (pool_ == nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "this router is colocated: it takes no workers");
    }
    if (absl::Status s = pool_->Register(*request); !s.ok()) return services::ToGrpcStatus(s);
    response->set_heartbeat_seconds(kHeartbeatSeconds);
    return grpc::Status::OK;
  }

 private:
  WorkerPool* pool_;
};

// gRPC answers a request it cannot parse (in proto3: a string field that is
// not valid UTF-8) with INTERNAL and no message before any handler runs; on
// a callback method (Generate) with UNIMPLEMENTED and no message, since our
// handler always returns a reactor. That is the client's fault: say so, as
// INVALID_ARGUMENT.
class ParseErrorInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit ParseErrorInterceptor(bool callback_method) : callback_method_(callback_method) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status s = methods->GetSendStatus();
      const grpc::StatusCode parse_failure =
          callback_method_ ? grpc::StatusCode::UNIMPLEMENTED : grpc::StatusCode::INTERNAL;
      if (s.error_code() == parse_failure && s.error_message().empty()) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            "the request could not be parsed: string fields (text, request_id, messages, stop, "
            "cache_salt) must be valid UTF-8 (proto3)"));
      }
    }
    methods->Proceed();
  }

 private:
  const bool callback_method_;
};

class ParseErrorInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new ParseErrorInterceptor(std::string_view(info->method()) ==
                                     "/tandem.v1.Generation/Generate");
  }
};

// Threads of the router's sync RPCs (short unary calls); Generate needs none.
constexpr int kMaxSyncThreads = 64;

}  // namespace

void ApplyServerDefaults(grpc::ServerBuilder* builder, int max_threads) {
  builder->SetMaxReceiveMessageSize(16 << 20);  // a 1 MiB prompt plus framing, with room
  builder->SetMaxSendMessageSize(64 << 20);
  // Long streams: keepalive pings every 60 s; accept client pings down to
  // every 10 s even without data (vLLM's setting) and never GOAWAY for them.
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 60000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  grpc::ResourceQuota quota("tandem");
  quota.SetMaxThreads(max_threads);
  builder->SetResourceQuota(quota);
}

namespace {

absl::Status CheckOptions(const RouterServer::Options& options) {
  if (options.tokenizer == nullptr) return absl::InvalidArgumentError("router: no tokenizer");
  if (options.max_inflight < 1 || options.max_inflight > 100000) {
    return absl::InvalidArgumentError("router: max_inflight must be in [1, 100000]");
  }
  if (options.migration_limit < 0 || options.migration_limit > 100) {
    return absl::InvalidArgumentError("router: migration_limit must be in [0, 100]");
  }
  if (options.remote_prefill_min_tokens < 0) {
    return absl::InvalidArgumentError("router: remote_prefill_min_tokens must be >= 0");
  }
  if (options.max_inflight_tokens < 1) {
    return absl::InvalidArgumentError("router: max_inflight_tokens must be >= 1");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::Start(Options options) {
  TANDEM_RETURN_IF_ERROR(CheckOptions(options));
  // TLS files are read and checked before anything starts.
  auto server_creds = services::MakeServerCredentials(options.tls);
  if (!server_creds.ok()) return server_creds.status();
  auto channel_security = services::MakeChannelSecurity(options.tls);
  if (!channel_security.ok()) return channel_security.status();
  std::unique_ptr<RouterServer> r(new RouterServer());
  r->options_ = options;
  auto m = metrics::TandemMetrics::Create(&r->registry_, metrics::kPhaseRouter, options.model_name);
  if (!m.ok()) return m.status();
  r->metrics_ = std::move(m).value();
  if (options.local_engine != nullptr && options.backend_override == nullptr) {
    TANDEM_ASSIGN_OR_RETURN(r->colocated_metrics_,
                            metrics::TandemMetrics::Create(&r->registry_, metrics::kPhaseColocated,
                                                           options.model_name));
    r->engine_exporter_ = std::make_unique<services::EngineMetricsExporter>(
        options.local_engine, r->colocated_metrics_.get());
  }
  TANDEM_RETURN_IF_ERROR(r->MakeBackend(*channel_security));
  r->MakeServices();
  TANDEM_RETURN_IF_ERROR(r->StartGrpc(*server_creds));
  if (options.metrics_port >= 0) {
    metrics::MetricsHttpServer::Options mo;
    mo.host = options.metrics_host;
    mo.port = options.metrics_port;
    Backend* backend = r->backend_;
    mo.healthy = [backend] { return backend->Ready(); };
    if (services::EngineMetricsExporter* exporter = r->engine_exporter_.get()) {
      mo.before_scrape = [exporter] { exporter->Update(); };
    }
    r->metrics_server_ = std::make_unique<metrics::MetricsHttpServer>(&r->registry_, mo);
    if (absl::Status s = r->metrics_server_->Start(); !s.ok()) {
      r->server_->Shutdown();
      return absl::Status(s.code(), absl::StrFormat("router /metrics: %s", s.message()));
    }
  }
  if (r->pool_ != nullptr) r->pool_->Start();
  r->StartHealthThread();
  return r;
}

absl::Status RouterServer::MakeBackend(const services::ChannelSecurity& channel_security) {
  const Options& options = options_;
  if (options.backend_override != nullptr) {
    backend_ = options.backend_override;
    return absl::OkStatus();
  }
  if (options.local_engine != nullptr) {
    owned_backend_ = std::make_unique<LocalBackend>(options.local_engine, colocated_metrics_.get());
    backend_ = owned_backend_.get();
    return absl::OkStatus();
  }
  WorkerPool::Options po;
  po.model = options.model_shape;
  po.health_interval = options.health_interval;
  po.channel_security = channel_security;
  pool_ = std::make_unique<WorkerPool>(po);
  for (const std::string& a : options.static_prefill) {
    TANDEM_RETURN_IF_ERROR(pool_->AddStatic("prefill", a));
  }
  for (const std::string& a : options.static_decode) {
    TANDEM_RETURN_IF_ERROR(pool_->AddStatic("decode", a));
  }
  DisaggregatedBackend::Options bo;
  bo.migration_limit = options.migration_limit;
  bo.remote_prefill_min_tokens = options.remote_prefill_min_tokens;
  bo.metrics = metrics_.get();
  WorkerPool* pool = pool_.get();  // outlives every scrape (Shutdown stops the server first)
  for (const char* role : {"prefill", "decode"}) {
    if (metrics_ == nullptr) break;
    metrics_->HealthyWorkers(role)->SetCallback(
        [pool, role] { return static_cast<double>(pool->NumHealthy(role)); });
  }
  owned_backend_ = std::make_unique<DisaggregatedBackend>(pool_.get(), bo);
  backend_ = owned_backend_.get();
  return absl::OkStatus();
}

void RouterServer::MakeServices() {
  const Options& options = options_;
  GenerationServiceImpl::Options go;
  go.tokenizer = options.tokenizer;
  go.limits = options.limits;
  go.model_name = options.model_name;
  go.architecture = options.architecture;
  go.kv_bytes_per_token = options.kv_bytes_per_token;
  go.backend = backend_;
  go.metrics = metrics_.get();
  go.max_inflight = options.max_inflight;
  go.max_inflight_tokens = options.max_inflight_tokens;
  go.api_keys = services::ApiKeySet(options.api_keys);
  generation_ = std::make_unique<GenerationServiceImpl>(go);
  registry_service_ = std::make_unique<RegistryServiceImpl>(pool_.get());
}

absl::Status RouterServer::StartGrpc(const std::shared_ptr<grpc::ServerCredentials>& creds) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string address = absl::StrFormat("%s:%d", options_.host, options_.port);
  builder.AddListeningPort(address, creds, &port_);
  // Generate is a callback reactor (generate_reactor.h) and holds no thread
  // while it streams; this bounds the sync handlers' threads (Tokenize,
  // GetModelInfo, registry, health), independent of --max-inflight.
  ApplyServerDefaults(&builder, kMaxSyncThreads);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<ParseErrorInterceptorFactory>());
  // gRPC's own thread-quota RESOURCE_EXHAUSTED gets the retry hints too.
  interceptors.push_back(services::RetryHintInterceptorFactory(generation_->options().retry_after));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.RegisterService(generation_.get());
  builder.RegisterService(registry_service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    return absl::UnavailableError(absl::StrFormat("router: cannot listen on %s", address));
  }
  return absl::OkStatus();
}

void RouterServer::StartHealthThread() {
  // Health: SERVING exactly while the backend can take requests.
  health_thread_ = std::thread([this] {
    absl::MutexLock lock(&mu_);
    while (!stopped_) {
      const bool ready = !draining_.load() && backend_->Ready();
      server_->GetHealthCheckService()->SetServingStatus(ready);
      server_->GetHealthCheckService()->SetServingStatus("tandem.v1.Generation", ready);
      // Colocated: keeps the engine's step records short between scrapes.
      if (engine_exporter_ != nullptr) engine_exporter_->Update();
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopped_; };
      mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Milliseconds(250));
    }
  });
}

void RouterServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  if (health_thread_.joinable()) health_thread_.join();
  if (server_ != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(false);
    server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  }
  // Reactors can outlive the server's Shutdown (a deadline alarm's callback);
  // they touch generation_, destroyed after this.
  if (generation_ != nullptr) generation_->WaitForReactors();
  if (pool_ != nullptr) pool_->Stop();
  if (metrics_server_ != nullptr) metrics_server_->Stop();
}

RouterServer::~RouterServer() { Shutdown(); }

bool RouterServer::Drain(absl::Duration timeout) {
  draining_.store(true);
  generation_->StartDraining();
  if (server_ != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(false);
    server_->GetHealthCheckService()->SetServingStatus("tandem.v1.Generation", false);
  }
  const absl::Time give_up = absl::Now() + timeout;
  while (generation_->num_inflight() > 0) {
    if (absl::Now() >= give_up) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

}  // namespace tandem::router
