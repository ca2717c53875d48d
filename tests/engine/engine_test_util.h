// Helpers shared by the engine tests: tiny random models, requests, and
// running one request alone on a fresh engine.
#ifndef TANDEM_TESTS_ENGINE_ENGINE_TEST_UTIL_H_
#define TANDEM_TESTS_ENGINE_ENGINE_TEST_UTIL_H_

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/gguf/gguf.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "engine/engine.h"
#include "engine/llama_model.h"
#include "gtest/gtest.h"
#include "tests/util/tiny_llama.h"

namespace tandem::engine {

// Tests run models on a 2-thread pool by default, so batch-invariance is
// checked with work split across threads (tests/common/thread_pool_test.cc
// covers the pool itself).
struct TinyModel {
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<LlamaModel> model;
};

inline TinyModel LoadTinyModel(const testing::TinyLlamaShape& shape, uint32_t seed = 7,
                               int threads = 2) {
  TinyModel t;
  t.pool = std::make_unique<ThreadPool>(threads);
  auto file = gguf::GgufFile::FromBuffer(testing::MakeRandomLlamaGguf(shape, seed));
  TANDEM_CHECK(file.ok());
  t.file = std::move(*file);
  auto model = LlamaModel::Load(*t.file, {t.pool.get(), false, {}});
  TANDEM_CHECK(model.ok());
  t.model = std::move(*model);
  return t;
}

inline testing::TinyLlamaShape DefaultTinyShape() {
  testing::TinyLlamaShape shape;
  shape.vocab = 256;
  shape.context = 1024;
  return shape;
}

inline std::vector<int32_t> RandomPrompt(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

inline EngineRequest MakeRequest(std::vector<int32_t> prompt, int64_t max_tokens,
                                 double temperature = 0.0, uint64_t seed = 0,
                                 std::optional<int> logprobs = 2) {
  EngineRequest r;
  r.prompt_token_ids = std::move(prompt);
  r.params.temperature = temperature;
  r.params.top_p = temperature > 0 ? 0.9 : 1.0;
  r.params.seed = seed;
  r.params.num_logprobs = logprobs;
  r.params.stop.max_tokens = max_tokens;
  return r;
}

inline EngineConfig TinyEngineConfig(int64_t num_blocks = 256) {
  EngineConfig c;
  c.num_kv_blocks = num_blocks;
  c.check_integrity_every_step = true;
  return c;
}

inline std::unique_ptr<Engine> MakeEngine(const EngineConfig& config, const LlamaModel* model,
                                          const tokenizer::Tokenizer* tok = nullptr) {
  auto engine = Engine::Create(config, model, tok);
  TANDEM_CHECK(engine.ok());
  return std::move(*engine);
}

// Runs `request` alone on a fresh engine (prefix caching off).
inline CollectedOutput RunAlone(const LlamaModel* model, EngineRequest request,
                                const tokenizer::Tokenizer* tok = nullptr) {
  EngineConfig config = TinyEngineConfig(1024);
  config.enable_prefix_caching = false;
  std::unique_ptr<Engine> engine = MakeEngine(config, model, tok);
  auto handle = engine->Submit(std::move(request));
  TANDEM_CHECK(handle.ok());
  CollectedOutput out = Collect(**handle);
  engine->Shutdown();
  EXPECT_TRUE(engine->CheckIntegrity().ok()) << engine->CheckIntegrity();
  return out;
}

// Same token ids and bit-identical logprobs.
inline void ExpectSameOutput(const CollectedOutput& a, const CollectedOutput& b,
                             const std::string& what) {
  ASSERT_TRUE(a.finish.has_value()) << what;
  ASSERT_TRUE(b.finish.has_value()) << what;
  EXPECT_EQ(a.token_ids, b.token_ids) << what;
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << what;
  for (size_t i = 0; i < a.logprobs.size(); ++i) {
    EXPECT_EQ(a.logprobs[i], b.logprobs[i]) << what << " token " << i;  // bit-exact
  }
  EXPECT_EQ(a.finish->reason, b.finish->reason) << what;
}

}  // namespace tandem::engine

#endif  // TANDEM_TESTS_ENGINE_ENGINE_TEST_UTIL_H_
