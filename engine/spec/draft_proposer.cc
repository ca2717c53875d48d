#include "engine/spec/draft_proposer.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/model_runner.h"

namespace tandem::engine::spec {

struct DraftProposer::Work {
  size_t index = 0;  // into the requests / proposals
  const Sequence* seq = nullptr;
  SeqState* state = nullptr;
  int64_t num_drafts = 0;        // wanted
  int64_t next = 0;              // next position to run in the catch-up
  std::vector<int32_t> history;  // the sequence's tokens, then the drafts so far
  Proposal* proposal = nullptr;
  bool ok = false;
};

DraftProposer::DraftProposer(const LlamaModel* model, const DraftProposerOptions& options)
    : options_(options), vocab_size_(model->config().vocab_size) {}

absl::StatusOr<std::unique_ptr<DraftProposer>> DraftProposer::Create(
    const LlamaModel* model, const DraftProposerOptions& options) {
  TANDEM_CHECK(model != nullptr);
  if (options.num_blocks < 1 || options.num_blocks > INT32_MAX || options.block_size < 1 ||
      options.max_batch_tokens < 1) {
    return absl::InvalidArgumentError("draft proposer: bad KV cache or batch size");
  }
  std::unique_ptr<DraftProposer> p(new DraftProposer(model, options));
  ExecutorOptions eo;
  eo.device = options.device;
  eo.num_blocks = options.num_blocks;
  eo.block_size = options.block_size;
  eo.kv_dtype = options.kv_dtype;
  TANDEM_ASSIGN_OR_RETURN(p->executor_, MakeExecutor(model, eo));
  p->kv_ = std::make_unique<KvCacheManager>(static_cast<int32_t>(options.num_blocks),
                                            options.block_size, /*enable_prefix_caching=*/false);
  p->description_ = absl::StrCat(options.num_blocks, " KV blocks x ", options.block_size,
                                 " tokens, ", p->executor_->Describe());
  return p;
}

void DraftProposer::Release(SeqId seq_id) {
  kv_->Free(seq_id);
  seqs_.erase(seq_id);
}

absl::Status DraftProposer::CheckIntegrity(bool idle) const {
  TANDEM_RETURN_IF_ERROR(kv_->CheckIntegrity());
  if (idle && (!seqs_.empty() || kv_->num_sequences() != 0 || num_used_blocks() != 0)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "draft proposer holds ", seqs_.size(), " sequences and ", num_used_blocks(), " blocks"));
  }
  return absl::OkStatus();
}

bool DraftProposer::Prepare(Work* w, absl::Span<const Request> requests) {
  const Sequence& seq = *w->seq;
  const SeqId id = seq.id();
  const int64_t n = seq.num_tokens();
  SeqState& st = seqs_[id];
  w->state = &st;
  // Rollback: keep the longest prefix of what the draft computed that is the
  // sequence's own, and at most n - 1 tokens (the last one is run for logits).
  const absl::Span<const int32_t> tokens = seq.token_ids();
  const int64_t limit = std::min<int64_t>(static_cast<int64_t>(st.tokens.size()), n - 1);
  int64_t m = std::min(st.num_verified, limit);
  while (m < limit && st.tokens[m] == tokens[m]) ++m;
  st.tokens.resize(m);
  st.num_verified = m;
  w->next = m;
  // K/V for positions [0, n - 1 + k): the sequence, then drafts 1 .. k - 1.
  const int64_t total = n - 1 + w->num_drafts;
  auto allocate = [&] {
    if (!kv_->Contains(id) && !kv_->AllocateNew(id, tokens, 0, 0, 1)) return false;
    std::vector<BlockCopy> copies;  // none: prefix caching is off
    return kv_->AllocateSlots(id, m, total - m, &copies);
  };
  if (allocate()) return true;
  // Evict sequences not drafting now; they catch up when they next draft.
  absl::flat_hash_set<SeqId> wanted;
  for (const Request& r : requests) wanted.insert(r.seq->id());
  std::vector<SeqId> idle;
  for (const auto& [other, unused] : seqs_) {
    if (!wanted.contains(other)) idle.push_back(other);
  }
  std::sort(idle.begin(), idle.end());
  for (SeqId other : idle) {
    Release(other);
    if (allocate()) return true;
  }
  return false;
}

absl::Status DraftProposer::Run(const SchedulerOutput& out, std::vector<float>* logits) {
  ForwardBatch batch = ModelRunner::BuildBatch(out, options_.block_size);
  logits->resize(batch.logits_indices.size() * vocab_size_);
  num_forward_tokens_ += batch.num_tokens();
  return executor_->Forward(batch, logits->data());
}

void DraftProposer::Choose(Work* w, absl::Span<const float> logits) {
  const Sequence& seq = *w->seq;
  const SamplingParams& params = seq.sampling_params();
  const SamplingContext context{.token_ids = w->history,
                                .num_prompt_tokens = seq.num_prompt_tokens(),
                                .eos_token_ids = options_.eos_token_ids};
  absl::Span<const float> x = logits;
  if (NeedsProcessing(params, context)) {
    ProcessLogits(logits, params, context, &processed_);
    x = processed_;
  }
  const int64_t position = static_cast<int64_t>(w->history.size());
  int32_t token = 0;
  if (params.temperature == 0.0) {
    token = Argmax(x);
  } else {
    sampler_.Candidates(x, params, &ids_, &probs_);
    std::vector<float>& q = w->proposal->probs;
    const size_t row = q.size();
    q.resize(row + vocab_size_, 0.0f);
    for (size_t i = 0; i < ids_.size(); ++i) q[row + ids_[i]] = static_cast<float>(probs_[i]);
    // Inverse CDF in id order over q as stored (float), so the draft is
    // exactly a draw from the q the verifier sees.
    double total = 0.0;
    for (int64_t i = 0; i < vocab_size_; ++i) total += q[row + i];
    const double target =
        CounterUniform(params.seed ^ kDraftSalt, static_cast<uint64_t>(position)) * total;
    double cum = 0.0;
    token = -1;
    for (int64_t i = 0; i < vocab_size_; ++i) {
      if (q[row + i] <= 0.0f) continue;
      token = static_cast<int32_t>(i);
      cum += q[row + i];
      if (target < cum) break;
    }
    TANDEM_CHECK(token >= 0);
  }
  w->proposal->token_ids.push_back(token);
  w->history.push_back(token);
}

absl::Status DraftProposer::CatchUp(std::vector<Work>& work, std::vector<float>* logits) {
  // Catch-up, chunked like prefill; the chunk reaching a sequence's end gives
  // its first draft.
  for (bool more = true; more;) {
    more = false;
    SchedulerOutput out;
    std::vector<Work*> sampled;
    int64_t budget = options_.max_batch_tokens;
    for (Work& w : work) {
      const int64_t end = w.seq->num_tokens();
      if (w.next >= end) continue;
      const int64_t t = std::min(end - w.next, budget);
      if (t == 0) {
        more = true;
        continue;
      }
      ScheduledSequence s;
      s.seq_id = w.seq->id();
      s.start_position = w.next;
      s.num_tokens = t;
      s.samples = w.next + t == end;
      s.token_ids.assign(w.history.begin() + w.next, w.history.begin() + w.next + t);
      const absl::Span<const int32_t> table = kv_->block_table(s.seq_id);
      s.block_table.assign(table.begin(), table.end());
      w.state->tokens.insert(w.state->tokens.end(), s.token_ids.begin(), s.token_ids.end());
      w.next += t;
      budget -= t;
      if (s.samples) sampled.push_back(&w);
      if (w.next < end) more = true;
      out.scheduled.push_back(std::move(s));
    }
    if (out.scheduled.empty()) break;
    TANDEM_RETURN_IF_ERROR(Run(out, logits));
    for (size_t j = 0; j < sampled.size(); ++j) {
      Choose(sampled[j], absl::MakeConstSpan(*logits).subspan(j * vocab_size_, vocab_size_));
    }
  }
  return absl::OkStatus();
}

absl::Status DraftProposer::DraftSteps(std::vector<Work>& work, std::vector<float>* logits) {
  // Drafts 2 .. k: one token per sequence and forward, each feeding the last.
  while (true) {
    SchedulerOutput out;
    std::vector<Work*> stepping;
    for (Work& w : work) {
      const int64_t have = static_cast<int64_t>(w.proposal->token_ids.size());
      if (have >= w.num_drafts) continue;
      ScheduledSequence s;
      s.seq_id = w.seq->id();
      s.start_position = static_cast<int64_t>(w.history.size()) - 1;
      s.num_tokens = 1;
      s.samples = true;
      s.token_ids = {w.history.back()};
      const absl::Span<const int32_t> table = kv_->block_table(s.seq_id);
      s.block_table.assign(table.begin(), table.end());
      w.state->tokens.push_back(w.history.back());
      stepping.push_back(&w);
      out.scheduled.push_back(std::move(s));
    }
    if (out.scheduled.empty()) break;
    TANDEM_RETURN_IF_ERROR(Run(out, logits));
    for (size_t j = 0; j < stepping.size(); ++j) {
      Choose(stepping[j], absl::MakeConstSpan(*logits).subspan(j * vocab_size_, vocab_size_));
    }
  }
  return absl::OkStatus();
}

std::vector<BatchProposer::Proposal> DraftProposer::Propose(absl::Span<const Request> requests) {
  std::vector<Proposal> proposals(requests.size());
  std::vector<Work> work;
  work.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const Request& r = requests[i];
    if (r.num_drafts < 1 || r.seq->num_tokens() < 1) continue;
    Work w;
    w.index = i;
    w.seq = r.seq;
    w.num_drafts = r.num_drafts;
    w.proposal = &proposals[i];
    w.history.assign(r.seq->token_ids().begin(), r.seq->token_ids().end());
    work.push_back(std::move(w));
  }
  // Prepare after all Work exists: eviction never touches a requested sequence.
  for (Work& w : work) w.ok = Prepare(&w, requests);
  std::erase_if(work, [](const Work& w) { return !w.ok; });

  std::vector<float> logits;
  auto fail = [&](const absl::Status&) {
    // The draft's cache content is unknown now: start these sequences over.
    for (Work& w : work) {
      Release(w.seq->id());
      *w.proposal = Proposal{};
    }
    return std::move(proposals);
  };
  if (absl::Status st = CatchUp(work, &logits); !st.ok()) return fail(st);
  for (Work& w : work) w.state->num_verified = w.seq->num_tokens();
  if (absl::Status st = DraftSteps(work, &logits); !st.ok()) return fail(st);
  // Greedy requests verify by argmax: q is not needed.
  for (Work& w : work) {
    if (w.seq->sampling_params().temperature == 0.0) w.proposal->probs.clear();
  }
  return proposals;
}

}  // namespace tandem::engine::spec
