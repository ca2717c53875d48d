// The metrics facade over prometheus-cpp: what Serialize() renders (through
// prometheus::TextSerializer), the registry's schema checks, label limits and
// thread safety, and every Tandem family (names, labels, buckets, help).
#include "common/metrics/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics/tandem_metrics.h"

namespace tandem::metrics {
namespace {

// The value of the sample line that starts with `series` ("name{labels}" as
// rendered) followed by a space; NAN when there is none.
double Sample(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return NAN;
}

bool HasLine(const std::string& text, const std::string& line) {
  return ("\n" + text).find("\n" + line + "\n") != std::string::npos;
}

TEST(MetricsTest, CounterExposition) {
  MetricsRegistry r;
  auto f = r.AddCounter("requests_total", "Requests \"served\".", {"code", "api"});
  ASSERT_TRUE(f.ok()) << f.status();
  (*(*f)->WithLabelValues({"b\"\\\n", "grpc"}))->Inc(2);
  (*(*f)->WithLabelValues({"a", "http"}))->Inc();
  auto plain = r.AddCounter("plain_total", "No labels.");
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE((*plain)->WithLabelValues({}).ok());
  const std::string text = r.Serialize();
  EXPECT_TRUE(HasLine(text, "# HELP requests_total Requests \"served\".")) << text;
  EXPECT_TRUE(HasLine(text, "# TYPE requests_total counter")) << text;
  // prometheus-cpp renders labels sorted by name (histograms: le last) and escapes \ " and newline.
  EXPECT_TRUE(HasLine(text, "requests_total{api=\"http\",code=\"a\"} 1")) << text;
  EXPECT_TRUE(HasLine(text, "requests_total{api=\"grpc\",code=\"b\\\"\\\\\\n\"} 2")) << text;
  EXPECT_TRUE(HasLine(text, "plain_total 0")) << text;
  // A labelled family without children renders nothing.
  ASSERT_TRUE(r.AddGauge("unused", "Unused.", {"x"}).ok());
  EXPECT_EQ(r.Serialize().find("unused"), std::string::npos);
}

TEST(MetricsTest, ValuesAreFormattedForPrometheus) {
  MetricsRegistry r;
  GaugeFamily* f = *r.AddGauge("v", "Values.", {"k"});
  const std::pair<const char*, double> cases[] = {
      {"zero", 0},     {"big", 800000}, {"neg", -3},     {"milli", 0.001},  {"tenth", 0.0001},
      {"tiny", 1e-05}, {"half", 2.5},   {"huge", 1e300}, {"inf", INFINITY}, {"minf", -INFINITY},
  };
  for (const auto& [k, v] : cases) (*f->WithLabelValues({k}))->Set(v);
  (*f->WithLabelValues({"nan"}))->Set(NAN);
  const std::string text = r.Serialize();
  for (const char* want :
       {"v{k=\"zero\"} 0", "v{k=\"big\"} 800000", "v{k=\"neg\"} -3", "v{k=\"milli\"} 0.001",
        "v{k=\"tenth\"} 0.0001", "v{k=\"tiny\"} 1e-05", "v{k=\"half\"} 2.5", "v{k=\"huge\"} 1e+300",
        "v{k=\"inf\"} +Inf", "v{k=\"minf\"} -Inf", "v{k=\"nan\"} Nan"}) {
    EXPECT_TRUE(HasLine(text, want)) << want << "\n" << text;
  }
}

TEST(MetricsTest, CounterIgnoresNegativeAndNaN) {
  MetricsRegistry r;
  Counter* c = *(*r.AddCounter("c_total", "c"))->WithLabelValues({});
  c->Inc(1.5);
  c->Inc(-1);
  c->Inc(NAN);
  EXPECT_EQ(c->Value(), 1.5);
  EXPECT_EQ(Sample(r.Serialize(), "c_total"), 1.5);
}

TEST(MetricsTest, GaugeAndCallback) {
  MetricsRegistry r;
  GaugeFamily* f = *r.AddGauge("queue_depth", "Depth.", {"phase", "model"});
  Gauge* g = *f->WithLabelValues({"decode", "m"});
  g->Set(5);
  g->Inc(2);
  g->Dec();
  EXPECT_EQ(g->Value(), 6);
  Gauge* cb = *f->WithLabelValues({"prefill", "m"});
  double source = 0.25;
  cb->SetCallback([&source] { return source; });
  source = 0.5;
  std::string text = r.Serialize();
  EXPECT_EQ(Sample(text, "queue_depth{model=\"m\",phase=\"decode\"}"), 6) << text;
  EXPECT_EQ(Sample(text, "queue_depth{model=\"m\",phase=\"prefill\"}"), 0.5) << text;
  cb->ClearCallback();
  source = 0.75;
  text = r.Serialize();
  EXPECT_EQ(Sample(text, "queue_depth{model=\"m\",phase=\"prefill\"}"), 0.5) << text;
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
  const std::string text = r.Serialize();
  EXPECT_TRUE(HasLine(text, "# TYPE latency_seconds histogram")) << text;
  for (const char* want : {
           "latency_seconds_bucket{phase=\"router\",le=\"0.001\"} 1",
           "latency_seconds_bucket{phase=\"router\",le=\"0.5\"} 2",
           "latency_seconds_bucket{phase=\"router\",le=\"1\"} 3",
           "latency_seconds_bucket{phase=\"router\",le=\"2560\"} 4",
           "latency_seconds_bucket{phase=\"router\",le=\"+Inf\"} 5",
           "latency_seconds_sum{phase=\"router\"} 4100.2509765625",
           "latency_seconds_count{phase=\"router\"} 5",
       }) {
    EXPECT_TRUE(HasLine(text, want)) << want << "\n" << text;
  }
}

TEST(MetricsTest, HistogramWithoutLabelsAndTrailingInf) {
  MetricsRegistry r;
  const double bounds[] = {1, INFINITY};
  Histogram* h = *(*r.AddHistogram("tokens", "Tokens.", {}, bounds))->WithLabelValues({});
  h->Observe(1);
  const std::string text = r.Serialize();
  EXPECT_EQ(Sample(text, "tokens_bucket{le=\"1\"}"), 1) << text;
  EXPECT_EQ(Sample(text, "tokens_bucket{le=\"+Inf\"}"), 1) << text;
  EXPECT_EQ(Sample(text, "tokens_count"), 1) << text;
  EXPECT_EQ(text.find("le=\"inf\""), std::string::npos) << text;  // one +Inf bucket only
}

TEST(MetricsTest, ConcurrentUpdatesAreExact) {
  MetricsRegistry r;
  CounterFamily* cf = *r.AddCounter("ops_total", "Ops.", {"thread"});
  HistogramFamily* hf = *r.AddHistogram("obs", "Obs.", {}, kIterationTokensBuckets);
  Histogram* h = *hf->WithLabelValues({});
  Gauge* g = *(*r.AddGauge("level", "Level."))->WithLabelValues({});
  constexpr int kThreads = 8, kIters = 20000;
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
  const std::string text = r.Serialize();
  double want_sum = 0, want_le1 = 0;
  for (int i = 0; i < kIters; ++i) {
    want_sum += i % 64;
    want_le1 += i % 64 <= 1;
  }
  EXPECT_EQ(Sample(text, "obs_count"), kThreads * kIters);
  EXPECT_EQ(Sample(text, "obs_sum"), kThreads * want_sum);  // integers: exact in any order
  EXPECT_EQ(Sample(text, "obs_bucket{le=\"1\"}"), kThreads * want_le1);
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
  // prometheus-cpp prints help verbatim: a newline would break the format.
  EXPECT_EQ(r.AddGauge("g", "two\nlines").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.AddGauge("g", "back\\slash").status().code(), absl::StatusCode::kInvalidArgument);
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
  EXPECT_TRUE(r.AddHistogram("h", "h", {}, b).ok());
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
  EXPECT_EQ(r.AddHistogram("lat", "Latency.", {"model"}, b).status().code(),
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
  EXPECT_EQ(f->WithLabelValues({"x", "y", "z"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f->WithLabelValues({"x", "\xc3"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(f->WithLabelValues({"1", ""}).ok());
  EXPECT_TRUE(f->WithLabelValues({"2", ""}).ok());
  EXPECT_TRUE(f->WithLabelValues({"3", ""}).ok());
  EXPECT_TRUE(f->WithLabelValues({"3", ""}).ok());  // existing child: no new slot
  EXPECT_EQ(f->WithLabelValues({"4", ""}).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(*f->WithLabelValues({"1", ""}), *f->WithLabelValues({"1", ""}));
  // Values that differ only in where one ends and the next begins.
  EXPECT_NE(*f->WithLabelValues({"3", ""}), *f->WithLabelValues({"1", ""}));
}

std::string Bucket(const std::string& name, const std::string& phase, const std::string& le) {
  return name + "_bucket{model=\"smollm2\",phase=\"" + phase + "\",le=\"" + le + "\"}";
}

TEST(TandemMetricsTest, RegistersEveryPhaseInOneRegistry) {
  MetricsRegistry r;
  auto router = TandemMetrics::Create(&r, kPhaseRouter, "smollm2");
  ASSERT_TRUE(router.ok()) << router.status();
  auto decode = TandemMetrics::Create(&r, kPhaseDecode, "smollm2");
  ASSERT_TRUE(decode.ok()) << decode.status();
  EXPECT_EQ(TandemMetrics::Create(&r, "bogus", "m").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TandemMetrics::Create(&r, kPhaseDecode, "bad\xff").status().code(),
            absl::StatusCode::kInvalidArgument);
  (*router)->time_to_first_token->Observe(0.05);
  (*decode)->generation_tokens->Inc(7);
  (*decode)->RequestSuccess("eos")->Inc();
  (*decode)->RequestErrors(absl::StatusCode::kResourceExhausted)->Inc();
  (*decode)->kv_cache_usage_ratio->SetCallback([] { return 0.75; });
  (*router)->HealthyWorkers("decode")->Set(2);
  (*router)->Migrations("decode_failed")->Inc();
  (*decode)->SpecAcceptedAtPosition(3)->Inc(4);
  const std::string text = r.Serialize();
  const std::string d = "model=\"smollm2\",phase=\"decode\"";
  const std::string rt = "model=\"smollm2\",phase=\"router\"";
  EXPECT_TRUE(HasLine(text, "# TYPE tandem_time_to_first_token_seconds histogram"));
  EXPECT_TRUE(HasLine(text,
                      "# HELP tandem_time_to_first_token_seconds Time from request arrival to the "
                      "first generated token, in seconds."));
  EXPECT_EQ(Sample(text, Bucket("tandem_time_to_first_token_seconds", "router", "0.04")), 0);
  EXPECT_EQ(Sample(text, Bucket("tandem_time_to_first_token_seconds", "router", "0.06")), 1);
  EXPECT_EQ(Sample(text, "tandem_generation_tokens_total{" + d + "}"), 7);
  EXPECT_EQ(Sample(text, "tandem_request_success_total{finish_reason=\"eos\"," + d + "}"), 1);
  // Created up front, so dashboards see zeros.
  EXPECT_EQ(Sample(text, "tandem_request_success_total{finish_reason=\"deadline\"," + rt + "}"), 0);
  EXPECT_EQ(Sample(text, "tandem_request_errors_total{code=\"RESOURCE_EXHAUSTED\"," + d + "}"), 1);
  EXPECT_EQ(Sample(text, "tandem_kv_cache_usage_ratio{" + d + "}"), 0.75);
  EXPECT_EQ(Sample(text, "tandem_router_healthy_workers{" + rt + ",role=\"decode\"}"), 2);
  EXPECT_EQ(Sample(text, "tandem_router_healthy_workers{" + rt + ",role=\"prefill\"}"), 0);
  EXPECT_EQ(Sample(text, "tandem_request_migrations_total{" + rt + ",reason=\"decode_failed\"}"),
            1);
  EXPECT_EQ(Sample(text, "tandem_request_migrations_total{" + rt + ",reason=\"transfer_failed\"}"),
            0);
  EXPECT_EQ(Sample(text, "tandem_router_prefill_decisions_total{" + rt + ",where=\"local\"}"), 0);
  EXPECT_EQ(Sample(text, "tandem_spec_decode_num_accepted_tokens_per_pos_total{" + d +
                             ",position=\"3\"}"),
            4);
  EXPECT_EQ(Sample(text, "tandem_spec_decode_num_accepted_tokens_per_pos_total{" + d +
                             ",position=\"15\"}"),
            0);
  EXPECT_TRUE(HasLine(text, "# TYPE tandem_num_leased_blocks gauge"));
  EXPECT_TRUE(HasLine(text, "# TYPE tandem_iteration_tokens histogram"));
  EXPECT_TRUE(HasLine(text, "# TYPE tandem_engine_step_seconds histogram"));
  (*decode)->kv_cache_usage_ratio->ClearCallback();
}

// Every bucket preset is exported with the same `le` strings as before the
// move to prometheus-cpp (recording rules and dashboards aggregate by le);
// prometheus-cpp puts le after the family's labels.
TEST(TandemMetricsTest, BucketBoundariesAndLeLabels) {
  MetricsRegistry r;
  auto m = TandemMetrics::Create(&r, kPhaseDecode, "smollm2");
  ASSERT_TRUE(m.ok()) << m.status();
  (*m)->kv_transfer_time->Observe(0.0002);
  (*m)->iteration_tokens->Observe(300);
  (*m)->e2e_request_latency->Observe(5000);
  (*m)->inter_token_latency->Observe(0.003);
  (*m)->batch_size->Observe(3);
  const std::string text = r.Serialize();
  auto les = [&](const std::string& name) {
    std::vector<std::string> out;
    const std::string prefix = name + "_bucket{model=\"smollm2\",phase=\"decode\",le=\"";
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(prefix, 0) != 0) continue;
      out.push_back(line.substr(prefix.size(), line.find('"', prefix.size()) - prefix.size()));
    }
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(les("tandem_kv_transfer_seconds"),
            (V{"0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05",
               "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "60", "+Inf"}));
  EXPECT_EQ(les("tandem_iteration_tokens"),
            (V{"1", "2", "4", "8", "16", "32", "64", "128", "256", "512", "1024", "2048", "4096",
               "8192", "16384", "+Inf"}));
  EXPECT_EQ(les("tandem_e2e_request_latency_seconds"),
            (V{"0.01", "0.025", "0.05", "0.1", "0.3", "0.5",  "0.8",  "1",   "1.5",
               "2",    "2.5",   "5",    "10",  "15",  "20",   "30",   "40",  "50",
               "60",   "120",   "240",  "480", "960", "1920", "7680", "+Inf"}));
  EXPECT_EQ(les("tandem_inter_token_latency_seconds").size(),
            std::size(kInterTokenSecondsBuckets) + 1);
  EXPECT_EQ(les("tandem_time_to_first_token_seconds").back(), "+Inf");
  EXPECT_EQ(les("tandem_time_to_first_token_seconds").size(), std::size(kTtftSecondsBuckets) + 1);
  EXPECT_EQ(Sample(text, Bucket("tandem_kv_transfer_seconds", "decode", "0.0001")), 0);
  EXPECT_EQ(Sample(text, Bucket("tandem_kv_transfer_seconds", "decode", "0.00025")), 1);
  EXPECT_EQ(Sample(text, Bucket("tandem_iteration_tokens", "decode", "256")), 0);
  EXPECT_EQ(Sample(text, Bucket("tandem_iteration_tokens", "decode", "512")), 1);
  EXPECT_EQ(Sample(text, Bucket("tandem_e2e_request_latency_seconds", "decode", "7680")), 1);
  EXPECT_EQ(Sample(text, Bucket("tandem_inter_token_latency_seconds", "decode", "0.0025")), 0);
  EXPECT_EQ(Sample(text, Bucket("tandem_inter_token_latency_seconds", "decode", "0.005")), 1);
  EXPECT_EQ(Sample(text, Bucket("tandem_batch_size", "decode", "4")), 1);
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
