// `tandem prefill` / `tandem decode`: one worker process each (what a
// Kubernetes pod runs). The servers themselves are services/prefill and
// services/decode; this file maps flags to a WorkerServerConfig, waits for
// SIGINT / SIGTERM, drains (health NOT_SERVING, the router told at once,
// calls in flight finish within --drain-seconds), then shuts down, exit 0.
#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>

#include "absl/strings/str_format.h"
#include "services/cli/args.h"
#include "services/cli/command_status.h"
#include "services/cli/commands.h"
#include "services/cli/device_flag.h"
#include "services/cli/kv_dtype_flag.h"
#include "services/cli/kv_memory_flag.h"
#include "services/cli/router_setup.h"
#include "services/cli/security_flags.h"
#include "services/cli/spec_flags.h"
#include "services/decode/decode_server.h"
#include "services/prefill/prefill_server.h"
#include "services/transfer/nccl_kv_transport.h"
#include "spdlog/spdlog.h"

namespace tandem::cli {
namespace {

struct WorkerFlags {
  std::string host = "0.0.0.0";
  int64_t port = 0;
  int64_t metrics_port = -1;
  std::string advertise;
  std::string router;
  std::string model;
  std::string served_model_name;  // the metrics' model label; empty: from the file
  std::string kv_cache_memory = "1GiB";
  int64_t kv_lease_seconds = 30;
  int64_t drain_seconds = 30;
  int64_t threads = 0;
  int64_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 512;
  int64_t max_waiting_requests = 256;    // engine waiting queue: past it RESOURCE_EXHAUSTED
  int64_t max_waiting_tokens = 1 << 18;  // (docs/operations.md, Overload)
  services::TlsOptions tls;              // docs/security.md
  std::string kv_transport = "host";     // docs/nccl.md
  std::string device = "cpu";            // docs/gpu.md
  std::string kv_cache_dtype;            // docs/kv_cache.md; both roles must agree
  SpecFlags spec;                        // decode: docs/speculative.md
};

void AddWorkerFlags(ArgParser& p, WorkerFlags& f, std::string_view role) {
  p.AddString("host", &f.host, "gRPC listen host");
  p.AddInt("port", &f.port, 0, 65535, "gRPC port (0 = any free port)");
  p.AddInt("metrics-port", &f.metrics_port, -1, 65535, "/metrics HTTP port (-1 = off, 0 = any)");
  p.AddString("advertise", &f.advertise, "address announced to the router (default host:port)");
  p.AddString("router", &f.router, "router address to register with (host:port)");
  p.AddString("model", &f.model, "GGUF model (default: the bundled SmolLM2)");
  p.AddString("served-model-name", &f.served_model_name,
              "the model's name in the metrics' model label and the KV compatibility check (give "
              "every worker and the router the same); default: the GGUF's general.name");
  p.AddString("kv-cache-memory", &f.kv_cache_memory,
              std::string("KV cache budget: ") + kKvCacheMemoryHelp);
  p.AddInt("drain-seconds", &f.drain_seconds, 0, 3600,
           "on SIGTERM: stop taking work and let calls in flight finish for up to this long");
  p.AddInt("kv-lease-seconds", &f.kv_lease_seconds, 1, 3600,
           "decode: received KV not claimed by a Decode call within this is freed");
  p.AddInt("threads", &f.threads, 0, 1024, "compute threads, 0 = all cores");
  p.AddInt("max-num-seqs", &f.max_num_seqs, 1, 4096, "sequences per batch");
  p.AddInt("max-num-batched-tokens", &f.max_num_batched_tokens, 1, 1 << 20, "tokens per step");
  p.AddInt("max-waiting-requests", &f.max_waiting_requests, 1, 1 << 20,
           "requests waiting for the engine at most; beyond: RESOURCE_EXHAUSTED + retry hint");
  p.AddInt("max-waiting-tokens", &f.max_waiting_tokens, 1, int64_t{1} << 32,
           "tokens of the waiting requests at most (prompt, + output so far for decode)");
  AddServerTlsFlags(p, f.tls);
  AddDeviceFlag(p, &f.device);
  AddKvDtypeFlag(p, &f.kv_cache_dtype);
  if (role == "decode") AddSpecFlags(p, &f.spec);
  p.AddString("kv-transport", &f.kv_transport,
              "KV handoff prefill -> decode: host (gRPC) or nccl (GPUs, docs/nccl.md); "
              "both roles must agree");
}

// The flags checked (every error a usage error) and mapped to the config.
absl::StatusOr<services::WorkerServerConfig> ConfigFromFlags(const WorkerFlags& f) {
  if (absl::Status s = services::ValidateServerTls(f.tls); !s.ok()) return UsageStatus(s);
  if (absl::Status s = transfer::CheckKvTransportKind(f.kv_transport); !s.ok()) {
    return UsageStatus(s);
  }
  auto device = ResolveDevice(f.device);
  if (!device.ok()) return UsageStatus(device.status());
  auto kv_dtype = ResolveKvDtype(f.kv_cache_dtype, *device);
  if (!kv_dtype.ok()) return UsageStatus(kv_dtype.status());
  auto spec = ResolveSpec(f.spec);
  if (!spec.ok()) return UsageStatus(spec.status());
  if (absl::Status s = ValidateServedModelName(f.served_model_name); !s.ok()) {
    return UsageStatus(s);
  }
  auto path = ResolveModelPath(f.model);
  if (!path.ok()) return UsageStatus(path.status());
  if (absl::Status s = CheckDraftVocab(f.spec, *path); !s.ok()) return UsageStatus(s);
  services::WorkerServerConfig config;
  if (absl::Status s = ApplyKvCacheMemory(f.kv_cache_memory, &config.engine); !s.ok()) {
    return UsageStatus(s);
  }
  config.listen_address = absl::StrFormat("%s:%d", f.host, f.port);
  if (f.metrics_port >= 0) {
    config.metrics_address = absl::StrFormat("%s:%d", f.host, f.metrics_port);
  }
  config.advertise_address = f.advertise;
  config.model_path = *path;
  config.model_name = f.served_model_name;
  config.engine.num_threads = static_cast<int>(f.threads);
  config.engine.device = *device;
  config.engine.kv_cache_dtype = *kv_dtype;
  config.engine.spec = *spec;
  config.engine.scheduler.max_num_seqs = f.max_num_seqs;
  config.engine.scheduler.max_num_batched_tokens = f.max_num_batched_tokens;
  config.engine.scheduler.max_waiting_requests = f.max_waiting_requests;
  config.engine.scheduler.max_waiting_tokens = f.max_waiting_tokens;
  // gRPC's thread quota for the worker's synchronous RPCs (the streaming
  // Prefill / Decode run on reactors and hold no thread): the engine's
  // bounds, with their message, come before it.
  config.max_rpc_threads =
      static_cast<int>(std::min<int64_t>(f.max_num_seqs + f.max_waiting_requests + 32, 4096));
  config.router_address = f.router;
  config.tls = f.tls;
  config.kv_lease = absl::Seconds(f.kv_lease_seconds);
  config.kv_transport = f.kv_transport;
  return config;
}

// Starts the server, serves until SIGINT / SIGTERM, drains, stops.
template <typename Server>
absl::Status Serve(const char* role, const WorkerFlags& f,
                   const services::WorkerServerConfig& config) {
  LogInit(role);
  BlockStopSignals();
  auto server = Server::Start(config);
  if (!server.ok()) return absl::InternalError(server.status().message());
  spdlog::info("gRPC on {}:{}, /metrics on port {}{}{}", f.host, (*server)->port(),
               (*server)->metrics_port(), f.router.empty() ? "" : ", router ", f.router);
  while (WaitStopSignal(absl::Seconds(1)) == 0) {
  }
  // Drain: NOT_SERVING, the router told at once, calls in flight finish.
  spdlog::info("draining (up to {} s)", static_cast<int>(f.drain_seconds));
  const absl::Time drain_start = absl::Now();
  const bool idle = (*server)->Drain(absl::Seconds(f.drain_seconds));
  spdlog::info("{} after {:.2f} s; stopping",
               idle ? "drained" : "drain timed out, cutting the calls left",
               absl::ToDoubleSeconds(absl::Now() - drain_start));
  (*server)->Shutdown();
  return absl::OkStatus();
}

template <typename Server>
int RunWorker(const char* role, int argc, char** argv) {
  WorkerFlags f;
  ArgParser p(role, absl::StrFormat("Runs a %s worker (registers with --router).", role));
  AddWorkerFlags(p, f, role);
  if (absl::Status s = p.Parse(argc, argv, 2); !s.ok()) return ExitFor(role, UsageStatus(s));
  if (p.help_requested()) {
    std::fputs(p.Help().c_str(), stdout);
    return kExitOk;
  }
  absl::StatusOr<services::WorkerServerConfig> config = ConfigFromFlags(f);
  if (!config.ok()) return ExitFor(role, config.status());
  if (absl::Status s = Serve<Server>(role, f, *config); !s.ok()) return ExitFor(role, s);
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
