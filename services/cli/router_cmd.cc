// `tandem router`: the public gRPC API in front of prefill and decode
// workers (static --prefill / --decode addresses plus those that register),
// or in front of an in-process engine with --colocated.
#include <cstdio>

#include "services/cli/args.h"
#include "services/cli/commands.h"
#include "services/cli/router_setup.h"

namespace tandem::cli {

void AddRouterFlags(ArgParser& p, RouterFlags& f) {
  p.AddString("host", &f.host, "gRPC listen host");
  p.AddInt("port", &f.port, 0, 65535, "gRPC port (0 = any free port)");
  p.AddInt("metrics-port", &f.metrics_port, -1, 65535, "/metrics HTTP port (-1 = off)");
  p.AddString("model", &f.model,
              "GGUF model (the router loads its tokenizer and config only, unless --colocated)");
  p.AddString("prefill", &f.prefill, "static prefill workers: host:port,host:port");
  p.AddString("decode", &f.decode, "static decode workers: host:port,host:port");
  p.AddInt("max-inflight", &f.max_inflight, 1, 100000,
           "Generate calls at once; beyond: RESOURCE_EXHAUSTED");
  p.AddBool("colocated", &f.colocated, "run one in-process engine for both phases (no workers)");
  p.AddString("kv-cache-memory", &f.kv_cache_memory, "--colocated: KV cache budget (1GiB, 0.25)");
  p.AddInt("max-num-seqs", &f.max_num_seqs, 1, 4096, "--colocated: sequences per batch");
  p.AddInt("max-num-batched-tokens", &f.max_num_batched_tokens, 1, 1 << 20,
           "--colocated: tokens per step");
  p.AddInt("threads", &f.threads, 0, 1024, "--colocated: compute threads, 0 = all cores");
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
  BlockStopSignals();
  auto router = StartRouter(f);
  if (!router.ok()) {
    std::fprintf(stderr, "tandem router: %s\n", std::string(router.status().message()).c_str());
    return kExitUsage;
  }
  std::fprintf(stderr, "[router] gRPC on %s:%d, /metrics on port %d (%s)\n", f.host.c_str(),
               (*router)->server->port(), (*router)->server->metrics_port(),
               f.colocated ? "colocated" : "disaggregated");
  while (WaitStopSignal(absl::Seconds(1)) == 0) {
  }
  std::fprintf(stderr, "[router] stopping\n");
  router->reset();
  return kExitOk;
}

}  // namespace tandem::cli
