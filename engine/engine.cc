#include "engine/engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "common/tokenizer/vocab.h"
#include "engine/memory_size.h"
#include "engine/spec/ngram_proposer.h"

namespace tandem::engine {

struct Engine::Owned {
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<LlamaModel> model;
};

struct Engine::DraftOwned {
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<LlamaModel> model;
};

struct Engine::ActiveRequest {
  RequestHandle stream;
  std::unique_ptr<OutputProcessor> output;
  bool wants_logprobs = false;
  absl::Time submit_time;
  bool scheduled = false;
  std::optional<FinishReason> finish;  // decided by the OutputProcessor
  Usage usage;
  bool export_kv = false;
  bool stream_kv_export = false;
  bool kv_export_on_device = false;  // stream_kv_export into executor memory
  bool kv_exported = false;          // the request ends because its K/V was exported
  int64_t kv_streamed = 0;           // stream_kv_export: tokens whose K/V went out as chunks
  std::shared_ptr<const KvExport> import_kv;  // until admitted
  std::shared_ptr<const KvExport> kv_export;  // set when exported
  absl::Status error;                         // with finish == kError
};

namespace {

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// The KV budget: the fixed size, or the fraction of the memory free on the
// engine's device with `model`'s weights counted out (then `note` says so,
// for the start-up line).
struct KvBudget {
  int64_t bytes = 0;
  std::string note;
};

absl::StatusOr<KvBudget> ResolveKvBudget(const EngineConfig& config, const LlamaModel* model) {
  const double fraction = config.kv_cache_memory_fraction;
  if (config.num_kv_blocks > 0 || fraction <= 0) return KvBudget{config.kv_cache_memory_bytes, ""};
  ExecutorOptions options;
  options.device = config.device;
  const std::string device(DeviceName(config.device));
  absl::StatusOr<int64_t> free_bytes = FreeMemoryForKv(model, options);
  absl::StatusOr<int64_t> bytes =
      free_bytes.ok() ? ShareOfFreeBytes(fraction, *free_bytes) : free_bytes.status();
  if (!bytes.ok()) {
    return absl::Status(bytes.status().code(),
                        absl::StrCat("KV cache memory fraction ", fraction, " on ", device, ": ",
                                     bytes.status().message()));
  }
  return KvBudget{*bytes, absl::StrFormat(", budget %g of %.2f GiB free on %s", fraction,
                                          static_cast<double>(*free_bytes) / (1 << 30), device)};
}

}  // namespace

KvDtype DefaultKvDtype(Device device) {
  return device == Device::kCuda ? KvDtype::kF32 : KvDtype::kF16;
}

absl::Status EngineConfig::Validate() const {
  if (block_size < 1) return absl::InvalidArgumentError("block_size must be >= 1");
  if (num_kv_blocks < 0) return absl::InvalidArgumentError("num_kv_blocks must be >= 0");
  if (!(kv_cache_memory_fraction >= 0 && kv_cache_memory_fraction <= 1)) {
    return absl::InvalidArgumentError("kv_cache_memory_fraction must be in (0, 1] (or 0: unset)");
  }
  if (num_kv_blocks == 0 && kv_cache_memory_fraction == 0 && kv_cache_memory_bytes <= 0) {
    return absl::InvalidArgumentError("kv_cache_memory_bytes must be positive");
  }
  if (num_threads < 0) return absl::InvalidArgumentError("num_threads must be >= 0");
  if (spec.num_tokens < 1 || spec.num_tokens > kMaxSpeculativeTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.num_tokens must be in [1, ", kMaxSpeculativeTokens, "]"));
  }
  if (spec.ngram_min < 1 || spec.ngram_max < spec.ngram_min || spec.ngram_max > 64) {
    return absl::InvalidArgumentError("spec n-gram lengths must satisfy 1 <= min <= max <= 64");
  }
  if (spec.method == SpecDecodeConfig::Method::kDraft && spec.draft_model_path.empty() &&
      spec.draft_model == nullptr) {
    return absl::InvalidArgumentError("spec method draft needs a draft model (--spec-draft-model)");
  }
  return scheduler.Validate();
}

bool ParseSpecMethod(const std::string& s, SpecDecodeConfig::Method* method) {
  if (s == "off") {
    *method = SpecDecodeConfig::Method::kOff;
  } else if (s == "ngram") {
    *method = SpecDecodeConfig::Method::kNgram;
  } else if (s == "draft") {
    *method = SpecDecodeConfig::Method::kDraft;
  } else {
    return false;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineConfig& config) {
  TANDEM_RETURN_IF_ERROR(config.Validate());
  if (config.model_path.empty()) return absl::InvalidArgumentError("model_path is empty");
  auto owned = std::make_unique<Owned>();
  const int threads = config.num_threads > 0
                          ? config.num_threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  owned->pool = std::make_unique<ThreadPool>(threads);
  TANDEM_ASSIGN_OR_RETURN(owned->file, gguf::GgufFile::Open(config.model_path));
  TANDEM_ASSIGN_OR_RETURN(tokenizer::Vocab vocab, tokenizer::VocabFromGguf(*owned->file));
  TANDEM_ASSIGN_OR_RETURN(owned->tokenizer, tokenizer::Tokenizer::Create(std::move(vocab)));
  TANDEM_ASSIGN_OR_RETURN(owned->model,
                          LlamaModel::Load(*owned->file, {owned->pool.get(), config.prefault, {}}));
  std::unique_ptr<Engine> engine(new Engine(config, owned->model.get(), owned->tokenizer.get()));
  engine->owned_ = std::move(owned);
  TANDEM_RETURN_IF_ERROR(engine->Init());
  return engine;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineConfig& config,
                                                       const LlamaModel* model,
                                                       const tokenizer::Tokenizer* tokenizer) {
  TANDEM_RETURN_IF_ERROR(config.Validate());
  if (model == nullptr) return absl::InvalidArgumentError("null model");
  std::unique_ptr<Engine> engine(new Engine(config, model, tokenizer));
  TANDEM_RETURN_IF_ERROR(engine->Init());
  return engine;
}

Engine::Engine(const EngineConfig& config, const LlamaModel* model,
               const tokenizer::Tokenizer* tokenizer)
    : config_(config), model_(model), tokenizer_(tokenizer) {}

absl::Status Engine::Init() {
  const ModelConfig& mc = model_->config();
  if (tokenizer_ != nullptr) {
    eos_token_ids_ = tokenizer_->vocab().eog_ids;
    const int32_t eos = tokenizer_->vocab().eos_id;
    if (eos >= 0 &&
        std::find(eos_token_ids_.begin(), eos_token_ids_.end(), eos) == eos_token_ids_.end()) {
      eos_token_ids_.push_back(eos);
    }
  }
  const KvDtype kv_dtype = config_.kv_dtype();
  kv_bytes_per_token_ =
      kernels::KvBytesPerToken(kv_dtype, mc.num_layers, mc.num_kv_heads, mc.head_dim);
  KvCacheConfig kv_config;
  kv_config.block_size = config_.block_size;
  kv_config.num_blocks = config_.num_kv_blocks;
  TANDEM_ASSIGN_OR_RETURN(const KvBudget budget, ResolveKvBudget(config_, model_));
  kv_config.memory_budget_bytes = budget.bytes;
  kv_config.enable_prefix_caching = config_.enable_prefix_caching;
  TANDEM_ASSIGN_OR_RETURN(const int64_t num_blocks, NumBlocksFor(kv_config, kv_bytes_per_token_));
  if (num_blocks > INT32_MAX) return absl::InvalidArgumentError("too many KV blocks");
  kv_description_ = DescribeKvCapacity(kv_bytes_per_token_, num_blocks, config_.block_size,
                                       config_.enable_prefix_caching, kv_dtype) +
                    budget.note;
  ExecutorOptions executor_options;
  executor_options.device = config_.device;
  executor_options.num_blocks = num_blocks;
  executor_options.block_size = config_.block_size;
  executor_options.kv_dtype = kv_dtype;
  TANDEM_ASSIGN_OR_RETURN(executor_, MakeExecutor(model_, executor_options));
  executor_description_ = executor_->Describe();
  kv_memory_domain_ = executor_->kv_memory_domain();
  kv_ = std::make_unique<KvCacheManager>(static_cast<int32_t>(num_blocks), config_.block_size,
                                         config_.enable_prefix_caching);
  SchedulerConfig scheduler_config = config_.scheduler;
  const bool speculate = config_.spec.method != SpecDecodeConfig::Method::kOff ||
                         static_cast<bool>(config_.spec.proposer);
  scheduler_config.num_speculative_tokens = speculate ? config_.spec.num_tokens : 0;
  scheduler_ = std::make_unique<Scheduler>(scheduler_config, kv_.get());
  if (config_.spec.proposer) {
    scheduler_->set_proposer(config_.spec.proposer);
  } else if (config_.spec.method == SpecDecodeConfig::Method::kDraft) {
    TANDEM_RETURN_IF_ERROR(InitDraft(num_blocks));
    scheduler_->set_batch_proposer(draft_.get());
  } else if (config_.spec.method == SpecDecodeConfig::Method::kNgram) {
    const int64_t lo = config_.spec.ngram_min, hi = config_.spec.ngram_max;
    scheduler_->set_proposer([lo, hi](const Sequence& seq, int64_t max_tokens) {
      return ProposeNgram(seq.token_ids(), lo, hi, max_tokens);
    });
  }
  runner_ = std::make_unique<ModelRunner>(executor_.get(), mc.vocab_size, eos_token_ids_);
  runner_->set_abort_flag(&abort_step_);
  {
    absl::MutexLock lock(&mu_);
    stats_.num_blocks_total = num_blocks;
  }
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

absl::Status Engine::InitDraft(int64_t num_blocks) {
  const SpecDecodeConfig& spec = config_.spec;
  const LlamaModel* draft = spec.draft_model;
  std::string name = "(preloaded)";
  if (draft == nullptr) {
    name = spec.draft_model_path;
    auto owned = std::make_unique<DraftOwned>();
    const int threads = config_.num_threads > 0
                            ? config_.num_threads
                            : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    owned->pool = std::make_unique<ThreadPool>(threads);
    auto file = gguf::GgufFile::Open(spec.draft_model_path);
    if (!file.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("draft model ", spec.draft_model_path, ": ", file.status().message()));
    }
    owned->file = *std::move(file);
    if (tokenizer_ != nullptr) {
      auto vocab = tokenizer::VocabFromGguf(*owned->file);
      if (!vocab.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("draft model ", spec.draft_model_path,
                                                       ": tokenizer: ", vocab.status().message()));
      }
      const std::vector<std::string>& mine = tokenizer_->vocab().tokens;
      if (vocab->tokens.size() != mine.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "draft model ", spec.draft_model_path, " has a vocabulary of ", vocab->tokens.size(),
            " tokens, the target model ", mine.size(), ": they must share one vocabulary"));
      }
      for (size_t i = 0; i < mine.size(); ++i) {
        if (vocab->tokens[i] != mine[i]) {
          return absl::InvalidArgumentError(absl::StrCat(
              "draft model ", spec.draft_model_path, ": token ", i, " differs from the target's ",
              "vocabulary: they must share one vocabulary"));
        }
      }
    }
    LoadOptions lo;
    lo.pool = owned->pool.get();
    lo.prefault = config_.prefault;
    lo.kernels = spec.draft_kernels;
    auto model = LlamaModel::Load(*owned->file, lo);
    if (!model.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("draft model ", spec.draft_model_path, ": ", model.status().message()));
    }
    owned->model = *std::move(model);
    draft = owned->model.get();
    draft_owned_ = std::move(owned);
  }
  const int64_t target_vocab = model_->config().vocab_size;
  if (draft->config().vocab_size != target_vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft model ", name, " has a vocabulary of ", draft->config().vocab_size,
        " tokens, the target model ", target_vocab, ": they must share one vocabulary"));
  }
  spec::DraftProposerOptions options;
  options.device = config_.device;
  // The target's token capacity plus every running sequence's lookahead.
  const int64_t lookahead_blocks =
      (kMaxSpeculativeTokens + config_.block_size - 1) / config_.block_size + 1;
  options.num_blocks = num_blocks + config_.scheduler.max_num_seqs * lookahead_blocks;
  options.block_size = config_.block_size;
  options.kv_dtype = config_.kv_dtype();
  options.max_batch_tokens = config_.scheduler.max_num_batched_tokens;
  options.eos_token_ids = eos_token_ids_;
  TANDEM_ASSIGN_OR_RETURN(draft_, spec::DraftProposer::Create(draft, options));
  draft_description_ = absl::StrCat("draft model ", name, ": ", draft->config().num_layers,
                                    " layers, ", draft_->description());
  return absl::OkStatus();
}

Engine::~Engine() { Shutdown(ShutdownMode::kCancel); }

absl::Status Engine::ValidateRequest(const EngineRequest& request) const {
  const ModelConfig& mc = model_->config();
  const int64_t num_prompt = static_cast<int64_t>(request.prompt_token_ids.size());
  if (num_prompt == 0) return absl::InvalidArgumentError("empty prompt");
  for (int32_t id : request.prompt_token_ids) {
    if (id < 0 || id >= mc.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token id ", id, " outside [0, ", mc.vocab_size, ")"));
    }
  }
  for (int32_t id : request.prefix_output_token_ids) {
    if (id < 0 || id >= mc.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("prefix_output_token_ids: id ", id, " outside [0, ", mc.vocab_size, ")"));
    }
  }
  const int64_t n = num_prompt + static_cast<int64_t>(request.prefix_output_token_ids.size());
  if (request.import_kv != nullptr) {
    const KvExport& kv = *request.import_kv;
    TANDEM_RETURN_IF_ERROR(kv.Validate());
    if (kv.bytes_per_token != kv_bytes_per_token_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "import_kv: ", kv.bytes_per_token, " bytes per token, this engine's ",
          kernels::KvDtypeName(config_.kv_dtype()), " KV cache has ", kv_bytes_per_token_));
    }
    if (kv.num_layers != mc.num_layers || kv.num_kv_heads != mc.num_kv_heads ||
        kv.head_dim != mc.head_dim) {
      return absl::InvalidArgumentError("import_kv: geometry does not match the model");
    }
    if (kv.device != nullptr && kv.device->domain() != kv_memory_domain_) {
      return absl::FailedPreconditionError(
          absl::StrCat("import_kv: the payload is in ", kv.device->domain(),
                       " memory, this engine's KV cache in ", kv_memory_domain_));
    }
    if (kv.num_tokens() < 1 || kv.num_tokens() >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("import_kv: ", kv.num_tokens(), " tokens; must be in [1, ", n, ")"));
    }
    for (int64_t i = 0; i < kv.num_tokens(); ++i) {
      const int32_t expected = i < num_prompt ? request.prompt_token_ids[i]
                                              : request.prefix_output_token_ids[i - num_prompt];
      if (kv.token_ids[i] != expected) {
        return absl::InvalidArgumentError(
            absl::StrCat("import_kv: token_ids[", i, "] differs from the request's tokens"));
      }
    }
  }
  TANDEM_RETURN_IF_ERROR(request.params.Validate(mc.vocab_size));
  if (n >= mc.context_length) {
    return absl::InvalidArgumentError(absl::StrCat("prompt of ", n, " tokens leaves no room in ",
                                                   "the context of ", mc.context_length));
  }
  if (kv_->BlocksFor(n + 1) > kv_->num_blocks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt of ", n, " tokens does not fit in the KV cache"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RequestHandle> Engine::Submit(EngineRequest request) {
  TANDEM_RETURN_IF_ERROR(ValidateRequest(request));
  const int64_t n = static_cast<int64_t>(request.prompt_token_ids.size() +
                                         request.prefix_output_token_ids.size());
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::FailedPreconditionError("engine is shut down");
  const SchedulerConfig& sc = config_.scheduler;
  if (n > sc.max_waiting_tokens) {  // could never be queued: not retryable
    return absl::InvalidArgumentError(absl::StrCat(
        "request of ", n, " tokens exceeds max_waiting_tokens ", sc.max_waiting_tokens));
  }
  if (num_waiting_ + 1 > sc.max_waiting_requests ||
      num_waiting_tokens_ + n > sc.max_waiting_tokens) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "waiting queue full (", num_waiting_, " requests, ", num_waiting_tokens_, " tokens)"));
  }
  const int64_t id = next_id_++;
  auto stream = std::make_shared<RequestStream>(id, std::move(request.request_id),
                                                std::move(request.on_event));
  auto seq = std::make_unique<Sequence>(id, std::move(request.prompt_token_ids),
                                        std::move(request.params), request.extra_key);
  for (int32_t t : request.prefix_output_token_ids) seq->AppendToken(t);
  if (request.import_kv != nullptr) seq->set_num_imported_tokens(request.import_kv->num_tokens());
  inbox_.push_back(
      Pending{std::move(seq), stream, absl::Now(), request.export_kv,
              request.export_kv && request.stream_kv_export, std::move(request.import_kv),
              static_cast<int64_t>(request.prefix_output_token_ids.size()),
              request.export_kv && request.stream_kv_export && request.kv_export_on_device});
  ++num_waiting_;
  num_waiting_tokens_ += n;
  wake_.Signal();
  return stream;
}

void Engine::Cancel(const RequestHandle& handle) {
  if (handle == nullptr) return;
  absl::MutexLock lock(&mu_);
  cancels_.push_back(handle->id());
  // A long step (a big prefill chunk) whose every request is now cancelled
  // stops between layers instead of running to its end.
  if (step_ids_.contains(handle->id())) {
    step_cancelled_.insert(handle->id());
    if (step_cancelled_.size() == step_ids_.size()) abort_step_.store(true);
  }
  wake_.Signal();
}

EngineStats Engine::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

std::vector<StepRecord> Engine::TakeStepRecords() {
  record_steps_.store(true, std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  std::vector<StepRecord> out(published_steps_.begin(), published_steps_.end());
  published_steps_.clear();
  return out;
}

void Engine::Shutdown(ShutdownMode mode) {
  absl::MutexLock join_lock(&join_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      stopping_ = true;
      shutdown_mode_ = mode;
      if (mode == ShutdownMode::kCancel && !step_ids_.empty()) abort_step_.store(true);
    }
    wake_.Signal();
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status Engine::CheckIntegrity() const {
  TANDEM_RETURN_IF_ERROR(integrity_);
  TANDEM_RETURN_IF_ERROR(kv_->CheckIntegrity());
  if (draft_ != nullptr) TANDEM_RETURN_IF_ERROR(draft_->CheckIntegrity(/*idle=*/true));
  if (scheduler_->has_unfinished() || kv_->num_sequences() != 0 || !active_.empty()) {
    return absl::FailedPreconditionError("sequences left after shutdown");
  }
  if (kv_->num_free_blocks() != kv_->num_blocks()) {
    return absl::FailedPreconditionError(absl::StrCat(kv_->num_blocks() - kv_->num_free_blocks(),
                                                      " KV blocks still held after shutdown"));
  }
  return absl::OkStatus();
}

void Engine::Loop() {
  while (true) {
    std::vector<Pending> submits;
    std::vector<int64_t> cancels;
    bool stopping = false;
    ShutdownMode mode = ShutdownMode::kCancel;
    {
      absl::MutexLock lock(&mu_);
      const bool busy = scheduler_->has_unfinished();
      while (!stopping_ && inbox_.empty() && cancels_.empty() && !busy) wake_.Wait(&mu_);
      submits.swap(inbox_);
      cancels.swap(cancels_);
      stopping = stopping_;
      mode = shutdown_mode_;
    }
    Admit(std::move(submits));
    ApplyCancels(cancels);
    if (stopping && (mode == ShutdownMode::kCancel || !scheduler_->has_unfinished())) {
      CancelAll();
      Publish();
      return;
    }
    if (scheduler_->has_unfinished()) Step();
    Publish();
  }
}

void Engine::Admit(std::vector<Pending> submits) {
  for (Pending& p : submits) {
    const int64_t id = p.seq->id();
    auto active = std::make_unique<ActiveRequest>();
    active->stream = p.stream;
    active->submit_time = p.submit_time;
    active->wants_logprobs = p.seq->sampling_params().num_logprobs.has_value();
    active->usage.num_prompt_tokens = p.seq->num_prompt_tokens();
    const int64_t room = model_->config().context_length - p.seq->num_prompt_tokens();
    active->output = std::make_unique<OutputProcessor>(tokenizer_, p.seq->sampling_params().stop,
                                                       eos_token_ids_, room);
    active->export_kv = p.export_kv;
    active->stream_kv_export = p.stream_kv_export;
    active->kv_export_on_device = p.kv_export_on_device;
    active->import_kv = std::move(p.import_kv);
    absl::Status st;
    // Replay delivered output through the detokenizer / stop checker, silently.
    absl::Span<const int32_t> prefix = p.seq->output_token_ids();
    std::optional<FinishReason> replay_finish;
    for (size_t i = 0; i < prefix.size() && !replay_finish.has_value(); ++i) {
      replay_finish = active->output->Process(prefix[i]).finish;
      if (replay_finish.has_value() && i + 1 < prefix.size()) {
        st = absl::InvalidArgumentError(absl::StrCat("prefix_output_token_ids[", i,
                                                     "] finishes the request; ",
                                                     prefix.size() - i - 1, " tokens follow it"));
      }
    }
    if (st.ok() && replay_finish.has_value()) {
      // The delivered output already ends the request (a worker died after
      // its last token but before the finish): finish now, nothing to run.
      FinishEvent finish;
      finish.reason = *replay_finish;
      finish.usage = active->usage;
      finish.usage.num_completion_tokens = static_cast<int64_t>(prefix.size());
      finished_events_.emplace_back(p.stream, std::move(finish));
      ++num_finished_;
      continue;
    }
    if (st.ok()) st = scheduler_->AddRequest(std::move(p.seq));
    if (!st.ok()) {
      FinishEvent finish;
      finish.reason = FinishReason::kError;
      finish.status = st;
      finish.usage = active->usage;
      finished_events_.emplace_back(p.stream, std::move(finish));
      ++num_finished_;
      continue;
    }
    active_[id] = std::move(active);
  }
}

void Engine::ApplyCancels(const std::vector<int64_t>& ids) {
  for (int64_t id : ids) {
    if (!active_.contains(id)) continue;  // already finished
    absl::StatusOr<std::unique_ptr<Sequence>> seq = scheduler_->Cancel(id);
    FinishRequest(id, seq.ok() ? seq->get() : nullptr, FinishReason::kCancelled, absl::OkStatus(),
                  active_[id]->output->Flush());
  }
}

void Engine::CancelAll() {
  std::vector<int64_t> ids;
  for (const auto& [id, active] : active_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  ApplyCancels(ids);
}

void Engine::FinishRequest(int64_t id, const Sequence* seq, FinishReason reason,
                           absl::Status status, std::string tail_text) {
  auto it = active_.find(id);
  TANDEM_CHECK(it != active_.end());
  ActiveRequest& a = *it->second;
  FinishEvent finish;
  finish.text = std::move(tail_text);
  finish.reason = reason;
  finish.status = std::move(status);
  finish.usage = std::move(a.usage);
  finish.kv_export = std::move(a.kv_export);
  finish.kv_exported = a.kv_exported && reason == FinishReason::kLength;
  if (seq != nullptr) {
    finish.usage.num_completion_tokens = seq->num_output_tokens();
    finish.usage.num_preemptions = seq->num_preemptions();
  }
  finish.usage.e2e_s = Seconds(absl::Now() - a.submit_time);
  finished_events_.emplace_back(a.stream, std::move(finish));
  active_.erase(it);
  ++num_finished_;
}

void Engine::Step() {
  const absl::Time start = absl::Now();
  SchedulerOutput out = scheduler_->Schedule();
  if (out.empty()) {
    // Nothing fits now (cannot happen with validated prompts); wait for a
    // Submit / Cancel rather than spin.
    absl::MutexLock lock(&mu_);
    if (inbox_.empty() && cancels_.empty() && !stopping_) {
      wake_.WaitWithTimeout(&mu_, absl::Milliseconds(10));
    }
    return;
  }
  MarkScheduled(out);
  ImportScheduledKv(out);
  BeginStep(out);
  absl::StatusOr<std::vector<SampledToken>> sampled = runner_->Execute(out);
  const bool aborted = abort_step_.exchange(false) && absl::IsCancelled(sampled.status());
  {
    absl::MutexLock lock(&mu_);
    step_ids_.clear();
    step_cancelled_.clear();
  }
  if (aborted) return;  // the step's requests are cancelled by the next ApplyCancels
  if (!sampled.ok()) {
    for (const ScheduledSequence& s : out.scheduled) {
      absl::StatusOr<std::unique_ptr<Sequence>> seq = scheduler_->Cancel(s.seq_id);
      FinishRequest(s.seq_id, seq.ok() ? seq->get() : nullptr, FinishReason::kError,
                    sampled.status(), "");
    }
    return;
  }
  const absl::Time done = absl::Now();
  // What ran (before a failed KV export takes a sequence out of `out`).
  const StepRecord record{static_cast<int32_t>(out.num_batched_tokens),
                          static_cast<int32_t>(out.scheduled.size()), 0};
  std::vector<SequenceResult> results;
  results.reserve(sampled->size());
  for (SampledToken& t : *sampled) results.push_back(ProcessSampled(t, done));
  StreamPromptKv(out);
  std::vector<std::unique_ptr<Sequence>> finished = scheduler_->Update(out, results);
  for (const std::unique_ptr<Sequence>& seq : finished) {
    const std::optional<FinishReason> reason = active_.at(seq->id())->finish;
    FinishRequest(seq->id(), seq.get(), reason.value_or(FinishReason::kLength),
                  active_.at(seq->id())->error, "");
  }
  if (record_steps_.load(std::memory_order_relaxed)) {
    step_records_.push_back(record);
    step_records_.back().seconds = Seconds(absl::Now() - start);
  }
  if (config_.check_integrity_every_step && integrity_.ok()) {
    integrity_ = kv_->CheckIntegrity();
    if (integrity_.ok() && draft_ != nullptr) integrity_ = draft_->CheckIntegrity(/*idle=*/false);
  }
}

void Engine::MarkScheduled(const SchedulerOutput& out) {
  const absl::Time now = absl::Now();
  for (const ScheduledSequence& s : out.scheduled) {
    ActiveRequest& a = *active_.at(s.seq_id);
    if (a.scheduled) continue;
    a.scheduled = true;
    a.usage.queue_time_s = Seconds(now - a.submit_time);
    a.usage.num_cached_tokens = s.seq->num_cached_tokens();
  }
}

void Engine::DropFromStep(SchedulerOutput& out, SeqId seq_id, const absl::Status& error) {
  std::erase_if(out.scheduled, [&](const ScheduledSequence& s) {
    if (s.seq_id != seq_id) return false;
    out.num_batched_tokens -= s.num_tokens;
    return true;
  });
  absl::StatusOr<std::unique_ptr<Sequence>> seq = scheduler_->Cancel(seq_id);
  FinishRequest(seq_id, seq.ok() ? seq->get() : nullptr, FinishReason::kError, error, "");
}

void Engine::ImportScheduledKv(SchedulerOutput& out) {
  for (const KvImport& imp : out.kv_imports) {
    ActiveRequest& a = *active_.at(imp.seq_id);
    TANDEM_CHECK(a.import_kv != nullptr);
    absl::Status imported =
        ImportKv(*a.import_kv, imp.begin, imp.end, *kv_, imp.seq_id, *executor_);
    a.import_kv.reset();  // written; a preempted sequence recomputes
    // A failed import ends that request with the error; the step runs without it.
    if (!imported.ok()) DropFromStep(out, imp.seq_id, imported);
  }
}

void Engine::BeginStep(const SchedulerOutput& out) {
  absl::MutexLock lock(&mu_);
  // step_ids_ and step_cancelled_ are empty between steps.
  for (const ScheduledSequence& s : out.scheduled) step_ids_.insert(s.seq_id);
  for (int64_t id : cancels_) {
    if (step_ids_.contains(id)) step_cancelled_.insert(id);
  }
  // Stats show the step being run (a long prefill is visible as running).
  MirrorQueueStats();
  abort_step_.store(!step_ids_.empty() && (step_cancelled_.size() == step_ids_.size() ||
                                           (stopping_ && shutdown_mode_ == ShutdownMode::kCancel)));
}

void Engine::RecordSpecStats(int64_t num_drafts, int64_t num_accepted) {
  if (num_drafts == 0) return;
  ++spec_stats_.num_drafts;
  spec_stats_.num_draft_tokens += num_drafts;
  spec_stats_.num_accepted_tokens += num_accepted;
  if (spec_stats_.accepted_per_position.size() < static_cast<size_t>(num_drafts)) {
    spec_stats_.accepted_per_position.resize(num_drafts, 0);
  }
  for (int64_t i = 0; i < num_accepted; ++i) ++spec_stats_.accepted_per_position[i];
}

SequenceResult Engine::ProcessSampled(SampledToken& t, absl::Time done) {
  ActiveRequest& a = *active_.at(t.seq_id);
  const double since_submit = Seconds(done - a.submit_time);
  // The accepted drafts, then the sampled token, in order; a stop ends the
  // step's tokens for this request (nothing past it is emitted).
  std::vector<SampleResult> emitted = std::move(t.accepted);
  emitted.push_back(std::move(t.result));
  RecordSpecStats(t.num_drafts, static_cast<int64_t>(emitted.size()) - 1);
  SequenceResult r;
  r.seq_id = t.seq_id;
  std::optional<FinishReason> finish;
  for (size_t i = 0; i < emitted.size() && !finish.has_value(); ++i) {
    const int32_t token_id = emitted[i].token_id;
    TokenOutcome outcome = a.output->Process(token_id);
    if (a.usage.token_times_s.empty()) a.usage.ttft_s = since_submit;
    a.usage.token_times_s.push_back(since_submit);
    std::optional<SampleResult> logprobs;
    if (a.wants_logprobs) logprobs = std::move(emitted[i]);
    a.stream->Push(TokenEvent{token_id, std::move(outcome.text), std::move(logprobs)});
    ++num_generated_tokens_;
    if (r.token_id != SequenceResult::kNoToken) r.accepted_draft_ids.push_back(r.token_id);
    r.token_id = token_id;
    finish = outcome.finish;
  }
  if (!finish.has_value() && a.export_kv) finish = ExportAfterFirstToken(a, t.seq_id);
  if (finish.has_value()) {
    a.finish = finish;
    r.finish = *finish;
  }
  return r;
}

FinishReason Engine::ExportAfterFirstToken(ActiveRequest& a, SeqId seq_id) {
  if (a.stream_kv_export) {
    // Streamed: the rest of the K/V after the first token.
    const absl::Status st = StreamKv(a, seq_id, scheduler_->Find(seq_id)->num_tokens());
    a.kv_exported = st.ok();
    if (!st.ok()) a.error = st;
    return st.ok() ? FinishReason::kLength : FinishReason::kError;
  }
  // Whole: copy the computed K/V out before Update frees the blocks.
  const Sequence* seq = scheduler_->Find(seq_id);
  absl::StatusOr<KvExport> exported = ExportKv(*executor_, *kv_, seq_id, seq->token_ids());
  if (!exported.ok()) {
    a.error = exported.status();
    return FinishReason::kError;
  }
  a.kv_export = std::make_shared<const KvExport>(*std::move(exported));
  a.kv_exported = true;
  return FinishReason::kLength;
}

void Engine::StreamPromptKv(SchedulerOutput& out) {
  // K/V of prompt chunks computed this step (no token yet).
  std::vector<std::pair<SeqId, absl::Status>> failures;
  for (const ScheduledSequence& s : out.scheduled) {
    if (s.samples) continue;
    ActiveRequest& a = *active_.at(s.seq_id);
    if (!a.stream_kv_export || a.finish.has_value()) continue;
    if (absl::Status st = StreamKv(a, s.seq_id, s.start_position + s.num_tokens); !st.ok()) {
      failures.emplace_back(s.seq_id, std::move(st));
    }
  }
  // A failed copy (device error) ends that request; the others go on.
  for (auto& [id, st] : failures) DropFromStep(out, id, st);
}

absl::Status Engine::StreamKv(ActiveRequest& a, SeqId seq_id, int64_t end) {
  if (end <= a.kv_streamed) return absl::OkStatus();
  KvChunkEvent chunk;
  chunk.begin = a.kv_streamed;
  chunk.end = end;
  if (a.kv_export_on_device) {
    TANDEM_ASSIGN_OR_RETURN(chunk.device,
                            ReadKvRangeToDevice(*executor_, *kv_, seq_id, chunk.begin, chunk.end));
  } else {
    TANDEM_RETURN_IF_ERROR(
        ReadKvRange(*executor_, *kv_, seq_id, chunk.begin, chunk.end, &chunk.bytes));
  }
  a.kv_streamed = end;
  a.stream->Push(std::move(chunk));
  return absl::OkStatus();
}

void Engine::MirrorQueueStats() {
  stats_.num_running = scheduler_->num_running();
  stats_.num_waiting = scheduler_->num_waiting();
  stats_.num_blocks_used = kv_->num_blocks() - kv_->num_free_blocks();
}

void Engine::Publish() {
  {
    absl::MutexLock lock(&mu_);
    // Requests still in inbox_ were counted by Submit and are not in the
    // scheduler yet.
    int64_t inbox_tokens = 0;
    for (const Pending& p : inbox_) inbox_tokens += p.seq->num_tokens();
    num_waiting_ = scheduler_->num_waiting() + static_cast<int64_t>(inbox_.size());
    num_waiting_tokens_ = scheduler_->num_waiting_tokens() + inbox_tokens;
    MirrorQueueStats();
    stats_.num_prefix_cache_query_tokens = kv_->prefix_cache_stats().num_query_tokens;
    stats_.num_prefix_cache_hit_tokens = kv_->prefix_cache_stats().num_hit_tokens;
    stats_.num_preemptions = scheduler_->num_preemptions();
    stats_.num_steps = runner_->num_steps();
    stats_.num_computed_tokens = runner_->num_computed_tokens();
    stats_.num_generated_tokens = num_generated_tokens_;
    stats_.spec = spec_stats_;
    stats_.num_finished = num_finished_;
    stats_.integrity = integrity_;
    published_steps_.insert(published_steps_.end(), step_records_.begin(), step_records_.end());
    while (published_steps_.size() > kMaxStepRecords) {
      published_steps_.pop_front();
      ++stats_.num_step_records_dropped;
    }
  }
  step_records_.clear();
  for (auto& [stream, finish] : finished_events_) stream->Push(std::move(finish));
  finished_events_.clear();
}

}  // namespace tandem::engine
