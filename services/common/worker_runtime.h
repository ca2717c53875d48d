// What a prefill or decode worker process runs on: the model file, tokenizer,
// model and engine, its KvCompatibility, and (optionally) the /metrics
// server. Also the config both worker servers take.
//
// Thread safety: immutable after Create(); engine() is thread-safe.
#ifndef TANDEM_SERVICES_COMMON_WORKER_RUNTIME_H_
#define TANDEM_SERVICES_COMMON_WORKER_RUNTIME_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/gguf/gguf.h"
#include "common/metrics/http_server.h"
#include "common/metrics/metrics.h"
#include "common/metrics/tandem_metrics.h"
#include "common/thread_pool.h"
#include "common/tokenizer/tokenizer.h"
#include "engine/engine.h"
#include "engine/llama_model.h"
#include "services/common/engine_metrics.h"
#include "services/common/tls.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::transfer {
class NcclOps;  // services/transfer/nccl_ops.h
}  // namespace tandem::transfer

namespace tandem::services {

struct WorkerServerConfig {
  // gRPC listen address; port 0 picks a free port (see the server's port()).
  std::string listen_address = "127.0.0.1:0";
  // host:port of /metrics; empty = no metrics server; port 0 = any free port.
  std::string metrics_address;
  // Address announced to the router; empty = listen host + bound port.
  std::string advertise_address;
  std::string model_path;       // GGUF; ignored when `model` is set
  std::string model_name;       // empty: general.name, else the file name
  engine::EngineConfig engine;  // engine.model_path is ignored
  // WorkerRegistry.Register target; empty = do not register.
  std::string router_address;
  absl::Duration heartbeat_period = absl::Seconds(5);
  absl::Duration kv_lease = absl::Seconds(30);  // decode: --kv-lease-seconds
  int max_rpc_threads = 64;                     // sync server thread bound
  // KV handoff prefill -> decode: "host" (DecodeWorker.PushKv) or "nccl"
  // (ncclSend / ncclRecv, docs/nccl.md); --kv-transport. Both roles must agree.
  std::string kv_transport = "host";
  // Tests: the NcclOps for kv_transport "nccl" (e.g. transfer::FakeNcclOps);
  // null = the CUDA ones (Start fails without NCCL or a GPU).
  std::shared_ptr<transfer::NcclOps> nccl_ops;
  // TLS of this worker's server and of its channels (Register with the
  // router; prefill: PushKv to decode workers). Empty = plaintext.
  TlsOptions tls;

  // Tests: use an already loaded model instead of model_path (not owned;
  // must outlive the server). `file` is needed for the compat fingerprint.
  const gguf::GgufFile* file = nullptr;
  const engine::LlamaModel* model = nullptr;
  const tokenizer::Tokenizer* tokenizer = nullptr;  // may be null with `model`
};

class WorkerRuntime {
 public:
  // Loads (or adopts) the model, starts the engine and, when configured, the
  // metrics HTTP server; phase is "prefill" or "decode".
  static absl::StatusOr<std::unique_ptr<WorkerRuntime>> Create(const WorkerServerConfig& config,
                                                               const std::string& phase);
  ~WorkerRuntime();

  engine::Engine& engine() { return *engine_; }
  const tandem::v1::KvCompatibility& compat() const { return compat_; }
  const std::string& model_name() const { return model_name_; }
  metrics::TandemMetrics& metrics() { return *metrics_; }
  int metrics_port() const { return http_ != nullptr ? http_->port() : 0; }
  std::string metrics_address() const;
  // Refreshes gauges / counters from engine stats (call periodically; every
  // /metrics scrape also does).
  void UpdateEngineMetrics();
  // Stops the metrics server and the engine (idempotent).
  void Shutdown();

 private:
  WorkerRuntime() = default;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<gguf::GgufFile> file_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<engine::LlamaModel> model_;
  std::unique_ptr<engine::Engine> engine_;
  tandem::v1::KvCompatibility compat_;
  std::string model_name_;
  std::string metrics_host_;
  std::unique_ptr<metrics::MetricsRegistry> registry_;
  std::unique_ptr<metrics::TandemMetrics> metrics_;
  std::unique_ptr<metrics::MetricsHttpServer> http_;
  std::unique_ptr<EngineMetricsExporter> exporter_;
};

// "host:port" -> host and port. InvalidArgument naming `what`.
absl::Status SplitHostPort(const std::string& address, const std::string& what, std::string* host,
                           int* port);

}  // namespace tandem::services

#endif  // TANDEM_SERVICES_COMMON_WORKER_RUNTIME_H_
