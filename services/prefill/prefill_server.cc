#include "services/prefill/prefill_server.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "services/common/convert.h"
#include "services/common/grpc_status.h"
#include "services/prefill/prefill_reactor.h"
#include "services/transfer/host_kv_transport.h"
#include "services/transfer/kv_push_pipe.h"
#include "services/transfer/nccl_kv_transport.h"

namespace tandem::prefill {

PrefillServiceImpl::PrefillServiceImpl(services::WorkerRuntime* runtime,
                                       transfer::KvTransport* transport)
    : runtime_(runtime), transport_(transport) {}

grpc::ServerWriteReactor<tandem::v1::PrefillResponse>* PrefillServiceImpl::Prefill(
    grpc::CallbackServerContext* context, const tandem::v1::PrefillRequest* request) {
  return PrefillReactor::Start(this, context, *request);
}

grpc::Status PrefillServiceImpl::GetStats(grpc::ServerContext* context,
                                          const tandem::v1::WorkerStatsRequest* request,
                                          tandem::v1::WorkerStats* response) {
  const engine::EngineStats s = runtime_->engine().Stats();
  response->set_role("prefill");
  response->set_num_running(static_cast<int32_t>(s.num_running));
  response->set_num_waiting(static_cast<int32_t>(s.num_waiting));
  response->set_num_blocks_used(s.num_blocks_used);
  response->set_num_blocks_total(s.num_blocks_total);
  response->set_prefix_cache_query_tokens(s.num_prefix_cache_query_tokens);
  response->set_prefix_cache_hit_tokens(s.num_prefix_cache_hit_tokens);
  response->set_num_preemptions(s.num_preemptions);
  response->set_num_steps(s.num_steps);
  *response->mutable_compat() = runtime_->compat();
  response->set_draining(draining_.load());
  response->set_num_active_rpcs(active_rpcs_.load());
  return grpc::Status::OK;
}

absl::StatusOr<std::unique_ptr<PrefillServer>> PrefillServer::Start(
    const services::WorkerServerConfig& config) {
  std::unique_ptr<PrefillServer> s(new PrefillServer());
  // Before the model load: --kv-transport=nccl without NCCL or a GPU fails fast.
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<transfer::NcclOps> nccl_ops,
                          transfer::NcclOpsForTransport(config.kv_transport, config.nccl_ops));
  TANDEM_ASSIGN_OR_RETURN(s->runtime_, services::WorkerRuntime::Create(config, "prefill"));
  TANDEM_ASSIGN_OR_RETURN(services::ChannelSecurity kv_security,
                          services::MakeChannelSecurity(config.tls));
  TANDEM_ASSIGN_OR_RETURN(s->transport_,
                          transfer::MakeKvTransport(config.kv_transport, nccl_ops, kv_security));
  s->service_ = std::make_unique<PrefillServiceImpl>(s->runtime_.get(), s->transport_.get());
  services::WorkerRuntime* rt = s->runtime_.get();
  TANDEM_ASSIGN_OR_RETURN(
      s->host_,
      services::WorkerHost::Start(config, "prefill", "tandem.v1.PrefillWorker", s->service_.get(),
                                  rt, [rt] { rt->UpdateEngineMetrics(); }));
  return s;
}

PrefillServer::~PrefillServer() { Shutdown(); }

bool PrefillServer::Drain(absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  service_->set_draining(true);
  host_->SetDraining();
  while (service_->active_rpcs() > 0) {
    if (absl::Now() >= give_up) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

void PrefillServer::Shutdown() {
  if (host_ != nullptr) host_->Shutdown();
  if (runtime_ != nullptr) runtime_->Shutdown();
  // A reactor may still be ending on a KV push thread (its last reference),
  // and it uses the service and the transport: wait before they go.
  if (service_ != nullptr) services::WaitForRpcsToEnd(service_->active_rpcs_counter(), "prefill");
}

}  // namespace tandem::prefill
