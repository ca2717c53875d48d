// Statistical tests of the sampler: draws against the distribution they
// should follow (chi-square at significance 0.001; fixed seeds, so the
// outcome is deterministic).
#include <cmath>
#include <vector>

#include "engine/sampler.h"
#include "gtest/gtest.h"

namespace tandem::engine {
namespace {

// Chi-square statistic of `draws` samples at positions [0, draws) against
// `expected` (probabilities over the ids); ids with expected 0 must never be
// drawn.
double ChiSquare(Sampler& s, absl::Span<const float> logits, const SamplingParams& p,
                 const SamplingContext& context, const std::vector<double>& expected, int draws) {
  std::vector<int> counts(expected.size());
  for (int pos = 0; pos < draws; ++pos) ++counts[s.Sample(logits, p, pos, context).token_id];
  double chi2 = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (expected[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "id " << i;
      continue;
    }
    const double e = expected[i] * draws;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi2;
}

std::vector<double> Softmax(const std::vector<double>& x, double t) {
  std::vector<double> p(x.size());
  double z = 0;
  for (size_t i = 0; i < x.size(); ++i) z += p[i] = std::exp(x[i] / t);
  for (double& q : p) q /= z;
  return p;
}

TEST(SamplerTest, TopKSamplingMatchesRenormalizedSoftmax) {
  Sampler s;
  const std::vector<float> logits = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f, -1.0f};
  // top-3 = ids 3, 5, 0.
  std::vector<double> kept = Softmax({1.0, 2.0, 1.5}, 0.8);
  std::vector<double> expected(logits.size());
  expected[0] = kept[0], expected[3] = kept[1], expected[5] = kept[2];
  SamplingParams p{.temperature = 0.8, .top_k = 3, .seed = 11};
  // 2 degrees of freedom: P(chi2 > 13.82) = 0.001.
  EXPECT_LT(ChiSquare(s, logits, p, {}, expected, 20000), 13.82);
}

TEST(SamplerTest, PenalizedSamplingMatchesSoftmaxOfPenalizedLogits) {
  Sampler s;
  const std::vector<float> logits = {1.0f, 0.5f, -0.5f, 2.0f, 0.0f};
  const std::vector<int32_t> history = {0, 3, 3};  // prompt {0}, output {3, 3}
  SamplingContext context{.token_ids = history, .num_prompt_tokens = 1};
  SamplingParams p{.temperature = 1.0,
                   .seed = 3,
                   .repetition_penalty = 2.0,
                   .presence_penalty = 0.25,
                   .frequency_penalty = 0.125};
  p.logit_bias = {{2, 1.0f}};
  // id 0: 1/2; id 3: 2/2 - (0.125*2 + 0.25); id 2: -0.5 + 1.
  const std::vector<double> expected = Softmax({0.5, 0.5, 0.5, 0.5, 0.0}, 1.0);
  // 4 degrees of freedom: P(chi2 > 18.47) = 0.001.
  EXPECT_LT(ChiSquare(s, logits, p, context, expected, 20000), 18.47);
}

TEST(SamplerTest, TopPSamplingMatchesNucleus) {
  Sampler s;
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  const std::vector<double> expected = {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0};
  SamplingParams p{.temperature = 1.0, .top_p = 0.9, .seed = 21};
  // 2 degrees of freedom.
  EXPECT_LT(ChiSquare(s, logits, p, {}, expected, 20000), 13.82);
}

}  // namespace
}  // namespace tandem::engine
