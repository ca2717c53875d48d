#include "services/decode/decode_server.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "services/common/convert.h"
#include "services/common/grpc_status.h"
#include "services/decode/decode_reactor.h"
#include "services/decode/push_kv_reactor.h"
#include "services/transfer/kv_push_receiver.h"
#include "services/transfer/kv_transport.h"
#include "services/transfer/nccl_kv_transport.h"

namespace tandem::decode {
namespace {

// Free KV capacity in bytes (engine blocks not in use).
int64_t FreeKvBytes(engine::Engine& engine, int32_t block_size) {
  const engine::EngineStats s = engine.Stats();
  return (s.num_blocks_total - s.num_blocks_used) * block_size * engine.kv_bytes_per_token();
}

transfer::KvPushLimits PushLimits(engine::Engine& engine,
                                  const tandem::v1::KvCompatibility& compat) {
  const engine::ModelConfig& mc = engine.model().config();
  transfer::KvPushLimits l;
  l.compat = compat;
  l.bytes_per_token = engine.kv_bytes_per_token();
  l.max_tokens = mc.context_length - 1;
  l.vocab_size = mc.vocab_size;
  l.num_layers = mc.num_layers;
  l.num_kv_heads = mc.num_kv_heads;
  l.head_dim = mc.head_dim;
  l.max_chunk_bytes = transfer::kMaxChunkBytes;
  return l;
}

}  // namespace

grpc::Status DrainingStatus() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "this decode worker is draining (shutting down); retry on another");
}

DecodeServiceImpl::DecodeServiceImpl(services::WorkerRuntime* runtime, absl::Duration kv_lease)
    : runtime_(runtime), leases_(kv_lease, runtime->compat().block_size()) {}

grpc::ServerReadReactor<tandem::v1::KvChunk>* DecodeServiceImpl::PushKv(
    grpc::CallbackServerContext* context, tandem::v1::PushKvResponse* response) {
  return new PushKvReactor(this, context, response);
}

transfer::KvPushLimits DecodeServiceImpl::push_limits() {
  return PushLimits(runtime_->engine(), runtime_->compat());
}

int64_t DecodeServiceImpl::free_kv_bytes() {
  return FreeKvBytes(runtime_->engine(), runtime_->compat().block_size());
}

grpc::ServerWriteReactor<tandem::v1::DecodeResponse>* DecodeServiceImpl::Decode(
    grpc::CallbackServerContext* context, const tandem::v1::DecodeRequest* request) {
  return DecodeReactor::Start(this, context, *request);
}

grpc::Status DecodeServiceImpl::ReleaseKv(grpc::ServerContext* context,
                                          const tandem::v1::ReleaseKvRequest* request,
                                          tandem::v1::ReleaseKvResponse* response) {
  response->set_released(leases_.Release(request->kv_handle()));
  return grpc::Status::OK;
}

grpc::Status DecodeServiceImpl::GetStats(grpc::ServerContext* context,
                                         const tandem::v1::WorkerStatsRequest* request,
                                         tandem::v1::WorkerStats* response) {
  const engine::EngineStats s = runtime_->engine().Stats();
  const transfer::KvLeaseStats l = leases_.Stats();
  response->set_role("decode");
  response->set_num_running(static_cast<int32_t>(s.num_running));
  response->set_num_waiting(static_cast<int32_t>(s.num_waiting));
  response->set_num_blocks_used(s.num_blocks_used);
  response->set_num_blocks_total(s.num_blocks_total);
  response->set_num_leases(static_cast<int32_t>(l.num_leases + l.num_reserved));
  response->set_num_leased_blocks(leases_.num_leased_blocks());
  response->set_prefix_cache_query_tokens(s.num_prefix_cache_query_tokens);
  response->set_prefix_cache_hit_tokens(s.num_prefix_cache_hit_tokens);
  response->set_num_preemptions(s.num_preemptions);
  response->set_num_steps(s.num_steps);
  *response->mutable_compat() = runtime_->compat();
  response->set_draining(draining_.load());
  response->set_num_active_rpcs(active_rpcs_.load());
  return grpc::Status::OK;
}

grpc::Status DecodeServiceImpl::NcclConnect(grpc::ServerContext* context,
                                            const tandem::v1::NcclConnectRequest* request,
                                            tandem::v1::NcclConnectResponse* response) {
  if (nccl_ == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this decode worker runs --kv-transport=host");
  }
  return nccl_->Connect(context, request, response);
}

grpc::Status DecodeServiceImpl::NcclPushKv(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<tandem::v1::NcclPushKvResponse, tandem::v1::NcclPushKvRequest>*
        stream) {
  services::ActiveRpc active(&active_rpcs_);
  if (nccl_ == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this decode worker runs --kv-transport=host");
  }
  return nccl_->PushKv(context, stream);
}

void DecodeServiceImpl::EnableNccl(std::shared_ptr<transfer::NcclOps> ops) {
  engine::Engine& engine = runtime_->engine();
  const engine::ModelConfig& mc = engine.model().config();
  transfer::NcclReceiverConfig rc;
  rc.compat = runtime_->compat();
  rc.bytes_per_token = engine.kv_bytes_per_token();
  rc.max_tokens = mc.context_length - 1;
  rc.vocab_size = mc.vocab_size;
  rc.free_bytes = [this] {
    return FreeKvBytes(runtime_->engine(), runtime_->compat().block_size());
  };
  rc.draining = [this] { return draining_.load(); };
  rc.kv_memory_domain = engine.kv_memory_domain();
  rc.on_received = [this](int64_t bytes, double seconds) {
    runtime_->metrics().kv_transfer_bytes->Inc(static_cast<double>(bytes));
    runtime_->metrics().kv_transfer_time->Observe(seconds);
  };
  nccl_ = std::make_unique<transfer::NcclKvReceiver>(std::move(ops), std::move(rc), &leases_);
}

absl::StatusOr<std::unique_ptr<DecodeServer>> DecodeServer::Start(
    const services::WorkerServerConfig& config) {
  std::unique_ptr<DecodeServer> s(new DecodeServer());
  // Before the model load: --kv-transport=nccl without NCCL or a GPU fails fast.
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<transfer::NcclOps> nccl_ops,
                          transfer::NcclOpsForTransport(config.kv_transport, config.nccl_ops));
  TANDEM_ASSIGN_OR_RETURN(s->runtime_, services::WorkerRuntime::Create(config, "decode"));
  s->service_ = std::make_unique<DecodeServiceImpl>(s->runtime_.get(), config.kv_lease);
  if (nccl_ops != nullptr) s->service_->EnableNccl(std::move(nccl_ops));
  s->service_->leases().StartReaper(std::min(absl::Seconds(1), config.kv_lease / 4));
  services::WorkerRuntime* rt = s->runtime_.get();
  DecodeServiceImpl* svc = s->service_.get();
  TANDEM_ASSIGN_OR_RETURN(
      s->host_,
      services::WorkerHost::Start(config, "decode", "tandem.v1.DecodeWorker", svc, rt, [rt, svc] {
        rt->UpdateEngineMetrics();
        rt->metrics().num_kv_leases->Set(static_cast<double>(svc->leases().Stats().num_leases));
        rt->metrics().num_leased_blocks->Set(
            static_cast<double>(svc->leases().num_leased_blocks()));
      }));
  return s;
}

DecodeServer::~DecodeServer() { Shutdown(); }

bool DecodeServer::Drain(absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  service_->set_draining(true);
  host_->SetDraining();
  while (true) {
    const transfer::KvLeaseStats l = service_->leases().Stats();
    if (service_->active_rpcs() == 0 && l.num_leases + l.num_reserved == 0) return true;
    if (absl::Now() >= give_up) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

void DecodeServer::Shutdown() {
  if (service_ != nullptr) service_->set_draining(true);
  if (host_ != nullptr) host_->Shutdown();
  if (runtime_ != nullptr) runtime_->Shutdown();
  // Decode and PushKv reactors may end after the server's Shutdown (the
  // engine's last event): wait before the service goes.
  if (service_ != nullptr) services::WaitForRpcsToEnd(service_->active_rpcs_counter(), "decode");
}

}  // namespace tandem::decode
