// Engine behaviour on tiny random models: prefix caching, continuous
// batching, preemption, cancellation, backpressure, shutdown; and equality
// with SingleSequenceRunner on the real SmolLM2 model.
#include "engine/engine.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <fstream>

#include "absl/synchronization/mutex.h"
#include "common/tokenizer/vocab.h"
#include "engine/memory_size.h"
#include "engine/sampler.h"
#include "engine/single_sequence_runner.h"
#include "tests/engine/engine_test_util.h"
#include "tests/util/test_paths.h"

namespace tandem::engine {
namespace {

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tiny_ = new TinyModel(LoadTinyModel(DefaultTinyShape())); }
  static void TearDownTestSuite() { delete tiny_; }
  const LlamaModel* model() { return tiny_->model.get(); }
  static TinyModel* tiny_;
};
TinyModel* EngineTest::tiny_ = nullptr;

// kv_cache_memory_fraction: the budget is that share of the memory free where
// the cache lives, measured at Create (MemAvailable for the CPU executor);
// out-of-range fractions are refused by Validate.
TEST_F(EngineTest, KvCacheMemoryFractionOfFreeMemory) {
  EngineConfig config;
  config.kv_cache_memory_bytes = 0;  // unused with a fraction
  config.kv_cache_memory_fraction = 0.001;
  const int64_t before = *ReadAvailableMemoryBytes();
  std::unique_ptr<Engine> engine = MakeEngine(config, model());
  const int64_t after = *ReadAvailableMemoryBytes();
  const int64_t block_bytes = engine->kv_bytes_per_token() * config.block_size;
  const int64_t blocks = engine->Stats().num_blocks_total;
  // MemAvailable moves a little on a busy machine: within its range then.
  EXPECT_GE(blocks, static_cast<int64_t>(0.001 * std::min(before, after)) / block_bytes * 9 / 10);
  EXPECT_LE(blocks, static_cast<int64_t>(0.001 * std::max(before, after)) / block_bytes * 11 / 10);
  EXPECT_NE(engine->kv_cache_description().find(", budget 0.001 of "), std::string::npos)
      << engine->kv_cache_description();
  EXPECT_NE(engine->kv_cache_description().find(" GiB free on cpu"), std::string::npos);
  for (double bad : {1.5, -0.25, std::nan("")}) {
    config.kv_cache_memory_fraction = bad;
    EXPECT_EQ(Engine::Create(config, model(), nullptr).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
  // A fixed size still needs positive bytes when no fraction is set.
  config.kv_cache_memory_fraction = 0;
  EXPECT_FALSE(config.Validate().ok());
}

// On CUDA without a device the fraction cannot be measured: the device error.
TEST_F(EngineTest, KvCacheMemoryFractionOnCudaWithoutDevice) {
  if (CheckDeviceAvailable(Device::kCuda).ok()) GTEST_SKIP() << "a CUDA device is visible";
  EngineConfig config;
  config.device = Device::kCuda;
  config.kv_cache_memory_fraction = 0.9;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(config, model(), nullptr);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition) << engine.status();
  EXPECT_NE(engine.status().message().find("--device cuda: "), absl::string_view::npos)
      << engine.status();
}

TEST_F(EngineTest, PrefixCacheHitComputesOnlyNewTokens) {
  const std::vector<int32_t> shared = RandomPrompt(64, 256, 1);
  std::vector<int32_t> a = shared, b = shared;
  for (int32_t t : RandomPrompt(10, 256, 2)) a.push_back(t);
  for (int32_t t : RandomPrompt(7, 256, 3)) b.push_back(t);
  const int64_t kMaxTokens = 12;

  std::unique_ptr<Engine> engine = MakeEngine(TinyEngineConfig(), model());
  CollectedOutput out_a = Collect(**engine->Submit(MakeRequest(a, kMaxTokens)));
  ASSERT_TRUE(out_a.finish.has_value());
  const EngineStats before = engine->Stats();
  CollectedOutput out_b = Collect(**engine->Submit(MakeRequest(b, kMaxTokens, 0.7, 5)));
  ASSERT_TRUE(out_b.finish.has_value());
  const EngineStats after = engine->Stats();

  EXPECT_EQ(out_b.finish->usage.num_cached_tokens, 64);
  // 7 own prompt tokens, then one per decode step (the last token is never run).
  EXPECT_EQ(after.num_computed_tokens - before.num_computed_tokens, 7 + kMaxTokens - 1);
  EXPECT_EQ(after.num_prefix_cache_hit_tokens - before.num_prefix_cache_hit_tokens, 64);
  ExpectSameOutput(out_b, RunAlone(model(), MakeRequest(b, kMaxTokens, 0.7, 5)), "cache hit");
  engine->Shutdown();
  EXPECT_TRUE(engine->CheckIntegrity().ok()) << engine->CheckIntegrity();
}

TEST_F(EngineTest, StepRecordsAreKeptOnceAskedForAndMatchTheSchedule) {
  EngineConfig config = TinyEngineConfig();
  config.scheduler.max_num_batched_tokens = 16;  // a 40-token prompt takes 3 chunks
  std::unique_ptr<Engine> engine = MakeEngine(config, model());
  ASSERT_TRUE(Collect(**engine->Submit(MakeRequest(RandomPrompt(10, 256, 20), 3))).finish);
  EXPECT_TRUE(engine->TakeStepRecords().empty());  // nobody asked before: none kept
  const EngineStats before = engine->Stats();
  RequestHandle a = *engine->Submit(MakeRequest(RandomPrompt(40, 256, 21), 4));
  RequestHandle b = *engine->Submit(MakeRequest(RandomPrompt(5, 256, 22), 2));
  ASSERT_TRUE(Collect(*a).finish.has_value());
  ASSERT_TRUE(Collect(*b).finish.has_value());
  const EngineStats after = engine->Stats();
  const std::vector<StepRecord> steps = engine->TakeStepRecords();
  ASSERT_EQ(static_cast<int64_t>(steps.size()), after.num_steps - before.num_steps);
  int64_t tokens = 0, sequences = 0;
  for (const StepRecord& s : steps) {
    EXPECT_GE(s.num_tokens, 1);
    EXPECT_LE(s.num_tokens, 16);  // never more than the step budget
    EXPECT_GE(s.num_sequences, 1);
    EXPECT_LE(s.num_sequences, 2);
    EXPECT_GE(s.seconds, 0);
    tokens += s.num_tokens;
    sequences += s.num_sequences;
  }
  EXPECT_EQ(tokens, after.num_computed_tokens - before.num_computed_tokens);
  EXPECT_EQ(tokens, 40 + 5 + (4 - 1) + (2 - 1));
  // a is scheduled in its 3 prefill chunks and 3 decode steps, b in 1 + 1.
  EXPECT_EQ(sequences, 3 + 3 + 1 + 1);
  EXPECT_TRUE(engine->TakeStepRecords().empty());  // taken: gone
  EXPECT_EQ(after.num_step_records_dropped, 0);
}

TEST_F(EngineTest, ShortRequestJoinsAndFinishesFirst) {
  std::unique_ptr<Engine> engine = MakeEngine(TinyEngineConfig(), model());
  RequestHandle longer = *engine->Submit(MakeRequest(RandomPrompt(30, 256, 4), 400));
  ASSERT_TRUE(longer->Next(absl::Seconds(30)).has_value());  // first token: it is running
  RequestHandle shorter = *engine->Submit(MakeRequest(RandomPrompt(5, 256, 5), 4));
  CollectedOutput out = Collect(*shorter);
  ASSERT_TRUE(out.finish.has_value());
  EXPECT_EQ(out.token_ids.size(), 4u);
  EXPECT_FALSE(longer->finished());
  EXPECT_EQ(engine->Stats().num_running, 1);
  ASSERT_TRUE(Collect(*longer).finish.has_value());
}

TEST_F(EngineTest, StepThatFreesASlotAdmitsWaiting) {
  EngineConfig config = TinyEngineConfig();
  config.scheduler.max_num_seqs = 1;
  std::unique_ptr<Engine> engine = MakeEngine(config, model());
  // Steps completed when each token event fires (Stats is published after a
  // step, and token callbacks run during the step).
  absl::Mutex mu;
  std::vector<int64_t> steps_a, steps_b;
  auto recorder = [&](std::vector<int64_t>* steps) {
    return [&, steps](const EngineEvent& e) {
      if (!std::holds_alternative<TokenEvent>(e)) return;
      const int64_t s = engine->Stats().num_steps;
      absl::MutexLock lock(&mu);
      steps->push_back(s);
    };
  };
  EngineRequest a = MakeRequest(RandomPrompt(8, 256, 6), 6);
  a.on_event = recorder(&steps_a);
  EngineRequest b = MakeRequest(RandomPrompt(8, 256, 7), 3);
  b.on_event = recorder(&steps_b);
  RequestHandle ha = *engine->Submit(std::move(a));
  RequestHandle hb = *engine->Submit(std::move(b));
  engine->Shutdown(ShutdownMode::kDrain);
  absl::MutexLock lock(&mu);
  ASSERT_EQ(steps_a.size(), 6u);
  ASSERT_EQ(steps_b.size(), 3u);
  EXPECT_EQ(steps_b.front(), steps_a.back() + 1);
  EXPECT_TRUE(engine->CheckIntegrity().ok()) << engine->CheckIntegrity();
}

TEST_F(EngineTest, PreemptionKeepsOutputs) {
  // 10 blocks of 16 tokens; each request needs 4 (20 + 40 tokens).
  EngineConfig config = TinyEngineConfig(10);
  std::unique_ptr<Engine> engine = MakeEngine(config, model());
  std::vector<EngineRequest> reqs;
  std::vector<RequestHandle> handles;
  for (int i = 0; i < 8; ++i) {
    reqs.push_back(MakeRequest(RandomPrompt(20, 256, 100 + i), 40, i % 2 ? 0.9 : 0.0, i));
    handles.push_back(*engine->Submit(reqs.back()));
  }
  for (int i = 0; i < 8; ++i) {
    CollectedOutput out = Collect(*handles[i]);
    ExpectSameOutput(out, RunAlone(model(), reqs[i]), "request " + std::to_string(i));
    EXPECT_EQ(out.token_ids.size(), 40u);
  }
  EXPECT_GT(engine->Stats().num_preemptions, 0);
  EXPECT_TRUE(engine->Stats().integrity.ok()) << engine->Stats().integrity;
  engine->Shutdown();
  EXPECT_TRUE(engine->CheckIntegrity().ok()) << engine->CheckIntegrity();
}

TEST_F(EngineTest, StopTokenEndsRequest) {
  EngineRequest req = MakeRequest(RandomPrompt(10, 256, 8), 20);
  const CollectedOutput free_run = RunAlone(model(), req);
  ASSERT_EQ(free_run.token_ids.size(), 20u);
  // Stop at the first occurrence of the 4th token.
  const int32_t stop = free_run.token_ids[3];
  size_t first = 0;
  while (free_run.token_ids[first] != stop) ++first;
  req.params.stop.stop_token_ids = {stop};
  const CollectedOutput out = RunAlone(model(), req);
  ASSERT_TRUE(out.finish.has_value());
  EXPECT_EQ(out.finish->reason, FinishReason::kStop);
  EXPECT_EQ(out.token_ids.size(), first + 1);
  EXPECT_EQ(out.finish->usage.num_completion_tokens, int64_t(first + 1));
}

TEST_F(EngineTest, CancelWhileWaitingAndMidDecode) {
  EngineConfig config = TinyEngineConfig();
  config.scheduler.max_num_seqs = 1;
  std::unique_ptr<Engine> engine = MakeEngine(config, model());
  RequestHandle running = *engine->Submit(MakeRequest(RandomPrompt(10, 256, 9), 900));
  ASSERT_TRUE(running->Next(absl::Seconds(30)).has_value());
  RequestHandle waiting = *engine->Submit(MakeRequest(RandomPrompt(10, 256, 10), 10));
  engine->Cancel(waiting);
  CollectedOutput w = Collect(*waiting);
  ASSERT_TRUE(w.finish.has_value());
  EXPECT_EQ(w.finish->reason, FinishReason::kCancelled);
  EXPECT_TRUE(w.token_ids.empty());
  engine->Cancel(running);
  CollectedOutput r = Collect(*running);
  ASSERT_TRUE(r.finish.has_value());
  EXPECT_EQ(r.finish->reason, FinishReason::kCancelled);
  EXPECT_LT(r.token_ids.size(), 899u);
  EXPECT_EQ(engine->Stats().num_blocks_used, 0);
  engine->Cancel(running);  // already finished: no-op
  engine->Shutdown();
  EXPECT_TRUE(engine->CheckIntegrity().ok()) << engine->CheckIntegrity();
}

TEST_F(EngineTest, CancelMidPrefill) {
  EngineConfig config = TinyEngineConfig();
  config.scheduler.max_num_batched_tokens = 4;
  std::unique_ptr<Engine> engine = MakeEngine(config, model());
  RequestHandle h = *engine->Submit(MakeRequest(RandomPrompt(1000, 256, 11), 5));
  while (engine->Stats().num_computed_tokens < 8) absl::SleepFor(absl::Microseconds(50));
  engine->Cancel(h);
  CollectedOutput out = Collect(*h);
  ASSERT_TRUE(out.finish.has_value());
  EXPECT_EQ(out.finish->reason, FinishReason::kCancelled);
  EXPECT_EQ(out.finish->usage.num_completion_tokens, 0);
  EXPECT_EQ(engine->Stats().num_blocks_used, 0);
  engine->Shutdown();
  EXPECT_TRUE(engine->CheckIntegrity().ok()) << engine->CheckIntegrity();
}

TEST_F(EngineTest, WaitingQueueOverflowIsResourceExhausted) {
  EngineConfig config = TinyEngineConfig();
  config.scheduler.max_num_seqs = 1;
  config.scheduler.max_waiting_requests = 2;
  std::unique_ptr<Engine> engine = MakeEngine(config, model());
  std::vector<RequestHandle> ok;
  int num_exhausted = 0;
  for (int i = 0; i < 5; ++i) {
    auto h = engine->Submit(MakeRequest(RandomPrompt(10, 256, 20 + i), 500));
    if (h.ok()) {
      ok.push_back(*h);
    } else {
      EXPECT_EQ(h.status().code(), absl::StatusCode::kResourceExhausted) << h.status();
      ++num_exhausted;
    }
  }
  EXPECT_GE(num_exhausted, 2);  // one runs at most, two wait
  EXPECT_LE(ok.size(), 3u);
  engine->Shutdown();  // cancels the rest
  for (const RequestHandle& h : ok) {
    CollectedOutput out = Collect(*h);
    ASSERT_TRUE(out.finish.has_value());
    EXPECT_EQ(out.finish->reason, FinishReason::kCancelled);
  }
  EXPECT_TRUE(engine->CheckIntegrity().ok()) << engine->CheckIntegrity();
  EXPECT_EQ(engine->Submit(MakeRequest({1, 2}, 2)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(EngineTest, RequestLargerThanWaitingTokenBoundIsInvalidArgument) {
  EngineConfig config = TinyEngineConfig();
  config.scheduler.max_waiting_tokens = 8;
  std::unique_ptr<Engine> engine = MakeEngine(config, model());
  // Alone over the bound: it could never be queued, so not backpressure.
  EXPECT_EQ(engine->Submit(MakeRequest(RandomPrompt(9, 256, 3), 2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto first = engine->Submit(MakeRequest(RandomPrompt(8, 256, 4), 2));
  ASSERT_TRUE(first.ok()) << first.status();
  engine->Shutdown();
  EXPECT_TRUE(engine->CheckIntegrity().ok()) << engine->CheckIntegrity();
}

TEST_F(EngineTest, RejectsBadRequests) {
  std::unique_ptr<Engine> engine = MakeEngine(TinyEngineConfig(4), model());
  EXPECT_EQ(engine->Submit(MakeRequest({}, 2)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->Submit(MakeRequest({1, 999}, 2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->Submit(MakeRequest(RandomPrompt(64, 256, 1), 2)).status().code(),
            absl::StatusCode::kInvalidArgument);  // 65 tokens > 4 blocks
  EngineConfig bad;
  bad.block_size = 0;
  EXPECT_FALSE(bad.Validate().ok());
}

TEST_F(EngineTest, DrainShutdownFinishesEverything) {
  std::unique_ptr<Engine> engine = MakeEngine(TinyEngineConfig(), model());
  std::vector<RequestHandle> handles;
  for (int i = 0; i < 6; ++i) {
    handles.push_back(*engine->Submit(MakeRequest(RandomPrompt(12, 256, 30 + i), 9)));
  }
  engine->Shutdown(ShutdownMode::kDrain);
  for (const RequestHandle& h : handles) {
    CollectedOutput out = Collect(*h, absl::Seconds(1));
    ASSERT_TRUE(out.finish.has_value());
    EXPECT_EQ(out.finish->reason, FinishReason::kLength);
    EXPECT_EQ(out.token_ids.size(), 9u);
    EXPECT_EQ(out.finish->usage.token_times_s.size(), 9u);
    EXPECT_GE(out.finish->usage.ttft_s, out.finish->usage.queue_time_s);
  }
  EXPECT_TRUE(engine->CheckIntegrity().ok()) << engine->CheckIntegrity();
}

// Greedy output of the Engine == SingleSequenceRunner greedy on SmolLM2.
TEST(EngineRealModelTest, MatchesSingleSequenceRunner) {
  const std::string path = testing::DefaultModelPath();
  if (!std::ifstream(path).good()) GTEST_SKIP() << "no model at " << path;
  EngineConfig config;
  config.model_path = path;
  config.kv_cache_memory_bytes = 64 << 20;
  config.num_threads = 2;  // work split across threads: still bit-identical
  auto engine = Engine::Create(config);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const tokenizer::Tokenizer& tok = *(*engine)->tokenizer();
  const std::vector<int32_t> prompt = tok.Encode("The capital of France is", true, true);
  const int kTokens = 16;

  auto runner = SingleSequenceRunner::Create(&(*engine)->model(), 256);
  ASSERT_TRUE(runner.ok());
  std::vector<int32_t> expected;
  absl::StatusOr<std::vector<float>> logits = (*runner)->Prefill(prompt);
  for (int i = 0; i < kTokens; ++i) {
    ASSERT_TRUE(logits.ok());
    const int32_t next = Argmax(*logits);
    if (tok.IsEog(next)) break;
    expected.push_back(next);
    logits = (*runner)->DecodeStep(next);
  }
  CollectedOutput out = Collect(**(*engine)->Submit(MakeRequest(prompt, kTokens, 0, 0, {})));
  ASSERT_TRUE(out.finish.has_value());
  std::vector<int32_t> got = out.token_ids;
  if (out.finish->reason == FinishReason::kEos) got.pop_back();
  EXPECT_EQ(got, expected);
  EXPECT_EQ(out.text, tok.Decode(expected, true));
  std::fprintf(stderr, "engine: \"The capital of France is\" ->%s\n", out.text.c_str());
}

}  // namespace
}  // namespace tandem::engine
