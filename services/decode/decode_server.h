// The decode worker: DecodeWorker service (PushKv: receive a KV handoff and
// hold it under a lease; Decode: adopt it and stream tokens; ReleaseKv;
// GetStats) on its own engine, plus health, reflection, /metrics and router
// registration (services/common/worker_host.h).
//
//   WorkerServerConfig config;            // listen_address "127.0.0.1:0", model_path, ...
//   auto server = DecodeServer::Start(config);
//   (*server)->port();                    // bound port
//   (*server)->Shutdown();
//
// Decode semantics: kv_handle set -> Claim the lease (NOT_FOUND when
// unknown / expired / claimed), import it, first_token_id is output already
// delivered (not streamed again). kv_handle empty -> the whole request runs
// here (colocated fallback, or a migration replay with no prefill worker
// left); first_token_id >= 0 is then also treated as delivered output.
// prefix_output_token_ids (a migrated request's tokens so far) come before
// first_token_id as delivered output.
//
// Drain (SIGTERM): health NOT_SERVING and the router told at once; PushKv
// and Decode without a kv_handle get UNAVAILABLE (the router sends them
// elsewhere); streams in flight and handoffs already leased here finish. Client cancel / deadline
// cancels the engine request (blocks freed) and the RPC ends CANCELLED / DEADLINE_EXCEEDED.
//
// Thread safety: all methods thread-safe.
#ifndef TANDEM_SERVICES_DECODE_DECODE_SERVER_H_
#define TANDEM_SERVICES_DECODE_DECODE_SERVER_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/common/worker_host.h"
#include "services/common/worker_runtime.h"
#include "services/transfer/kv_lease_table.h"
#include "services/transfer/kv_push_receiver.h"
#include "services/transfer/nccl_receiver.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::decode {

// UNAVAILABLE: new work goes to another decode worker.
grpc::Status DrainingStatus();

// Decode and PushKv are on gRPC's callback API (decode_reactor.h: no thread
// per stream, woken by the engine; push_kv_reactor.h: no thread per push);
// the other methods are sync.
class DecodeServiceImpl final
    : public tandem::v1::DecodeWorker::WithCallbackMethod_Decode<
          tandem::v1::DecodeWorker::WithCallbackMethod_PushKv<tandem::v1::DecodeWorker::Service>> {
 public:
  // runtime: not owned.
  DecodeServiceImpl(services::WorkerRuntime* runtime, absl::Duration kv_lease);

  grpc::ServerReadReactor<tandem::v1::KvChunk>* PushKv(
      grpc::CallbackServerContext* context, tandem::v1::PushKvResponse* response) override;
  grpc::ServerWriteReactor<tandem::v1::DecodeResponse>* Decode(
      grpc::CallbackServerContext* context, const tandem::v1::DecodeRequest* request) override;
  grpc::Status ReleaseKv(grpc::ServerContext* context, const tandem::v1::ReleaseKvRequest* request,
                         tandem::v1::ReleaseKvResponse* response) override;
  grpc::Status GetStats(grpc::ServerContext* context, const tandem::v1::WorkerStatsRequest* request,
                        tandem::v1::WorkerStats* response) override;
  // NCCL KV transport (docs/nccl.md): forwarded to the NcclKvReceiver;
  // FAILED_PRECONDITION when this worker runs --kv-transport=host.
  grpc::Status NcclConnect(grpc::ServerContext* context,
                           const tandem::v1::NcclConnectRequest* request,
                           tandem::v1::NcclConnectResponse* response) override;
  grpc::Status NcclPushKv(grpc::ServerContext* context,
                          grpc::ServerReaderWriter<tandem::v1::NcclPushKvResponse,
                                                   tandem::v1::NcclPushKvRequest>* stream) override;
  // Receive KV over NCCL with `ops` (--kv-transport=nccl). Call before serving.
  void EnableNccl(std::shared_ptr<transfer::NcclOps> ops);
  transfer::NcclKvReceiver* nccl_receiver() { return nccl_.get(); }

  transfer::KvLeaseTable& leases() { return leases_; }
  void set_draining(bool draining) { draining_.store(draining); }
  int active_rpcs() const { return active_rpcs_.load(); }
  const std::atomic<int>& active_rpcs_counter() const { return active_rpcs_; }

 private:
  friend class DecodeReactor;
  friend class PushKvReactor;
  transfer::KvPushLimits push_limits();
  int64_t free_kv_bytes();  // KV bytes the engine's free blocks hold
  services::WorkerRuntime* runtime_;
  transfer::KvLeaseTable leases_;
  std::atomic<bool> draining_{false};
  std::atomic<int> active_rpcs_{0};                 // PushKv + Decode being served
  std::unique_ptr<transfer::NcclKvReceiver> nccl_;  // after leases_: destroyed first
};

class DecodeServer {
 public:
  static absl::StatusOr<std::unique_ptr<DecodeServer>> Start(
      const services::WorkerServerConfig& config);
  ~DecodeServer();  // Shutdown()

  int port() const { return host_->port(); }
  const std::string& address() const { return host_->address(); }
  int metrics_port() const { return runtime_->metrics_port(); }
  engine::Engine& engine() { return runtime_->engine(); }
  DecodeServiceImpl& service() { return *service_; }
  // Stops taking new work (see the header comment) and waits until no
  // stream, push or lease is left, at most `timeout`; true when idle.
  bool Drain(absl::Duration timeout);
  // Health NOT_SERVING, stop the server, then the engine. Idempotent.
  void Shutdown();

 private:
  DecodeServer() = default;
  std::unique_ptr<services::WorkerRuntime> runtime_;
  std::unique_ptr<DecodeServiceImpl> service_;
  std::unique_ptr<services::WorkerHost> host_;
};

}  // namespace tandem::decode

#endif  // TANDEM_SERVICES_DECODE_DECODE_SERVER_H_
