#include "engine/sampler.h"

#include <cmath>
#include <map>
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
  for (int64_t pos = 0; pos < 50; ++pos) differ += s.Sample(logits, p, pos) != s.Sample(logits, q, pos);
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

}  // namespace
}  // namespace tandem::engine
