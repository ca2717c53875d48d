// `tandem prefill` / `tandem decode`: one worker process each (what a
// Kubernetes pod runs). The servers themselves are services/prefill and
// services/decode; this file maps flags to a WorkerServerConfig, waits for
// SIGINT / SIGTERM and shuts down (health NOT_SERVING first).
#include <cstdio>
#include <string>

#include "absl/strings/str_format.h"
#include "engine/memory_size.h"
#include "services/cli/args.h"
#include "services/cli/commands.h"
#include "services/cli/router_setup.h"
#include "services/decode/decode_server.h"
#include "services/prefill/prefill_server.h"

namespace tandem::cli {
namespace {

struct WorkerFlags {
  std::string host = "0.0.0.0";
  int64_t port = 0;
  int64_t metrics_port = -1;
  std::string advertise;
  std::string router;
  std::string model;
  std::string kv_cache_memory = "1GiB";
  int64_t kv_lease_seconds = 30;
  int64_t threads = 0;
  int64_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 512;
};

template <typename Server>
int RunWorker(const char* role, int argc, char** argv) {
  WorkerFlags f;
  ArgParser p(role, absl::StrFormat("Runs a %s worker (registers with --router).", role));
  p.AddString("host", &f.host, "gRPC listen host");
  p.AddInt("port", &f.port, 0, 65535, "gRPC port (0 = any free port)");
  p.AddInt("metrics-port", &f.metrics_port, -1, 65535, "/metrics HTTP port (-1 = off, 0 = any)");
  p.AddString("advertise", &f.advertise, "address announced to the router (default host:port)");
  p.AddString("router", &f.router, "router address to register with (host:port)");
  p.AddString("model", &f.model, "GGUF model (default: the bundled SmolLM2)");
  p.AddString("kv-cache-memory", &f.kv_cache_memory, "KV cache budget (1GiB, 512MiB, 0.25)");
  p.AddInt("kv-lease-seconds", &f.kv_lease_seconds, 1, 3600,
           "decode: received KV not claimed by a Decode call within this is freed");
  p.AddInt("threads", &f.threads, 0, 1024, "compute threads, 0 = all cores");
  p.AddInt("max-num-seqs", &f.max_num_seqs, 1, 4096, "sequences per batch");
  p.AddInt("max-num-batched-tokens", &f.max_num_batched_tokens, 1, 1 << 20, "tokens per step");
  auto usage = [role](const std::string& m) {
    std::fprintf(stderr, "tandem %s: %s\n", role, m.c_str());
    return kExitUsage;
  };
  if (absl::Status s = p.Parse(argc, argv, 2); !s.ok()) return usage(std::string(s.message()));
  if (p.help_requested()) {
    std::fputs(p.Help().c_str(), stdout);
    return kExitOk;
  }
  auto path = ResolveModelPath(f.model);
  if (!path.ok()) return usage(std::string(path.status().message()));
  auto kv_bytes = engine::ParseMemorySize(f.kv_cache_memory);
  if (!kv_bytes.ok())
    return usage("--kv-cache-memory: " + std::string(kv_bytes.status().message()));

  services::WorkerServerConfig config;
  config.listen_address = absl::StrFormat("%s:%d", f.host, f.port);
  if (f.metrics_port >= 0) {
    config.metrics_address = absl::StrFormat("%s:%d", f.host, f.metrics_port);
  }
  config.advertise_address = f.advertise;
  config.model_path = *path;
  config.engine.kv_cache_memory_bytes = *kv_bytes;
  config.engine.num_threads = static_cast<int>(f.threads);
  config.engine.scheduler.max_num_seqs = f.max_num_seqs;
  config.engine.scheduler.max_num_batched_tokens = f.max_num_batched_tokens;
  config.router_address = f.router;
  config.kv_lease = absl::Seconds(f.kv_lease_seconds);

  BlockStopSignals();
  auto server = Server::Start(config);
  if (!server.ok()) {
    std::fprintf(stderr, "tandem %s: %s\n", role, std::string(server.status().message()).c_str());
    return kExitFailure;
  }
  std::fprintf(stderr, "[%s] gRPC on %s:%d, /metrics on port %d%s%s\n", role, f.host.c_str(),
               (*server)->port(), (*server)->metrics_port(), f.router.empty() ? "" : ", router ",
               f.router.c_str());
  while (WaitStopSignal(absl::Seconds(1)) == 0) {
  }
  (*server)->Shutdown();
  return kExitOk;
}

}  // namespace

int RunPrefill(int argc, char** argv) {
  return RunWorker<prefill::PrefillServer>("prefill", argc, argv);
}
int RunDecode(int argc, char** argv) {
  return RunWorker<decode::DecodeServer>("decode", argc, argv);
}

}  // namespace tandem::cli
