// `tandem serve`: a whole cluster on one machine. The router runs in this
// process; --prefill-workers N and --decode-workers M child processes
// (`tandem prefill|decode --router 127.0.0.1:PORT`) register with it on
// loopback. Prints the endpoint and an example client call, then "ready"
// once every worker is registered and healthy. SIGINT / SIGTERM drain and
// stop the whole cluster: the router refuses new calls and lets those in
// flight finish (--drain-seconds), then the children get SIGTERM (each
// drains; SIGKILL after --drain-seconds + 10 s) and are reaped; exit code 0.
// A worker that dies is not restarted (the router migrates its requests). --colocated runs only the
// router, with an in-process engine.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/json.h"
#include "common/status.h"
#include "services/cli/args.h"
#include "services/cli/commands.h"
#include "services/cli/device_flag.h"
#include "services/cli/kv_dtype_flag.h"
#include "services/cli/kv_memory_flag.h"
#include "services/cli/router_setup.h"
#include "services/cli/security_flags.h"
#include "services/cli/spec_flags.h"
#include "services/common/api_key.h"
#include "services/transfer/nccl_kv_transport.h"
#include "spdlog/spdlog.h"

namespace tandem::cli {
namespace {

struct ServeFlags {
  int64_t port = 50051;
  int64_t metrics_port = 9090;
  int64_t http_port = 8000;  // OpenAI HTTP API; -1 = off, 0 = any free port
  int64_t prefill_workers = 1;
  int64_t decode_workers = 1;
  bool colocated = false;
  std::string model;
  std::string served_model_name;  // router and workers (the metrics' model label)
  std::string endpoints_file;
  std::string kv_cache_memory = "1GiB";
  int64_t kv_lease_seconds = 30;
  int64_t migration_limit = 3;
  int64_t remote_prefill_min_tokens = router::kDefaultRemotePrefillMinTokens;
  int64_t drain_seconds = 30;
  int64_t max_inflight = 256;
  int64_t max_inflight_tokens = 1 << 20;
  int64_t max_waiting_requests = 256;
  int64_t max_waiting_tokens = 1 << 18;
  int64_t threads = 0;
  int64_t max_num_batched_tokens = 512;  // every engine: tokens per step
  std::string device = "cpu";            // every engine (docs/gpu.md)
  std::string kv_cache_dtype;            // every engine; empty: the device's default
  std::string kv_transport = "host";     // prefill -> decode (docs/nccl.md)
  SpecFlags spec;                        // decode workers / --colocated
  int64_t ready_timeout_seconds = 300;
  services::TlsOptions tls;  // router and workers (docs/security.md)
  std::string api_key_file;
};

struct Child {
  std::string role;
  pid_t pid = -1;
  std::string grpc_address;
  std::string metrics_address;
  bool running = false;
  std::string http_address;  // the router's OpenAI HTTP API, when on
};

std::string SelfExe(const char* argv0) {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return argv0;
  return std::string(buf, static_cast<size_t>(n));
}

pid_t Spawn(const std::vector<std::string>& argv) {
  // Everything the child needs is built before fork: the router's threads
  // (gRPC, the pool's polls, HTTP) may hold the allocator's lock at the
  // fork, and a child that allocates before exec can then block forever
  // (seen under ASan: one worker of three never started). Between fork and
  // exec the child makes async-signal-safe calls only.
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  sigset_t unblocked;
  sigemptyset(&unblocked);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid != 0) return pid;
  // Child: signals were blocked for sigtimedwait in the parent; exec keeps
  // the mask, so unblock them. Die with the parent.
  sigprocmask(SIG_SETMASK, &unblocked, nullptr);
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(1);
  execv(args[0], args.data());
  _exit(127);
}

// Reaps exited children; returns false if any worker died.
bool ReapChildren(std::vector<Child>& children) {
  bool all_alive = true;
  for (Child& c : children) {
    if (!c.running) continue;
    int status = 0;
    if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
      c.running = false;
      all_alive = false;
      spdlog::error("{} worker pid {} exited ({} {})", c.role, c.pid,
                    WIFSIGNALED(status) ? "signal" : "code",
                    WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    }
  }
  return all_alive;
}

// SIGTERM (each worker drains), then SIGKILL after `wait`.
void StopChildren(std::vector<Child>& children, absl::Duration wait = absl::Seconds(10)) {
  for (Child& c : children) {
    if (c.running) kill(c.pid, SIGTERM);
  }
  const absl::Time give_up = absl::Now() + wait;
  while (absl::Now() < give_up) {
    ReapChildren(children);
    bool any = false;
    for (const Child& c : children) any |= c.running;
    if (!any) return;
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (Child& c : children) {
    if (!c.running) continue;
    kill(c.pid, SIGKILL);
    waitpid(c.pid, nullptr, 0);
    c.running = false;
  }
}

absl::Status WriteEndpoints(const std::string& path, const std::vector<Child>& all) {
  json::OrderedJson list = json::OrderedJson::array();
  for (const Child& c : all) {
    json::OrderedJson e = {{"role", c.role},
                           {"pid", c.pid},
                           {"grpc_address", c.grpc_address},
                           {"metrics_address", c.metrics_address}};
    if (!c.http_address.empty()) e["http_address"] = c.http_address;
    list.push_back(std::move(e));
  }
  const std::string out =
      list.dump(2, ' ', /*ensure_ascii=*/false, json::OrderedJson::error_handler_t::replace) + "\n";
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << out;
    if (!f.good()) return absl::UnavailableError(absl::StrFormat("cannot write %s", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrFormat("cannot rename %s to %s", tmp, path));
  }
  return absl::OkStatus();
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "tandem serve: %s\n", message.c_str());
  return kExitFailure;
}

void AddServeFlags(ArgParser& p, ServeFlags& f) {
  p.AddInt("port", &f.port, 0, 65535,
           "router gRPC port; workers take the next free ports (0 = any free port, workers too)");
  p.AddInt("metrics-port", &f.metrics_port, 0, 65535,
           "router /metrics port; workers take the next free ports (0 = any free port, workers "
           "too)");
  p.AddInt("http-port", &f.http_port, -1, 65535,
           "router's OpenAI-compatible HTTP API (-1 = off, 0 = any free port)");
  p.AddInt("prefill-workers", &f.prefill_workers, 1, 64, "prefill worker processes");
  p.AddInt("decode-workers", &f.decode_workers, 1, 64, "decode worker processes");
  p.AddBool("colocated", &f.colocated, "one in-process engine for both phases, no workers");
  p.AddString("model", &f.model, "GGUF model (default: the bundled SmolLM2)");
  p.AddString("served-model-name", &f.served_model_name, kServedModelNameHelp);
  p.AddString(
      "endpoints-file", &f.endpoints_file,
      "write [{role, pid, grpc_address, metrics_address[, http_address]}] as JSON once ready");
  p.AddString("kv-cache-memory", &f.kv_cache_memory,
              std::string("KV cache budget per engine: ") + kKvCacheMemoryHelp);
  p.AddInt("kv-lease-seconds", &f.kv_lease_seconds, 1, 3600,
           "decode workers free received KV not claimed within this time");
  p.AddInt("max-inflight", &f.max_inflight, 1, 100000, "router: Generate calls at once");
  p.AddInt("migration-limit", &f.migration_limit, 0, 100,
           "router: re-dispatch a request at most this often when its worker fails");
  p.AddInt(
      "remote-prefill-min-tokens", &f.remote_prefill_min_tokens, 0, int64_t{1} << 30,
      "router: "
      "prompts with fewer tokens than this not already in the chosen decode worker's prefix cache "
      "are prefilled on that decode worker instead of a prefill worker (0 = always remote)");
  p.AddInt("drain-seconds", &f.drain_seconds, 0, 3600,
           "SIGTERM: calls in flight finish within this (router, then each worker)");
  p.AddInt("max-inflight-tokens", &f.max_inflight_tokens, 1, int64_t{1} << 40,
           "router: prompt tokens + max_tokens summed over admitted calls");
  p.AddInt("max-waiting-requests", &f.max_waiting_requests, 1, 1 << 20,
           "per engine (workers, or --colocated): waiting requests at most");
  p.AddInt("max-waiting-tokens", &f.max_waiting_tokens, 1, int64_t{1} << 32,
           "per engine: tokens of the waiting requests at most");
  p.AddInt("threads", &f.threads, 0, 1024, "compute threads per engine, 0 = all cores");
  p.AddInt("max-num-batched-tokens", &f.max_num_batched_tokens, 1, 1 << 20,
           "tokens in one engine step at most, per engine (chunked prefill splits longer "
           "prompts)");
  AddDeviceFlag(p, &f.device);
  AddKvDtypeFlag(p, &f.kv_cache_dtype);
  p.AddString("kv-transport", &f.kv_transport,
              "KV handoff prefill -> decode: host (gRPC) or nccl (GPUs, docs/nccl.md)");
  AddSpecFlags(p, &f.spec);
  p.AddInt("ready-timeout-seconds", &f.ready_timeout_seconds, 1, 3600,
           "give up when the workers are not healthy by then");
  AddServerTlsFlags(p, f.tls);
  p.AddString("api-key-file", &f.api_key_file,
              "router: tandem.v1.Generation requires a bearer key from this file");
}

// Every flag that can be checked before anything starts.
absl::Status CheckServeFlags(const ServeFlags& f) {
  TANDEM_RETURN_IF_ERROR(ValidateServedModelName(f.served_model_name));
  TANDEM_RETURN_IF_ERROR(services::ValidateServerTls(f.tls));
  TANDEM_ASSIGN_OR_RETURN(auto device, ResolveDevice(f.device));
  TANDEM_RETURN_IF_ERROR(ResolveKvDtype(f.kv_cache_dtype, device).status());
  engine::EngineConfig engine_config;
  TANDEM_RETURN_IF_ERROR(ApplyKvCacheMemory(f.kv_cache_memory, &engine_config));
  TANDEM_RETURN_IF_ERROR(transfer::CheckKvTransportKind(f.kv_transport));
  TANDEM_RETURN_IF_ERROR(ResolveSpec(f.spec).status());
  if (!f.api_key_file.empty()) {
    TANDEM_RETURN_IF_ERROR(services::LoadApiKeyFile(f.api_key_file).status());
  }
  return absl::OkStatus();
}

RouterFlags RouterFlagsFor(const ServeFlags& f, const std::string& model_path) {
  RouterFlags rf;
  rf.host = "127.0.0.1";
  rf.port = f.port;
  rf.metrics_port = f.metrics_port;
  rf.http_port = f.http_port;
  rf.model = model_path;
  rf.max_inflight = f.max_inflight;
  rf.migration_limit = f.migration_limit;
  rf.remote_prefill_min_tokens = f.remote_prefill_min_tokens;
  rf.max_inflight_tokens = f.max_inflight_tokens;
  rf.max_waiting_requests = f.max_waiting_requests;
  rf.max_waiting_tokens = f.max_waiting_tokens;
  rf.colocated = f.colocated;
  rf.kv_cache_memory = f.kv_cache_memory;
  rf.threads = f.threads;
  rf.max_num_batched_tokens = f.max_num_batched_tokens;
  rf.device = f.device;
  rf.kv_cache_dtype = f.kv_cache_dtype;
  rf.spec = f.spec;
  rf.tls = f.tls;
  rf.api_key_file = f.api_key_file;
  rf.served_model_name = f.served_model_name;
  return rf;
}

// The command line of one worker child.
std::vector<std::string> WorkerArgv(const ServeFlags& f, const std::string& self,
                                    const std::string& role, int grpc_port, int metrics_port,
                                    const std::string& router_address,
                                    const std::string& model_path) {
  // Every worker runs on the same device (cuda:0 with --device cuda): a
  // fraction of its free memory is split between them (kv_memory_flag.h).
  engine::Device device = engine::Device::kCpu;
  (void)engine::ParseDevice(f.device, &device);
  const std::string kv_cache_memory =
      WorkerKvCacheMemory(f.kv_cache_memory, device, f.prefill_workers + f.decode_workers)
          .value_or(f.kv_cache_memory);
  std::vector<std::string> args = {self,
                                   role,
                                   "--host",
                                   "127.0.0.1",
                                   "--port",
                                   std::to_string(grpc_port),
                                   "--metrics-port",
                                   std::to_string(metrics_port),
                                   "--router",
                                   router_address,
                                   "--model",
                                   model_path,
                                   "--kv-cache-memory",
                                   kv_cache_memory,
                                   "--threads",
                                   std::to_string(f.threads),
                                   "--max-num-batched-tokens",
                                   std::to_string(f.max_num_batched_tokens),
                                   "--device",
                                   f.device,
                                   "--kv-transport",
                                   f.kv_transport};
  for (const std::string& a :
       {std::string("--max-waiting-requests"), std::to_string(f.max_waiting_requests),
        std::string("--max-waiting-tokens"), std::to_string(f.max_waiting_tokens)}) {
    args.push_back(a);
  }
  if (!f.kv_cache_dtype.empty()) {
    args.push_back("--kv-cache-dtype");
    args.push_back(f.kv_cache_dtype);
  }
  if (!f.served_model_name.empty()) {
    args.push_back("--served-model-name");
    args.push_back(f.served_model_name);
  }
  for (const std::string& a : TlsArgs(f.tls)) args.push_back(a);
  args.push_back("--drain-seconds");
  args.push_back(std::to_string(f.drain_seconds));
  if (role == "decode") {
    args.push_back("--kv-lease-seconds");
    args.push_back(std::to_string(f.kv_lease_seconds));
    for (const std::string& a : SpecArgs(f.spec)) args.push_back(a);
  }
  return args;
}

// Children on port 0: their real addresses, from their registrations.
void AdoptRegisteredAddresses(router::WorkerPool* pool, std::vector<Child>& children,
                              std::vector<Child>& all) {
  if (pool != nullptr) {
    const std::vector<router::WorkerSnapshot> registered = pool->List();
    for (std::vector<Child>* list : {&children, &all}) {
      for (Child& c : *list) {
        for (const router::WorkerSnapshot& w : registered) {
          if (c.pid <= 0 || w.pid != c.pid) continue;
          c.grpc_address = w.address;
          c.metrics_address = w.metrics_address;
        }
      }
    }
  }
}

void PrintBanner(const ServeFlags& f, const std::string& router_address,
                 const std::vector<Child>& all, const std::vector<Child>& children) {
  std::printf("Tandem %s: gRPC %s (tandem.v1.Generation), metrics http://%s/metrics\n",
              f.colocated ? "colocated" : "cluster", router_address.c_str(),
              all[0].metrics_address.c_str());
  if (!all[0].http_address.empty()) {
    std::printf("  OpenAI HTTP API http://%s/v1 (completions, chat/completions, models)\n",
                all[0].http_address.c_str());
  }
  for (const Child& c : children) {
    std::printf("  %-7s pid %d  gRPC %s  metrics %s\n", c.role.c_str(), c.pid,
                c.grpc_address.c_str(), c.metrics_address.c_str());
  }
  std::printf(
      "try: tandem client --server %s --prompt \"The capital of France is\" "
      "--max-tokens 32 --stream%s%s\n",
      router_address.c_str(), f.tls.enabled() ? " --tls-ca CA [--tls-cert C --tls-key K]" : "",
      f.api_key_file.empty() ? "" : " --api-key KEY");
  std::printf("  security: %s%s\n", services::DescribeTls(f.tls).c_str(),
              f.api_key_file.empty() ? "" : ", API key required");
  std::printf("ready\n");
  std::fflush(stdout);
}

// Starts the worker children; each is appended to `children` and `all`.
absl::Status SpawnWorkers(const ServeFlags& f, const RunningRouter& router, const std::string& self,
                          const std::string& router_address, const std::string& model_path,
                          std::vector<Child>& children, std::vector<Child>& all) {
  // Port 0: every process binds its own free port and the workers'
  // addresses come from their registrations (no window in which another
  // process can take a port chosen for a child). Else the workers take the
  // next free ports above the router's.
  std::vector<int> taken = {router.server->port(), router.server->metrics_port()};
  if (router.http != nullptr) taken.push_back(router.http->port());
  int next_grpc = static_cast<int>(f.port) + 1;
  int next_metrics = static_cast<int>(f.metrics_port) + 1;
  for (int64_t i = 0; !f.colocated && i < f.prefill_workers + f.decode_workers; ++i) {
    const std::string role = i < f.prefill_workers ? "prefill" : "decode";
    absl::StatusOr<int> gp = f.port == 0 ? absl::StatusOr<int>(0) : FindFreePort(next_grpc, taken);
    if (gp.ok() && *gp != 0) taken.push_back(*gp);
    absl::StatusOr<int> mp =
        f.metrics_port == 0 ? absl::StatusOr<int>(0) : FindFreePort(next_metrics, taken);
    if (!gp.ok() || !mp.ok()) return absl::UnavailableError("no free ports for the workers");
    if (*mp != 0) taken.push_back(*mp);
    next_grpc = *gp + 1;
    next_metrics = *mp + 1;
    std::vector<std::string> args = WorkerArgv(f, self, role, *gp, *mp, router_address, model_path);
    Child c{role,
            Spawn(args),
            absl::StrFormat("127.0.0.1:%d", *gp),
            absl::StrFormat("127.0.0.1:%d", *mp),
            true,
            ""};
    if (c.pid < 0) return absl::InternalError("fork failed");
    children.push_back(c);
    all.push_back(c);
  }

  return absl::OkStatus();
}

// Waits until every worker registered and answers its health poll.
// Cancelled: a stop signal came first.
absl::Status WaitReady(const ServeFlags& f, router::WorkerPool* pool,
                       std::vector<Child>& children) {
  const absl::Time give_up = absl::Now() + absl::Seconds(f.ready_timeout_seconds);
  while (pool != nullptr && (pool->NumHealthy("prefill") < f.prefill_workers ||
                             pool->NumHealthy("decode") < f.decode_workers)) {
    if (WaitStopSignal(absl::Milliseconds(100)) != 0) return absl::CancelledError("stopped");
    if (!ReapChildren(children)) {
      return absl::UnavailableError("a worker exited before the cluster was ready");
    }
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(
          absl::StrFormat("the workers were not healthy within %d s", f.ready_timeout_seconds));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int RunServe(int argc, char** argv) {
  ServeFlags f;
  ArgParser p("serve", "Starts a router plus prefill and decode worker processes on loopback.");
  AddServeFlags(p, f);
  if (absl::Status s = p.Parse(argc, argv, 2); !s.ok()) {
    std::fprintf(stderr, "tandem serve: %s\n", std::string(s.message()).c_str());
    return kExitUsage;
  }
  if (absl::Status s = CheckServeFlags(f); !s.ok()) {
    std::fprintf(stderr, "tandem serve: %s\n", std::string(s.message()).c_str());
    return kExitUsage;
  }
  if (p.help_requested()) {
    std::fputs(p.Help().c_str(), stdout);
    return kExitOk;
  }
  auto model_path = ResolveModelPath(f.model);
  if (!model_path.ok()) {
    std::fprintf(stderr, "tandem serve: %s\n", std::string(model_path.status().message()).c_str());
    return kExitUsage;
  }
  if (absl::Status s = CheckDraftVocab(f.spec, *model_path); !s.ok()) {
    std::fprintf(stderr, "tandem serve: %s\n", std::string(s.message()).c_str());
    return kExitUsage;
  }
  LogInit("serve");
  BlockStopSignals();

  auto router = StartRouter(RouterFlagsFor(f, *model_path));
  if (!router.ok()) return Fail(std::string(router.status().message()));
  const std::string router_address = absl::StrFormat("127.0.0.1:%d", (*router)->server->port());
  std::vector<Child> all = {{"router", getpid(), router_address,
                             absl::StrFormat("127.0.0.1:%d", (*router)->server->metrics_port()),
                             false, ""}};
  std::vector<Child> children;
  if ((*router)->http != nullptr) {
    all[0].http_address = absl::StrFormat("127.0.0.1:%d", (*router)->http->port());
  }
  if (absl::Status s =
          SpawnWorkers(f, **router, SelfExe(argv[0]), router_address, *model_path, children, all);
      !s.ok()) {
    StopChildren(children);
    return Fail(std::string(s.message()));
  }
  router::WorkerPool* pool = (*router)->server->pool();
  if (absl::Status s = WaitReady(f, pool, children); !s.ok()) {
    StopChildren(children);
    return absl::IsCancelled(s) ? kExitOk : Fail(std::string(s.message()));
  }
  AdoptRegisteredAddresses(pool, children, all);
  if (!f.endpoints_file.empty()) {
    if (absl::Status s = WriteEndpoints(f.endpoints_file, all); !s.ok()) {
      StopChildren(children);
      return Fail(std::string(s.message()));
    }
  }
  PrintBanner(f, router_address, all, children);
  while (WaitStopSignal(absl::Milliseconds(200)) == 0) ReapChildren(children);
  // Drain: the router stops taking calls and lets those in flight finish,
  // then each worker drains (idle by then) and exits.
  spdlog::info("draining (up to {} s)", static_cast<int>(f.drain_seconds));
  const bool idle = (*router)->server->Drain(absl::Seconds(f.drain_seconds));
  spdlog::info("{}; stopping the workers",
               idle ? "drained" : "drain timed out, cutting the calls left");
  StopChildren(children, absl::Seconds(f.drain_seconds + 10));
  router->reset();
  return kExitOk;
}

}  // namespace tandem::cli
