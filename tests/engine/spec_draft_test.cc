// Speculative decoding with a draft model (--spec-method draft): greedy
// output token-for-token (and logprob-for-logprob) the output without
// speculation; sampled output independent of the batch; the draft's KV
// freed on every path (finish, cancel, preemption); the vocabulary check;
// the per-request option.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/spec/draft_proposer.h"
#include "tests/engine/engine_test_util.h"

namespace tandem::engine {
namespace {

TinyModel LoadWithKernels(const testing::TinyLlamaShape& shape, uint32_t seed, KernelMode mode) {
  TinyModel t;
  t.pool = std::make_unique<ThreadPool>(2);
  auto file = gguf::GgufFile::FromBuffer(testing::MakeRandomLlamaGguf(shape, seed));
  TANDEM_CHECK(file.ok());
  t.file = std::move(*file);
  LoadOptions options;
  options.pool = t.pool.get();
  options.prefault = false;
  options.kernels = mode;
  auto model = LlamaModel::Load(*t.file, options);
  TANDEM_CHECK(model.ok());
  t.model = std::move(*model);
  return t;
}

class SpecDraftTest : public ::testing::Test {
 protected:
  void SetUp() override {
    target_ = LoadTinyModel(DefaultTinyShape(), 11);
    // The target itself at another precision: drafts mostly accepted.
    self_int8_ = LoadWithKernels(DefaultTinyShape(), 11, KernelMode::kFastInt8);
    // A smaller, unrelated model with the same vocabulary: drafts mostly rejected.
    testing::TinyLlamaShape small = DefaultTinyShape();
    small.num_layers = 1;
    other_ = LoadTinyModel(small, 99);
  }

  static SpecDecodeConfig Draft(const LlamaModel* draft, int64_t k) {
    SpecDecodeConfig c;
    c.method = SpecDecodeConfig::Method::kDraft;
    c.num_tokens = k;
    c.draft_model = draft;
    return c;
  }

  // Runs `requests` together on one engine; returns their outputs in order.
  std::vector<CollectedOutput> Run(const std::vector<EngineRequest>& requests,
                                   const SpecDecodeConfig& spec, EngineStats* stats = nullptr,
                                   int64_t budget = 512, int64_t num_blocks = 512) {
    EngineConfig config = TinyEngineConfig(num_blocks);
    config.spec = spec;
    config.scheduler.max_num_batched_tokens = budget;
    config.scheduler.max_waiting_requests = 16384;
    std::unique_ptr<Engine> engine = MakeEngine(config, target_.model.get());
    std::vector<RequestHandle> handles;
    for (const EngineRequest& r : requests) {
      auto h = engine->Submit(r);
      EXPECT_TRUE(h.ok()) << h.status();
      handles.push_back(*h);
    }
    std::vector<CollectedOutput> outs;
    for (auto& h : handles) outs.push_back(Collect(*h));
    engine->Shutdown();
    // Includes the draft proposer: no sequence, no draft KV block left.
    EXPECT_TRUE(engine->CheckIntegrity().ok()) << engine->CheckIntegrity();
    const EngineStats s = engine->Stats();
    EXPECT_TRUE(s.integrity.ok()) << s.integrity;
    if (stats != nullptr) *stats = s;
    return outs;
  }

  std::vector<EngineRequest> GreedyBatch(int n, int64_t max_tokens) {
    std::vector<EngineRequest> reqs;
    for (int i = 0; i < n; ++i) {
      reqs.push_back(MakeRequest(RandomPrompt(20 + 7 * i, 256, 300 + i), max_tokens));
    }
    return reqs;
  }

  TinyModel target_, self_int8_, other_;
};

TEST_F(SpecDraftTest, GreedyEqualsPlainDecodingAloneAndBatched) {
  const std::vector<EngineRequest> reqs = GreedyBatch(6, 40);
  const std::vector<CollectedOutput> plain = Run(reqs, SpecDecodeConfig{});
  for (const LlamaModel* draft : {self_int8_.model.get(), other_.model.get()}) {
    for (int64_t k : {1, 4}) {
      const std::string what =
          std::string(draft == other_.model.get() ? "other" : "self") + " k=" + std::to_string(k);
      EngineStats stats;
      const std::vector<CollectedOutput> spec = Run(reqs, Draft(draft, k), &stats);
      for (size_t i = 0; i < reqs.size(); ++i) {
        ExpectSameOutput(plain[i], spec[i], what + " request " + std::to_string(i));
      }
      EXPECT_GT(stats.spec.num_drafts, 0) << what;
      EXPECT_LE(stats.spec.num_accepted_tokens, stats.spec.num_draft_tokens) << what;
      if (draft == self_int8_.model.get()) {
        // The same weights at int8 activations agree on most argmaxes.
        EXPECT_GT(stats.spec.num_accepted_tokens * 2, stats.spec.num_draft_tokens) << what;
        EXPECT_LT(stats.num_steps, stats.num_generated_tokens) << what;
      }
    }
  }
  const std::vector<CollectedOutput> alone = Run({reqs[2]}, Draft(self_int8_.model.get(), 4));
  ExpectSameOutput(plain[2], alone[0], "alone");
}

// Sampled: the rejection sampler's draws are keyed by (seed, position), the
// draft's by (seed ^ salt, position), and the number of drafts by the
// sequence alone, so a request gives the same tokens alone and batched.
TEST_F(SpecDraftTest, SampledIsTheSameAloneAndBatched) {
  std::vector<EngineRequest> reqs;
  for (uint32_t i = 0; i < 5; ++i) {
    EngineRequest r = MakeRequest(RandomPrompt(24 + 5 * i, 256, 500 + i), 36,
                                  /*temperature=*/0.8, 7000 + i);
    r.params.top_k = 40;
    r.params.repetition_penalty = 1.1;
    r.params.min_p = i % 2 == 0 ? 0.02 : 0.0;
    reqs.push_back(std::move(r));
  }
  for (const LlamaModel* draft : {self_int8_.model.get(), other_.model.get()}) {
    EngineStats stats;
    const std::vector<CollectedOutput> batched = Run(reqs, Draft(draft, 4), &stats);
    EXPECT_GT(stats.spec.num_drafts, 0);
    EXPECT_GT(stats.spec.num_accepted_tokens, 0);
    for (size_t i = 0; i < reqs.size(); ++i) {
      const std::vector<CollectedOutput> alone = Run({reqs[i]}, Draft(draft, 4));
      ExpectSameOutput(batched[i], alone[0], "request " + std::to_string(i));
    }
    // A budget that makes sequences wait for room for their drafts.
    const std::vector<CollectedOutput> tight = Run(reqs, Draft(draft, 4), nullptr, 12);
    for (size_t i = 0; i < reqs.size(); ++i) {
      ExpectSameOutput(batched[i], tight[i], "tight budget, request " + std::to_string(i));
    }
  }
}

// Few KV blocks: sequences are preempted (their draft KV released) and
// recomputed; the output stays exact and nothing leaks (integrity after
// every step, and the idle check at the end).
TEST_F(SpecDraftTest, PreemptionKeepsOutputExactAndFreesDraftKv) {
  const std::vector<EngineRequest> reqs = GreedyBatch(8, 48);
  const std::vector<CollectedOutput> plain = Run(reqs, SpecDecodeConfig{});
  EngineStats stats;
  const std::vector<CollectedOutput> spec =
      Run(reqs, Draft(self_int8_.model.get(), 4), &stats, 512, /*num_blocks=*/20);
  EXPECT_GT(stats.num_preemptions, 0);
  EXPECT_GT(stats.spec.num_accepted_tokens, 0);
  for (size_t i = 0; i < reqs.size(); ++i) ExpectSameOutput(plain[i], spec[i], std::to_string(i));
  // Sampled: preempted and recomputed (in chunks of a small budget) or not,
  // the same tokens.
  std::vector<EngineRequest> sampled = reqs;
  for (size_t i = 0; i < sampled.size(); ++i) {
    sampled[i].params.temperature = 0.9;
    sampled[i].params.top_p = 0.95;
    sampled[i].params.seed = 40 + i;
  }
  const std::vector<CollectedOutput> roomy =
      Run(sampled, Draft(other_.model.get(), 3), nullptr, 512, 512);
  const std::vector<CollectedOutput> tight =
      Run(sampled, Draft(other_.model.get(), 3), &stats, 40, /*num_blocks=*/20);
  EXPECT_GT(stats.num_preemptions, 0);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ExpectSameOutput(roomy[i], tight[i], "sampled " + std::to_string(i));
  }
}

TEST_F(SpecDraftTest, CancelAndFinishFreeTheDraftKv) {
  EngineConfig config = TinyEngineConfig(512);
  config.spec = Draft(self_int8_.model.get(), 4);
  std::unique_ptr<Engine> engine = MakeEngine(config, target_.model.get());
  std::vector<RequestHandle> handles;
  for (int i = 0; i < 4; ++i) {
    auto h = engine->Submit(MakeRequest(RandomPrompt(30, 256, 900 + i), i < 2 ? 400 : 8));
    ASSERT_TRUE(h.ok());
    handles.push_back(*h);
  }
  // Cancel the two long ones once they are decoding (drafting).
  for (int i = 0; i < 2; ++i) {
    for (int seen = 0; seen < 3;) {
      std::optional<EngineEvent> ev = handles[i]->Next(absl::Seconds(60));
      ASSERT_TRUE(ev.has_value());
      ASSERT_TRUE(std::holds_alternative<TokenEvent>(*ev));
      ++seen;
    }
    engine->Cancel(handles[i]);
  }
  for (auto& h : handles) {
    CollectedOutput out = Collect(*h);
    ASSERT_TRUE(out.finish.has_value());
  }
  // Everything finished, the engine still up: the draft holds nothing.
  for (int i = 0; i < 200 && engine->Stats().num_running + engine->Stats().num_waiting > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  engine->Shutdown(ShutdownMode::kDrain);
  EXPECT_TRUE(engine->CheckIntegrity().ok()) << engine->CheckIntegrity();
  EXPECT_GT(engine->Stats().spec.num_drafts, 0);
}

TEST_F(SpecDraftTest, DraftProposerReleaseFreesBlocks) {
  spec::DraftProposerOptions options;
  options.num_blocks = 64;
  auto proposer = spec::DraftProposer::Create(self_int8_.model.get(), options);
  ASSERT_TRUE(proposer.ok()) << proposer.status();
  Sequence a(1, RandomPrompt(40, 256, 1), SamplingParams{});
  SamplingParams sampled;
  sampled.temperature = 0.9;
  sampled.seed = 5;
  Sequence b(2, RandomPrompt(17, 256, 2), sampled);
  const std::vector<BatchProposer::Request> reqs = {{&a, 3}, {&b, 5}};
  std::vector<BatchProposer::Proposal> p = (*proposer)->Propose(reqs);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].token_ids.size(), 3u);
  EXPECT_TRUE(p[0].probs.empty());  // greedy: q not needed
  EXPECT_EQ(p[1].token_ids.size(), 5u);
  ASSERT_EQ(p[1].probs.size(), 5u * 256);
  for (int i = 0; i < 5; ++i) {  // q is a distribution giving its draft mass
    double sum = 0;
    for (int v = 0; v < 256; ++v) sum += p[1].probs[i * 256 + v];
    EXPECT_NEAR(sum, 1.0, 1e-4);
    EXPECT_GT(p[1].probs[i * 256 + p[1].token_ids[i]], 0.0f);
  }
  EXPECT_EQ((*proposer)->num_sequences(), 2);
  EXPECT_GT((*proposer)->num_used_blocks(), 0);
  // Same inputs, same drafts (deterministic), also after a rollback.
  std::vector<BatchProposer::Proposal> again = (*proposer)->Propose(reqs);
  EXPECT_EQ(again[0].token_ids, p[0].token_ids);
  EXPECT_EQ(again[1].token_ids, p[1].token_ids);
  EXPECT_EQ(again[1].probs, p[1].probs);
  (*proposer)->Release(1);
  EXPECT_TRUE((*proposer)->CheckIntegrity(/*idle=*/false).ok());
  EXPECT_FALSE((*proposer)->CheckIntegrity(/*idle=*/true).ok());
  (*proposer)->Release(2);
  EXPECT_TRUE((*proposer)->CheckIntegrity(/*idle=*/true).ok()) << (*proposer)->CheckIntegrity(true);
  EXPECT_EQ((*proposer)->num_used_blocks(), 0);
}

TEST_F(SpecDraftTest, VocabularyMismatchIsAClearError) {
  testing::TinyLlamaShape shape = DefaultTinyShape();
  shape.vocab = 128;
  TinyModel small_vocab = LoadTinyModel(shape, 3);
  EngineConfig config = TinyEngineConfig(64);
  config.spec = Draft(small_vocab.model.get(), 4);
  auto engine = Engine::Create(config, target_.model.get(), nullptr);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("vocabulary of 128 tokens, the target model 256"),
            std::string::npos)
      << engine.status();
  // A file that is not there / not a GGUF.
  config.spec.draft_model = nullptr;
  config.spec.draft_model_path = ::testing::TempDir() + "/no_such_draft.gguf";
  engine = Engine::Create(config, target_.model.get(), nullptr);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("no_such_draft.gguf"), std::string::npos)
      << engine.status();
  // Loaded from a path (the same shape, other weights): works.
  const std::string path = ::testing::TempDir() + "/tiny_draft.gguf";
  {
    std::ofstream out(path, std::ios::binary);
    out << testing::MakeRandomLlamaGguf(DefaultTinyShape(), 11);
  }
  config.spec.draft_model_path = path;
  engine = Engine::Create(config, target_.model.get(), nullptr);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_NE((*engine)->draft_description().find("tiny_draft.gguf"), std::string::npos);
  auto h = (*engine)->Submit(MakeRequest(RandomPrompt(20, 256, 1), 16));
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE(Collect(**h).finish.has_value());
  (*engine)->Shutdown();
  EXPECT_TRUE((*engine)->CheckIntegrity().ok());
  EXPECT_GT((*engine)->Stats().spec.num_accepted_tokens, 0);
  std::remove(path.c_str());
  // Method draft without a model.
  EngineConfig bad = TinyEngineConfig(64);
  bad.spec.method = SpecDecodeConfig::Method::kDraft;
  EXPECT_FALSE(bad.Validate().ok());
}

// SamplingParams::num_speculative_tokens: 0 turns drafting off for the
// request, 1 limits it to one draft per step; the output is unchanged.
TEST_F(SpecDraftTest, PerRequestOptionIsHonoured) {
  EngineRequest base = MakeRequest(RandomPrompt(25, 256, 77), 32);
  const std::vector<CollectedOutput> plain = Run({base}, SpecDecodeConfig{});
  EngineRequest off = base;
  off.params.num_speculative_tokens = 0;
  EngineStats stats;
  std::vector<CollectedOutput> out = Run({off}, Draft(self_int8_.model.get(), 4), &stats);
  ExpectSameOutput(plain[0], out[0], "off");
  EXPECT_EQ(stats.spec.num_drafts, 0);
  EngineRequest one = base;
  one.params.num_speculative_tokens = 1;
  out = Run({one}, Draft(self_int8_.model.get(), 4), &stats);
  ExpectSameOutput(plain[0], out[0], "one");
  EXPECT_GT(stats.spec.num_drafts, 0);
  EXPECT_EQ(stats.spec.num_draft_tokens, stats.spec.num_drafts);  // one draft per step
  EXPECT_EQ(stats.spec.accepted_per_position.size(), 1u);
  // Unset: the server's k (up to 4 drafts per step).
  out = Run({base}, Draft(self_int8_.model.get(), 4), &stats);
  EXPECT_GT(stats.spec.num_draft_tokens, stats.spec.num_drafts);
  // Out of range is rejected at Submit.
  EngineRequest bad = base;
  bad.params.num_speculative_tokens = 17;
  EXPECT_FALSE(bad.params.Validate().ok());
  bad.params.num_speculative_tokens = -1;
  EXPECT_FALSE(bad.params.Validate().ok());
}

// Sampled output with a draft distribution q != p has the distribution of
// plain sampling: the second output token (the first one drafted) over 10000
// seeds, with and without speculation (an unrelated draft model, so most
// drafts are rejected and the residual draws matter), by a two-sample
// chi-square test on bins with >= 10 expected counts. Seeds are fixed, so
// the test is deterministic; the threshold is the p = 0.001 critical value
// (accepting drafts at twice the right rate gives about 3x that).
TEST_F(SpecDraftTest, SampledDistributionMatchesPlainSampling) {
  const std::vector<int32_t> prompt = RandomPrompt(12, 256, 4242);
  std::vector<EngineRequest> reqs;
  for (uint32_t i = 0; i < 10000; ++i) {
    EngineRequest r = MakeRequest(prompt, 3, /*temperature=*/1.0, 100000 + i, std::nullopt);
    r.params.top_p = 1.0;
    r.params.top_k = 12;
    reqs.push_back(std::move(r));
  }
  auto histogram = [&](const SpecDecodeConfig& spec, EngineStats* stats) {
    std::map<int32_t, double> h;
    for (const CollectedOutput& o : Run(reqs, spec, stats, 4096, 2048)) {
      EXPECT_EQ(o.token_ids.size(), 3u);
      if (o.token_ids.size() == 3) h[o.token_ids[1]] += 1;
    }
    return h;
  };
  EngineStats stats;
  std::map<int32_t, double> plain = histogram(SpecDecodeConfig{}, nullptr);
  std::map<int32_t, double> spec = histogram(Draft(other_.model.get(), 2), &stats);
  EXPECT_GE(stats.spec.num_draft_tokens, 10000);
  EXPECT_LT(stats.spec.num_accepted_tokens, stats.spec.num_draft_tokens);  // residual draws used
  // Bins: tokens with >= 20 counts in both runs together, the rest pooled.
  double chi2 = 0, rest_a = 0, rest_b = 0;
  int df = 0;
  std::map<int32_t, double> all = plain;
  for (const auto& [t, c] : spec) all[t] += 0;
  for (const auto& [t, unused] : all) {
    const double a = plain.count(t) ? plain[t] : 0, b = spec.count(t) ? spec[t] : 0;
    if (a + b < 20) {
      rest_a += a;
      rest_b += b;
      continue;
    }
    chi2 += (a - b) * (a - b) / (a + b);
    ++df;
  }
  if (rest_a + rest_b > 0) {
    chi2 += (rest_a - rest_b) * (rest_a - rest_b) / (rest_a + rest_b);
    ++df;
  }
  ASSERT_GE(df, 4);
  // The p = 0.001 critical value (Wilson-Hilferty).
  const double c = 2.0 / (9.0 * df);
  const double critical = df * std::pow(1.0 - c + 3.09 * std::sqrt(c), 3);
  EXPECT_LT(chi2, critical) << "df " << df;
}

}  // namespace
}  // namespace tandem::engine
