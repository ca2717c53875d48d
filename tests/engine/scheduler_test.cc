#include "engine/scheduler.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::engine {
namespace {

using ::testing::ElementsAre;

std::vector<int32_t> Range(int32_t first, int32_t n) {
  std::vector<int32_t> t(n);
  for (int32_t i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

struct NewRequest {
  SeqId id;
  int32_t num_prompt_tokens;
  int64_t max_output_tokens;
  int32_t first_token = 0;  // prompt is first_token, first_token + 1, ...
};

// One row of a scheduling table: requests arriving before the step, then what
// Schedule() must return. "A:8@16" reads: sequence A runs 8 tokens from
// position 16 ("@start" optional).
struct Step {
  std::vector<NewRequest> add;
  std::vector<std::string> scheduled;
  std::vector<SeqId> preempted = {};
};

// Drives a Scheduler with a fake model: a sequence that samples gets token
// 100 * id + output index; it finishes (kLength) at max_output_tokens.
class Harness {
 public:
  Harness(SchedulerConfig config, int32_t num_blocks, int32_t block_size, bool prefix_caching)
      : kv_(num_blocks, block_size, prefix_caching), scheduler_(config, &kv_) {}

  absl::Status Add(const NewRequest& r) {
    max_output_[r.id] = r.max_output_tokens;
    return scheduler_.AddRequest(std::make_unique<Sequence>(
        r.id, Range(r.first_token, r.num_prompt_tokens), SamplingParams{}));
  }

  // Schedules and applies one step; returns "A:8@16"-style entries.
  std::vector<std::string> RunStep(std::vector<SeqId>* preempted) {
    SchedulerOutput out = scheduler_.Schedule();
    EXPECT_TRUE(kv_.CheckIntegrity().ok()) << kv_.CheckIntegrity();
    std::vector<std::string> got;
    std::vector<SequenceResult> results;
    int64_t total = 0;
    for (const ScheduledSequence& s : out.scheduled) {
      got.push_back(absl::StrCat(Name(s.seq_id), ":", s.num_tokens, "@", s.start_position));
      total += s.num_tokens;
      if (!s.samples) continue;
      const Sequence* seq = scheduler_.Find(s.seq_id);
      const int64_t index = seq->num_output_tokens();
      SequenceResult r;
      r.seq_id = s.seq_id;
      r.token_id = static_cast<int32_t>(100 * s.seq_id + index);
      if (index + 1 >= max_output_[s.seq_id]) r.finish = FinishReason::kLength;
      results.push_back(r);
    }
    EXPECT_EQ(total, out.num_batched_tokens);
    *preempted = out.preempted;
    for (auto& seq : scheduler_.Update(out, results)) finished_.push_back(std::move(seq));
    EXPECT_TRUE(kv_.CheckIntegrity().ok()) << kv_.CheckIntegrity();
    return got;
  }

  void RunTable(const std::vector<Step>& steps) {
    for (size_t i = 0; i < steps.size(); ++i) {
      for (const NewRequest& r : steps[i].add) ASSERT_TRUE(Add(r).ok());
      std::vector<SeqId> preempted;
      std::vector<std::string> got = RunStep(&preempted);
      std::vector<std::string> want;
      for (const std::string& w : steps[i].scheduled) {
        want.push_back(w.find('@') == std::string::npos ? w : w);
      }
      ASSERT_EQ(Strip(got, want), want) << "step " << i + 1;
      ASSERT_EQ(preempted, steps[i].preempted) << "step " << i + 1;
    }
  }

  static std::string Name(SeqId id) { return std::string(1, static_cast<char>('A' + id)); }

  KvCacheManager& kv() { return kv_; }
  Scheduler& scheduler() { return scheduler_; }
  const std::vector<std::unique_ptr<Sequence>>& finished() const { return finished_; }

 private:
  // Drops "@start" from got entries whose wanted entry has none.
  static std::vector<std::string> Strip(const std::vector<std::string>& got,
                                        const std::vector<std::string>& want) {
    std::vector<std::string> out = got;
    for (size_t i = 0; i < out.size() && i < want.size(); ++i) {
      if (want[i].find('@') == std::string::npos) out[i] = out[i].substr(0, out[i].find('@'));
    }
    return out;
  }

  KvCacheManager kv_;
  Scheduler scheduler_;
  absl::flat_hash_map<SeqId, int64_t> max_output_;
  std::vector<std::unique_ptr<Sequence>> finished_;
};

constexpr SeqId A = 0, B = 1, C = 2, D = 3;

SchedulerConfig Config(int64_t budget, int64_t max_seqs = 64) {
  SchedulerConfig c;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_seqs;
  return c;
}

TEST(SchedulerTest, ChunkedPrefillOfALongPromptUnderTheBudget) {
  Harness h(Config(8), 16, 4, false);
  h.RunTable({
      {{{A, 20, 2}}, {"A:8@0"}},
      {{}, {"A:8@8"}},
      {{}, {"A:4@16"}},  // reaches 20: samples
      {{}, {"A:1@20"}},  // decode, finishes
      {{}, {}},
  });
  ASSERT_EQ(h.finished().size(), 1u);
  EXPECT_THAT(h.finished()[0]->output_token_ids(), ElementsAre(0, 1));
  EXPECT_EQ(h.kv().num_free_blocks(), 16);
}

TEST(SchedulerTest, ShortRequestDecodesWhileALongPrefillIsChunked) {
  Harness h(Config(8), 32, 4, false);
  h.RunTable({
      {{{A, 3, 4}, {B, 20, 2}}, {"A:3@0", "B:5@0"}},
      {{}, {"A:1@3", "B:7@5"}},  // decode first, then the chunk continues
      {{}, {"A:1@4", "B:7@12"}},
      {{{C, 2, 1}}, {"A:1@5", "B:1@19", "C:2@0"}},  // A finishes; B samples; C fits
      {{}, {"B:1@20"}},
      {{}, {}},
  });
  EXPECT_EQ(h.finished().size(), 3u);
}

TEST(SchedulerTest, MaxNumSeqsAndAFreedSlotAdmitsTheNextStep) {
  Harness h(Config(64, 2), 32, 4, false);
  h.RunTable({
      {{{A, 2, 2}, {B, 2, 3}, {C, 2, 1}}, {"A:2", "B:2"}},  // C waits: 2 seqs max
      {{}, {"A:1", "B:1"}},                                 // A finishes here
      {{}, {"B:1", "C:2"}},                                 // its slot goes to C
      {{}, {}},
  });
}

TEST(SchedulerTest, WaitingQueueIsFifoWithoutOvertaking) {
  // B does not fit the remaining budget; C (small) must not overtake it.
  SchedulerConfig config = Config(10);
  config.enable_chunked_prefill = false;
  Harness h(config, 32, 4, false);
  h.RunTable({
      {{{A, 6, 2}, {B, 8, 1}, {C, 1, 1}}, {"A:6"}},
      {{}, {"A:1", "B:8", "C:1"}},  // after B, C fits the rest of the budget
      {{}, {}},
  });
}

TEST(SchedulerTest, PreemptsNewestFirstAndRecomputesItsOutput) {
  // 4 blocks of 2 tokens: A and B each hold 2 blocks after prefill.
  Harness h(Config(16), 4, 2, false);
  h.RunTable({
      {{{A, 3, 3}, {B, 3, 4}}, {"A:3@0", "B:3@0"}},
      {{}, {"A:1@3", "B:1@3"}},
      {{}, {"A:1@4"}, {B}},  // A needs a third block: B (newest) is preempted
      {{}, {"B:5@0"}},       // A finished and freed; B recomputes prompt + 2 outputs
      {{}, {"B:1@5"}},
      {{}, {}},
  });
  ASSERT_EQ(h.finished().size(), 2u);
  const Sequence& b = *h.finished()[1];
  EXPECT_EQ(b.id(), B);
  EXPECT_EQ(b.num_preemptions(), 1);
  EXPECT_THAT(b.output_token_ids(), ElementsAre(100, 101, 102, 103));
  EXPECT_EQ(h.kv().num_free_blocks(), 4);
}

TEST(SchedulerTest, PreemptionPicksTheNewestRunning) {
  // 6 blocks of 2: A, B, C hold 2 each after prefill.
  Harness h(Config(16), 6, 2, false);
  h.RunTable({
      {{{A, 3, 9}, {B, 3, 9}, {C, 3, 9}}, {"A:3", "B:3", "C:3"}},
      {{}, {"A:1", "B:1", "C:1"}},
      {{}, {"A:1", "B:1"}, {C}},  // A's new block comes from C; B takes the other
      {{}, {"A:1", "B:1"}},       // C (5 tokens, 3 blocks) cannot come back yet
      {{}, {"A:1"}, {B}},         // A grows again: B is now the newest running
  });
  EXPECT_THAT(h.scheduler().waiting_ids(), ElementsAre(B, C));  // older victim first
  EXPECT_EQ(h.scheduler().num_preemptions(), 2);
}

TEST(SchedulerTest, APrefixHitSkipsComputedTokens) {
  Harness h(Config(64), 32, 4, true);
  h.RunTable({
      {{{A, 10, 1}}, {"A:10@0"}},     // A finishes, its 2 full blocks stay cached
      {{{B, 11, 1}}, {"B:3@8"}},      // same first 10 tokens: 8 are cached
      {{{C, 11, 1, 1}}, {"C:11@0"}},  // shifted tokens: no hit
  });
  EXPECT_EQ(h.kv().prefix_cache_stats().num_hit_tokens, 8);
  EXPECT_EQ(h.kv().prefix_cache_stats().num_query_tokens, 32);
  EXPECT_EQ(h.finished()[1]->num_cached_tokens(), 8);
}

TEST(SchedulerTest, PreemptedSequenceResumesFromItsOwnCachedBlocks) {
  Harness h(Config(16), 4, 2, true);
  h.RunTable({
      {{{A, 3, 3}, {B, 3, 4, 50}}, {"A:3@0", "B:3@0"}},
      {{}, {"A:1@3", "B:1@3"}},
      {{}, {"A:1@4"}, {B}},
      // B's blocks were freed tail first, so A took B's tail block; B's head
      // block [0, 2) is still cached and reused.
      {{}, {"B:3@2"}},
  });
}

TEST(SchedulerTest, IdenticalPromptsComputedTogetherShareTheCanonicalBlock) {
  // A and B compute the same first block in one step: A's copy becomes the
  // cached one and B's chain continues from it, so after B is preempted its
  // second block is still found through A's first.
  Harness h(Config(16), 4, 2, true);
  h.RunTable({
      {{{A, 3, 3}, {B, 3, 4}}, {"A:3@0", "B:3@0"}},
      {{}, {"A:1@3", "B:1@3"}},
      {{}, {"A:1@4"}, {B}},  // B's uncached duplicate block 0 is reused first
      {{}, {"B:1@4"}},       // blocks [0, 2) from A and [2, 4) from B: 4 cached
  });
}

TEST(SchedulerTest, WaitingQueueOverflowIsResourceExhausted) {
  SchedulerConfig config = Config(16);
  config.max_waiting_requests = 2;
  config.max_waiting_tokens = 10;
  Harness h(config, 16, 4, false);
  ASSERT_TRUE(h.Add({A, 4, 1}).ok());
  ASSERT_TRUE(h.Add({B, 4, 1}).ok());
  EXPECT_EQ(h.Add({C, 1, 1}).code(), absl::StatusCode::kResourceExhausted);  // by requests
  std::vector<SeqId> preempted;
  h.RunStep(&preempted);  // admits A and B; both finish
  ASSERT_TRUE(h.Add({C, 6, 1}).ok());
  EXPECT_EQ(h.Add({D, 5, 1}).code(), absl::StatusCode::kResourceExhausted);  // by tokens
  EXPECT_EQ(h.scheduler().num_waiting_tokens(), 6);
  // Bad requests are InvalidArgument, not backpressure.
  EXPECT_EQ(h.Add({C, 2, 1}).code(), absl::StatusCode::kInvalidArgument);    // duplicate
  EXPECT_EQ(h.Add({9, 0, 1}).code(), absl::StatusCode::kInvalidArgument);    // empty
  EXPECT_EQ(h.Add({10, 65, 1}).code(), absl::StatusCode::kInvalidArgument);  // > KV capacity
}

TEST(SchedulerTest, CancelInAnyStateFreesAllBlocks) {
  Harness h(Config(8), 16, 4, true);
  ASSERT_TRUE(h.Add({A, 20, 5}).ok());  // will be mid-prefill
  ASSERT_TRUE(h.Add({B, 3, 5}).ok());
  std::vector<SeqId> preempted;
  EXPECT_THAT(h.RunStep(&preempted), ElementsAre("A:8@0"));
  ASSERT_TRUE(h.Add({C, 2, 5}).ok());
  h.RunStep(&preempted);  // A:8, B waits? budget 8 all to A
  EXPECT_EQ(h.scheduler().Find(A)->num_computed_tokens(), 16);
  // Mid-prefill.
  absl::StatusOr<std::unique_ptr<Sequence>> a = h.scheduler().Cancel(A);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->status(), SequenceStatus::kFinishedAborted);
  EXPECT_FALSE(h.kv().Contains(A));
  EXPECT_THAT(h.RunStep(&preempted), ElementsAre("B:3@0", "C:2@0"));
  // Running (decoding) and waiting.
  ASSERT_TRUE(h.Add({D, 4, 5}).ok());
  ASSERT_TRUE(h.scheduler().Cancel(B).ok());
  ASSERT_TRUE(h.scheduler().Cancel(D).ok());
  EXPECT_EQ(h.scheduler().Cancel(D).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(h.scheduler().num_waiting_tokens(), 0);
  ASSERT_TRUE(h.scheduler().Cancel(C).ok());
  EXPECT_FALSE(h.scheduler().has_unfinished());
  EXPECT_EQ(h.kv().num_sequences(), 0);
  EXPECT_EQ(h.kv().num_free_blocks(), 16);
  EXPECT_TRUE(h.kv().CheckIntegrity().ok());
}

TEST(SchedulerTest, CancelBetweenScheduleAndUpdateIsIgnoredByUpdate) {
  Harness h(Config(8), 16, 4, false);
  ASSERT_TRUE(h.Add({A, 3, 5}).ok());
  SchedulerOutput out = h.scheduler().Schedule();
  ASSERT_TRUE(h.scheduler().Cancel(A).ok());
  SequenceResult r;
  r.seq_id = A;
  r.token_id = 7;
  EXPECT_TRUE(h.scheduler().Update(out, {&r, 1}).empty());
  EXPECT_EQ(h.kv().num_free_blocks(), 16);
}

TEST(SchedulerTest, LongPrefillThresholdCapsOneSequence) {
  SchedulerConfig config = Config(16);
  config.long_prefill_token_threshold = 6;
  Harness h(config, 32, 4, false);
  h.RunTable({
      {{{A, 20, 1}, {B, 4, 1}}, {"A:6@0", "B:4@0"}},
      {{}, {"A:6@6"}},
  });
}

TEST(SchedulerTest, ConfigValidate) {
  EXPECT_TRUE(SchedulerConfig{}.Validate().ok());
  SchedulerConfig c;
  c.max_num_batched_tokens = 0;
  EXPECT_FALSE(c.Validate().ok());
  c = SchedulerConfig{};
  c.max_num_seqs = 0;
  EXPECT_FALSE(c.Validate().ok());
  c = SchedulerConfig{};
  c.long_prefill_token_threshold = -1;
  EXPECT_FALSE(c.Validate().ok());
}

}  // namespace
}  // namespace tandem::engine
