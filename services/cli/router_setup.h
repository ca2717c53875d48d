// What `tandem router` and `tandem serve` share: starting a RouterServer from
// flags (the tokenizer only, or the whole model with --colocated), waiting
// for SIGINT / SIGTERM, and picking free loopback ports.
#ifndef TANDEM_SERVICES_CLI_ROUTER_SETUP_H_
#define TANDEM_SERVICES_CLI_ROUTER_SETUP_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/thread_pool.h"
#include "engine/engine.h"
#include "services/cli/model_loader.h"
#include "services/cli/spec_flags.h"
#include "services/common/tls.h"
#include "services/http/openai_server.h"
#include "services/router/router_server.h"

namespace tandem::cli {

// --served-model-name: the model's name in the API and the metrics.
inline constexpr char kServedModelNameHelp[] =
    "the model's name in the API (OpenAI `model` and /v1/models, GetModelInfo) and in the "
    "metrics' model label; default: the GGUF's general.name, else the file name";
// 1..256 bytes of UTF-8 without control characters; "" (the default) passes.
absl::Status ValidateServedModelName(const std::string& name);

struct RouterFlags {
  std::string host = "0.0.0.0";
  int64_t port = 50051;
  int64_t metrics_port = 9090;  // -1 = off
  int64_t http_port = -1;       // OpenAI HTTP API; -1 = off, 0 = any free port
  std::string model;
  std::string served_model_name;  // empty: from the model file
  std::string prefill;            // comma-separated static addresses
  std::string decode;
  int64_t max_inflight = 256;
  int64_t migration_limit = 3;  // re-dispatches after worker failures
  int64_t remote_prefill_min_tokens = router::kDefaultRemotePrefillMinTokens;  // pd-decider
  int64_t drain_seconds = 30;             // SIGTERM: in-flight calls finish within this
  int64_t max_inflight_tokens = 1 << 20;  // prompt + max_tokens of admitted calls
  bool colocated = false;
  // Colocated engine.
  std::string kv_cache_memory = "1GiB";
  int64_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 512;
  int64_t max_waiting_requests = 256;    // engine waiting queue bounds
  int64_t max_waiting_tokens = 1 << 18;  // (see docs/operations.md, Overload)
  int64_t threads = 0;
  std::string device = "cpu";  // cpu | cuda (docs/gpu.md)
  std::string kv_cache_dtype;  // empty: the device's default (docs/kv_cache.md)
  SpecFlags spec;              // docs/speculative.md
  // Security (docs/security.md): TLS of the gRPC port and of the channels to
  // workers; a key file makes tandem.v1.Generation require a bearer key.
  services::TlsOptions tls;
  std::string api_key_file;
};

// A running router and what it keeps alive.
struct RunningRouter {
  LoadedModel loaded;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<router::RouterServer> server;
  std::unique_ptr<http::OpenAiServer> http;  // --http-port; null when off
  ~RunningRouter();                          // HTTP, then the gRPC server, then the engine
};

absl::StatusOr<std::unique_ptr<RunningRouter>> StartRouter(const RouterFlags& flags);

// Blocks SIGINT / SIGTERM in this thread (call before starting threads, so
// every thread inherits the mask) ...
void BlockStopSignals();
// ... then waits for one of them up to `timeout`; returns the signal or 0.
int WaitStopSignal(absl::Duration timeout);

// The first port >= `start` (start == 0: any) that can be bound on 127.0.0.1,
// skipping `taken`.
absl::StatusOr<int> FindFreePort(int start, const std::vector<int>& taken);

std::vector<std::string> SplitList(const std::string& list);

}  // namespace tandem::cli

#endif  // TANDEM_SERVICES_CLI_ROUTER_SETUP_H_
