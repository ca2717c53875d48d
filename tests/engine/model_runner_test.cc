// ModelRunner: the ForwardBatch it builds from a SchedulerOutput (positions,
// slots, context lens, logits rows only for sampling sequences), block copies
// before the forward, and sampled tokens equal to a single-sequence run.
#include "engine/model_runner.h"

#include "engine/cpu_executor.h"
#include "engine/sampler.h"
#include "engine/single_sequence_runner.h"
#include "tests/engine/engine_test_util.h"

namespace tandem::engine {
namespace {

class ModelRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tiny_ = LoadTinyModel(DefaultTinyShape(), 3);
    executor_ = *CpuExecutor::Create(tiny_.model.get(), 32, 16);
    cache_ = &executor_->cache();
    kv_ = std::make_unique<KvCacheManager>(32, 16, true);
    SchedulerConfig sc;
    sc.max_num_batched_tokens = 40;
    scheduler_ = std::make_unique<Scheduler>(sc, kv_.get());
    runner_ = std::make_unique<ModelRunner>(executor_.get(), tiny_.model->config().vocab_size,
                                            std::vector<int32_t>{});
  }
  void Add(SeqId id, std::vector<int32_t> prompt) {
    SamplingParams p;
    ASSERT_TRUE(scheduler_->AddRequest(std::make_unique<Sequence>(id, std::move(prompt), p)).ok());
  }

  TinyModel tiny_;
  std::unique_ptr<CpuExecutor> executor_;
  KvCacheStorage* cache_ = nullptr;
  std::unique_ptr<KvCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
};

TEST_F(ModelRunnerTest, BuildsFlattenedBatch) {
  Add(1, RandomPrompt(10, 256, 1));
  Add(2, RandomPrompt(50, 256, 2));  // 30 of 50 tokens fit in this step's budget
  const SchedulerOutput out = scheduler_->Schedule();
  ASSERT_EQ(out.scheduled.size(), 2u);
  const ForwardBatch b = ModelRunner::BuildBatch(out, 16);
  ASSERT_EQ(b.num_seqs(), 2);
  EXPECT_EQ(b.num_tokens(), out.num_batched_tokens);
  EXPECT_EQ(b.query_start, (std::vector<int32_t>{0, 10, 40}));
  EXPECT_EQ(b.context_lens, (std::vector<int32_t>{10, 30}));
  EXPECT_EQ(b.logits_indices, (std::vector<int32_t>{9}));  // only seq 1 samples
  for (int64_t i = 0; i < b.num_tokens(); ++i) {
    const SeqId id = i < 10 ? 1 : 2;
    const int64_t pos = i < 10 ? i : i - 10;
    EXPECT_EQ(b.positions[i], pos);
    EXPECT_EQ(b.slot_mapping[i], kv_->Slot(id, pos));
    EXPECT_EQ(b.token_ids[i], scheduler_->Find(id)->token_ids()[pos]);
  }
  EXPECT_TRUE(tiny_.model->ValidateBatch(b, *cache_).ok());
}

TEST_F(ModelRunnerTest, SamplesLikeSingleSequenceRunner) {
  const std::vector<int32_t> prompt = RandomPrompt(37, 256, 5);
  Add(1, prompt);
  Add(2, RandomPrompt(3, 256, 6));
  auto single = SingleSequenceRunner::Create(tiny_.model.get(), 128);
  ASSERT_TRUE(single.ok());
  absl::StatusOr<std::vector<float>> logits = (*single)->Prefill(prompt);
  for (int step = 0; step < 6; ++step) {
    const SchedulerOutput out = scheduler_->Schedule();
    auto sampled = runner_->Execute(out);
    ASSERT_TRUE(sampled.ok()) << sampled.status();
    ASSERT_EQ(sampled->size(), 2u);
    std::vector<SequenceResult> results;
    for (const SampledToken& t : *sampled) {
      SequenceResult r;
      r.seq_id = t.seq_id;
      r.token_id = t.result.token_id;
      results.push_back(std::move(r));
    }
    EXPECT_EQ((*sampled)[0].seq_id, 1);
    ASSERT_TRUE(logits.ok());
    const int32_t expected = Argmax(*logits);
    EXPECT_EQ((*sampled)[0].result.token_id, expected) << "step " << step;
    logits = (*single)->DecodeStep(expected);
    scheduler_->Update(out, results);
    ASSERT_TRUE(kv_->CheckIntegrity().ok());
  }
  EXPECT_EQ(runner_->num_steps(), 6);
  EXPECT_EQ(runner_->num_computed_tokens(), 37 + 3 + 2 * 5);
}

TEST_F(ModelRunnerTest, PerformsBlockCopiesFirst) {
  float* k = cache_->k(0);
  const int64_t n = cache_->block_floats();
  for (int64_t i = 0; i < n; ++i) k[3 * n + i] = float(i) + 0.5f;
  SchedulerOutput out;
  out.block_copies.push_back({3, 7});
  auto sampled = runner_->Execute(out);
  ASSERT_TRUE(sampled.ok());
  EXPECT_TRUE(sampled->empty());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(k[7 * n + i], float(i) + 0.5f);
}

TEST_F(ModelRunnerTest, BadBlockCopyIsAnErrorNotACrash) {
  SchedulerOutput out;
  out.block_copies.push_back({3, 32});  // the cache has blocks 0..31
  auto sampled = runner_->Execute(out);
  ASSERT_FALSE(sampled.ok());
  EXPECT_EQ(sampled.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(sampled.status().message().find("32"), std::string_view::npos);
}

// The runner builds the batch from what the SchedulerOutput carries: the
// chunk's tokens and the block table after allocation (no call back into the
// scheduler), so the batch is the same after the scheduler has moved on.
TEST_F(ModelRunnerTest, OutputCarriesTokensAndBlockTables) {
  Add(1, RandomPrompt(20, 256, 7));
  const SchedulerOutput out = scheduler_->Schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  const ScheduledSequence& s = out.scheduled[0];
  EXPECT_EQ(s.token_ids, std::vector<int32_t>(scheduler_->Find(1)->token_ids().begin(),
                                              scheduler_->Find(1)->token_ids().end()));
  const auto table = kv_->block_table(1);
  EXPECT_EQ(s.block_table, std::vector<int32_t>(table.begin(), table.end()));
  EXPECT_EQ(s.seq, scheduler_->Find(1));
  const ForwardBatch before = ModelRunner::BuildBatch(out, 16);
  ASSERT_TRUE(scheduler_->Cancel(1).ok());  // frees the blocks in the manager
  const ForwardBatch after = ModelRunner::BuildBatch(out, 16);
  EXPECT_EQ(before.slot_mapping, after.slot_mapping);
  EXPECT_EQ(before.token_ids, after.token_ids);
}

}  // namespace
}  // namespace tandem::engine
