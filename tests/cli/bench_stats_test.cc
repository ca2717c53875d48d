// `tandem bench` math: the Poisson / gamma arrival generator, percentiles,
// aggregation (TPOT, goodput, errors), the SSE parser and the workloads.
#include <cmath>
#include <vector>

#include "bench/serve/backend.h"
#include "bench/serve/stats.h"
#include "bench/serve/workload.h"
#include "gtest/gtest.h"

namespace tandem::bench {
namespace {

TEST(ArrivalGeneratorTest, PoissonMeanGapIsOneOverRate) {
  for (double rate : {0.5, 4.0, 100.0}) {
    ArrivalGenerator g(rate, 1.0, 42);
    constexpr int kN = 200000;
    double sum = 0, sum_sq = 0;
    for (int i = 0; i < kN; ++i) {
      const double x = g.NextGapSeconds();
      ASSERT_GE(x, 0);
      sum += x;
      sum_sq += x * x;
    }
    const double mean = sum / kN;
    EXPECT_NEAR(mean * rate, 1.0, 0.01) << rate;
    // Exponential: stddev == mean.
    EXPECT_NEAR(std::sqrt(sum_sq / kN - mean * mean) / mean, 1.0, 0.02) << rate;
  }
}

TEST(ArrivalGeneratorTest, BurstinessKeepsTheMeanAndChangesTheSpread) {
  for (double b : {0.25, 4.0}) {
    ArrivalGenerator g(10.0, b, 7);
    constexpr int kN = 200000;
    double sum = 0, sum_sq = 0;
    for (int i = 0; i < kN; ++i) {
      const double x = g.NextGapSeconds();
      sum += x;
      sum_sq += x * x;
    }
    const double mean = sum / kN;
    EXPECT_NEAR(mean * 10.0, 1.0, 0.02) << b;
    // Gamma(k): coefficient of variation 1 / sqrt(k).
    EXPECT_NEAR(std::sqrt(sum_sq / kN - mean * mean) / mean, 1 / std::sqrt(b), 0.05) << b;
  }
}

TEST(ArrivalGeneratorTest, FixedSeedIsReproducibleAndInfIsAllAtOnce) {
  ArrivalGenerator a(3.0, 1.0, 123), b(3.0, 1.0, 123), c(3.0, 1.0, 124);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const double x = a.NextGapSeconds();
    EXPECT_EQ(x, b.NextGapSeconds());
    differs = differs || x != c.NextGapSeconds();
  }
  EXPECT_TRUE(differs);
  ArrivalGenerator inf(0, 1.0, 1);
  EXPECT_EQ(inf.NextGapSeconds(), 0);
  ArrivalGenerator inf2(INFINITY, 1.0, 1);
  EXPECT_EQ(inf2.NextGapSeconds(), 0);
}

TEST(PercentileTest, LinearInterpolationLikeNumpy) {
  EXPECT_EQ(Percentile({}, 0.5), 0);
  EXPECT_EQ(Percentile({7}, 0.99), 7);
  std::vector<double> v = {5, 1, 4, 2, 3};  // sorted 1..5
  EXPECT_DOUBLE_EQ(Percentile(v, 0.5), 3);
  EXPECT_DOUBLE_EQ(Percentile(v, 0.0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 1.0), 5);
  EXPECT_DOUBLE_EQ(Percentile(v, 0.9), 4.6);  // numpy.percentile(1..5, 90)
  EXPECT_DOUBLE_EQ(Percentile(v, 0.99), 4.96);
  std::vector<double> h;
  for (int i = 1; i <= 100; ++i) h.push_back(i);
  EXPECT_DOUBLE_EQ(Percentile(h, 0.5), 50.5);
  EXPECT_DOUBLE_EQ(Percentile(h, 0.99), 99.01);
  Distribution d = Summarize(h);
  EXPECT_EQ(d.count, 100);
  EXPECT_DOUBLE_EQ(d.mean, 50.5);
  EXPECT_DOUBLE_EQ(d.max, 100);
}

TEST(AggregateTest, TpotGoodputAndErrors) {
  RequestRecord a;
  a.ok = true;
  a.ttft_ms = 100;
  a.e2e_ms = 1000;
  a.output_tokens = 10;  // TPOT 900 / 9 = 100
  a.prompt_tokens = 8;
  a.itl_ms = std::vector<double>(9, 100);
  RequestRecord b = a;
  b.ttft_ms = 600;  // misses a 500 ms TTFT SLO; TPOT (1000-600)/9
  RequestRecord c;
  c.error_code = "UNAVAILABLE";
  RunSummary s = Aggregate({a, b, c}, 2.0, Slo{500, 200});
  EXPECT_DOUBLE_EQ(a.TpotMs(), 100);
  EXPECT_EQ(s.completed, 2);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.errors.at("UNAVAILABLE"), 1);
  EXPECT_EQ(s.good_requests, 1);
  EXPECT_DOUBLE_EQ(s.goodput, 0.5);
  EXPECT_DOUBLE_EQ(s.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(s.output_tokens_per_second, 10);
  EXPECT_EQ(s.itl.count, 18);
  EXPECT_DOUBLE_EQ(s.tpot.mean, (100 + 400.0 / 9) / 2);
  EXPECT_DOUBLE_EQ(s.mean_in_flight, 1.0);  // 2 s of e2e over 2 s
}

TEST(SseParserTest, SplitsDataLinesAcrossFeeds) {
  SseParser p;
  EXPECT_TRUE(p.Feed("data: {\"a\"").empty());
  std::vector<std::string> got = p.Feed(":1}\r\n\r\nevent: x\ndata:[DONE]\n");
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], "{\"a\":1}");
  EXPECT_EQ(got[1], "[DONE]");
}

TEST(WorkloadTest, SyntheticLengthsSharedPrefixAndErrors) {
  WorkloadOptions o;
  o.num_requests = 6;
  o.input_len = 20;
  o.output_len = 8;
  o.vocab_size = 49152;
  o.shared_prefix_len = 16;
  o.num_prefixes = 2;
  auto w = BuildWorkload(o);
  ASSERT_TRUE(w.ok()) << w.status();
  for (const BenchRequest& r : *w) {
    EXPECT_EQ(r.prompt_ids.size(), 36u);
    EXPECT_EQ(r.max_tokens, 8);
  }
  // Requests 0 and 2 share prefix 0; 0 and 1 do not.
  EXPECT_TRUE(std::equal((*w)[0].prompt_ids.begin(), (*w)[0].prompt_ids.begin() + 16,
                         (*w)[2].prompt_ids.begin()));
  EXPECT_FALSE(std::equal((*w)[0].prompt_ids.begin(), (*w)[0].prompt_ids.begin() + 16,
                          (*w)[1].prompt_ids.begin()));
  auto again = BuildWorkload(o);
  EXPECT_EQ((*again)[5].prompt_ids, (*w)[5].prompt_ids);

  o.shared_prefix_len = 0;
  o.range_ratio = 0.5;
  o.num_requests = 200;
  auto spread = BuildWorkload(o);
  ASSERT_TRUE(spread.ok());
  for (const BenchRequest& r : *spread) {
    EXPECT_GE(r.prompt_ids.size(), 10u);
    EXPECT_LE(r.prompt_ids.size(), 30u);
  }
  o.context_length = 25;
  EXPECT_FALSE(BuildWorkload(o).ok());
  o.context_length = 0;
  o.dataset = "/nonexistent/prompts.jsonl";
  EXPECT_FALSE(BuildWorkload(o).ok());
}

}  // namespace
}  // namespace tandem::bench
