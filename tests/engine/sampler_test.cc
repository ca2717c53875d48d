#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::engine {
namespace {

std::vector<float> Logits() {
  // Distinct values with a clear order: id 3 > 0 > 5 > 1 > 4 > 2 > ...
  return {2.0f, 0.5f, -1.0f, 3.0f, 0.0f, 1.0f, -2.0f, -3.0f};
}

TEST(SamplerTest, GreedyIsArgmaxLowestIdOnTies) {
  Sampler s;
  SamplingParams p;
  EXPECT_EQ(s.Sample(Logits(), p, 0), 3);
  std::vector<float> ties = {1.0f, 5.0f, 5.0f, 2.0f};
  EXPECT_EQ(s.Sample(ties, p, 7), 1);
}

TEST(SamplerTest, TopKKeepsExactlyKLargest) {
  Sampler s;
  SamplingParams p{.temperature = 1.0, .top_k = 3};
  std::vector<int32_t> ids;
  std::vector<double> probs;
  s.Candidates(Logits(), p, &ids, &probs);
  EXPECT_EQ(ids, (std::vector<int32_t>{3, 0, 5}));
  double sum = 0;
  for (double q : probs) sum += q;
  EXPECT_NEAR(sum, 1.0, 1e-12);
}

TEST(SamplerTest, TopPKeepsSmallestPrefixReachingMass) {
  Sampler s;
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  std::vector<int32_t> ids;
  std::vector<double> probs;
  s.Candidates(logits, {.temperature = 1.0, .top_p = 0.8}, &ids, &probs);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1}));
  s.Candidates(logits, {.temperature = 1.0, .top_p = 0.81}, &ids, &probs);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_NEAR(probs[0], 0.5 / 0.95, 1e-6);
}

TEST(SamplerTest, MinPDropsTokensBelowFractionOfMax) {
  Sampler s;
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  std::vector<int32_t> ids;
  std::vector<double> probs;
  s.Candidates(logits, {.temperature = 1.0, .min_p = 0.29}, &ids, &probs);  // threshold 0.145
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2}));
  s.Candidates(logits, {.temperature = 1.0, .min_p = 0.31}, &ids, &probs);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1}));
}

TEST(SamplerTest, SameSeedAndPositionSameToken) {
  Sampler s;
  std::vector<float> logits(1000);
  for (int i = 0; i < 1000; ++i) logits[i] = std::sin(i * 0.37f) * 3.0f;
  SamplingParams p{.temperature = 1.0, .seed = 1234};
  for (int64_t pos = 0; pos < 50; ++pos) {
    EXPECT_EQ(s.Sample(logits, p, pos), s.Sample(logits, p, pos));
  }
  // Different seeds disagree somewhere.
  int differ = 0;
  SamplingParams q = p;
  q.seed = 99;
  for (int64_t pos = 0; pos < 50; ++pos)
    differ += s.Sample(logits, p, pos) != s.Sample(logits, q, pos);
  EXPECT_GT(differ, 10);
}

TEST(SamplerTest, TemperatureSamplingMatchesSoftmaxChiSquare) {
  Sampler s;
  std::vector<float> logits = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f};
  const double t = 0.7;
  std::vector<double> expected(logits.size());
  double z = 0;
  for (size_t i = 0; i < logits.size(); ++i) z += expected[i] = std::exp(logits[i] / t);
  for (double& e : expected) e /= z;
  const int draws = 20000;
  std::vector<int> counts(logits.size());
  SamplingParams p{.temperature = t, .seed = 7};
  for (int pos = 0; pos < draws; ++pos) ++counts[s.Sample(logits, p, pos)];
  double chi2 = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double e = expected[i] * draws;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  // 4 degrees of freedom: P(chi2 > 18.47) = 0.001.
  EXPECT_LT(chi2, 18.47);
}

TEST(SamplerTest, CounterUniformInRangeAndSpread) {
  double sum = 0;
  for (uint64_t i = 0; i < 10000; ++i) {
    double u = CounterUniform(42, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
}

TEST(SamplerTest, ValidateNamesTheField) {
  EXPECT_TRUE(SamplingParams{}.Validate().ok());
  auto bad = SamplingParams{.temperature = -1}.Validate();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("temperature"), std::string::npos);
  EXPECT_NE(SamplingParams{.top_p = 1.5}.Validate().message().find("top_p"), std::string::npos);
  EXPECT_NE(SamplingParams{.top_p = 0}.Validate().message().find("top_p"), std::string::npos);
  EXPECT_NE(SamplingParams{.top_k = -3}.Validate().message().find("top_k"), std::string::npos);
  EXPECT_NE(SamplingParams{.min_p = 2}.Validate().message().find("min_p"), std::string::npos);
}

// ---- Exact support on a large vocabulary: the fast paths (partial
// selection, threshold prefilter) against a brute-force full sort.

std::vector<float> RandomLogits(int n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> logits(n);
  for (float& l : logits) l = normal(rng);
  // Plant ties around the top so tie-breaking is exercised.
  for (int i : {17, 4242, 40000}) {
    if (i < n) logits[i] = 4.0f * scale;
  }
  return logits;
}

// Reference: full sort by (logit desc, id asc), softmax of the top-k (all when
// 0), min-p, then top-p over the un-renormalized probabilities.
std::vector<int32_t> ReferenceSupport(const std::vector<float>& logits, const SamplingParams& p) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  if (p.top_k > 0 && p.top_k < static_cast<int64_t>(ids.size())) ids.resize(p.top_k);
  std::vector<double> probs;
  double sum = 0;
  for (int32_t id : ids) {
    probs.push_back(std::exp((logits[id] - logits[ids[0]]) / p.temperature));
    sum += probs.back();
  }
  for (double& q : probs) q /= sum;
  size_t keep = ids.size();
  if (p.min_p > 0) {
    size_t k = 1;
    while (k < keep && probs[k] >= p.min_p * probs[0]) ++k;
    keep = k;
  }
  if (p.top_p < 1) {
    double cum = 0;
    size_t k = 0;
    while (k < keep) {
      cum += probs[k++];
      if (cum >= p.top_p) break;
    }
    keep = k;
  }
  ids.resize(keep);
  return ids;
}

TEST(SamplerTest, SupportMatchesFullSortOnLargeVocab) {
  Sampler s;
  const std::vector<float> logits = RandomLogits(49152, 5, 2.0f);
  const std::vector<SamplingParams> cases = {
      {.temperature = 1.0, .top_k = 1},
      {.temperature = 1.0, .top_k = 3},  // the three planted ties
      {.temperature = 0.7, .top_k = 50},
      {.temperature = 1.0, .top_k = 50, .top_p = 0.5},
      {.temperature = 1.0, .top_k = 200, .min_p = 0.05},
      {.temperature = 1.0, .top_p = 0.9},
      {.temperature = 0.5, .top_p = 0.3},
      {.temperature = 2.0, .top_p = 0.999},
      {.temperature = 1.0, .min_p = 0.1},
      {.temperature = 1.3, .min_p = 0.01},
      {.temperature = 1.0, .top_p = 0.95, .min_p = 0.02},
  };
  std::vector<int32_t> ids;
  std::vector<double> probs;
  for (const SamplingParams& p : cases) {
    SCOPED_TRACE(testing::Message() << "top_k=" << p.top_k << " top_p=" << p.top_p
                                    << " min_p=" << p.min_p << " t=" << p.temperature);
    s.Candidates(logits, p, &ids, &probs);
    EXPECT_EQ(ids, ReferenceSupport(logits, p));
    EXPECT_NEAR(std::accumulate(probs.begin(), probs.end(), 0.0), 1.0, 1e-9);
  }
}

TEST(SamplerTest, TiesKeepLowestIdsAndWholeTieGroupsWhereRequired) {
  Sampler s;
  std::vector<int32_t> ids;
  std::vector<double> probs;
  const std::vector<float> ties = {1.0f, 2.0f, 2.0f, 2.0f, 0.0f};
  s.Candidates(ties, {.temperature = 1.0, .top_k = 2}, &ids, &probs);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2}));
  // top-p stops at the first prefix reaching the mass: 0.25 + 0.25 = 0.5.
  const std::vector<float> flat = {1.0f, 1.0f, 1.0f, 1.0f};
  s.Candidates(flat, {.temperature = 1.0, .top_p = 0.5}, &ids, &probs);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1}));
  EXPECT_DOUBLE_EQ(probs[0], 0.5);
  // min-p keeps every token above the threshold, ties included.
  const std::vector<float> minp = {1.0f, 3.0f, 1.0f, -5.0f};  // e^-2 = 0.135 >= 0.1
  s.Candidates(minp, {.temperature = 1.0, .min_p = 0.1}, &ids, &probs);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 0, 2}));
}

// ---- Logit processing, exactly.

struct PenaltyFixture {
  std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f, 1.0f};
  std::vector<int32_t> history = {0, 1, 1, 3, 3, 9999};  // prompt {0, 1}; 9999 out of vocab
  SamplingContext context{.token_ids = history, .num_prompt_tokens = 2};
};

TEST(SamplerTest, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  PenaltyFixture f;
  std::vector<float> out;
  ProcessLogits(f.logits, {.repetition_penalty = 2.0}, f.context, &out);
  // Seen in prompt + output: 0, 1, 3 (once each, however often).
  EXPECT_EQ(out, (std::vector<float>{1.0f, -2.0f, 0.5f, 1.5f, 1.0f}));
}

TEST(SamplerTest, PresenceAndFrequencyPenaltiesCountOutputTokensOnly) {
  PenaltyFixture f;
  std::vector<float> out;
  // Output: 1 once, 3 twice. Token 0 is only in the prompt.
  ProcessLogits(f.logits, {.presence_penalty = 0.5}, f.context, &out);
  EXPECT_EQ(out, (std::vector<float>{2.0f, -1.5f, 0.5f, 2.5f, 1.0f}));
  ProcessLogits(f.logits, {.frequency_penalty = 0.25}, f.context, &out);
  EXPECT_EQ(out, (std::vector<float>{2.0f, -1.25f, 0.5f, 2.5f, 1.0f}));
  ProcessLogits(f.logits, {.presence_penalty = -1.0, .frequency_penalty = 0.5}, f.context, &out);
  EXPECT_EQ(out, (std::vector<float>{2.0f, -0.5f, 0.5f, 3.0f, 1.0f}));
}

TEST(SamplerTest, PenaltiesThenBiasInFixedOrder) {
  PenaltyFixture f;
  SamplingParams p{.repetition_penalty = 2.0, .frequency_penalty = 0.25};
  p.logit_bias = {{3, 0.5f}, {4, -2.0f}};
  std::vector<float> out;
  ProcessLogits(f.logits, p, f.context, &out);
  // id 3: 3 / 2 - 0.25 * 2 + 0.5; id 1: -1 * 2 - 0.25.
  EXPECT_EQ(out, (std::vector<float>{1.0f, -2.25f, 0.5f, 1.5f, -1.0f}));
}

TEST(SamplerTest, LogitBiasForcesAndBans) {
  Sampler s;
  const std::vector<float> logits = Logits();
  SamplingParams force{.temperature = 1.0, .seed = 5};
  force.logit_bias = {{7, 100.0f}};  // the least likely token
  for (int64_t pos = 0; pos < 200; ++pos) EXPECT_EQ(s.Sample(logits, force, pos, {}).token_id, 7);
  SamplingParams ban{.temperature = 1.0, .seed = 5};
  ban.logit_bias = {{3, -100.0f}};  // the argmax
  for (int64_t pos = 0; pos < 200; ++pos) EXPECT_NE(s.Sample(logits, ban, pos, {}).token_id, 3);
  SamplingParams greedy_ban;
  greedy_ban.logit_bias = {{3, -100.0f}};
  EXPECT_EQ(s.Sample(logits, greedy_ban, 0), 0);  // the legacy overload applies bias too
}

TEST(SamplerTest, MinTokensMasksEosAndStopTokensUntilReached) {
  Sampler s;
  const std::vector<float> logits = Logits();  // 3 > 0 > 5 > 1 ...
  const std::vector<int32_t> eos = {3};
  std::vector<int32_t> history = {1, 1, 2};  // prompt {1, 1}, one output token
  SamplingContext context{.token_ids = history, .num_prompt_tokens = 2, .eos_token_ids = eos};
  SamplingParams p;
  p.stop.min_tokens = 2;
  p.stop.stop_token_ids = {0};
  EXPECT_EQ(s.Sample(logits, p, 3, context).token_id, 5);  // 3 and 0 masked
  std::vector<float> out;
  ProcessLogits(logits, p, context, &out);
  EXPECT_EQ(out[3], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[0], -std::numeric_limits<float>::infinity());
  // Sampled with temperature, masked tokens never come up.
  SamplingParams t = p;
  t.temperature = 1.0;
  for (int64_t pos = 0; pos < 300; ++pos) {
    const int32_t id = s.Sample(logits, t, pos, context).token_id;
    EXPECT_TRUE(id != 3 && id != 0) << id;
  }
  // ignore_eos: EOS is an ordinary token, stop tokens still masked.
  p.stop.ignore_eos = true;
  EXPECT_EQ(s.Sample(logits, p, 3, context).token_id, 3);
  p.stop.ignore_eos = false;
  // Two output tokens: min_tokens reached, nothing masked.
  history.push_back(4);
  context.token_ids = history;
  EXPECT_EQ(s.Sample(logits, p, 4, context).token_id, 3);
}

TEST(SamplerTest, LogprobsAreLogSoftmaxOfProcessedLogitsWithTopN) {
  Sampler s;
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f, 0.5f, 2.0f};
  const double log_z = std::log(std::exp(1.0) + 2 * std::exp(2.0) + std::exp(3.0) + std::exp(0.5));
  SamplingParams p{.num_logprobs = 3};
  SampleResult r = s.Sample(logits, p, 0, {});
  EXPECT_EQ(r.token_id, 2);
  EXPECT_NEAR(r.logprob, 3.0 - log_z, 1e-6);
  ASSERT_EQ(r.top_logprobs.size(), 3u);
  EXPECT_EQ(r.top_logprobs[0].id, 2);
  EXPECT_EQ(r.top_logprobs[1].id, 1);  // tie with 4: lower id first
  EXPECT_EQ(r.top_logprobs[2].id, 4);
  EXPECT_NEAR(r.top_logprobs[1].logprob, 2.0 - log_z, 1e-6);
  EXPECT_EQ(r.top_logprobs[1].logprob, r.top_logprobs[2].logprob);
  // Independent of temperature and truncation: a sampled token reports the
  // same number.
  SamplingParams t{.temperature = 0.3, .top_k = 2, .seed = 1, .num_logprobs = 0};
  r = s.Sample(logits, t, 9, {});
  EXPECT_TRUE(r.top_logprobs.empty());
  EXPECT_NEAR(r.logprob, logits[r.token_id] - log_z, 1e-6);
  // After bias: the distribution the request reshaped.
  p.logit_bias = {{3, 2.5f}};  // id 3 -> 3.0, ties id 2
  r = s.Sample(logits, p, 0, {});
  const double log_z2 = std::log(std::exp(1.0) + 2 * std::exp(2.0) + 2 * std::exp(3.0));
  EXPECT_EQ(r.token_id, 2);
  EXPECT_NEAR(r.logprob, 3.0 - log_z2, 1e-6);
  EXPECT_EQ(r.top_logprobs[1].id, 3);
  // No logprobs unless asked.
  EXPECT_TRUE(s.Sample(logits, SamplingParams{}, 0, {}).top_logprobs.empty());
}

// ---- Reproducibility.

TEST(SamplerTest, DrawDependsOnlyOnSeedAndPositionNotOnHistory) {
  const std::vector<float> logits = RandomLogits(49152, 9, 1.5f);
  SamplingParams p{.temperature = 1.0, .top_p = 0.95, .seed = 77};
  Sampler fresh;
  std::vector<int32_t> expected;
  for (int64_t pos = 100; pos < 140; ++pos)
    expected.push_back(fresh.Sample(logits, p, pos, {}).token_id);
  // A sampler that has served other requests and positions, in another order.
  Sampler used;
  const std::vector<float> other = RandomLogits(49152, 10, 3.0f);
  for (int64_t pos = 0; pos < 30; ++pos) used.Sample(other, {.temperature = 0.5, .top_k = 5}, pos);
  for (int64_t pos = 139; pos >= 100; --pos) {
    EXPECT_EQ(used.Sample(logits, p, pos, {}).token_id, expected[pos - 100]) << pos;
  }
  // History without penalties does not change the draw.
  const std::vector<int32_t> history = {1, 2, 3, 4};
  EXPECT_EQ(used.Sample(logits, p, 100, {.token_ids = history, .num_prompt_tokens = 2}).token_id,
            expected[0]);
  // Positions draw independently: not all the same token.
  EXPECT_GT(std::set<int32_t>(expected.begin(), expected.end()).size(), 5u);
}

TEST(SamplerTest, LegacyOverloadMatchesFullSample) {
  Sampler s;
  const std::vector<float> logits = RandomLogits(1000, 2, 1.0f);
  SamplingParams p{.temperature = 0.9, .top_k = 40, .top_p = 0.9, .seed = 8};
  for (int64_t pos = 0; pos < 20; ++pos) {
    EXPECT_EQ(s.Sample(logits, p, pos), s.Sample(logits, p, pos, {}).token_id);
  }
}

}  // namespace
}  // namespace tandem::engine
