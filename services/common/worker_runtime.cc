#include "services/common/worker_runtime.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/tokenizer/vocab.h"
#include "services/common/compat.h"

namespace tandem::services {

absl::Status SplitHostPort(const std::string& address, const std::string& what, std::string* host,
                           int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected host:port, got '", address, "'"));
  }
  int p = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &p) || p < 0 || p > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": bad port in '", address, "'"));
  }
  std::string h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  *host = h;
  *port = p;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WorkerRuntime>> WorkerRuntime::Create(
    const WorkerServerConfig& config, const std::string& phase) {
  std::unique_ptr<WorkerRuntime> rt(new WorkerRuntime());
  const gguf::GgufFile* file = config.file;
  const engine::LlamaModel* model = config.model;
  const tokenizer::Tokenizer* tok = config.tokenizer;
  if (model == nullptr) {
    if (config.model_path.empty()) return absl::InvalidArgumentError("model path is empty");
    const int threads = config.engine.num_threads > 0
                            ? config.engine.num_threads
                            : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    rt->pool_ = std::make_unique<ThreadPool>(threads);
    TANDEM_ASSIGN_OR_RETURN(rt->file_, gguf::GgufFile::Open(config.model_path));
    TANDEM_ASSIGN_OR_RETURN(tokenizer::Vocab vocab, tokenizer::VocabFromGguf(*rt->file_));
    TANDEM_ASSIGN_OR_RETURN(rt->tokenizer_, tokenizer::Tokenizer::Create(std::move(vocab)));
    TANDEM_ASSIGN_OR_RETURN(
        rt->model_,
        engine::LlamaModel::Load(*rt->file_, {rt->pool_.get(), config.engine.prefault, {}}));
    file = rt->file_.get();
    model = rt->model_.get();
    tok = rt->tokenizer_.get();
  } else if (file == nullptr) {
    return absl::InvalidArgumentError("WorkerServerConfig.file is required with model");
  }
  rt->model_name_ = config.model_name;
  if (rt->model_name_.empty()) rt->model_name_ = model->config().name;
  if (rt->model_name_.empty()) {
    std::string p = config.model_path;
    if (p.rfind('/') != std::string::npos) p = p.substr(p.rfind('/') + 1);
    rt->model_name_ = p.empty() ? "model" : p;
  }
  TANDEM_ASSIGN_OR_RETURN(rt->engine_, engine::Engine::Create(config.engine, model, tok));
  rt->compat_ = MakeCompat(*file, *model, rt->model_name_, config.engine.block_size,
                           config.engine.kv_dtype());

  rt->registry_ = std::make_unique<metrics::MetricsRegistry>();
  TANDEM_ASSIGN_OR_RETURN(
      rt->metrics_, metrics::TandemMetrics::Create(rt->registry_.get(), phase, rt->model_name_));
  if (!config.metrics_address.empty()) {
    metrics::MetricsHttpServer::Options options;
    TANDEM_RETURN_IF_ERROR(
        SplitHostPort(config.metrics_address, "metrics address", &options.host, &options.port));
    rt->metrics_host_ = options.host;
    rt->http_ = std::make_unique<metrics::MetricsHttpServer>(rt->registry_.get(), options);
    TANDEM_RETURN_IF_ERROR(rt->http_->Start());
  }
  return rt;
}

WorkerRuntime::~WorkerRuntime() { Shutdown(); }

void WorkerRuntime::Shutdown() {
  if (http_ != nullptr) http_->Stop();
  if (engine_ != nullptr) engine_->Shutdown();
}

std::string WorkerRuntime::metrics_address() const {
  if (http_ == nullptr) return "";
  const std::string host = metrics_host_ == "0.0.0.0" ? "127.0.0.1" : metrics_host_;
  return absl::StrCat(host, ":", http_->port());
}

void WorkerRuntime::UpdateEngineMetrics() {
  const engine::EngineStats s = engine_->Stats();
  metrics_->num_requests_running->Set(static_cast<double>(s.num_running));
  metrics_->num_requests_waiting->Set(static_cast<double>(s.num_waiting));
  metrics_->kv_cache_usage_ratio->Set(
      s.num_blocks_total > 0 ? static_cast<double>(s.num_blocks_used) / s.num_blocks_total : 0.0);
  absl::MutexLock lock(&mu_);
  metrics_->num_preemptions->Inc(static_cast<double>(s.num_preemptions - last_preemptions_));
  // Tokens this worker sampled (prefill: the first token of each request;
  // decode: the rest), so tandem_generation_tokens_total{phase} is per phase.
  metrics_->generation_tokens->Inc(static_cast<double>(s.num_generated_tokens - last_generated_));
  metrics_->prefix_cache_queries->Inc(
      static_cast<double>(s.num_prefix_cache_query_tokens - last_query_tokens_));
  metrics_->prefix_cache_hits->Inc(
      static_cast<double>(s.num_prefix_cache_hit_tokens - last_hit_tokens_));
  // Per-step histograms from the deltas since the last refresh: the mean
  // tokens per step over the interval (the engine has no per-step hook yet).
  const int64_t steps = s.num_steps - last_steps_;
  if (steps > 0) {
    metrics_->iteration_tokens->Observe(
        static_cast<double>(s.num_computed_tokens - last_computed_) / static_cast<double>(steps));
    metrics_->batch_size->Observe(static_cast<double>(s.num_running));
  }
  metrics_->spec_num_drafts->Inc(static_cast<double>(s.spec.num_drafts - last_spec_.num_drafts));
  metrics_->spec_num_draft_tokens->Inc(
      static_cast<double>(s.spec.num_draft_tokens - last_spec_.num_draft_tokens));
  metrics_->spec_num_accepted_tokens->Inc(
      static_cast<double>(s.spec.num_accepted_tokens - last_spec_.num_accepted_tokens));
  for (size_t i = 0; i < s.spec.accepted_per_position.size(); ++i) {
    const int64_t before =
        i < last_spec_.accepted_per_position.size() ? last_spec_.accepted_per_position[i] : 0;
    if (s.spec.accepted_per_position[i] > before) {
      metrics_->SpecAcceptedAtPosition(static_cast<int64_t>(i))
          ->Inc(static_cast<double>(s.spec.accepted_per_position[i] - before));
    }
  }
  last_spec_ = s.spec;
  last_preemptions_ = s.num_preemptions;
  last_query_tokens_ = s.num_prefix_cache_query_tokens;
  last_hit_tokens_ = s.num_prefix_cache_hit_tokens;
  last_steps_ = s.num_steps;
  last_computed_ = s.num_computed_tokens;
  last_generated_ = s.num_generated_tokens;
}

}  // namespace tandem::services
