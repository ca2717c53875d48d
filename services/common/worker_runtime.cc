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
  rt->exporter_ = std::make_unique<EngineMetricsExporter>(rt->engine_.get(), rt->metrics_.get());
  if (!config.metrics_address.empty()) {
    metrics::MetricsHttpServer::Options options;
    EngineMetricsExporter* exporter = rt->exporter_.get();  // outlives the server (Shutdown)
    options.before_scrape = [exporter] { exporter->Update(); };
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

void WorkerRuntime::UpdateEngineMetrics() { exporter_->Update(); }

}  // namespace tandem::services
