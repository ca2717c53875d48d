// A request's tokens and logprobs are bit-identical whatever the engine does
// around it: alone vs a batch of 64, chunked prefill at several chunk sizes,
// a prefix-cache hit, preemption; greedy and sampled. Tiny random model, plus
// 8 concurrent vs alone on SmolLM2.
#include <fstream>

#include "common/gguf/gguf.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/vocab.h"
#include "tests/engine/engine_test_util.h"
#include "tests/util/test_paths.h"

namespace tandem::engine {
namespace {

class DeterminismTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tiny_ = new TinyModel(LoadTinyModel(DefaultTinyShape(), 11)); }
  static void TearDownTestSuite() { delete tiny_; }
  const LlamaModel* model() { return tiny_->model.get(); }
  static TinyModel* tiny_;

  // Request i of a mixed workload: every third greedy, others sampled.
  static EngineRequest Request(int i, int64_t prompt_len = 0) {
    const int64_t n = prompt_len > 0 ? prompt_len : 5 + (i * 7) % 60;
    return MakeRequest(RandomPrompt(n, 256, 1000 + i), 10 + i % 13, i % 3 == 0 ? 0.0 : 0.8,
                       /*seed=*/i * 31 + 1);
  }

  // Runs all requests concurrently on one engine; returns outputs in order.
  std::vector<CollectedOutput> RunTogether(const EngineConfig& config,
                                           const std::vector<EngineRequest>& reqs,
                                           EngineStats* stats = nullptr) {
    std::unique_ptr<Engine> engine = MakeEngine(config, model());
    std::vector<RequestHandle> handles;
    for (const EngineRequest& r : reqs) handles.push_back(*engine->Submit(r));
    std::vector<CollectedOutput> outs;
    for (const RequestHandle& h : handles) outs.push_back(Collect(*h));
    if (stats != nullptr) *stats = engine->Stats();
    EXPECT_TRUE(engine->Stats().integrity.ok()) << engine->Stats().integrity;
    engine->Shutdown();
    EXPECT_TRUE(engine->CheckIntegrity().ok()) << engine->CheckIntegrity();
    return outs;
  }
};
TinyModel* DeterminismTest::tiny_ = nullptr;

TEST_F(DeterminismTest, BatchOf64MatchesAlone) {
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 64; ++i) reqs.push_back(Request(i));
  EngineStats stats;
  const std::vector<CollectedOutput> together = RunTogether(TinyEngineConfig(), reqs, &stats);
  EXPECT_LT(stats.num_steps, 100);  // batched: far fewer steps than tokens
  for (int i = 0; i < 64; ++i) {
    ExpectSameOutput(together[i], RunAlone(model(), reqs[i]), "request " + std::to_string(i));
  }
}

TEST_F(DeterminismTest, ChunkedPrefillMatchesAlone) {
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(Request(i, 70 + 9 * i));
  std::vector<CollectedOutput> alone;
  for (const EngineRequest& r : reqs) alone.push_back(RunAlone(model(), r));
  for (int64_t chunk : {1, 7, 16, 33}) {
    EngineConfig config = TinyEngineConfig();
    config.scheduler.max_num_batched_tokens = chunk;
    const std::vector<CollectedOutput> got = RunTogether(config, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      ExpectSameOutput(got[i], alone[i],
                       "chunk " + std::to_string(chunk) + " request " + std::to_string(i));
    }
  }
}

TEST_F(DeterminismTest, PrefixCacheHitMatchesMiss) {
  const std::vector<int32_t> system = RandomPrompt(80, 256, 77);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    EngineRequest r = Request(i);
    r.prompt_token_ids.insert(r.prompt_token_ids.begin(), system.begin(), system.end());
    reqs.push_back(std::move(r));
  }
  EngineConfig config = TinyEngineConfig();
  std::unique_ptr<Engine> engine = MakeEngine(config, model());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const CollectedOutput hit = Collect(**engine->Submit(reqs[i]));
    if (i > 0) {
      EXPECT_EQ(hit.finish->usage.num_cached_tokens, 80) << i;
    }
    ExpectSameOutput(hit, RunAlone(model(), reqs[i]), "request " + std::to_string(i));
  }
  EXPECT_EQ(engine->Stats().num_prefix_cache_hit_tokens, 7 * 80);
}

TEST_F(DeterminismTest, PreemptionMatchesAlone) {
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 12; ++i) {
    EngineRequest r = Request(i, 20 + i);
    r.params.stop.max_tokens = 30;
    reqs.push_back(std::move(r));
  }
  EngineConfig config = TinyEngineConfig(12);  // each needs 4 of 12 blocks
  config.scheduler.max_num_batched_tokens = 24;
  EngineStats stats;
  const std::vector<CollectedOutput> got = RunTogether(config, reqs, &stats);
  EXPECT_GT(stats.num_preemptions, 0);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ExpectSameOutput(got[i], RunAlone(model(), reqs[i]), "request " + std::to_string(i));
  }
}

// 8 concurrent requests vs each alone on SmolLM2 (greedy and sampled).
TEST(DeterminismRealModelTest, EightConcurrentMatchAlone) {
  const std::string path = testing::DefaultModelPath();
  if (!std::ifstream(path).good()) GTEST_SKIP() << "no model at " << path;
  EngineConfig config;
  config.model_path = path;
  config.kv_cache_memory_bytes = 64 << 20;
  config.num_threads = 2;  // work split across threads: still bit-identical
  config.check_integrity_every_step = true;
  auto engine = Engine::Create(config);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const tokenizer::Tokenizer& tok = *(*engine)->tokenizer();
  const char* kPrompts[] = {"The capital of France is", "Once upon a time",
                            "def fibonacci(n):",        "The three primary colors are",
                            "In 1969, astronauts",      "My favourite recipe is",
                            "Water boils at",           "The quick brown fox"};
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    reqs.push_back(MakeRequest(tok.Encode(kPrompts[i], true, true), 12, i % 2 ? 0.8 : 0.0, i));
  }
  std::vector<CollectedOutput> alone;
  for (const EngineRequest& r : reqs) alone.push_back(Collect(**(*engine)->Submit(r)));
  (*engine)->Shutdown();
  ASSERT_TRUE((*engine)->CheckIntegrity().ok()) << (*engine)->CheckIntegrity();

  config.enable_prefix_caching = false;
  auto batch_engine = Engine::Create(config);
  ASSERT_TRUE(batch_engine.ok());
  std::vector<RequestHandle> handles;
  for (const EngineRequest& r : reqs) handles.push_back(*(*batch_engine)->Submit(r));
  for (int i = 0; i < 8; ++i) {
    ExpectSameOutput(Collect(*handles[i]), alone[i], kPrompts[i]);
  }
}

}  // namespace
}  // namespace tandem::engine
