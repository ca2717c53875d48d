// Speculative decoding in the engine: n-gram drafts, verification by
// sample-and-compare, rollback of rejected drafts, back-off. The output must
// be token-for-token (and logprob-for-logprob) the output without
// speculation, greedy and sampled, alone and batched, with every stop rule
// exact and no KV block leaked.
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/spec/ngram_proposer.h"
#include "tests/engine/engine_test_util.h"

namespace tandem::engine {
namespace {

TEST(NgramProposerTest, LongestRecentSuffixMatch) {
  // Suffix [7 8] occurs at 1 and 5; the most recent (5) continues with 9 4.
  const std::vector<int32_t> t = {1, 7, 8, 2, 3, 7, 8, 9, 4, 5, 7, 8};
  EXPECT_EQ(ProposeNgram(t, 1, 4, 2), (std::vector<int32_t>{9, 4}));
  // A longer suffix wins over a more recent shorter one: [5 6 7] at 0 -> 1 2.
  const std::vector<int32_t> u = {5, 6, 7, 1, 2, 6, 7, 3, 5, 6, 7};
  EXPECT_EQ(ProposeNgram(u, 1, 3, 3), (std::vector<int32_t>{1, 2, 6}));
  // Only suffixes of length >= ngram_min count: [7] alone would match.
  EXPECT_EQ(ProposeNgram(u, 4, 4, 3), std::vector<int32_t>{});
  // The continuation stops at the end of the sequence: [4 3] at 1, its match
  // reaching back 3 tokens, continues with 4 3 and then the sequence ends.
  const std::vector<int32_t> v = {3, 4, 3, 4, 3};
  EXPECT_EQ(ProposeNgram(v, 1, 2, 5), (std::vector<int32_t>{4, 3}));
  EXPECT_EQ(ProposeNgram(std::vector<int32_t>{1, 2, 3}, 1, 3, 4), std::vector<int32_t>{});
  EXPECT_EQ(ProposeNgram(std::vector<int32_t>{}, 1, 3, 4), std::vector<int32_t>{});
  EXPECT_EQ(ProposeNgram(t, 1, 4, 0), std::vector<int32_t>{});
}

TEST(NgramProposerTest, LongestContextOccurrenceWins) {
  // Suffix [2 3] occurs at 1 and 6. The most recent one (6) is preceded by 5,
  // the older one by 1 as the sequence's end is: its match is 3 tokens long
  // ([1 2 3]), so it is the passage being copied: 9 8 5, not 7 6.
  const std::vector<int32_t> w = {1, 2, 3, 9, 8, 5, 2, 3, 7, 6, 1, 2, 3};
  EXPECT_EQ(ProposeNgram(w, 1, 2, 3), (std::vector<int32_t>{9, 8, 5}));
  // Equal matches: the most recent occurrence.
  const std::vector<int32_t> x = {4, 2, 3, 9, 4, 2, 3, 7, 1, 2, 3};
  EXPECT_EQ(ProposeNgram(x, 1, 2, 1), (std::vector<int32_t>{7}));
}

TEST(NgramProposerTest, DraftsCappedByMatchLength) {
  // A one-token match ([3] at 0) proposes one draft, however many are asked.
  EXPECT_EQ(ProposeNgram(std::vector<int32_t>{3, 4, 3}, 1, 2, 5), (std::vector<int32_t>{4}));
  // A two-token match ([4 5] at 1, preceded by 1, not 9): two drafts.
  const std::vector<int32_t> y = {1, 4, 5, 6, 7, 8, 9, 4, 5};
  EXPECT_EQ(ProposeNgram(y, 1, 4, 4), (std::vector<int32_t>{6, 7}));
  // A run copied for 18 tokens: its match counts 16 at most, so 16 drafts
  // however many are asked (118, 119, 1, 100 .. 112), fewer when asked fewer.
  std::vector<int32_t> z;
  for (int i = 0; i < 20; ++i) z.push_back(100 + i);
  z.push_back(1);
  for (int i = 0; i < 18; ++i) z.push_back(100 + i);
  std::vector<int32_t> want = {118, 119, 1};
  for (int i = 0; i < 13; ++i) want.push_back(100 + i);
  EXPECT_EQ(ProposeNgram(z, 1, 4, 20), want);
  EXPECT_EQ(ProposeNgram(z, 1, 4, 2), (std::vector<int32_t>{118, 119}));
}

class SpecDecodeTest : public ::testing::Test {
 protected:
  void SetUp() override { tiny_ = LoadTinyModel(DefaultTinyShape(), 11); }

  // Runs `requests` together on one engine; returns their outputs in order.
  std::vector<CollectedOutput> Run(const std::vector<EngineRequest>& requests,
                                   const SpecDecodeConfig& spec, EngineStats* stats = nullptr,
                                   int64_t budget = 512) {
    EngineConfig config = TinyEngineConfig(512);
    config.spec = spec;
    config.scheduler.max_num_batched_tokens = budget;
    std::unique_ptr<Engine> engine = MakeEngine(config, tiny_.model.get());
    std::vector<RequestHandle> handles;
    for (const EngineRequest& r : requests) {
      auto h = engine->Submit(r);
      EXPECT_TRUE(h.ok()) << h.status();
      handles.push_back(*h);
    }
    std::vector<CollectedOutput> outs;
    for (auto& h : handles) outs.push_back(Collect(*h));
    engine->Shutdown();
    EXPECT_TRUE(engine->CheckIntegrity().ok()) << engine->CheckIntegrity();
    const EngineStats s = engine->Stats();
    EXPECT_TRUE(s.integrity.ok()) << s.integrity;
    if (stats != nullptr) *stats = s;
    return outs;
  }

  // Prompts with repeated spans so that prompt lookup finds drafts.
  std::vector<int32_t> RepetitivePrompt(uint32_t seed) {
    std::vector<int32_t> span = RandomPrompt(12, 256, seed);
    std::vector<int32_t> p;
    for (int i = 0; i < 4; ++i) p.insert(p.end(), span.begin(), span.end());
    return p;
  }

  TinyModel tiny_;
};

// A proposer that knows the answer (the plain run's output tokens): its
// drafts are exactly what the target will produce.
SpecDecodeConfig Oracle(std::vector<int32_t> answer, int64_t prompt_len, int64_t k) {
  SpecDecodeConfig oracle;
  oracle.num_tokens = k;
  oracle.proposer = [answer = std::move(answer), prompt_len](const Sequence& seq, int64_t n) {
    const int64_t done = seq.num_tokens() - prompt_len;
    std::vector<int32_t> d;
    for (int64_t i = done; i < done + n && i < static_cast<int64_t>(answer.size()); ++i) {
      d.push_back(answer[i]);
    }
    return d;
  };
  return oracle;
}

SpecDecodeConfig Ngram(int64_t k) {
  SpecDecodeConfig s;
  s.method = SpecDecodeConfig::Method::kNgram;
  s.num_tokens = k;
  return s;
}

TEST_F(SpecDecodeTest, GreedyNgramEqualsPlainDecodingAloneAndBatched) {
  std::vector<EngineRequest> reqs;
  for (uint32_t i = 0; i < 8; ++i) reqs.push_back(MakeRequest(RepetitivePrompt(100 + i), 40));
  const std::vector<CollectedOutput> plain = Run(reqs, SpecDecodeConfig{});
  for (int64_t k : {1, 3, 5}) {
    EngineStats stats;
    const std::vector<CollectedOutput> spec = Run(reqs, Ngram(k), &stats);
    for (size_t i = 0; i < reqs.size(); ++i) {
      ExpectSameOutput(plain[i], spec[i],
                       "k=" + std::to_string(k) + " request " + std::to_string(i));
    }
    EXPECT_GT(stats.spec.num_drafts, 0) << "k=" << k;
    EXPECT_GT(stats.spec.num_accepted_tokens, 0) << "k=" << k;
    EXPECT_LE(stats.spec.num_accepted_tokens, stats.spec.num_draft_tokens);
    // Fewer steps than tokens: several tokens per step on some sequences.
    EXPECT_LT(stats.num_steps, stats.num_generated_tokens);
  }
  // Alone equals batched.
  const std::vector<CollectedOutput> alone = Run({reqs[3]}, Ngram(4));
  ExpectSameOutput(plain[3], alone[0], "alone");
}

TEST_F(SpecDecodeTest, SampledOutputIsUnchangedBySpeculation) {
  std::vector<EngineRequest> reqs;
  for (uint32_t i = 0; i < 6; ++i) {
    EngineRequest r = MakeRequest(RepetitivePrompt(200 + i), 32, /*temperature=*/0.7, 1000 + i);
    r.params.top_k = 20;
    r.params.repetition_penalty = 1.1;
    reqs.push_back(std::move(r));
  }
  const std::vector<CollectedOutput> plain = Run(reqs, SpecDecodeConfig{});
  const std::vector<CollectedOutput> spec = Run(reqs, Ngram(4));
  for (size_t i = 0; i < reqs.size(); ++i) ExpectSameOutput(plain[i], spec[i], std::to_string(i));
}

// An oracle proposer that knows the answer: every draft is accepted, and the
// steps shrink by about k + 1; a random proposer: drafts are rejected, the
// output is still exact and the back-off kicks in.
TEST_F(SpecDecodeTest, AcceptedAndRejectedDraftsBothGiveTheExactOutput) {
  const EngineRequest req = MakeRequest(RandomPrompt(30, 256, 5), 48);
  const std::vector<CollectedOutput> plain = Run({req}, SpecDecodeConfig{});
  const std::vector<int32_t> answer = plain[0].token_ids;
  const int64_t prompt_len = static_cast<int64_t>(req.prompt_token_ids.size());

  const SpecDecodeConfig oracle = Oracle(answer, prompt_len, 4);
  EngineStats stats;
  ExpectSameOutput(plain[0], Run({req}, oracle, &stats)[0], "oracle");
  EXPECT_EQ(stats.spec.num_accepted_tokens, stats.spec.num_draft_tokens);
  EXPECT_LE(stats.num_steps, 1 + (48 + 4) / 5 + 1);
  ASSERT_EQ(stats.spec.accepted_per_position.size(), 4u);
  EXPECT_EQ(stats.spec.accepted_per_position[0], stats.spec.num_drafts);

  SpecDecodeConfig wrong;
  wrong.num_tokens = 3;
  wrong.proposer = [&](const Sequence& seq, int64_t k) {
    const int64_t done = seq.num_tokens() - prompt_len;
    std::vector<int32_t> d;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t at = std::min<int64_t>(done + i, answer.size() - 1);
      d.push_back((answer[at] + 1) % 256);  // never the right token
    }
    return d;
  };
  ExpectSameOutput(plain[0], Run({req}, wrong, &stats)[0], "always wrong");
  EXPECT_EQ(stats.spec.num_accepted_tokens, 0);
  // Back-off: after a miss the sequence pauses 1, 2, 4, ... steps, so far
  // fewer drafts than steps.
  EXPECT_GT(stats.spec.num_drafts, 0);
  EXPECT_LT(stats.spec.num_drafts, 48 / 2);
}

// Stops stay exact when several tokens arrive in one step: max_tokens,
// a stop token inside the accepted drafts, min_tokens.
TEST_F(SpecDecodeTest, StopsAreExactWithSeveralTokensPerStep) {
  const EngineRequest base = MakeRequest(RepetitivePrompt(300), 40);
  const std::vector<int32_t> answer = Run({base}, SpecDecodeConfig{})[0].token_ids;
  ASSERT_GE(answer.size(), 20u);
  const int64_t prompt_len = static_cast<int64_t>(base.prompt_token_ids.size());
  const SpecDecodeConfig oracle = Oracle(answer, prompt_len, 6);
  for (int64_t max_tokens : {1, 2, 7, 13}) {
    EngineRequest r = base;
    r.params.stop.max_tokens = max_tokens;
    const CollectedOutput out = Run({r}, oracle)[0];
    EXPECT_EQ(out.token_ids, std::vector<int32_t>(answer.begin(), answer.begin() + max_tokens));
    EXPECT_EQ(out.finish->reason, FinishReason::kLength);
  }
  // A stop token that first appears at output position p ends the output
  // there, even when it arrives as an accepted draft mid-step.
  size_t p = 9;
  const int32_t stop = answer[p];
  while (p > 0 && std::find(answer.begin(), answer.begin() + p, stop) != answer.begin() + p) --p;
  p = std::find(answer.begin(), answer.end(), stop) - answer.begin();
  EngineRequest r = base;
  r.params.stop.stop_token_ids = {stop};
  const CollectedOutput out = Run({r}, oracle)[0];
  EXPECT_EQ(out.token_ids, std::vector<int32_t>(answer.begin(), answer.begin() + p + 1));
  EXPECT_EQ(out.finish->reason, FinishReason::kStop);
}

// A small step budget truncates drafts (never more tokens than the budget),
// and the lookahead blocks come and go without leaking (integrity is checked
// after every step by TinyEngineConfig).
TEST_F(SpecDecodeTest, SmallBudgetAndManySequences) {
  std::vector<EngineRequest> reqs;
  for (uint32_t i = 0; i < 16; ++i) reqs.push_back(MakeRequest(RepetitivePrompt(400 + i), 24));
  const std::vector<CollectedOutput> plain = Run(reqs, SpecDecodeConfig{}, nullptr, 24);
  const std::vector<CollectedOutput> spec = Run(reqs, Ngram(8), nullptr, 24);
  for (size_t i = 0; i < reqs.size(); ++i) ExpectSameOutput(plain[i], spec[i], std::to_string(i));
}

TEST(SpecDecodeConfigTest, ValidatesAndParses) {
  EngineConfig c;
  c.spec.num_tokens = 0;
  EXPECT_FALSE(c.Validate().ok());
  c.spec.num_tokens = 17;
  EXPECT_FALSE(c.Validate().ok());
  c.spec.num_tokens = 4;
  c.spec.ngram_min = 3;
  c.spec.ngram_max = 2;
  EXPECT_FALSE(c.Validate().ok());
  c.spec.ngram_max = 3;
  EXPECT_TRUE(c.Validate().ok());
  SpecDecodeConfig::Method m;
  EXPECT_TRUE(ParseSpecMethod("ngram", &m));
  EXPECT_EQ(m, SpecDecodeConfig::Method::kNgram);
  EXPECT_TRUE(ParseSpecMethod("off", &m));
  EXPECT_EQ(m, SpecDecodeConfig::Method::kOff);
  EXPECT_TRUE(ParseSpecMethod("draft", &m));
  EXPECT_EQ(m, SpecDecodeConfig::Method::kDraft);
  EXPECT_FALSE(ParseSpecMethod("medusa", &m));
  EXPECT_FALSE(ParseSpecMethod("", &m));
}

}  // namespace
}  // namespace tandem::engine
