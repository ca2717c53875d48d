// Tests of draft verification (engine/spec/rejection_sampler.h): statistical
// (the emitted token at every position follows the target distribution p,
// whatever the draft distribution q) and exact (greedy, processing, RNG
// keying). Seeds are fixed, so every outcome is deterministic.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/sampler.h"
#include "engine/spec/rejection_sampler.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::engine::spec {
namespace {

using ::testing::ElementsAre;

// Regularized upper incomplete gamma Q(a, x): series for x < a + 1, else
// Lentz's continued fraction (Numerical Recipes 6.2).
double GammaQ(double a, double x) {
  if (x <= 0.0) return 1.0;
  const double log_prefix = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1.0) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 10000; ++n) {
      term *= x / (a + n);
      sum += term;
      if (std::fabs(term) < std::fabs(sum) * 1e-15) break;
    }
    return std::max(0.0, 1.0 - sum * std::exp(log_prefix));
  }
  constexpr double kTiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / kTiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = b + an / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1.0) < 1e-15) break;
  }
  return std::exp(log_prefix) * h;
}

// P(X > chi2) for X ~ chi-square with `dof` degrees of freedom.
double ChiSquareSurvival(double chi2, int dof) { return GammaQ(0.5 * dof, 0.5 * chi2); }

// p-value of `counts` against `probs` (same length). Bins are merged in
// ascending order of expected count until each expects >= 5. Ids with
// probs == 0 are left out (callers check them separately).
double ChiSquarePValue(const std::vector<int64_t>& counts, const std::vector<double>& probs) {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  std::vector<size_t> order;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] > 0.0) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return probs[a] < probs[b]; });
  std::vector<double> expected, observed;
  double e = 0.0, o = 0.0;
  for (size_t i : order) {
    e += probs[i] * n;
    o += counts[i];
    if (e >= 5.0) {
      expected.push_back(e), observed.push_back(o);
      e = o = 0.0;
    }
  }
  if (e > 0.0) {
    if (expected.empty()) return 1.0;
    expected.back() += e, observed.back() += o;
  }
  if (expected.size() < 2) return 1.0;
  double chi2 = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    chi2 += (observed[i] - expected[i]) * (observed[i] - expected[i]) / expected[i];
  }
  return ChiSquareSurvival(chi2, static_cast<int>(expected.size()) - 1);
}

TEST(ChiSquareTest, SurvivalMatchesTables) {
  EXPECT_NEAR(ChiSquareSurvival(3.841, 1), 0.05, 1e-4);
  EXPECT_NEAR(ChiSquareSurvival(13.816, 2), 0.001, 1e-5);
  EXPECT_NEAR(ChiSquareSurvival(23.209, 10), 0.01, 1e-4);
  EXPECT_NEAR(ChiSquareSurvival(135.807, 100), 0.01, 1e-4);
  EXPECT_NEAR(ChiSquareSurvival(2.0, 2), std::exp(-1.0), 1e-12);
}

std::vector<double> Normalize(std::vector<double> w) {
  double s = 0.0;
  for (double x : w) s += x;
  for (double& x : w) x /= s;
  return w;
}

// A random target row: softmax of N(0, 1.5) logits with a top-k mask keeping
// 60% of the vocabulary (the rest has p = 0).
std::vector<double> RandomTarget(int vocab, std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, 1.5);
  std::vector<double> logits(vocab);
  for (double& l : logits) l = normal(rng);
  std::vector<double> sorted = logits;
  const int keep = (vocab * 6 + 9) / 10;
  std::nth_element(sorted.begin(), sorted.begin() + (keep - 1), sorted.end(), std::greater<>());
  const double cut = sorted[keep - 1];
  std::vector<double> w(vocab);
  for (int i = 0; i < vocab; ++i) w[i] = logits[i] >= cut ? std::exp(logits[i]) : 0.0;
  return Normalize(w);
}

// A random distribution with full support (so drafts can be masked tokens).
std::vector<double> RandomFull(int vocab, std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> w(vocab);
  for (double& x : w) x = std::exp(normal(rng));
  return Normalize(w);
}

int32_t Draw(const std::vector<double>& probs, std::mt19937_64& rng) {
  std::discrete_distribution<int32_t> dist(probs.begin(), probs.end());
  return dist(rng);
}

enum class DraftKind {
  kNear,    // q = 0.7 p + 0.3 r: high acceptance, deep positions reached
  kFar,     // q independent of p: frequent rejections, residual sampling
  kOneHot,  // deterministic drafter: q one-hot at d, d from a p-like law
};

std::string KindName(DraftKind kind) {
  switch (kind) {
    case DraftKind::kNear:
      return "near";
    case DraftKind::kFar:
      return "far";
    case DraftKind::kOneHot:
      return "one_hot";
  }
  return "";
}

struct Trials {
  std::vector<std::vector<double>> p;              // [k + 1][V]
  std::vector<std::vector<int64_t>> counts;        // [k + 1][V] emitted at position j
  std::vector<std::vector<int64_t>> wrong_counts;  // same, "resample from p" bug
  std::vector<int64_t> num_reached;                // [k + 1]
  int64_t outside_support = 0;                     // emitted tokens with p == 0
  int64_t bad_shape = 0;                           // malformed VerifyResult
};

// Runs `num_trials` verifications of fresh drafts against fixed p rows.
Trials RunTrials(int vocab, int k, DraftKind kind, int num_trials, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Trials t;
  std::vector<std::vector<double>> q(k), draft_law(k);
  for (int j = 0; j <= k; ++j) t.p.push_back(RandomTarget(vocab, rng));
  for (int j = 0; j < k; ++j) {
    const std::vector<double> r = RandomFull(vocab, rng);
    switch (kind) {
      case DraftKind::kNear:
        q[j].resize(vocab);
        for (int i = 0; i < vocab; ++i) q[j][i] = 0.7 * t.p[j][i] + 0.3 * r[i];
        draft_law[j] = q[j];
        break;
      case DraftKind::kFar:
        q[j] = r;
        draft_law[j] = r;
        break;
      case DraftKind::kOneHot: {
        // Sharpened p mixed with a little of everything (masked ids too).
        std::vector<double> w(vocab);
        for (int i = 0; i < vocab; ++i) w[i] = t.p[j][i] * t.p[j][i];
        w = Normalize(w);
        for (int i = 0; i < vocab; ++i) w[i] = 0.9 * w[i] + 0.1 / vocab;
        draft_law[j] = w;
        break;
      }
    }
  }
  std::vector<double> target_flat, q_flat;
  for (const auto& row : t.p) target_flat.insert(target_flat.end(), row.begin(), row.end());
  if (kind != DraftKind::kOneHot) {
    for (const auto& row : q) q_flat.insert(q_flat.end(), row.begin(), row.end());
  }
  std::vector<std::discrete_distribution<int32_t>> draft_dists, p_dists;
  for (const auto& law : draft_law) draft_dists.emplace_back(law.begin(), law.end());
  for (const auto& row : t.p) p_dists.emplace_back(row.begin(), row.end());
  t.counts.assign(k + 1, std::vector<int64_t>(vocab));
  t.wrong_counts.assign(k + 1, std::vector<int64_t>(vocab));
  t.num_reached.assign(k + 1, 0);
  std::vector<int32_t> draft(k);
  for (int trial = 0; trial < num_trials; ++trial) {
    for (int j = 0; j < k; ++j) draft[j] = draft_dists[j](rng);
    const VerifyResult r = RejectionSample(target_flat, vocab, draft, q_flat,
                                           /*seed=*/seed * 1000003 + trial, /*first_position=*/17);
    if (r.num_accepted < 0 || r.num_accepted > k ||
        r.token_ids.size() != static_cast<size_t>(r.num_accepted) + 1 ||
        !std::equal(r.token_ids.begin(), r.token_ids.begin() + r.num_accepted, draft.begin())) {
      ++t.bad_shape;
      continue;
    }
    for (size_t j = 0; j < r.token_ids.size(); ++j) {
      const int32_t id = r.token_ids[j];
      ++t.num_reached[j];
      ++t.counts[j][id];
      if (t.p[j][id] == 0.0) ++t.outside_support;
      // The classic bug: on rejection draw from p instead of the residual.
      const bool rejected = static_cast<int>(j) == r.num_accepted && r.num_accepted < k;
      ++t.wrong_counts[j][rejected ? p_dists[j](rng) : id];
    }
  }
  return t;
}

constexpr int kNumTrials = 100000;
constexpr double kMinPValue = 0.01;
constexpr int64_t kMinSamplesToTest = 1000;

class RejectionSampleDistributionTest
    : public ::testing::TestWithParam<std::tuple<int, DraftKind>> {};

TEST_P(RejectionSampleDistributionTest, EmittedTokensFollowTarget) {
  const auto [vocab, kind] = GetParam();
  // All chi-square tests of this instance form one family: it passes when
  // the Bonferroni-adjusted p-value (smallest p times the number of tests)
  // exceeds kMinPValue, so a correct sampler fails an instance with
  // probability <= 1%, not ~1% per test (about 15 per instance). A sweep of
  // 646 such tests over other seeds gave p-values uniform on [0, 1] (1.2%
  // below 0.01, 9.9% below 0.1, 48.6% below 0.5).
  std::vector<std::string> tested;
  std::vector<double> p_values;
  for (int k = 1; k <= 5; ++k) {
    SCOPED_TRACE(absl::StrCat("vocab ", vocab, " k ", k, " ", KindName(kind)));
    const Trials t = RunTrials(vocab, k, kind, kNumTrials,
                               /*seed=*/vocab * 100 + k * 10 + static_cast<int>(kind));
    EXPECT_EQ(t.bad_shape, 0);
    EXPECT_EQ(t.outside_support, 0);
    EXPECT_EQ(t.num_reached[0], kNumTrials);
    int num_tested = 0;
    for (int j = 0; j <= k; ++j) {
      if (t.num_reached[j] < kMinSamplesToTest) continue;
      ++num_tested;
      p_values.push_back(ChiSquarePValue(t.counts[j], t.p[j]));
      tested.push_back(absl::StrCat("k ", k, " position ", j, " (", t.num_reached[j],
                                    " samples): p = ", p_values.back()));
    }
    // Near drafts are accepted often enough to test every position,
    // including the bonus; the others at least the first two.
    EXPECT_GE(num_tested, kind == DraftKind::kNear ? k + 1 : std::min(k + 1, 2));
    // The harness has power: resampling from p instead of the residual is
    // detected at the first position.
    EXPECT_LT(ChiSquarePValue(t.wrong_counts[0], t.p[0]), 1e-6);
  }
  const size_t worst = std::min_element(p_values.begin(), p_values.end()) - p_values.begin();
  EXPECT_GT(p_values[worst] * p_values.size(), kMinPValue)
      << "worst of " << p_values.size() << " tests: " << tested[worst];
}

INSTANTIATE_TEST_SUITE_P(VocabAndDraft, RejectionSampleDistributionTest,
                         ::testing::Combine(::testing::Values(16, 40, 64),
                                            ::testing::Values(DraftKind::kNear, DraftKind::kFar,
                                                              DraftKind::kOneHot)),
                         [](const auto& info) {
                           return absl::StrCat("V", std::get<0>(info.param), "_",
                                               KindName(std::get<1>(info.param)));
                         });

TEST(RejectionSampleTest, NoDraftSamplesBonusFromTarget) {
  std::mt19937_64 rng(5);
  const int vocab = 24;
  const std::vector<double> p = RandomTarget(vocab, rng);
  std::vector<int64_t> counts(vocab);
  for (int t = 0; t < kNumTrials; ++t) {
    const VerifyResult r = RejectionSample(p, vocab, {}, {}, /*seed=*/3, /*first_position=*/t);
    ASSERT_EQ(r.token_ids.size(), 1u);
    ASSERT_GT(p[r.token_ids[0]], 0.0);
    ++counts[r.token_ids[0]];
  }
  EXPECT_GT(ChiSquarePValue(counts, p), kMinPValue);
}

TEST(RejectionSampleTest, DraftOutsideVocabOrSupportIsNeverAccepted) {
  // V = 3; row 0 masks id 2 (p = 0), row 1 is one-hot at 1.
  const std::vector<double> p = {0.5, 0.5, 0.0, 0.0, 1.0, 0.0};
  // A draft model that puts all its mass on the masked id.
  const std::vector<double> q = {0.0, 0.0, 1.0};
  for (uint64_t seed = 0; seed < 1000; ++seed) {
    for (int32_t d : {-1, 2, 3, 7}) {
      const std::vector<int32_t> draft = {d};
      for (bool one_hot : {true, false}) {
        const VerifyResult r =
            RejectionSample(p, 3, draft, one_hot ? absl::Span<const double>() : q, seed, 5);
        ASSERT_EQ(r.num_accepted, 0);
        ASSERT_EQ(r.token_ids.size(), 1u);
        ASSERT_TRUE(r.token_ids[0] == 0 || r.token_ids[0] == 1) << r.token_ids[0];
      }
    }
  }
  // p(d) == 1 with one-hot q: always accepted, then the bonus from row 1.
  const VerifyResult r =
      RejectionSample({0.0, 1.0, 0.0, 0.0, 1.0, 0.0}, 3, std::vector<int32_t>{1}, {}, 9, 0);
  EXPECT_THAT(r.token_ids, ElementsAre(1, 1));
  EXPECT_EQ(r.num_accepted, 1);
}

TEST(RejectionSampleTest, DrawsAreKeyedBySeedAndPosition) {
  // Verifying (d0, d1, d2) at position 40 and, once d0 is accepted,
  // verifying (d1, d2) at position 41 against the same rows consume the same
  // random numbers for positions 41..43: the result for those positions does
  // not depend on how the work was split into steps.
  std::mt19937_64 rng(21);
  const int vocab = 16, k = 3;
  std::vector<double> flat;
  std::vector<std::vector<double>> rows;
  for (int j = 0; j <= k; ++j) {
    rows.push_back(RandomTarget(vocab, rng));
    flat.insert(flat.end(), rows.back().begin(), rows.back().end());
  }
  int num_compared = 0;
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    std::vector<int32_t> draft(k);
    for (int j = 0; j < k; ++j) draft[j] = Draw(rows[j], rng);
    const VerifyResult full = RejectionSample(flat, vocab, draft, {}, seed, 40);
    const VerifyResult again = RejectionSample(flat, vocab, draft, {}, seed, 40);
    ASSERT_EQ(full.token_ids, again.token_ids);
    if (full.num_accepted == 0) continue;
    const VerifyResult rest = RejectionSample(absl::MakeConstSpan(flat).subspan(vocab), vocab,
                                              absl::MakeConstSpan(draft).subspan(1), {}, seed, 41);
    ASSERT_EQ(std::vector<int32_t>(full.token_ids.begin() + 1, full.token_ids.end()),
              rest.token_ids);
    ++num_compared;
  }
  EXPECT_GT(num_compared, 100);
}

// Rows of logits whose argmax is ids[i].
std::vector<float> PeakedRows(int vocab, const std::vector<int32_t>& ids) {
  std::vector<float> out;
  for (int32_t id : ids) {
    std::vector<float> row(vocab);
    for (int i = 0; i < vocab; ++i) row[i] = static_cast<float>((i * 7 + id) % 5) * 0.1f;
    row[id] = 3.0f;
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

TEST(GreedyVerifyTest, FullMatchEmitsBonus) {
  const std::vector<float> logits = PeakedRows(10, {4, 7, 1, 9});
  const VerifyResult r = GreedyVerify(logits, 10, std::vector<int32_t>{4, 7, 1});
  EXPECT_THAT(r.token_ids, ElementsAre(4, 7, 1, 9));
  EXPECT_EQ(r.num_accepted, 3);
}

TEST(GreedyVerifyTest, EarlyMismatchEmitsArgmaxAndStops) {
  const std::vector<float> logits = PeakedRows(10, {4, 7, 1, 9});
  const VerifyResult r = GreedyVerify(logits, 10, std::vector<int32_t>{4, 2, 1});
  EXPECT_THAT(r.token_ids, ElementsAre(4, 7));
  EXPECT_EQ(r.num_accepted, 1);
  const VerifyResult first = GreedyVerify(logits, 10, std::vector<int32_t>{3, 7, 1});
  EXPECT_THAT(first.token_ids, ElementsAre(4));
  EXPECT_EQ(first.num_accepted, 0);
}

TEST(GreedyVerifyTest, EmptyDraftEmitsArgmax) {
  const VerifyResult r = GreedyVerify(PeakedRows(10, {6}), 10, {});
  EXPECT_THAT(r.token_ids, ElementsAre(6));
  EXPECT_EQ(r.num_accepted, 0);
}

TEST(GreedyVerifyTest, TiesGoToLowestIdLikeTheGreedySampler) {
  // Ids 2 and 5 tie for the max: the greedy sampler picks 2, so a draft of 5
  // is rejected and 2 emitted.
  const std::vector<float> row = {0.0f, 1.0f, 3.0f, -1.0f, 0.5f, 3.0f};
  Sampler sampler;
  ASSERT_EQ(sampler.Sample(row, SamplingParams{.temperature = 0.0}, 0), 2);
  const VerifyResult r = GreedyVerify(row, 6, {});
  EXPECT_THAT(r.token_ids, ElementsAre(2));
  std::vector<float> two_rows = row;
  two_rows.insert(two_rows.end(), row.begin(), row.end());
  EXPECT_THAT(GreedyVerify(two_rows, 6, std::vector<int32_t>{5}).token_ids, ElementsAre(2));
  EXPECT_THAT(GreedyVerify(two_rows, 6, std::vector<int32_t>{2}).token_ids, ElementsAre(2, 2));
}

TEST(GreedyVerifyTest, MatchesSequentialGreedySamplingWithPenalties) {
  // Flat logits plus a repetition penalty: the plain greedy sampler never
  // repeats a token already in the history. Verification must see the draft
  // tokens as history, row by row.
  const int vocab = 6;
  const std::vector<float> base = {2.0f, 1.9f, 1.8f, 1.7f, 1.6f, 1.5f};
  const SamplingParams params{.temperature = 0.0, .repetition_penalty = 2.0};
  const std::vector<int32_t> prompt = {0};
  const SamplingContext context{.token_ids = prompt, .num_prompt_tokens = 1};
  // Sequential reference: 1, 2, 3, 4.
  Sampler sampler;
  std::vector<int32_t> history = prompt;
  for (int i = 0; i < 4; ++i) {
    const SamplingContext c{.token_ids = history, .num_prompt_tokens = 1};
    history.push_back(
        sampler.Sample(base, params, static_cast<int64_t>(history.size()), c).token_id);
  }
  ASSERT_THAT(history, ElementsAre(0, 1, 2, 3, 4));
  std::vector<float> logits;
  for (int i = 0; i < 4; ++i) logits.insert(logits.end(), base.begin(), base.end());
  const std::vector<int32_t> draft = {1, 2, 3};
  std::vector<float> processed;
  ProcessDraftLogits(logits, vocab, params, context, draft, &processed);
  const VerifyResult r = GreedyVerify(processed, vocab, draft);
  EXPECT_THAT(r.token_ids, ElementsAre(1, 2, 3, 4));
  // Unprocessed logits would reject the first draft (argmax 0).
  EXPECT_THAT(GreedyVerify(logits, vocab, draft).token_ids, ElementsAre(0));
}

TEST(TargetProbsTest, MatchesTemperatureTopKSoftmax) {
  const int vocab = 8;
  const std::vector<float> row = {0.5f, 2.0f, -1.0f, 1.0f, 1.5f, 0.0f, -0.5f, 0.9f};
  const SamplingParams params{.temperature = 0.7, .top_k = 3};
  Sampler sampler;
  std::vector<double> probs;
  TargetProbs(row, vocab, params, &sampler, &probs);
  ASSERT_EQ(probs.size(), static_cast<size_t>(vocab));
  // top-3 ids: 1, 4, 3.
  const double z = std::exp(2.0 / 0.7) + std::exp(1.5 / 0.7) + std::exp(1.0 / 0.7);
  for (int i = 0; i < vocab; ++i) {
    const double expected = (i == 1 || i == 4 || i == 3) ? std::exp(row[i] / 0.7) / z : 0.0;
    EXPECT_NEAR(probs[i], expected, 1e-6) << "id " << i;
  }
}

TEST(ProcessDraftLogitsTest, RowIHasTheFirstIDraftsAsHistory) {
  const int vocab = 4;
  const std::vector<float> logits(3 * vocab, 1.0f);
  const SamplingParams params{.temperature = 1.0, .repetition_penalty = 2.0};
  const std::vector<int32_t> prompt = {0};
  const SamplingContext context{.token_ids = prompt, .num_prompt_tokens = 1};
  std::vector<float> out;
  ProcessDraftLogits(logits, vocab, params, context, std::vector<int32_t>{2, 3}, &out);
  EXPECT_THAT(out, ElementsAre(0.5f, 1.0f, 1.0f, 1.0f,    // history {0}
                               0.5f, 1.0f, 0.5f, 1.0f,    // {0, 2}
                               0.5f, 1.0f, 0.5f, 0.5f));  // {0, 2, 3}
}

}  // namespace
}  // namespace tandem::engine::spec
