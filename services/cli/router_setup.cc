#include "services/cli/router_setup.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "common/utf8.h"
#include "engine/model_config.h"
#include "services/cli/device_flag.h"
#include "services/cli/kv_dtype_flag.h"
#include "services/cli/kv_memory_flag.h"
#include "services/common/api_key.h"
#include "spdlog/spdlog.h"

namespace tandem::cli {

RunningRouter::~RunningRouter() {
  http.reset();
  if (server != nullptr) server->Shutdown();
  server.reset();
  if (engine != nullptr) engine->Shutdown();
}

std::vector<std::string> SplitList(const std::string& list) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    out.emplace_back(part);
  }
  return out;
}

namespace {

// --colocated: loads the whole model into `r` and starts the engine the
// router runs in-process.
absl::Status StartLocalEngine(const RouterFlags& flags, const std::string& path, RunningRouter& r,
                              router::RouterServer::Options& o) {
  const int threads = flags.threads > 0
                          ? static_cast<int>(flags.threads)
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  engine::EngineConfig config;
  TANDEM_RETURN_IF_ERROR(ApplyKvCacheMemory(flags.kv_cache_memory, &config));
  r.pool = std::make_unique<ThreadPool>(threads);
  TANDEM_ASSIGN_OR_RETURN(r.loaded, LoadModel(path, r.pool.get(), /*verbose=*/true));
  TANDEM_ASSIGN_OR_RETURN(config.device, ResolveDevice(flags.device));
  TANDEM_ASSIGN_OR_RETURN(config.kv_cache_dtype,
                          ResolveKvDtype(flags.kv_cache_dtype, config.device));
  TANDEM_ASSIGN_OR_RETURN(config.spec, ResolveSpec(flags.spec));
  config.scheduler.max_num_seqs = flags.max_num_seqs;
  config.scheduler.max_num_batched_tokens = flags.max_num_batched_tokens;
  config.scheduler.max_waiting_requests = flags.max_waiting_requests;
  config.scheduler.max_waiting_tokens = flags.max_waiting_tokens;
  TANDEM_ASSIGN_OR_RETURN(
      r.engine, engine::Engine::Create(config, r.loaded.model.get(), r.loaded.tokenizer.get()));
  spdlog::info("engine: {}", r.engine->kv_cache_description());
  spdlog::info("engine: {}", r.engine->executor_description());
  o.local_engine = r.engine.get();
  o.kv_bytes_per_token = r.engine->kv_bytes_per_token();
  return absl::OkStatus();
}

// The router's options that come from the model file and the flags.
void SetModelOptions(const RouterFlags& flags, const std::string& path,
                     const engine::ModelConfig& config, router::RouterServer::Options& o) {
  o.limits.context_length = static_cast<int32_t>(config.context_length);
  o.limits.vocab_size = static_cast<int32_t>(config.vocab_size);
  o.limits.max_tokens_limit = static_cast<int32_t>(config.context_length - 1);
  o.model_shape = {config.num_layers, config.num_kv_heads, config.head_dim};
  if (o.kv_bytes_per_token == 0) {
    // Without an engine: the dtype the flags give the workers (tandem serve
    // passes its own), else the CPU default.
    engine::KvDtype dtype = engine::DefaultKvDtype(engine::Device::kCpu);
    engine::Device device;
    if (engine::ParseDevice(flags.device, &device)) dtype = engine::DefaultKvDtype(device);
    (void)kernels::ParseKvDtype(flags.kv_cache_dtype, &dtype);
    o.kv_bytes_per_token =
        kernels::KvBytesPerToken(dtype, config.num_layers, config.num_kv_heads, config.head_dim);
  }
  o.model_name = !flags.served_model_name.empty() ? flags.served_model_name
                 : config.name.empty()            ? path.substr(path.find_last_of('/') + 1)
                                                  : config.name;
  o.architecture = config.architecture;
}

// The OpenAI-compatible HTTP front door on the router's GenerationService.
absl::StatusOr<std::unique_ptr<http::OpenAiServer>> StartHttp(const RouterFlags& flags,
                                                              router::RouterServer* server) {
  http::OpenAiServer::Options ho;
  ho.host = flags.host;
  ho.port = static_cast<int>(flags.http_port);
  ho.generation = server->generation();
  ho.ready = [server] { return server->Ready(); };
  // Connections cost memory, not threads: room for every call the router may
  // admit plus idle keep-alive clients (each is a file descriptor too).
  ho.max_connections = static_cast<int>(std::clamp<int64_t>(flags.max_inflight + 256, 1024, 65536));
  return http::OpenAiServer::Start(std::move(ho));
}

}  // namespace

absl::Status ValidateServedModelName(const std::string& name) {
  if (name.empty()) return absl::OkStatus();
  if (name.size() > 256) {
    return absl::InvalidArgumentError("--served-model-name: at most 256 bytes");
  }
  if (!utf8::IsValidUtf8(name)) return absl::InvalidArgumentError("--served-model-name: not UTF-8");
  // In valid UTF-8 every byte below 0x80 is an ASCII character.
  for (unsigned char c : name) {
    if (c < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError("--served-model-name: control characters are not allowed");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RunningRouter>> StartRouter(const RouterFlags& flags) {
  // Security flags and the name are checked before any slow start-up work.
  TANDEM_RETURN_IF_ERROR(ValidateServedModelName(flags.served_model_name));
  TANDEM_RETURN_IF_ERROR(services::ValidateServerTls(flags.tls));
  std::vector<std::string> api_keys;
  if (!flags.api_key_file.empty()) {
    TANDEM_ASSIGN_OR_RETURN(api_keys, services::LoadApiKeyFile(flags.api_key_file));
  }
  auto r = std::make_unique<RunningRouter>();
  TANDEM_ASSIGN_OR_RETURN(std::string path, ResolveModelPath(flags.model));
  router::RouterServer::Options o;
  if (flags.colocated) {
    TANDEM_RETURN_IF_ERROR(StartLocalEngine(flags, path, *r, o));
  } else {
    TANDEM_ASSIGN_OR_RETURN(r->loaded, LoadTokenizer(path));
    o.static_prefill = SplitList(flags.prefill);
    o.static_decode = SplitList(flags.decode);
  }
  TANDEM_ASSIGN_OR_RETURN(engine::ModelConfig config,
                          engine::ModelConfig::FromGguf(*r->loaded.file));
  SetModelOptions(flags, path, config, o);
  o.host = flags.host;
  o.port = static_cast<int>(flags.port);
  o.metrics_port = static_cast<int>(flags.metrics_port);
  o.metrics_host = flags.host;
  o.tokenizer = r->loaded.tokenizer.get();
  o.max_inflight = static_cast<int>(flags.max_inflight);
  o.migration_limit = static_cast<int>(flags.migration_limit);
  o.remote_prefill_min_tokens = flags.remote_prefill_min_tokens;
  o.tls = flags.tls;
  o.api_keys = std::move(api_keys);
  o.max_inflight_tokens = flags.max_inflight_tokens;
  TANDEM_ASSIGN_OR_RETURN(r->server, router::RouterServer::Start(std::move(o)));
  if (flags.http_port >= 0) {
    TANDEM_ASSIGN_OR_RETURN(r->http, StartHttp(flags, r->server.get()));
  }
  return r;
}

void BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitStopSignal(absl::Duration timeout) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  const timespec ts = absl::ToTimespec(timeout);
  const int sig = sigtimedwait(&set, nullptr, &ts);
  return sig > 0 ? sig : 0;
}

namespace {
// The port bound on 127.0.0.1 (`port` 0: an ephemeral one), or 0.
int TryBind(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  return ok ? ntohs(addr.sin_port) : 0;
}
}  // namespace

absl::StatusOr<int> FindFreePort(int start, const std::vector<int>& taken) {
  auto is_taken = [&](int p) { return std::find(taken.begin(), taken.end(), p) != taken.end(); };
  for (int i = 0; i < 2000; ++i) {
    const int want = start == 0 ? 0 : start + i;
    if (want > 65535) break;
    if (want != 0 && is_taken(want)) continue;
    const int got = TryBind(want);
    if (got != 0 && !is_taken(got)) return got;
  }
  return absl::UnavailableError(absl::StrFormat("no free port from %d", start));
}

}  // namespace tandem::cli
