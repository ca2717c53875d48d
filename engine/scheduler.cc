#include "engine/scheduler.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::engine {

absl::Status SchedulerConfig::Validate() const {
  if (max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError("max_num_batched_tokens must be >= 1");
  }
  if (max_num_seqs < 1) return absl::InvalidArgumentError("max_num_seqs must be >= 1");
  if (max_waiting_requests < 1) {
    return absl::InvalidArgumentError("max_waiting_requests must be >= 1");
  }
  if (max_waiting_tokens < 1) return absl::InvalidArgumentError("max_waiting_tokens must be >= 1");
  if (long_prefill_token_threshold < 0) {
    return absl::InvalidArgumentError("long_prefill_token_threshold must be >= 0");
  }
  if (num_speculative_tokens < 0 || num_speculative_tokens > kMaxSpeculativeTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_speculative_tokens must be in [0, ", kMaxSpeculativeTokens, "]"));
  }
  return absl::OkStatus();
}

Scheduler::Scheduler(const SchedulerConfig& config, KvCacheManager* kv) : config_(config), kv_(kv) {
  TANDEM_CHECK(config_.Validate().ok());
  TANDEM_CHECK(kv_ != nullptr);
}

int64_t Scheduler::max_num_tokens_per_sequence() const {
  return int64_t{kv_->num_blocks()} * kv_->block_size();
}

absl::Status Scheduler::AddRequest(std::unique_ptr<Sequence> seq) {
  if (seq == nullptr) return absl::InvalidArgumentError("null sequence");
  if (seq->num_tokens() == 0) return absl::InvalidArgumentError("empty prompt");
  if (seqs_.contains(seq->id())) {
    return absl::InvalidArgumentError(absl::StrCat("duplicate sequence id ", seq->id()));
  }
  if (seq->num_tokens() > max_num_tokens_per_sequence()) {
    return absl::InvalidArgumentError(absl::StrCat("prompt of ", seq->num_tokens(),
                                                   " tokens exceeds the KV cache capacity of ",
                                                   max_num_tokens_per_sequence()));
  }
  if (!config_.enable_chunked_prefill && seq->num_tokens() > config_.max_num_batched_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt of ", seq->num_tokens(), " tokens exceeds max_num_batched_tokens ",
                     config_.max_num_batched_tokens, " without chunked prefill"));
  }
  if (num_waiting() >= config_.max_waiting_requests) {
    return absl::ResourceExhaustedError(
        absl::StrCat("waiting queue is full (", config_.max_waiting_requests, " requests)"));
  }
  if (num_waiting_tokens_ + seq->num_tokens() > config_.max_waiting_tokens) {
    return absl::ResourceExhaustedError(
        absl::StrCat("waiting queue is full (", config_.max_waiting_tokens, " tokens)"));
  }
  seq->set_arrival(next_arrival_++);
  seq->set_status(SequenceStatus::kWaiting);
  seq->set_num_computed_tokens(0);
  Sequence* raw = seq.get();
  seqs_.emplace(raw->id(), std::move(seq));
  waiting_.push_back(raw);
  num_waiting_tokens_ += raw->num_tokens();
  return absl::OkStatus();
}

SchedulerOutput Scheduler::Schedule() {
  SchedulerOutput out;
  int64_t budget = config_.max_num_batched_tokens;
  std::vector<size_t> batch_indices;  // entries waiting for BatchProposer drafts
  ScheduleRunning(&out, &budget, &batch_indices);
  // After a preemption the pool is short: admitting now would only thrash.
  if (out.preempted.empty()) ScheduleWaiting(&out, &budget, &batch_indices);
  if (!batch_indices.empty()) ProposeBatch(&out, batch_indices, &budget);
  out.num_batched_tokens = config_.max_num_batched_tokens - budget;
  return out;
}

int64_t Scheduler::TokensToRun(const Sequence& seq, int64_t num_computed, int64_t budget) const {
  int64_t n = seq.num_tokens() - num_computed;
  if (config_.long_prefill_token_threshold > 0) {
    n = std::min(n, config_.long_prefill_token_threshold);
  }
  // Without chunking a prompt runs whole or waits, unless it could never fit
  // in one step (a preempted sequence that grew past the budget).
  if (!config_.enable_chunked_prefill && n > budget && n <= config_.max_num_batched_tokens) {
    return 0;
  }
  return std::max<int64_t>(0, std::min(n, budget));
}

int64_t Scheduler::WantedDrafts(const Sequence& seq, bool* backing_off) const {
  *backing_off = false;
  int64_t limit = config_.num_speculative_tokens;
  if (const std::optional<int64_t> r = seq.sampling_params().num_speculative_tokens) {
    limit = std::min(limit, *r);
  }
  if (limit <= 0) return 0;
  if (seq.spec_skip_steps() > 0) {
    *backing_off = true;
    return 0;
  }
  // Never draft past what the sequence may still emit (max_tokens: the
  // sampled token comes on top of the drafts) or the KV cache could hold.
  // Adaptive k: about one more draft than this sequence has been getting
  // accepted, so a verification step does not pay for drafts that will not
  // stick (on a compute-bound CPU each draft costs about one token).
  const int64_t wanted =
      static_cast<int64_t>(std::ceil(std::min<double>(seq.spec_accept_ema(), double(limit)))) + 1;
  int64_t k = std::min(limit, wanted);
  const std::optional<int64_t> max_tokens = seq.sampling_params().stop.max_tokens;
  if (max_tokens.has_value()) k = std::min(k, *max_tokens - seq.num_output_tokens() - 1);
  k = std::min(k, max_num_tokens_per_sequence() - seq.num_tokens());
  return std::max<int64_t>(k, 0);
}

void Scheduler::SkipDraftStep(Sequence* seq) {
  seq->set_spec_backoff(seq->spec_skip_steps() - 1, seq->spec_misses());
}

std::vector<int32_t> Scheduler::Drafts(Sequence* seq, int64_t budget) {
  if (config_.num_speculative_tokens == 0 || !proposer_) return {};
  if (seq->num_uncomputed_tokens() != 1) return {};  // prefill or replay
  bool backing_off = false;
  const int64_t k = std::min(WantedDrafts(*seq, &backing_off), budget - 1);
  if (backing_off) SkipDraftStep(seq);
  if (k <= 0) return {};
  std::vector<int32_t> drafts = proposer_(*seq, k);
  if (static_cast<int64_t>(drafts.size()) > k) drafts.resize(k);
  return drafts;
}

bool Scheduler::PlanBatchDrafts(const Sequence& seq, int64_t start, int64_t budget, int64_t* n,
                                int64_t* num_drafts, bool* backing_off) const {
  const int64_t rem = seq.num_tokens() - start;
  *num_drafts = 0;
  *backing_off = false;
  // Only a step that samples verifies drafts; the first output token never
  // has any (as on a prefill worker, so colocated and disaggregated agree).
  if (*n != rem || seq.num_output_tokens() == 0) return true;
  // A step of the whole budget can always hold a decode's 1 + k.
  const int64_t k = std::min(WantedDrafts(seq, backing_off), config_.max_num_batched_tokens - 1);
  if (k <= 0) return true;
  if (rem + k <= budget) {
    *num_drafts = k;
    return true;
  }
  if (seq.sampling_params().temperature == 0.0) {  // greedy: any k gives the same tokens
    *num_drafts = std::max<int64_t>(0, budget - rem);
    return true;
  }
  // Sampled: fewer drafts would change the tokens drawn (header), so compute
  // all but the last token now (a recompute after preemption) or wait.
  if (rem > 1) {
    *n = rem - 1;
    return true;
  }
  return false;
}

void Scheduler::ProposeBatch(SchedulerOutput* out, const std::vector<size_t>& indices,
                             int64_t* budget) {
  std::vector<BatchProposer::Request> requests;
  requests.reserve(indices.size());
  for (size_t i : indices) {
    const ScheduledSequence& s = out->scheduled[i];
    requests.push_back({s.seq, s.num_spec_tokens});
  }
  std::vector<BatchProposer::Proposal> proposals = batch_proposer_->Propose(requests);
  TANDEM_CHECK(proposals.size() == requests.size());
  for (size_t j = 0; j < indices.size(); ++j) {
    ScheduledSequence& s = out->scheduled[indices[j]];
    BatchProposer::Proposal& p = proposals[j];
    const int64_t wanted = s.num_spec_tokens;
    const int64_t got = std::min<int64_t>(wanted, static_cast<int64_t>(p.token_ids.size()));
    if (!p.probs.empty() && got > 0) {
      const size_t vocab = p.probs.size() / p.token_ids.size();
      p.probs.resize(static_cast<size_t>(got) * vocab);
      s.draft_probs = std::move(p.probs);
    }
    s.token_ids.insert(s.token_ids.end(), p.token_ids.begin(), p.token_ids.begin() + got);
    s.num_tokens += got - wanted;
    s.num_spec_tokens = got;
    // Slots allocated for missing drafts stay with the sequence (used later).
    *budget += wanted - got;
  }
}

ScheduledSequence Scheduler::MakeScheduled(const Sequence& seq, int64_t start, int64_t n) const {
  ScheduledSequence s;
  s.seq_id = seq.id();
  s.start_position = start;
  s.num_tokens = n;
  s.samples = start + n == seq.num_tokens();
  absl::Span<const int32_t> tokens = seq.token_ids();
  s.token_ids.assign(tokens.begin() + start, tokens.begin() + start + n);
  absl::Span<const int32_t> table = kv_->block_table(seq.id());
  s.block_table.assign(table.begin(), table.end());
  s.seq = &seq;
  return s;
}

void Scheduler::ScheduleRunning(SchedulerOutput* out, int64_t* budget,
                                std::vector<size_t>* batch_indices) {
  const bool batched = batch_proposer_ != nullptr && config_.num_speculative_tokens > 0;
  // running_ shrinks from the back when sequences are preempted; victims are
  // always behind i, so nothing already scheduled is taken back.
  for (size_t i = 0; i < running_.size() && *budget > 0; ++i) {
    Sequence* seq = running_[i];
    const int64_t start = seq->num_computed_tokens();
    std::vector<int32_t> drafts;
    int64_t n = 0;  // sequence tokens to compute
    int64_t num_drafts = 0;
    bool backing_off = false;
    if (batched) {
      n = TokensToRun(*seq, start, *budget);
      if (!PlanBatchDrafts(*seq, start, *budget, &n, &num_drafts, &backing_off)) {
        continue;  // waits for a step with room for its drafts
      }
    } else {
      drafts = Drafts(seq, *budget);
      num_drafts = static_cast<int64_t>(drafts.size());
      n = num_drafts == 0 ? TokensToRun(*seq, start, *budget) : 1;
    }
    if (n == 0) continue;
    bool self_preempted = false;
    while (!kv_->AllocateSlots(seq->id(), start, n + num_drafts, &out->block_copies)) {
      Sequence* victim = running_.back();
      Preempt(victim, out);
      if (victim == seq) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;
    if (backing_off) SkipDraftStep(seq);
    ScheduledSequence s = MakeScheduled(*seq, start, n);
    if (num_drafts > 0) {
      s.num_tokens = n + num_drafts;
      s.num_spec_tokens = num_drafts;
      s.token_ids.insert(s.token_ids.end(), drafts.begin(), drafts.end());
      if (batched) batch_indices->push_back(out->scheduled.size());
    }
    out->scheduled.push_back(std::move(s));
    *budget -= n + num_drafts;
  }
}

void Scheduler::ScheduleWaiting(SchedulerOutput* out, int64_t* budget,
                                std::vector<size_t>* batch_indices) {
  const bool batched = batch_proposer_ != nullptr && config_.num_speculative_tokens > 0;
  while (!waiting_.empty() && *budget > 0 && num_running() < config_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    const int64_t cached = kv_->FindCachedPrefix(seq->token_ids(), seq->extra_key());
    // Imported K/V costs blocks but no compute budget.
    const int64_t start = std::max(cached, seq->num_imported_tokens());
    int64_t n = TokensToRun(*seq, start, *budget);
    if (n == 0) break;
    // A recomputed (preempted) or handed-off sequence may sample at
    // admission: drafts as for a running one.
    int64_t num_drafts = 0;
    bool backing_off = false;
    if (batched && !PlanBatchDrafts(*seq, start, *budget, &n, &num_drafts, &backing_off)) break;
    if (!kv_->AllocateNew(seq->id(), seq->token_ids(), seq->extra_key(), cached,
                          start - cached + n)) {
      break;
    }
    if (num_drafts > 0 &&
        !kv_->AllocateSlots(seq->id(), start + n, num_drafts, &out->block_copies)) {
      if (seq->sampling_params().temperature > 0.0) {  // all or nothing (see header)
        kv_->Free(seq->id());
        break;
      }
      num_drafts = 0;
    }
    if (backing_off) SkipDraftStep(seq);
    waiting_.pop_front();
    num_waiting_tokens_ -= seq->num_tokens();
    if (start > cached) out->kv_imports.push_back(KvImport{seq->id(), cached, start});
    seq->set_num_imported_tokens(0);
    seq->set_num_computed_tokens(start);
    seq->set_num_cached_tokens(cached);
    seq->set_status(SequenceStatus::kRunning);
    running_.push_back(seq);
    ScheduledSequence s = MakeScheduled(*seq, start, n);
    if (num_drafts > 0) {
      s.num_tokens = n + num_drafts;
      s.num_spec_tokens = num_drafts;
      batch_indices->push_back(out->scheduled.size());
    }
    out->scheduled.push_back(std::move(s));
    *budget -= n + num_drafts;
  }
}

void Scheduler::Preempt(Sequence* seq, SchedulerOutput* out) {
  TANDEM_CHECK(!running_.empty() && running_.back() == seq);
  running_.pop_back();
  kv_->Free(seq->id());
  if (batch_proposer_ != nullptr) batch_proposer_->Release(seq->id());
  seq->set_num_computed_tokens(0);
  seq->set_num_cached_tokens(0);
  seq->set_status(SequenceStatus::kPreempted);
  seq->count_preemption();
  ++num_preemptions_;
  PushWaitingFront(seq);
  out->preempted.push_back(seq->id());
}

void Scheduler::PushWaitingFront(Sequence* seq) {
  waiting_.push_front(seq);
  num_waiting_tokens_ += seq->num_tokens();
}

std::vector<std::unique_ptr<Sequence>> Scheduler::Update(const SchedulerOutput& output,
                                                         absl::Span<const SequenceResult> results) {
  absl::flat_hash_map<SeqId, const SequenceResult*> by_id;
  for (const SequenceResult& r : results) by_id[r.seq_id] = &r;
  std::vector<std::unique_ptr<Sequence>> finished;
  for (const ScheduledSequence& s : output.scheduled) {
    auto it = seqs_.find(s.seq_id);
    if (it == seqs_.end()) continue;  // cancelled since Schedule()
    Sequence* seq = it->second.get();
    TANDEM_CHECK(seq->status() == SequenceStatus::kRunning);
    TANDEM_CHECK(seq->num_computed_tokens() == s.start_position);
    auto r = by_id.find(s.seq_id);
    const SequenceResult* result = r == by_id.end() ? nullptr : r->second;
    // Points into `results` (which outlives this loop); null: keep going.
    const FinishReason* reason =
        result != nullptr && result->finish.has_value() ? &*result->finish : nullptr;
    // Computed: the scheduled tokens except drafts, plus the drafts accepted
    // (their K/V was written this step and they are now the sequence's).
    int64_t accepted = 0;
    if (s.samples && result != nullptr && result->token_id != SequenceResult::kNoToken) {
      accepted = static_cast<int64_t>(result->accepted_draft_ids.size());
      TANDEM_CHECK(accepted <= s.num_spec_tokens);
      for (int32_t id : result->accepted_draft_ids) seq->AppendToken(id);
      seq->AppendToken(result->token_id);
    } else {
      // A sequence that reached num_tokens must either grow or finish.
      TANDEM_CHECK(!s.samples || reason != nullptr);
    }
    seq->set_num_computed_tokens(s.start_position + s.num_tokens - s.num_spec_tokens + accepted);
    kv_->MarkComputed(seq->id(), seq->token_ids(), seq->num_computed_tokens());
    if (s.num_spec_tokens > 0) {
      // Back-off: a draft with nothing accepted doubles the pause (1, 2, 4,
      // ... 16 steps) before the next proposal; any acceptance resets it.
      const int64_t misses = accepted == 0 ? seq->spec_misses() + 1 : 0;
      const double ema = seq->spec_accept_ema() > 1e8
                             ? double(accepted)
                             : 0.7 * seq->spec_accept_ema() + 0.3 * accepted;
      seq->set_spec_accept_ema(ema);
      seq->set_spec_backoff(misses == 0 ? 0 : std::min<int64_t>(16, int64_t{1} << (misses - 1)),
                            misses);
    }
    if (reason != nullptr) {
      Finish(seq, *reason);
      finished.push_back(std::move(it->second));
      seqs_.erase(it);
    }
  }
  return finished;
}

void Scheduler::RemoveFromQueues(Sequence* seq) {
  if (auto it = std::find(running_.begin(), running_.end(), seq); it != running_.end()) {
    running_.erase(it);
  }
  if (auto it = std::find(waiting_.begin(), waiting_.end(), seq); it != waiting_.end()) {
    waiting_.erase(it);
    num_waiting_tokens_ -= seq->num_tokens();
  }
}

void Scheduler::Finish(Sequence* seq, FinishReason reason) {
  RemoveFromQueues(seq);
  kv_->Free(seq->id());
  if (batch_proposer_ != nullptr) batch_proposer_->Release(seq->id());
  seq->set_status(FinishedStatus(reason));
}

absl::StatusOr<std::unique_ptr<Sequence>> Scheduler::Cancel(SeqId seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("no unfinished sequence ", seq_id));
  }
  Finish(it->second.get(), FinishReason::kCancelled);
  std::unique_ptr<Sequence> seq = std::move(it->second);
  seqs_.erase(it);
  return seq;
}

const Sequence* Scheduler::Find(SeqId seq_id) const {
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

std::vector<SeqId> Scheduler::running_ids() const {
  std::vector<SeqId> ids;
  for (const Sequence* s : running_) ids.push_back(s->id());
  return ids;
}

std::vector<SeqId> Scheduler::waiting_ids() const {
  std::vector<SeqId> ids;
  for (const Sequence* s : waiting_) ids.push_back(s->id());
  return ids;
}

}  // namespace tandem::engine
