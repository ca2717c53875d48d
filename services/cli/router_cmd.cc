// `tandem router`: the public gRPC API in front of prefill and decode
// workers (static --prefill / --decode addresses plus those that register),
// or in front of an in-process engine with --colocated.
#include <cstdio>

#include "common/log.h"
#include "services/cli/args.h"
#include "services/cli/commands.h"
#include "services/cli/device_flag.h"
#include "services/cli/kv_dtype_flag.h"
#include "services/cli/kv_memory_flag.h"
#include "services/cli/router_setup.h"
#include "services/cli/security_flags.h"
#include "spdlog/spdlog.h"

namespace tandem::cli {

void AddRouterFlags(ArgParser& p, RouterFlags& f) {
  p.AddString("host", &f.host, "gRPC listen host");
  p.AddInt("port", &f.port, 0, 65535, "gRPC port (0 = any free port)");
  p.AddInt("metrics-port", &f.metrics_port, -1, 65535, "/metrics HTTP port (-1 = off)");
  p.AddInt("http-port", &f.http_port, -1, 65535,
           "OpenAI-compatible HTTP API port (/v1/completions, /v1/chat/completions; "
           "-1 = off, 0 = any free port)");
  p.AddString("model", &f.model,
              "GGUF model (the router loads its tokenizer and config only, unless --colocated)");
  p.AddString("served-model-name", &f.served_model_name, kServedModelNameHelp);
  p.AddString("prefill", &f.prefill, "static prefill workers: host:port,host:port");
  p.AddString("decode", &f.decode, "static decode workers: host:port,host:port");
  p.AddInt("max-inflight", &f.max_inflight, 1, 100000,
           "Generate calls at once; beyond: RESOURCE_EXHAUSTED");
  p.AddInt("max-inflight-tokens", &f.max_inflight_tokens, 1, int64_t{1} << 40,
           "prompt tokens + max_tokens summed over admitted calls; beyond: RESOURCE_EXHAUSTED "
           "(one call above it alone: INVALID_ARGUMENT)");
  p.AddInt("migration-limit", &f.migration_limit, 0, 100,
           "re-dispatch a request at most this often when its worker fails (0 = never)");
  p.AddInt(
      "remote-prefill-min-tokens", &f.remote_prefill_min_tokens, 0, int64_t{1} << 30,
      "prompts with fewer tokens than this not already in the chosen decode worker's prefix cache "
      "are prefilled on that decode worker instead of a prefill worker (0 = always remote)");
  p.AddInt("drain-seconds", &f.drain_seconds, 0, 3600,
           "on SIGTERM: NOT_SERVING, refuse new calls, let calls in flight finish this long");
  p.AddBool("colocated", &f.colocated, "run one in-process engine for both phases (no workers)");
  p.AddString("kv-cache-memory", &f.kv_cache_memory,
              std::string("--colocated: KV cache budget: ") + kKvCacheMemoryHelp);
  p.AddInt("max-num-seqs", &f.max_num_seqs, 1, 4096, "--colocated: sequences per batch");
  p.AddInt("max-num-batched-tokens", &f.max_num_batched_tokens, 1, 1 << 20,
           "--colocated: tokens per step");
  p.AddInt("max-waiting-requests", &f.max_waiting_requests, 1, 1 << 20,
           "--colocated: requests waiting for the engine at most; beyond: RESOURCE_EXHAUSTED");
  p.AddInt("max-waiting-tokens", &f.max_waiting_tokens, 1, int64_t{1} << 32,
           "--colocated: prompt tokens of the waiting requests at most");
  p.AddInt("threads", &f.threads, 0, 1024, "--colocated: compute threads, 0 = all cores");
  p.AddString("device", &f.device, std::string("--colocated: ") + kDeviceHelp);
  p.AddString("kv-cache-dtype", &f.kv_cache_dtype, std::string("--colocated: ") + kKvDtypeHelp);
  AddSpecFlags(p, &f.spec);
  AddServerTlsFlags(p, f.tls);
  p.AddString("api-key-file", &f.api_key_file,
              "tandem.v1.Generation requires 'authorization: Bearer <key>' for a key in this "
              "file (one per line, # comments)");
}

void LogInit(const std::string& component) {
  if (absl::Status s = InitLogging(component); !s.ok())
    spdlog::warn("{}", std::string(s.message()));
}

int RunRouter(int argc, char** argv) {
  RouterFlags f;
  ArgParser p("router", "Serves tandem.v1.Generation and routes to prefill/decode workers.");
  AddRouterFlags(p, f);
  if (absl::Status s = p.Parse(argc, argv, 2); !s.ok()) {
    std::fprintf(stderr, "tandem router: %s\n", std::string(s.message()).c_str());
    return kExitUsage;
  }
  if (p.help_requested()) {
    std::fputs(p.Help().c_str(), stdout);
    return kExitOk;
  }
  if (auto device = ResolveDevice(f.device); !device.ok()) {
    std::fprintf(stderr, "tandem router: %s\n", std::string(device.status().message()).c_str());
    return kExitUsage;
  } else if (auto kv_dtype = ResolveKvDtype(f.kv_cache_dtype, *device); !kv_dtype.ok()) {
    std::fprintf(stderr, "tandem router: %s\n", std::string(kv_dtype.status().message()).c_str());
    return kExitUsage;
  }
  if (auto spec = ResolveSpec(f.spec); !spec.ok()) {
    std::fprintf(stderr, "tandem router: %s\n", std::string(spec.status().message()).c_str());
    return kExitUsage;
  }
  LogInit("router");
  BlockStopSignals();
  auto router = StartRouter(f);
  if (!router.ok()) {
    std::fprintf(stderr, "tandem router: %s\n", std::string(router.status().message()).c_str());
    return kExitUsage;
  }
  spdlog::info("gRPC on {}:{}, /metrics on port {} ({})", f.host, (*router)->server->port(),
               (*router)->server->metrics_port(), f.colocated ? "colocated" : "disaggregated");
  if ((*router)->http != nullptr) {
    spdlog::info("OpenAI HTTP API on http://{}:{}/v1", f.host, (*router)->http->port());
  }
  spdlog::info("{}{}", services::DescribeTls(f.tls),
               f.api_key_file.empty() ? "" : ", API key required");
  while (WaitStopSignal(absl::Seconds(1)) == 0) {
  }
  spdlog::info("draining (up to {} s)", static_cast<int>(f.drain_seconds));
  const bool idle = (*router)->server->Drain(absl::Seconds(f.drain_seconds));
  spdlog::info("{}; stopping", idle ? "drained" : "drain timed out, cutting the calls left");
  router->reset();
  return kExitOk;
}

}  // namespace tandem::cli
