// Engine throughput and KV / prefix-cache numbers on the real model. Runs only
// with TANDEM_BENCH=1 (it takes tens of seconds):
//   TANDEM_BENCH=1 build/tests/engine_bench_test
#include <cstdlib>
#include <fstream>

#include "absl/time/clock.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/engine/engine_test_util.h"
#include "tests/util/test_paths.h"

namespace tandem::engine {
namespace {

class EngineBenchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* bench = std::getenv("TANDEM_BENCH");
    if (bench == nullptr || std::string(bench) != "1") GTEST_SKIP() << "set TANDEM_BENCH=1";
    path_ = testing::DefaultModelPath();
    if (!std::ifstream(path_).good()) GTEST_SKIP() << "no model at " << path_;
  }
  std::unique_ptr<Engine> Create(bool prefix_caching) {
    EngineConfig config;
    config.model_path = path_;
    config.kv_cache_memory_bytes = int64_t{512} << 20;
    config.enable_prefix_caching = prefix_caching;
    auto engine = Engine::Create(config);
    TANDEM_CHECK(engine.ok());
    return std::move(*engine);
  }
  std::string path_;
};

TEST_F(EngineBenchTest, KvCacheTableAtDefaultBudget) {
  std::unique_ptr<Engine> engine = Create(true);
  KvCacheConfig kv;
  kv.memory_budget_bytes = kDefaultKvCacheMemoryBytes;
  const int64_t bpt = engine->kv_bytes_per_token();
  const int64_t blocks = *NumBlocksFor(kv, bpt);
  std::printf("default budget %lld B: %s\n", static_cast<long long>(kDefaultKvCacheMemoryBytes),
              DescribeKvCapacity(bpt, blocks, kv.block_size, true).c_str());
}

TEST_F(EngineBenchTest, GreedyThroughput) {
  std::unique_ptr<Engine> engine = Create(false);
  const int64_t vocab = engine->model().config().vocab_size;
  for (int concurrency : {1, 8, 32}) {
    std::vector<RequestHandle> handles;
    const absl::Time start = absl::Now();
    for (int i = 0; i < concurrency; ++i) {
      EngineRequest r = MakeRequest(RandomPrompt(128, vocab, 500 + i), 128, 0, 0, {});
      r.params.stop.ignore_eos = true;
      handles.push_back(*engine->Submit(std::move(r)));
    }
    int64_t generated = 0;
    double ttft = 0;
    for (const RequestHandle& h : handles) {
      CollectedOutput out = Collect(*h, absl::Seconds(600));
      ASSERT_TRUE(out.finish.has_value());
      generated += out.finish->usage.num_completion_tokens;
      ttft += out.finish->usage.ttft_s;
    }
    const double secs = absl::ToDoubleSeconds(absl::Now() - start);
    std::printf(
        "concurrency %2d: %lld output tokens in %.2f s = %.1f output tok/s (%.1f tok/s incl. "
        "prompt), mean TTFT %.3f s\n",
        concurrency, static_cast<long long>(generated), secs, generated / secs,
        (generated + 128.0 * concurrency) / secs, ttft / concurrency);
  }
}

TEST_F(EngineBenchTest, SharedSystemPromptHitRate) {
  std::unique_ptr<Engine> engine = Create(true);
  const int64_t vocab = engine->model().config().vocab_size;
  const std::vector<int32_t> system = RandomPrompt(200, vocab, 9);
  std::vector<RequestHandle> handles;
  // The first request warms the cache; the other 15 arrive together.
  for (int i = 0; i < 16; ++i) {
    std::vector<int32_t> prompt = system;
    for (int32_t t : RandomPrompt(20, vocab, 900 + i)) prompt.push_back(t);
    handles.push_back(*engine->Submit(MakeRequest(prompt, 8, 0, 0, {})));
    if (i == 0) {
      ASSERT_TRUE(Collect(*handles[0]).finish.has_value());
    }
  }
  for (size_t i = 1; i < handles.size(); ++i) ASSERT_TRUE(Collect(*handles[i]).finish.has_value());
  const EngineStats s = engine->Stats();
  std::printf("prefix cache: %lld of %lld prompt tokens hit (%.1f%%), %lld tokens computed\n",
              static_cast<long long>(s.num_prefix_cache_hit_tokens),
              static_cast<long long>(s.num_prefix_cache_query_tokens),
              100.0 * s.num_prefix_cache_hit_tokens / s.num_prefix_cache_query_tokens,
              static_cast<long long>(s.num_computed_tokens));
}

}  // namespace
}  // namespace tandem::engine
