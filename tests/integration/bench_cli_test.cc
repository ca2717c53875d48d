// Drives `tandem bench` against a real `tandem serve` (colocated, then
// disaggregated) and checks the numbers are consistent: TTFT <= e2e, token
// counts match max_tokens (ignore_eos), ITL has one gap per chunk after the
// first, the totals match the router's Prometheus counters, the JSON has the
// tandem.bench.v1 fields, and `tandem plan --measured` accepts it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/cluster_util.h"
#include "tests/util/http_get.h"
#include "tests/util/json_reader.h"
#include "tests/util/subprocess.h"

namespace tandem::testing {
namespace {

constexpr int kNumRequests = 12;
constexpr int kOutputLen = 8;

// Sum of the samples of `name` whose labels contain `label`.
double SumMetric(const std::string& text, const std::string& name, const std::string& label) {
  std::istringstream in(text);
  double sum = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + "{", 0) != 0) continue;
    const size_t close = line.find('}');
    if (line.substr(0, close).find(label) == std::string::npos) continue;
    sum += std::stod(line.substr(close + 2));
  }
  return sum;
}

struct Counters {
  double success = 0, tokens = 0;
};
Counters Scrape(const std::string& metrics_address) {
  const int port = std::stoi(metrics_address.substr(metrics_address.rfind(':') + 1));
  const std::string text = HttpGetBody(port, "/metrics");
  return {SumMetric(text, "tandem_request_success_total", "phase=\"router\""),
          SumMetric(text, "tandem_generation_tokens_total", "phase=\"router\"")};
}

void CheckBench(const std::vector<std::string>& serve_args, const std::string& name) {
  ServeProcess serve;
  ASSERT_EQ(serve.Start(serve_args), "");
  std::string router_metrics;
  for (const Endpoint& e : serve.endpoints()) {
    if (e.role == "router") router_metrics = e.metrics_address;
  }
  ASSERT_FALSE(router_metrics.empty());
  const Counters before = Scrape(router_metrics);
  const std::string out = serve.dir() + "/" + name + ".json";
  ProcessResult r = RunProcess({TandemBinary(),
                                "bench",
                                "--server",
                                serve.Address("router"),
                                "--num-requests",
                                std::to_string(kNumRequests),
                                "--input-len",
                                "24",
                                "--output-len",
                                std::to_string(kOutputLen),
                                "--request-rates",
                                "20,inf",
                                "--concurrency",
                                "6",
                                "--seed",
                                "3",
                                "--max-duration-s",
                                "60",
                                "--timeout-s",
                                "30",
                                "--slo-ttft-ms",
                                "60000",
                                "--out",
                                out});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("TTFT"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("12/12 requests"), std::string::npos) << r.err;  // progress bar
  const Counters after = Scrape(router_metrics);

  Json j = Json::Parse(ReadFileOrEmpty(out));
  EXPECT_EQ(j["schema"].str, "tandem.bench.v1");
  for (const char* key : {"output_tokens_per_second", "mean_tpot_ms", "concurrency", "mean_ttft_ms",
                          "prompt_tokens_mean", "output_tokens_mean", "request_throughput",
                          "p99_ttft_ms", "p50_itl_ms", "goodput"}) {
    ASSERT_TRUE(j.has(key)) << key;
    EXPECT_GT(j[key].number, 0) << key;
  }
  EXPECT_GE(j["concurrency"].number, 1);
  ASSERT_EQ(j["runs"].size(), 2u);
  double total_requests = 0, total_tokens = 0;
  for (size_t k = 0; k < j["runs"].size(); ++k) {
    const Json& run = j["runs"][k];
    EXPECT_EQ(run["completed"].number, kNumRequests);
    EXPECT_EQ(run["failed"].number, 0);
    EXPECT_EQ(run["total_output_tokens"].number, kNumRequests * kOutputLen);
    EXPECT_EQ(run["goodput"].number, run["request_throughput"].number);
    EXPECT_LE(run["p50_ttft_ms"].number, run["p99_ttft_ms"].number);
    ASSERT_EQ(run["requests"].size(), static_cast<size_t>(kNumRequests));
    size_t itl_count = 0;
    for (size_t i = 0; i < run["requests"].size(); ++i) {
      const Json& q = run["requests"][i];
      EXPECT_TRUE(q["ok"].boolean) << q["error"].str;
      EXPECT_GT(q["ttft_ms"].number, 0);
      EXPECT_LE(q["ttft_ms"].number, q["e2e_ms"].number);
      EXPECT_EQ(q["output_tokens"].number, kOutputLen);
      EXPECT_EQ(q["prompt_tokens"].number, 24);
      EXPECT_EQ(q["finish_reason"].str, "length");
      const size_t chunks = static_cast<size_t>(q["num_chunks"].number);
      EXPECT_EQ(q["itl_ms"].size() + 1, chunks);
      EXPECT_LE(chunks, static_cast<size_t>(kOutputLen));
      itl_count += q["itl_ms"].size();
      double itl_sum = 0;
      for (const Json& g : q["itl_ms"].array) itl_sum += g.number;
      EXPECT_NEAR(q["ttft_ms"].number + itl_sum, q["e2e_ms"].number, 50);
      const double tpot = (q["e2e_ms"].number - q["ttft_ms"].number) / (kOutputLen - 1);
      EXPECT_NEAR(q["tpot_ms"].number, tpot, 1e-3 * tpot + 1e-6);
    }
    total_requests += run["completed"].number;
    total_tokens += run["total_output_tokens"].number;
    // One token per streamed message is the norm; allow coalescing.
    EXPECT_GE(itl_count, static_cast<size_t>(kNumRequests * (kOutputLen - 1) / 2));
  }
  EXPECT_EQ(after.success - before.success, total_requests);
  EXPECT_EQ(after.tokens - before.tokens, total_tokens);

  ProcessResult plan = RunProcess({TandemBinary(), "plan", "--measured", out, "--json"});
  EXPECT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_NE(plan.out.find("bandwidth_fraction_of_limit"), std::string::npos);
  EXPECT_EQ(serve.Stop(), 0);
}

TEST(BenchCliTest, ColocatedNumbersAreConsistent) {
  CheckBench({"--colocated", "--threads", "2"}, "colocated");
}

TEST(BenchCliTest, DisaggregatedNumbersAreConsistent) {
  CheckBench({"--threads", "1"}, "disaggregated");
}

TEST(BenchCliTest, BadFlagsAndDeadServerFailCleanly) {
  ProcessResult r = RunProcess({TandemBinary(), "bench", "--request-rate", "-3"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("tandem bench:"), std::string::npos);
  r = RunProcess({TandemBinary(), "bench", "--backend", "openai-http"});
  EXPECT_EQ(r.exit_code, 2);
  r = RunProcess({TandemBinary(), "bench", "--server", "127.0.0.1:" + std::to_string(FreePort()),
                  "--num-requests", "1", "--timeout-s", "1"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  // An --out or --plot that cannot be written is a usage error before any
  // server is called (the dead server above would otherwise answer first).
  for (const auto& flags :
       std::vector<std::vector<std::string>>{{"--out", "/nonexistent-dir/b.json"},
                                             {"--out", ::testing::TempDir()},
                                             {"--plot", "/nonexistent-dir/b.png"}}) {
    std::vector<std::string> args = {
        TandemBinary(),   "bench", "--server",    "127.0.0.1:" + std::to_string(FreePort()),
        "--num-requests", "1",     "--timeout-s", "1"};
    args.insert(args.end(), flags.begin(), flags.end());
    r = RunProcess(args);
    EXPECT_EQ(r.exit_code, 2) << flags[1] << ": " << r.err;
    EXPECT_NE(r.err.find("tandem bench: " + flags[0] + ": "), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace tandem::testing
