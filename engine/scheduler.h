// Continuous-batching scheduler (vLLM v1 style).
//
// A step is Schedule() -> SchedulerOutput -> (model runs the batch, the
// caller samples and checks stops) -> Update(). There is no prefill or decode
// phase: each step gives sequences tokens so num_computed_tokens catches up
// with num_tokens, within max_num_batched_tokens tokens per step:
//   1. running sequences in admission order (decodes and continuing chunked
//      prefills); when one cannot get a block, the newest running sequence is
//      preempted by recompute (blocks freed, num_computed_tokens = 0, back to
//      the FRONT of the waiting queue; its output so far is recomputed too),
//      repeatedly, possibly itself;
//   2. then, if nobody was preempted this step, waiting sequences in FIFO
//      order while the token budget, max_num_seqs and free blocks allow; a
//      prefix-cache hit reduces the tokens to compute. Admission stops at the
//      first one that does not fit (no overtaking).
//
// Update() advances num_computed_tokens by what was scheduled, appends the
// token sampled for each sequence that reached num_tokens, and finishes those
// the caller says are finished, freeing their blocks at once so the next
// Schedule() can admit waiting sequences into them.
//
// Speculative decoding (num_speculative_tokens > 0 and a proposer set): a
// running sequence in its decode phase (one uncomputed token) gets up to k
// draft tokens from the proposer; the step runs [last token, d1..dk] as one
// chunk (the lookahead's blocks are allocated like any other tokens), the
// caller verifies the drafts against the target's logits and reports the
// accepted drafts plus one sampled token. Update() appends them and sets
// num_computed_tokens to cover the last token and the accepted drafts only:
// the rejected drafts' K/V slots are simply overwritten later. A sequence
// whose drafts keep being rejected backs off (skips proposing for 1, 2, 4,
// ... up to 16 steps), so speculation that does not pay is turned down.
// A request's SamplingParams::num_speculative_tokens lowers k (0 = off).
//
// A BatchProposer (the draft model, engine/spec/draft_proposer.h) is asked
// once per step, after the running sequences are scheduled, for all the
// sequences that want drafts together; it returns exactly the k drafts asked
// (fewer only on failure) with the draft's distribution q per draft. Its
// Release() is called whenever a sequence leaves the running set (finished,
// cancelled, preempted), so it can free the sequence's draft state. With a
// BatchProposer the drafts are attached to whichever step samples the
// sequence, whatever its chunk (one decode token, or the tail of a
// recompute after preemption), except the first output token (never
// drafted, as on a prefill worker). For a sampled request (temperature > 0)
// the number of drafts then depends on the sequence's own state alone,
// never on chunking or what else is in the step: when the step's remaining
// budget cannot hold the chunk and k drafts, the chunk stops one token short
// (or, at one token, the sequence waits for the next step) instead of
// drafting fewer, since with a draft distribution q the tokens drawn depend
// on where drafts were verified.
//
// Thread safety: none; the engine thread owns it. The KvCacheManager is not
// owned and must outlive the Scheduler; the Scheduler is its only mutator.
#ifndef TANDEM_ENGINE_SCHEDULER_H_
#define TANDEM_ENGINE_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/kv_cache_manager.h"
#include "engine/sequence.h"

namespace tandem::engine {

inline constexpr int64_t kMaxSpeculativeTokens = kMaxRequestSpecTokens;

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 512;  // token budget of one step
  int64_t max_num_seqs = 64;             // running sequences at most
  int64_t max_waiting_requests = 1024;   // AddRequest -> ResourceExhausted beyond
  int64_t max_waiting_tokens = 1 << 20;  // sum of num_tokens in the waiting queue
  bool enable_chunked_prefill = true;
  // > 0: a sequence gets at most this many tokens per step (so one long
  // prompt cannot take the whole budget); 0 = off.
  int64_t long_prefill_token_threshold = 0;
  // Speculative decoding: draft tokens per step and sequence at most (0 = off;
  // also needs Scheduler::set_proposer).
  int64_t num_speculative_tokens = 0;

  // InvalidArgument naming the field when out of range.
  absl::Status Validate() const;
};

// One sequence's share of a step: tokens [start_position, start_position +
// num_tokens) of its token_ids() are computed this step.
struct ScheduledSequence {
  SeqId seq_id = 0;
  int64_t start_position = 0;  // == num_computed_tokens at Schedule()
  int64_t num_tokens = 0;      // >= 1
  // True when this step reaches num_tokens(): the caller computes logits for
  // the last scheduled token and samples one token for the sequence.
  bool samples = false;
  // Speculative decoding: the last num_spec_tokens of token_ids are draft
  // tokens (not in the sequence); the caller computes logits for the last
  // num_spec_tokens + 1 positions and verifies the drafts.
  int64_t num_spec_tokens = 0;
  // The draft model's distribution of each draft, [num_spec_tokens, vocab]
  // row major, when the drafts were sampled from one (BatchProposer, sampled
  // requests); empty for deterministic drafts (n-gram, greedy: q one-hot).
  std::vector<float> draft_probs;
  // What the executor needs, so the runner never calls back into the
  // scheduler or the block manager per sequence:
  // token_ids[start_position, start_position + num_tokens) of the sequence,
  std::vector<int32_t> token_ids;
  // and its block table after this step's allocation and copy-on-write
  // (covers start_position + num_tokens tokens; position p lives in slot
  // block_table[p / block_size] * block_size + p % block_size).
  std::vector<int32_t> block_table;
  // The sequence (history and sampling params for the sampler). Valid until
  // the next Update() / Cancel() of the scheduler; null in hand-made outputs.
  const Sequence* seq = nullptr;
  bool operator==(const ScheduledSequence&) const = default;
};

// K/V the caller writes for positions [begin, end) of a sequence admitted
// this step (from Sequence::num_imported_tokens; positions below begin came
// from the prefix cache). Perform before running the step.
struct KvImport {
  SeqId seq_id = 0;
  int64_t begin = 0;
  int64_t end = 0;
  bool operator==(const KvImport&) const = default;
};

struct SchedulerOutput {
  std::vector<ScheduledSequence> scheduled;  // running first, then admitted
  std::vector<SeqId> preempted;              // in preemption order (newest first)
  // Perform in KvCacheStorage, in order, before running the step.
  std::vector<BlockCopy> block_copies;
  std::vector<KvImport> kv_imports;
  int64_t num_batched_tokens = 0;  // sum of scheduled[i].num_tokens

  bool empty() const { return scheduled.empty(); }
};

// What the caller reports for one scheduled sequence after the step.
struct SequenceResult {
  static constexpr int32_t kNoToken = -1;
  SeqId seq_id = 0;
  int32_t token_id = kNoToken;         // sampled token; required when `samples`
  std::optional<FinishReason> finish;  // none = keep going
  // Accepted draft tokens (speculative decoding), appended before token_id.
  std::vector<int32_t> accepted_draft_ids;
};

// A draft source asked once per step for a batch of sequences (a draft
// model). Engine thread only.
class BatchProposer {
 public:
  struct Request {
    const Sequence* seq = nullptr;
    int64_t num_drafts = 0;  // >= 1: drafts wanted after seq's tokens
  };
  struct Proposal {
    std::vector<int32_t> token_ids;  // [<= num_drafts]; fewer only on failure
    std::vector<float> probs;        // [token_ids.size(), vocab] or empty (one-hot)
  };
  virtual ~BatchProposer() = default;
  // One proposal per request, in order.
  virtual std::vector<Proposal> Propose(absl::Span<const Request> requests) = 0;
  // The sequence left the running set (finished, cancelled or preempted):
  // drop its drafting state. No-op when it has none.
  virtual void Release(SeqId seq_id) = 0;
};

class Scheduler {
 public:
  // REQUIRES: config.Validate().ok(); kv outlives the Scheduler.
  Scheduler(const SchedulerConfig& config, KvCacheManager* kv);

  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  const SchedulerConfig& config() const { return config_; }

  // Speculative decoding's draft source: up to max_tokens draft tokens that
  // would follow the sequence's tokens (may return fewer or none).
  using Proposer = std::function<std::vector<int32_t>(const Sequence& seq, int64_t max_tokens)>;
  void set_proposer(Proposer proposer) { proposer_ = std::move(proposer); }
  // A batched draft source instead (not owned; must outlive the Scheduler).
  void set_batch_proposer(BatchProposer* proposer) { batch_proposer_ = proposer; }
  // The most tokens one sequence can hold (the whole KV cache). The caller's
  // stop checks must finish a sequence (kLength) before it grows past this,
  // or it can never be scheduled again.
  int64_t max_num_tokens_per_sequence() const;

  // Queues a new sequence (status kWaiting). ResourceExhausted when the
  // waiting queue is full by requests or tokens; InvalidArgument for an empty
  // prompt, a duplicate id, or a prompt that can never fit in the KV cache
  // (or, without chunked prefill, in one step's budget).
  absl::Status AddRequest(std::unique_ptr<Sequence> seq);

  // Plans one step (see header comment). Empty output when nothing can run.
  SchedulerOutput Schedule();

  // Applies a step's results. `results` has at most one entry per scheduled
  // sequence; entries for sequences cancelled since Schedule() are ignored.
  // REQUIRES: `output` is the latest Schedule()'s; every scheduled sequence
  // with `samples` that is not finished by its result has a token.
  // Returns the sequences that finished this step (blocks already freed).
  std::vector<std::unique_ptr<Sequence>> Update(const SchedulerOutput& output,
                                                absl::Span<const SequenceResult> results);

  // Removes a sequence in any state (waiting, running, mid-prefill), frees its
  // blocks and returns it with status kFinishedAborted. NotFound when unknown.
  // Call between steps, not between Schedule() and the model run (the freed
  // blocks may be reused at once).
  absl::StatusOr<std::unique_ptr<Sequence>> Cancel(SeqId seq_id);

  // nullptr when unknown (finished sequences are handed out by Update).
  const Sequence* Find(SeqId seq_id) const;

  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_waiting_tokens() const { return num_waiting_tokens_; }
  bool has_unfinished() const { return !seqs_.empty(); }
  int64_t num_preemptions() const { return num_preemptions_; }
  // Running ids in admission order; waiting ids front to back. For tests.
  std::vector<SeqId> running_ids() const;
  std::vector<SeqId> waiting_ids() const;

 private:
  ScheduledSequence MakeScheduled(const Sequence& seq, int64_t start, int64_t n) const;
  // Draft tokens for a running sequence in its decode phase ({} when off,
  // backing off, or nothing to propose), at most budget - 1 of them.
  std::vector<int32_t> Drafts(Sequence* seq, int64_t budget);
  // BatchProposer: *n sequence tokens to compute and *num_drafts drafts to
  // verify after them this step; false when the sequence must wait for a
  // step with room for its drafts (sampled).
  // *n comes in as TokensToRun; *backing_off: the step that runs must call
  // SkipDraftStep (only once it is scheduled).
  bool PlanBatchDrafts(const Sequence& seq, int64_t start, int64_t budget, int64_t* n,
                       int64_t* num_drafts, bool* backing_off) const;
  // Asks the BatchProposer for the drafts of out->scheduled[indices[i]] and
  // fills them in; drafts it could not give return to *budget.
  void ProposeBatch(SchedulerOutput* out, const std::vector<size_t>& indices, int64_t* budget);
  // Drafts a sequence may take by its own state (config, request cap,
  // adaptive k, max_tokens, KV capacity); 0 and *backing_off when it is
  // pausing proposals (then the step that samples calls SkipDraftStep).
  int64_t WantedDrafts(const Sequence& seq, bool* backing_off) const;
  void SkipDraftStep(Sequence* seq);
  // batch_indices: entries of out->scheduled that wait for BatchProposer drafts.
  void ScheduleRunning(SchedulerOutput* out, int64_t* budget, std::vector<size_t>* batch_indices);
  void ScheduleWaiting(SchedulerOutput* out, int64_t* budget, std::vector<size_t>* batch_indices);
  // Tokens `seq` may run this step under `budget` (0 = none).
  int64_t TokensToRun(const Sequence& seq, int64_t num_computed, int64_t budget) const;
  void Preempt(Sequence* seq, SchedulerOutput* out);
  void PushWaitingFront(Sequence* seq);
  void Finish(Sequence* seq, FinishReason reason);
  void RemoveFromQueues(Sequence* seq);

  SchedulerConfig config_;
  Proposer proposer_;
  BatchProposer* batch_proposer_ = nullptr;                     // not owned
  KvCacheManager* kv_;                                          // not owned
  absl::flat_hash_map<SeqId, std::unique_ptr<Sequence>> seqs_;  // unfinished
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // admission order; the back is the newest
  int64_t num_waiting_tokens_ = 0;
  int64_t next_arrival_ = 0;
  int64_t num_preemptions_ = 0;
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_SCHEDULER_H_
