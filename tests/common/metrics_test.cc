#include "common/metrics/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics/tandem_metrics.h"
#include "common/metrics/text_format.h"

namespace tandem::metrics {
namespace {

TEST(TextFormatTest, Values) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(800000), "800000");
  EXPECT_EQ(FormatValue(-3), "-3");
  EXPECT_EQ(FormatValue(0.001), "0.001");
  EXPECT_EQ(FormatValue(0.0001), "0.0001");
  EXPECT_EQ(FormatValue(1e-05), "1e-05");
  EXPECT_EQ(FormatValue(2.5), "2.5");
  EXPECT_EQ(FormatValue(1e300), "1e+300");
  EXPECT_EQ(FormatValue(1234567.5), "1.2345675e+06");
  EXPECT_EQ(FormatValue(123456.5), "123456.5");
  EXPECT_EQ(FormatValue(1e15), "1e+15");
  EXPECT_EQ(FormatValue(-0.5), "-0.5");
  EXPECT_EQ(FormatValue(INFINITY), "+Inf");
  EXPECT_EQ(FormatValue(-INFINITY), "-Inf");
  EXPECT_EQ(FormatValue(NAN), "NaN");
  EXPECT_EQ(std::strtod(FormatValue(0.1 + 0.2).c_str(), nullptr), 0.1 + 0.2);
}

TEST(TextFormatTest, Escaping) {
  std::string s;
  AppendEscapedLabelValue("a\\b\"c\nd", &s);
  EXPECT_EQ(s, "a\\\\b\\\"c\\nd");
  s.clear();
  AppendEscapedHelp("a\\b\"c\nd", &s);
  EXPECT_EQ(s, "a\\\\b\"c\\nd");
}

TEST(MetricsTest, CounterExposition) {
  MetricsRegistry r;
  auto f = r.AddCounter("requests_total", "Requests \"served\".\nSecond \\ line.", {"code"});
  ASSERT_TRUE(f.ok()) << f.status();
  (*(*f)->WithLabelValues({"b\"\\\n"}))->Inc(2);
  (*(*f)->Labels({{"code", "a"}}))->Inc();
  auto plain = r.AddCounter("plain_total", "No labels.");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(r.Serialize(),
            "# HELP requests_total Requests \"served\".\\nSecond \\\\ line.\n"
            "# TYPE requests_total counter\n"
            "requests_total{code=\"a\"} 1\n"
            "requests_total{code=\"b\\\"\\\\\\n\"} 2\n"
            "# HELP plain_total No labels.\n"
            "# TYPE plain_total counter\n"
            "plain_total 0\n");
}

TEST(MetricsTest, CounterIgnoresNegativeAndNaN) {
  MetricsRegistry r;
  Counter* c = *(*r.AddCounter("c_total", "c"))->WithLabelValues({});
  c->Inc(1.5);
  c->Inc(-1);
  c->Inc(NAN);
  EXPECT_EQ(c->Value(), 1.5);
}

TEST(MetricsTest, GaugeAndCallback) {
  MetricsRegistry r;
  GaugeFamily* f = *r.AddGauge("queue_depth", "Depth.", {"phase", "model"});
  Gauge* g = *f->Labels({{"model", "m"}, {"phase", "decode"}});
  g->Set(5);
  g->Inc(2);
  g->Dec();
  EXPECT_EQ(g->Value(), 6);
  Gauge* cb = *f->WithLabelValues({"prefill", "m"});
  double source = 0.25;
  cb->SetCallback([&source] { return source; });
  source = 0.5;
  EXPECT_EQ(r.Serialize(),
            "# HELP queue_depth Depth.\n"
            "# TYPE queue_depth gauge\n"
            "queue_depth{phase=\"decode\",model=\"m\"} 6\n"
            "queue_depth{phase=\"prefill\",model=\"m\"} 0.5\n");
  cb->ClearCallback();
  EXPECT_EQ(cb->Value(), 0);
  g->Set(NAN);
  EXPECT_NE(r.Serialize().find("model=\"m\"} NaN\n"), std::string::npos);
}

TEST(MetricsTest, HistogramExposition) {
  MetricsRegistry r;
  const double bounds[] = {0.001, 0.5, 1, 2560};
  HistogramFamily* f = *r.AddHistogram("latency_seconds", "Latency.", {"phase"}, bounds);
  Histogram* h = *f->WithLabelValues({"router"});
  h->Observe(0.0009765625);  // 2^-10: exact sums
  h->Observe(0.25);
  h->Observe(1);  // le is inclusive
  h->Observe(3);
  h->Observe(4096);
  h->Observe(NAN);  // ignored
  EXPECT_EQ(r.Serialize(),
            "# HELP latency_seconds Latency.\n"
            "# TYPE latency_seconds histogram\n"
            "latency_seconds_bucket{phase=\"router\",le=\"0.001\"} 1\n"
            "latency_seconds_bucket{phase=\"router\",le=\"0.5\"} 2\n"
            "latency_seconds_bucket{phase=\"router\",le=\"1\"} 3\n"
            "latency_seconds_bucket{phase=\"router\",le=\"2560\"} 4\n"
            "latency_seconds_bucket{phase=\"router\",le=\"+Inf\"} 5\n"
            "latency_seconds_sum{phase=\"router\"} 4100.2509765625\n"
            "latency_seconds_count{phase=\"router\"} 5\n");
}

TEST(MetricsTest, HistogramWithoutLabelsAndTrailingInf) {
  MetricsRegistry r;
  const double bounds[] = {1, INFINITY};
  Histogram* h = *(*r.AddHistogram("tokens", "Tokens.", {}, bounds))->WithLabelValues({});
  h->Observe(1);
  EXPECT_EQ(r.Serialize(),
            "# HELP tokens Tokens.\n# TYPE tokens histogram\n"
            "tokens_bucket{le=\"1\"} 1\ntokens_bucket{le=\"+Inf\"} 1\n"
            "tokens_sum 1\ntokens_count 1\n");
}

TEST(MetricsTest, ConcurrentUpdatesAreExact) {
  MetricsRegistry r;
  CounterFamily* cf = *r.AddCounter("ops_total", "Ops.", {"thread"});
  HistogramFamily* hf = *r.AddHistogram("obs", "Obs.", {}, kIterationTokensBuckets);
  Histogram* h = *hf->WithLabelValues({});
  Gauge* g = *(*r.AddGauge("level", "Level."))->WithLabelValues({});
  constexpr int kThreads = 8, kIters = 100000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Half the threads share one child, half look theirs up each time.
      for (int i = 0; i < kIters; ++i) {
        (*cf->WithLabelValues({t % 2 == 0 ? "shared" : "own"}))->Inc();
        h->Observe(i % 64);
        g->Inc();
        if (i % 1000 == 0) (void)r.Serialize();  // scrapes race with updates
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ((*cf->WithLabelValues({"shared"}))->Value() + (*cf->WithLabelValues({"own"}))->Value(),
            kThreads * kIters);
  Histogram::Snapshot s = h->Collect();
  EXPECT_EQ(s.count, static_cast<uint64_t>(kThreads) * kIters);
  double want_sum = 0;
  for (int i = 0; i < kIters; ++i) want_sum += i % 64;
  EXPECT_EQ(s.sum, kThreads * want_sum);  // integers: exact in any order
  EXPECT_EQ(g->Value(), kThreads * kIters);
}

TEST(MetricsTest, NameValidation) {
  MetricsRegistry r;
  EXPECT_EQ(r.AddGauge("", "h").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.AddGauge("1abc", "h").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.AddGauge("a-b", "h").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.AddGauge("__reserved", "h").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(r.AddGauge("ns:sub_name1", "h").ok());
  EXPECT_EQ(r.AddCounter("no_suffix", "h").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.AddGauge("g", "h", {"a:b"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.AddGauge("g", "h", {"__x"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.AddGauge("g", "h", {"a", "a"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.AddGauge("g", "bad \xff help").status().code(), absl::StatusCode::kInvalidArgument);
  const double b[] = {1, 2};
  EXPECT_EQ(r.AddHistogram("h", "h", {"le"}, b).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(r.AddGauge("le_gauge", "h", {"le"}).ok());  // le is reserved for histograms only
  const double unsorted[] = {2, 1};
  const double dup[] = {1, 1};
  const double nan[] = {NAN};
  EXPECT_FALSE(r.AddHistogram("h", "h", {}, unsorted).ok());
  EXPECT_FALSE(r.AddHistogram("h", "h", {}, dup).ok());
  EXPECT_FALSE(r.AddHistogram("h", "h", {}, nan).ok());
}

TEST(MetricsTest, ReRegistration) {
  MetricsRegistry r;
  const double b[] = {1, 2};
  const double other[] = {1, 3};
  auto h = r.AddHistogram("lat", "Latency.", {"phase"}, b);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(*r.AddHistogram("lat", "Latency.", {"phase"}, b), *h);  // same schema: same family
  EXPECT_EQ(r.AddHistogram("lat", "Latency.", {"phase"}, other).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(r.AddHistogram("lat", "Other.", {"phase"}, b).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(r.AddGauge("lat", "Latency.", {"phase"}).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(r.AddGauge("lat_count", "x").status().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(r.AddGauge("x_sum", "x").ok());
  EXPECT_EQ(r.AddHistogram("x", "x", {}, b).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST(MetricsTest, LabelErrors) {
  MetricsRegistry r(MetricsRegistry::Options{.max_children_per_family = 3});
  CounterFamily* f = *r.AddCounter("c_total", "c", {"a", "b"});
  EXPECT_EQ(f->WithLabelValues({"x"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f->Labels({{"a", "x"}, {"c", "y"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f->Labels({{"a", "x"}, {"a", "y"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f->WithLabelValues({"x", "\xc3"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(f->WithLabelValues({"1", ""}).ok());
  EXPECT_TRUE(f->WithLabelValues({"2", ""}).ok());
  EXPECT_TRUE(f->WithLabelValues({"3", ""}).ok());
  EXPECT_TRUE(f->WithLabelValues({"3", ""}).ok());  // existing child: no new slot
  EXPECT_EQ(f->WithLabelValues({"4", ""}).status().code(), absl::StatusCode::kResourceExhausted);
  // Same child by name or position.
  EXPECT_EQ(*f->Labels({{"b", ""}, {"a", "1"}}), *f->WithLabelValues({"1", ""}));
}

TEST(TandemMetricsTest, RegistersEveryPhaseInOneRegistry) {
  MetricsRegistry r;
  auto router = TandemMetrics::Create(&r, kPhaseRouter, "smollm2");
  ASSERT_TRUE(router.ok()) << router.status();
  auto decode = TandemMetrics::Create(&r, kPhaseDecode, "smollm2");
  ASSERT_TRUE(decode.ok()) << decode.status();
  EXPECT_EQ(TandemMetrics::Create(&r, "bogus", "m").status().code(),
            absl::StatusCode::kInvalidArgument);
  (*router)->time_to_first_token->Observe(0.05);
  (*decode)->generation_tokens->Inc(7);
  (*decode)->RequestSuccess("eos")->Inc();
  (*decode)->RequestErrors(absl::StatusCode::kResourceExhausted)->Inc();
  (*decode)->kv_cache_usage_ratio->SetCallback([] { return 0.75; });
  std::string text = r.Serialize();
  for (const char* want : {
           "# TYPE tandem_time_to_first_token_seconds histogram\n",
           "tandem_time_to_first_token_seconds_bucket{phase=\"router\",model=\"smollm2\","
           "le=\"0.06\"} 1\n",
           "tandem_generation_tokens_total{phase=\"decode\",model=\"smollm2\"} 7\n",
           "tandem_request_success_total{phase=\"decode\",model=\"smollm2\",finish_reason=\"eos\"} "
           "1\n",
           "tandem_request_success_total{phase=\"router\",model=\"smollm2\",finish_reason="
           "\"deadline\"} 0\n",
           "tandem_request_errors_total{phase=\"decode\",model=\"smollm2\",code="
           "\"RESOURCE_EXHAUSTED\"} 1\n",
           "tandem_kv_cache_usage_ratio{phase=\"decode\",model=\"smollm2\"} 0.75\n",
           "# TYPE tandem_num_leased_blocks gauge\n",
           "# TYPE tandem_iteration_tokens histogram\n",
           "tandem_batch_size_bucket{phase=\"decode\",model=\"smollm2\",le=\"1024\"} 0\n",
       }) {
    EXPECT_NE(text.find(want), std::string::npos) << want;
  }
  (*decode)->kv_cache_usage_ratio->ClearCallback();
}

// promtool (Debian package `prometheus`) is the reference parser.
TEST(TandemMetricsTest, PromtoolAcceptsExposition) {
  if (std::system("command -v promtool > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool not installed (apt-get install prometheus)";
  }
  MetricsRegistry r;
  auto m = TandemMetrics::Create(&r, kPhaseColocated, "we\"ird\\model\nname");
  ASSERT_TRUE(m.ok()) << m.status();
  (*m)->e2e_request_latency->Observe(1.25);
  (*m)->iteration_tokens->Observe(300);
  (*m)->prompt_tokens->Inc(12345678901.0);
  (*m)->num_requests_waiting->Set(NAN);
  std::string path = testing::TempDir() + "/metrics_promtool_" + std::to_string(getpid()) + ".txt";
  std::ofstream(path) << r.Serialize();
  std::string cmd = "promtool check metrics < " + path + " > " + path + ".out 2>&1";
  int rc = std::system(cmd.c_str());
  std::ifstream in(path + ".out");
  std::string output((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(rc, 0) << output;
}

}  // namespace
}  // namespace tandem::metrics
