// The inference engine: a continuous-batching step loop on one thread, behind
// a thread-safe request API. This is what services/* and the CLI build on.
//
//   auto engine = Engine::Create(config);          // loads the model, sizes the KV cache
//   auto handle = (*engine)->Submit(request);      // any thread
//   while (auto ev = (*handle)->Next()) { ... }    // TokenEvent..., FinishEvent
//   (*engine)->Cancel(*handle);                    // any thread, any time
//
// The engine thread runs Schedule() -> ModelRunner::Execute ->
// Scheduler::Update; it sleeps on a condition variable when there is nothing
// to run and wakes on Submit, Cancel and Shutdown. Each sampled token goes
// through the request's StreamingDetokenizer and StopChecker and out as a
// TokenEvent; a finished request's blocks are freed before its FinishEvent is
// pushed (so Stats() seen after a FinishEvent no longer counts them).
//
// Determinism: a request's tokens (and logprobs) depend only on its prompt,
// params and seed: not on the batch it runs in, chunking, prefix-cache hits or
// preemption (the model's batch invariance plus the (seed, position) RNG).
//
// Thread safety: Submit, Cancel, Stats and Shutdown may be called from any
// thread. Event callbacks run on the engine thread and must not block.
#ifndef TANDEM_ENGINE_ENGINE_H_
#define TANDEM_ENGINE_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/gguf/gguf.h"
#include "common/thread_pool.h"
#include "common/tokenizer/tokenizer.h"
#include "engine/executor.h"
#include "engine/kv_cache.h"
#include "engine/kv_cache_manager.h"
#include "engine/llama_model.h"
#include "engine/model_runner.h"
#include "engine/output_processor.h"
#include "engine/request_stream.h"
#include "engine/scheduler.h"
#include "engine/spec/draft_proposer.h"

namespace tandem::engine {

inline constexpr int64_t kDefaultKvCacheMemoryBytes = int64_t{1} << 30;  // 1 GiB

// Speculative decoding (docs/speculative.md).
struct SpecDecodeConfig {
  enum class Method { kOff, kNgram, kDraft };
  Method method = Method::kOff;
  int64_t num_tokens = 4;  // drafts per step and sequence at most, 1..16
  // n-gram (prompt lookup): suffix lengths tried, longest first.
  int64_t ngram_min = 1;
  int64_t ngram_max = 4;
  // draft: a second GGUF with the target's vocabulary (checked at Create:
  // InvalidArgument naming both sizes / the first differing token), loaded
  // with draft_kernels; or, instead of the path, a loaded model (not owned,
  // must outlive the engine; tests). Its KV cache holds as many tokens as the
  // target's plus each running sequence's lookahead, at the target's dtype.
  std::string draft_model_path;
  KernelMode draft_kernels = KernelMode::kFastInt8;
  const LlamaModel* draft_model = nullptr;
  // Overrides the method's proposer when set (tests, experiments).
  Scheduler::Proposer proposer;
};

// The KV dtype when none is asked for: f16 on the CPU (same greedy output as
// f32 on the goldens, half the bytes; docs/kv_cache.md), f32 on CUDA (the
// only dtype the CUDA executor holds).
KvDtype DefaultKvDtype(Device device);

// "off" / "ngram" / "draft"; false on anything else.
bool ParseSpecMethod(const std::string& s, SpecDecodeConfig::Method* method);

struct EngineConfig {
  std::string model_path;  // GGUF file; used by Create(config) only
  // KV cache size: num_kv_blocks when > 0, else as many blocks as fit in
  // the budget at the KV dtype's bytes per token. The budget is
  // kv_cache_memory_fraction (in (0, 1]) of the memory free where the cache
  // lives, measured at Create with the model's weights counted out
  // (FreeMemoryForKv: MemAvailable on the CPU, free device memory less the
  // weights' device bytes on CUDA) when that is > 0, else
  // kv_cache_memory_bytes.
  int64_t kv_cache_memory_bytes = kDefaultKvCacheMemoryBytes;
  double kv_cache_memory_fraction = 0;
  int64_t num_kv_blocks = 0;
  int32_t block_size = 16;
  // Element type of the KV cache (kernels/kv_dtype.h); unset: the device's
  // default, DefaultKvDtype(device).
  std::optional<KvDtype> kv_cache_dtype;
  // Where steps run (engine/executor.h); the KV cache lives there.
  Device device = Device::kCpu;
  bool enable_prefix_caching = true;
  SchedulerConfig scheduler;
  SpecDecodeConfig spec;
  int num_threads = 0;   // compute threads for Create(config); 0 = all cores
  bool prefault = true;  // Create(config): touch all weight pages at load
  // Run KvCacheManager::CheckIntegrity after every step (tests); the first
  // failure shows in EngineStats::integrity.
  bool check_integrity_every_step = false;

  // InvalidArgument naming the field.
  absl::Status Validate() const;
  // kv_cache_dtype, or DefaultKvDtype(device) when unset.
  KvDtype kv_dtype() const { return kv_cache_dtype.value_or(DefaultKvDtype(device)); }
};

struct EngineStats {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t num_blocks_used = 0;
  int64_t num_blocks_total = 0;
  int64_t num_prefix_cache_query_tokens = 0;
  int64_t num_prefix_cache_hit_tokens = 0;
  int64_t num_preemptions = 0;
  int64_t num_steps = 0;
  int64_t num_computed_tokens = 0;   // tokens run through the model
  int64_t num_generated_tokens = 0;  // tokens sampled
  int64_t num_finished = 0;          // requests ended, any reason
  // Speculative decoding: steps that verified drafts, drafts proposed and
  // accepted in all, and how often the i-th draft of a step was accepted.
  struct Spec {
    int64_t num_drafts = 0;
    int64_t num_draft_tokens = 0;
    int64_t num_accepted_tokens = 0;
    std::vector<int64_t> accepted_per_position;
  } spec;
  absl::Status integrity;  // see check_integrity_every_step
  // Step records dropped because nobody took them (see TakeStepRecords).
  int64_t num_step_records_dropped = 0;
};

// One engine step that ran the model, for per-step histograms
// (tandem_iteration_tokens, tandem_batch_size).
struct StepRecord {
  int32_t num_tokens = 0;     // tokens run through the model (prefill chunks + decodes + drafts)
  int32_t num_sequences = 0;  // sequences in the batch
  double seconds = 0;         // Schedule to the step's tokens streamed and finished requests out
};

enum class ShutdownMode {
  kCancel,  // outstanding requests finish with kCancelled
  kDrain,   // outstanding requests run to completion first
};

class Engine {
 public:
  // Loads config.model_path (GGUF: tokenizer + model) and starts the engine.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineConfig& config);

  // Starts an engine on a loaded model (not owned; must outlive the engine).
  // tokenizer may be null: events then carry ids only and no EOS is known
  // besides stop_token_ids. config.model_path and num_threads are ignored.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineConfig& config,
                                                        const LlamaModel* model,
                                                        const tokenizer::Tokenizer* tokenizer);

  // Shutdown(kCancel).
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. InvalidArgument for an empty prompt, ids outside the
  // vocabulary, invalid params, or a prompt that cannot fit (context length,
  // KV cache, or alone more than max_waiting_tokens); ResourceExhausted when
  // the waiting queue is full (requests or tokens); FailedPrecondition after
  // Shutdown.
  absl::StatusOr<RequestHandle> Submit(EngineRequest request);

  // Ends the request at its next step boundary with FinishEvent kCancelled
  // and frees its blocks. No-op when it already finished.
  void Cancel(const RequestHandle& handle);

  EngineStats Stats() const;

  // The steps run since the previous call, oldest first. Steps are recorded
  // only once this has been called (a process that never asks keeps none),
  // and at most kMaxStepRecords wait between calls: older ones are dropped
  // and counted in EngineStats::num_step_records_dropped.
  static constexpr size_t kMaxStepRecords = 1 << 16;
  std::vector<StepRecord> TakeStepRecords();

  // Stops the loop and joins the engine thread. Idempotent.
  void Shutdown(ShutdownMode mode = ShutdownMode::kCancel);

  // KV bookkeeping check: manager integrity, no sequence left, every block
  // free. REQUIRES: after Shutdown().
  absl::Status CheckIntegrity() const;

  // "KV cache: 46080 B/token, ... blocks x 16 tokens = ... tokens (...)".
  const std::string& kv_cache_description() const { return kv_description_; }
  int64_t kv_bytes_per_token() const { return kv_bytes_per_token_; }
  // The executor's one-line description ("cpu: 2 threads, ...").
  const std::string& executor_description() const { return executor_description_; }
  // Executor::kv_memory_domain() ("cpu", "cuda:0"): where a request's
  // kv_export_on_device chunks live and what an import's device payload must be in.
  const std::string& kv_memory_domain() const { return kv_memory_domain_; }
  // --spec-method draft: "draft model: <path>, ..." (empty otherwise).
  const std::string& draft_description() const { return draft_description_; }
  const LlamaModel& model() const { return *model_; }
  const tokenizer::Tokenizer* tokenizer() const { return tokenizer_; }

 private:
  struct Owned;          // model, tokenizer, file, pool of Create(config)
  struct DraftOwned;     // the draft model's file, pool and model (draft_model_path)
  struct ActiveRequest;  // engine-thread state of one request
  struct Pending {
    std::unique_ptr<Sequence> seq;
    RequestHandle stream;
    absl::Time submit_time;
    bool export_kv = false;
    bool stream_kv_export = false;
    std::shared_ptr<const KvExport> import_kv;
    int64_t num_prefix_output_tokens = 0;
    bool kv_export_on_device = false;
  };

  Engine(const EngineConfig& config, const LlamaModel* model,
         const tokenizer::Tokenizer* tokenizer);
  absl::Status Init();
  // --spec-method draft: loads (or takes) the draft model, checks its
  // vocabulary against the target's and creates draft_.
  absl::Status InitDraft(int64_t num_blocks);
  absl::Status ValidateRequest(const EngineRequest& request) const;

  // Engine thread.
  void Loop();
  void Admit(std::vector<Pending> submits);
  void ApplyCancels(const std::vector<int64_t>& ids);
  void CancelAll();
  // One engine step: Schedule -> Execute -> Update, in the named parts below.
  void Step();
  // Queue time and cached tokens of requests scheduled for the first time.
  void MarkScheduled(const SchedulerOutput& out);
  // Writes imported K/V (the decode side of a handoff) before the step.
  void ImportScheduledKv(SchedulerOutput& out);
  // Marks the step's requests (cancels mid-step abort it) and mirrors stats.
  void BeginStep(const SchedulerOutput& out);
  // Emits one sequence's accepted drafts and sampled token; decides its finish.
  SequenceResult ProcessSampled(SampledToken& t, absl::Time done);
  void RecordSpecStats(int64_t num_drafts, int64_t num_accepted);
  // Prefill-only requests after their first token: kLength once the K/V is
  // out (streamed or whole), kError (a.error set) if that failed.
  FinishReason ExportAfterFirstToken(ActiveRequest& a, SeqId seq_id);
  // Streamed exports: pushes the K/V of prompt chunks computed this step.
  void StreamPromptKv(SchedulerOutput& out);
  // Ends `seq_id` with `error` and takes it out of this step's output.
  void DropFromStep(SchedulerOutput& out, SeqId seq_id, const absl::Status& error);
  void FinishRequest(int64_t id, const Sequence* seq, FinishReason reason, absl::Status status,
                     std::string tail_text);
  void Publish();  // stats mirror, then the deferred FinishEvents
  // Running / waiting requests and blocks in use into stats_.
  void MirrorQueueStats() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // stream_kv_export: pushes a KvChunkEvent with the K/V of tokens
  // [a.kv_streamed, end) of seq_id (nothing when end <= kv_streamed).
  absl::Status StreamKv(ActiveRequest& a, SeqId seq_id, int64_t end);

  EngineConfig config_;
  std::unique_ptr<Owned> owned_;
  const LlamaModel* model_;
  const tokenizer::Tokenizer* tokenizer_;
  std::vector<int32_t> eos_token_ids_;
  int64_t kv_bytes_per_token_ = 0;
  std::string kv_description_;
  std::string executor_description_;
  std::string kv_memory_domain_;

  // Engine thread only (and the caller after Shutdown).
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<KvCacheManager> kv_;
  std::unique_ptr<DraftOwned> draft_owned_;
  std::unique_ptr<spec::DraftProposer> draft_;  // --spec-method draft
  std::string draft_description_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  absl::flat_hash_map<int64_t, std::unique_ptr<ActiveRequest>> active_;
  std::vector<std::pair<RequestHandle, FinishEvent>> finished_events_;
  int64_t num_generated_tokens_ = 0;
  EngineStats::Spec spec_stats_;
  int64_t num_finished_ = 0;
  absl::Status integrity_;

  mutable absl::Mutex mu_;
  absl::CondVar wake_;
  std::vector<Pending> inbox_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> cancels_ ABSL_GUARDED_BY(mu_);
  // The requests of the step being run, and those of them cancelled since it
  // started: when all are, abort_step_ stops the step between layers.
  absl::flat_hash_set<int64_t> step_ids_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<int64_t> step_cancelled_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> abort_step_{false};
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Waiting requests / tokens: the scheduler's after the last step plus
  // those moved from inbox_ since (so Submit sees a bound, never an undercount).
  int64_t num_waiting_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t num_waiting_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  ShutdownMode shutdown_mode_ ABSL_GUARDED_BY(mu_) = ShutdownMode::kCancel;
  EngineStats stats_ ABSL_GUARDED_BY(mu_);
  // TakeStepRecords: steps since its last call, once it has been called.
  std::atomic<bool> record_steps_{false};
  std::vector<StepRecord> step_records_;  // engine thread: this loop turn's
  std::deque<StepRecord> published_steps_ ABSL_GUARDED_BY(mu_);
  absl::Mutex join_mu_;  // serializes Shutdown callers
  std::thread thread_;
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_ENGINE_H_
