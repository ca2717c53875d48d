// Prefill/decode handoff at the engine level: export the prompt's K/V from
// engine A (export_kv), import it into engine B (import_kv +
// prefix_output_token_ids {first token}) and compare with one engine doing
// everything: tokens and logprobs must be bit-identical.
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"
#include "tests/util/test_paths.h"

namespace tandem::engine {
namespace {

struct Handoff {
  CollectedOutput prefill;  // one token + finish (with kv_export)
  CollectedOutput decode;   // the rest
};

// Runs `request` disaggregated over two engines on `model`.
Handoff RunDisaggregated(Engine& prefill, Engine& decode, const EngineRequest& request) {
  Handoff h;
  EngineRequest p = request;
  p.export_kv = true;
  auto ph = prefill.Submit(p);
  TANDEM_CHECK(ph.ok());
  h.prefill = Collect(**ph);
  TANDEM_CHECK(h.prefill.finish.has_value());
  if (h.prefill.finish->kv_export == nullptr) return h;
  EngineRequest d = request;
  d.import_kv = h.prefill.finish->kv_export;
  d.prefix_output_token_ids = h.prefill.token_ids;
  auto dh = decode.Submit(d);
  TANDEM_CHECK(dh.ok());
  h.decode = Collect(**dh);
  return h;
}

CollectedOutput Concat(const Handoff& h) {
  CollectedOutput out = h.prefill;
  if (h.prefill.finish->kv_export == nullptr) return out;
  out.token_ids.insert(out.token_ids.end(), h.decode.token_ids.begin(), h.decode.token_ids.end());
  out.logprobs.insert(out.logprobs.end(), h.decode.logprobs.begin(), h.decode.logprobs.end());
  out.text += h.decode.text;
  out.finish = h.decode.finish;
  return out;
}

void ExpectAllFree(Engine& engine) {
  EXPECT_EQ(engine.Stats().num_blocks_used, 0);
  engine.Shutdown();
  EXPECT_TRUE(engine.CheckIntegrity().ok()) << engine.CheckIntegrity();
}

class PdHandoffTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tiny_ = new TinyModel(LoadTinyModel(DefaultTinyShape())); }
  static void TearDownTestSuite() { delete tiny_; }
  static const LlamaModel* model() { return tiny_->model.get(); }
  static TinyModel* tiny_;
};
TinyModel* PdHandoffTest::tiny_ = nullptr;

TEST_F(PdHandoffTest, ExportCarriesPromptKv) {
  auto engine = MakeEngine(TinyEngineConfig(64), model());
  auto h = engine->Submit([] {
    EngineRequest r = MakeRequest(RandomPrompt(37, 256, 1), 8);
    r.export_kv = true;
    return r;
  }());
  ASSERT_TRUE(h.ok());
  CollectedOutput out = Collect(**h);
  ASSERT_TRUE(out.finish.has_value());
  ASSERT_EQ(out.token_ids.size(), 1u);
  ASSERT_NE(out.finish->kv_export, nullptr);
  const KvExport& kv = *out.finish->kv_export;
  EXPECT_TRUE(kv.Validate().ok()) << kv.Validate();
  EXPECT_EQ(kv.num_tokens(), 37);
  EXPECT_EQ(kv.bytes_per_token, engine->kv_bytes_per_token());
  EXPECT_EQ(kv.token_ids, RandomPrompt(37, 256, 1));
  ExpectAllFree(*engine);
}

TEST_F(PdHandoffTest, MaxTokensOneNeedsNoTransfer) {
  auto engine = MakeEngine(TinyEngineConfig(64), model());
  EngineRequest r = MakeRequest(RandomPrompt(20, 256, 2), 1);
  r.export_kv = true;
  CollectedOutput out = Collect(**engine->Submit(r));
  ASSERT_TRUE(out.finish.has_value());
  EXPECT_EQ(out.finish->reason, RequestFinishReason::kLength);
  EXPECT_EQ(out.finish->kv_export, nullptr);
  ExpectAllFree(*engine);
}

TEST_F(PdHandoffTest, DisaggregatedMatchesColocatedGreedyAndSampled) {
  for (int i = 0; i < 6; ++i) {
    const double temperature = i % 2 ? 0.9 : 0.0;
    EngineRequest r = MakeRequest(RandomPrompt(5 + 13 * i, 256, 10 + i), 10, temperature, 77 + i);
    if (i == 5) {
      r.params.repetition_penalty = 1.3;
      r.params.frequency_penalty = 0.5;
    }
    const CollectedOutput colocated = RunAlone(model(), r);
    auto prefill = MakeEngine(TinyEngineConfig(64), model());
    auto decode = MakeEngine(TinyEngineConfig(64), model());
    const Handoff h = RunDisaggregated(*prefill, *decode, r);
    ExpectSameOutput(Concat(h), colocated, "request " + std::to_string(i));
    ExpectAllFree(*prefill);
    ExpectAllFree(*decode);
  }
}

TEST_F(PdHandoffTest, ImportWithPrefixCacheHitAndChunkedPrefill) {
  // Decode engine already caches part of the prompt; prefill chunks the prompt.
  EngineConfig pc = TinyEngineConfig(64);
  pc.scheduler.max_num_batched_tokens = 16;
  auto prefill = MakeEngine(pc, model());
  auto decode = MakeEngine(TinyEngineConfig(64), model());
  std::vector<int32_t> prompt = RandomPrompt(70, 256, 5);
  std::vector<int32_t> head(prompt.begin(), prompt.begin() + 40);
  Collect(**decode->Submit(MakeRequest(head, 2)));
  EngineRequest r = MakeRequest(prompt, 9, 0.7, 3);
  const Handoff h = RunDisaggregated(*prefill, *decode, r);
  ExpectSameOutput(Concat(h), RunAlone(model(), r), "prefix hit");
  EXPECT_GT(h.decode.finish->usage.num_cached_tokens, 0);
  ExpectAllFree(*prefill);
  ExpectAllFree(*decode);
}

TEST_F(PdHandoffTest, ImportedSequenceSurvivesPreemption) {
  // 10 blocks of 16: three imported sequences of 40 tokens that grow must preempt.
  EngineConfig dc = TinyEngineConfig(10);
  auto prefill = MakeEngine(TinyEngineConfig(64), model());
  auto decode = MakeEngine(dc, model());
  std::vector<EngineRequest> reqs;
  std::vector<EngineRequest> imports;
  std::vector<RequestHandle> handles;
  for (int i = 0; i < 3; ++i) {
    EngineRequest r = MakeRequest(RandomPrompt(40, 256, 30 + i), 14, i % 2 ? 0.8 : 0.0, i);
    EngineRequest p = r;
    p.export_kv = true;
    CollectedOutput first = Collect(**prefill->Submit(p));
    ASSERT_NE(first.finish->kv_export, nullptr);
    EngineRequest d = r;
    d.import_kv = first.finish->kv_export;
    d.prefix_output_token_ids = first.token_ids;
    reqs.push_back(r);
    imports.push_back(d);
  }
  for (EngineRequest& d : imports) handles.push_back(*decode->Submit(d));
  for (int i = 0; i < 3; ++i) {
    CollectedOutput got = Collect(*handles[i]);
    const CollectedOutput alone = RunAlone(model(), reqs[i]);
    ASSERT_TRUE(got.finish.has_value());
    EXPECT_EQ(got.token_ids,
              std::vector<int32_t>(alone.token_ids.begin() + 1, alone.token_ids.end()));
  }
  EXPECT_GT(decode->Stats().num_preemptions, 0);
  ExpectAllFree(*prefill);
  ExpectAllFree(*decode);
}

TEST_F(PdHandoffTest, CancelImportedFreesBlocks) {
  auto prefill = MakeEngine(TinyEngineConfig(64), model());
  auto decode = MakeEngine(TinyEngineConfig(64), model());
  EngineRequest r = MakeRequest(RandomPrompt(30, 256, 9), 500);
  EngineRequest p = r;
  p.export_kv = true;
  CollectedOutput first = Collect(**prefill->Submit(p));
  EngineRequest d = r;
  d.import_kv = first.finish->kv_export;
  d.prefix_output_token_ids = first.token_ids;
  auto h = decode->Submit(d);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE((*h)->Next().has_value());
  decode->Cancel(*h);
  CollectedOutput rest = Collect(**h);
  ASSERT_TRUE(rest.finish.has_value());
  EXPECT_EQ(rest.finish->reason, RequestFinishReason::kCancelled);
  ExpectAllFree(*prefill);
  ExpectAllFree(*decode);
}

TEST_F(PdHandoffTest, RejectsMismatchedImport) {
  auto decode = MakeEngine(TinyEngineConfig(64), model());
  auto prefill = MakeEngine(TinyEngineConfig(64), model());
  EngineRequest r = MakeRequest(RandomPrompt(20, 256, 4), 5);
  EngineRequest p = r;
  p.export_kv = true;
  auto kv = Collect(**prefill->Submit(p)).finish->kv_export;
  EngineRequest d = r;
  d.import_kv = kv;  // covers every token: nothing left to compute
  EXPECT_EQ(decode->Submit(d).status().code(), absl::StatusCode::kInvalidArgument);
  d.prefix_output_token_ids = {1};
  d.prompt_token_ids[3] ^= 1;  // tokens differ
  EXPECT_EQ(decode->Submit(d).status().code(), absl::StatusCode::kInvalidArgument);
  auto bad = std::make_shared<KvExport>(*kv);
  bad->bytes.resize(bad->bytes.size() - 4);
  d = r;
  d.prefix_output_token_ids = {1};
  d.import_kv = bad;
  EXPECT_EQ(decode->Submit(d).status().code(), absl::StatusCode::kInvalidArgument);
  ExpectAllFree(*prefill);
  ExpectAllFree(*decode);
}

TEST(PdHandoffRealModelTest, DisaggregatedMatchesColocated) {
  const std::string path = testing::DefaultModelPath();
  if (!std::ifstream(path).good()) GTEST_SKIP() << "no model at " << path;
  EngineConfig config;
  config.model_path = path;
  config.kv_cache_memory_bytes = 32 << 20;
  config.num_threads = 2;
  config.check_integrity_every_step = true;
  auto colocated = Engine::Create(config);
  ASSERT_TRUE(colocated.ok()) << colocated.status();
  const tokenizer::Tokenizer& tok = *(*colocated)->tokenizer();
  auto prefill = Engine::Create(config, &(*colocated)->model(), &tok);
  auto decode = Engine::Create(config, &(*colocated)->model(), &tok);
  ASSERT_TRUE(prefill.ok() && decode.ok());
  const char* kPrompts[] = {"The capital of France is", "Once upon a time, in a land"};
  for (int i = 0; i < 2; ++i) {
    for (double temperature : {0.0, 0.8}) {
      EngineRequest r = MakeRequest(tok.Encode(kPrompts[i], true, true), 10, temperature, 5 + i);
      const CollectedOutput alone = Collect(**(*colocated)->Submit(r));
      const Handoff h = RunDisaggregated(**prefill, **decode, r);
      ExpectSameOutput(Concat(h), alone, kPrompts[i]);
      EXPECT_EQ(Concat(h).text, alone.text);
    }
  }
  ExpectAllFree(**prefill);
  ExpectAllFree(**decode);
  ExpectAllFree(**colocated);
}

}  // namespace
}  // namespace tandem::engine
