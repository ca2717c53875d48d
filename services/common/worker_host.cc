#include "services/common/worker_host.h"

#include <unistd.h>

#include <cstdio>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "services/common/grpc_status.h"
#include "services/common/tls.h"
#include "spdlog/spdlog.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::services {

absl::StatusOr<std::unique_ptr<WorkerHost>> WorkerHost::Start(
    const WorkerServerConfig& config, const std::string& role, const std::string& service_name,
    grpc::Service* service, WorkerRuntime* runtime, std::function<void()> stats_fn) {
  std::string host;
  int requested_port = 0;
  TANDEM_RETURN_IF_ERROR(
      SplitHostPort(config.listen_address, "listen address", &host, &requested_port));
  std::unique_ptr<WorkerHost> h(new WorkerHost());
  h->config_ = config;
  h->role_ = role;
  h->service_name_ = service_name;
  h->runtime_ = runtime;
  h->stats_fn_ = std::move(stats_fn);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds,
                          MakeServerCredentials(config.tls));
  builder.AddListeningPort(config.listen_address, creds, &h->port_);
  builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(16 << 20);
  builder.SetMaxSendMessageSize(16 << 20);
  grpc::ResourceQuota quota(absl::StrCat("tandem-", role));
  quota.SetMaxThreads(std::max(4, config.max_rpc_threads));
  builder.SetResourceQuota(quota);
  {  // gRPC's thread-quota RESOURCE_EXHAUSTED carries the retry hints too.
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> hooks;
    hooks.push_back(RetryHintInterceptorFactory(absl::Milliseconds(100)));
    builder.experimental().SetInterceptorCreators(std::move(hooks));
  }
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  h->server_ = builder.BuildAndStart();
  if (h->server_ == nullptr || h->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", config.listen_address));
  }
  h->server_->GetHealthCheckService()->SetServingStatus(service_name, true);
  h->server_->GetHealthCheckService()->SetServingStatus("", true);
  h->address_ = config.advertise_address.empty()
                    ? absl::StrCat(host == "0.0.0.0" ? "127.0.0.1" : host, ":", h->port_)
                    : config.advertise_address;
  h->thread_ = std::thread([p = h.get()] { p->Loop(); });
  return h;
}

WorkerHost::~WorkerHost() { Shutdown(); }

void WorkerHost::Loop() {
  std::unique_ptr<tandem::v1::WorkerRegistry::Stub> registry;
  if (!config_.router_address.empty()) {
    // Checked at Start (MakeServerCredentials reads the same files).
    absl::StatusOr<ChannelSecurity> security = MakeChannelSecurity(config_.tls);
    if (!security.ok()) {
      spdlog::error("{}: cannot register: {}", role_, std::string(security.status().message()));
    } else {
      registry =
          tandem::v1::WorkerRegistry::NewStub(CreateChannel(config_.router_address, *security));
    }
  }
  absl::Time next_register = absl::Now();
  absl::Duration heartbeat = config_.heartbeat_period;
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const bool draining = draining_;
    const bool announce = announce_;
    announce_ = false;
    mu_.Unlock();
    if (stats_fn_) stats_fn_();
    if (registry != nullptr && (announce || absl::Now() >= next_register)) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
      tandem::v1::RegisterRequest req;
      req.set_role(role_);
      req.set_address(address_);
      req.set_metrics_address(runtime_->metrics_address());
      *req.mutable_compat() = runtime_->compat();
      req.set_draining(draining);
      req.set_pid(getpid());
      tandem::v1::RegisterResponse resp;
      const grpc::Status st = registry->Register(&ctx, req, &resp);
      if (st.ok() && resp.heartbeat_seconds() > 0) {
        heartbeat = std::min(config_.heartbeat_period, absl::Seconds(resp.heartbeat_seconds()));
      }
      // Failed registration retries sooner.
      next_register = absl::Now() + (st.ok() ? heartbeat : std::min(heartbeat, absl::Seconds(1)));
    }
    mu_.Lock();
    if (!announce_ && !stopping_) cv_.WaitWithTimeout(&mu_, absl::Milliseconds(250));
  }
}

void WorkerHost::SetDraining() {
  {
    absl::MutexLock lock(&mu_);
    if (draining_ || stopping_) return;
    draining_ = true;
    announce_ = true;
    cv_.SignalAll();
  }
  if (server_ != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(service_name_, false);
    server_->GetHealthCheckService()->SetServingStatus("", false);
  }
}

void WaitForRpcsToEnd(const std::atomic<int>& n, const std::string& role) {
  absl::Time next_log = absl::Now() + absl::Seconds(10);
  while (n.load() > 0) {
    if (absl::Now() >= next_log) {
      spdlog::warn("{} worker shutdown: waiting for {} call(s) to end", role, n.load());
      next_log += absl::Seconds(10);
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
}

void WorkerHost::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    cv_.SignalAll();
  }
  if (server_ != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(service_name_, false);
    server_->GetHealthCheckService()->SetServingStatus("", false);
  }
  if (thread_.joinable()) thread_.join();
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
}

}  // namespace tandem::services
