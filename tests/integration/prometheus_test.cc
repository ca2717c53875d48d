// Observability end to end: a real Prometheus server (Debian package
// `prometheus`) scrapes the router's, the prefill worker's and the decode
// worker's /metrics every second while a load runs through `tandem serve`;
// then PromQL histogram_quantile(0.9, ...) over TTFT and TPOT returns numbers.
// Skips when no prometheus binary is installed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/cluster_util.h"
#include "tests/util/http_get.h"
#include "tests/util/json_reader.h"
#include "tests/util/subprocess.h"

namespace tandem::testing {
namespace {

std::string PrometheusBinary() {
  for (const char* p : {"/usr/bin/prometheus", "/usr/local/bin/prometheus"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (isalnum(c) || c == '_' || c == '.' || c == '-' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char hex[4];
      std::snprintf(hex, sizeof(hex), "%%%02X", c);
      out += hex;
    }
  }
  return out;
}

// The query's first sample value, or NaN when the result is empty / not a number.
double QueryScalar(int port, const std::string& promql, std::string* raw) {
  *raw = HttpGetBody(port, "/api/v1/query?query=" + UrlEncode(promql));
  try {
    Json j = Json::Parse(*raw);
    if (j["status"].str != "success") return NAN;
    const Json& result = j["data"]["result"];
    if (result.size() == 0) return NAN;
    return std::stod(result[0]["value"][1].str);
  } catch (...) {
    return NAN;
  }
}

TEST(PrometheusTest, ScrapesAllServicesAndAnswersQuantileQueries) {
  const std::string prometheus = PrometheusBinary();
  if (prometheus.empty()) GTEST_SKIP() << "no prometheus binary (apt-get install prometheus)";
  ServeProcess cluster;
  const std::string err = cluster.Start({});
  ASSERT_EQ(err, "") << err;
  ASSERT_EQ(cluster.endpoints().size(), 3u);

  const std::string config = cluster.dir() + "/prometheus.yml";
  {
    std::ofstream f(config);
    f << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
         "scrape_configs:\n  - job_name: tandem\n    static_configs:\n      - targets: [";
    for (size_t i = 0; i < cluster.endpoints().size(); ++i) {
      f << (i ? ", " : "") << "'" << cluster.endpoints()[i].metrics_address << "'";
    }
    f << "]\n";
  }
  const int web_port = FreePort();
  const pid_t prom = fork();
  if (prom == 0) {
    const std::string log = cluster.dir() + "/prometheus.log";
    FILE* l = std::fopen(log.c_str(), "w");
    dup2(fileno(l), STDOUT_FILENO);
    dup2(fileno(l), STDERR_FILENO);
    const std::string a1 = "--config.file=" + config;
    const std::string a2 = "--storage.tsdb.path=" + cluster.dir() + "/tsdb";
    const std::string a3 = "--web.listen-address=127.0.0.1:" + std::to_string(web_port);
    execl(prometheus.c_str(), prometheus.c_str(), a1.c_str(), a2.c_str(), a3.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
  } reaper{prom};

  // Ready?
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (HttpGetBody(web_port, "/-/ready").find("Ready") == std::string::npos) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up) << "prometheus did not start";
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  // Every target scraped once before the load (so rate() sees it grow).
  std::string raw;
  while (QueryScalar(web_port, "sum(up{job=\"tandem\"})", &raw) != 3) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up + std::chrono::seconds(30))
        << "targets not up: " << raw;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  // Load in rounds of 8 concurrent requests, a second or more apart, so
  // rate() over [1m] sees increases between scrapes. On a loaded machine a
  // scrape can be late or missed, so after the first 3 rounds keep adding a
  // round (at most 5 more, bounded by the deadline) until both quantiles are
  // numbers.
  auto load_round = [&](int round) {
    ProcessResult r =
        RunProcess({TandemBinary(), "client", "--server", cluster.Address("router"), "--prompt",
                    "Tell me about the sea", "--max-tokens", "16", "--ignore-eos", "--num-requests",
                    "8", "--concurrency", "8", "--seed", std::to_string(round * 10)});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  };
  for (int round = 0; round < 3; ++round) load_round(round);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  double up = NAN, ttft = NAN, tpot = NAN;
  for (int extra = 0; std::chrono::steady_clock::now() < deadline; ++extra) {
    for (int poll = 0; poll < 6; ++poll) {
      up = QueryScalar(web_port, "sum(up{job=\"tandem\"})", &raw);
      ttft =
          QueryScalar(web_port,
                      "histogram_quantile(0.9, sum(rate(tandem_time_to_first_token_seconds_bucket"
                      "[1m])) by (le))",
                      &raw);
      tpot =
          QueryScalar(web_port,
                      "histogram_quantile(0.9, sum(rate(tandem_inter_token_latency_seconds_bucket"
                      "[1m])) by (le))",
                      &raw);
      if (up == 3 && std::isfinite(ttft) && std::isfinite(tpot)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    if (up == 3 && std::isfinite(ttft) && std::isfinite(tpot)) break;
    if (extra >= 5) break;
    load_round(3 + extra);
  }
  EXPECT_EQ(up, 3) << raw;
  if (!std::isfinite(ttft)) {
    QueryScalar(web_port, "tandem_time_to_first_token_seconds_count", &raw);
    std::fprintf(stderr, "count: %s\n", raw.c_str());
    QueryScalar(web_port, "tandem_time_to_first_token_seconds_count[1m]", &raw);
    std::fprintf(stderr, "range: %s\n", raw.c_str());
  }
  EXPECT_TRUE(std::isfinite(ttft) && ttft > 0) << "TTFT p90: " << ttft << " " << raw;
  EXPECT_TRUE(std::isfinite(tpot) && tpot > 0) << "TPOT p90: " << tpot << " " << raw;
  std::fprintf(stderr, "prometheus: TTFT p90 %.4f s, TPOT p90 %.4f s\n", ttft, tpot);
  // Per phase: the workers export their own series too.
  for (const char* q : {"sum(tandem_prompt_tokens_total{phase=\"router\"})",
                        "count(tandem_kv_cache_usage_ratio)"}) {
    EXPECT_TRUE(std::isfinite(QueryScalar(web_port, q, &raw))) << q << ": " << raw;
  }
  EXPECT_EQ(cluster.Stop(), 0);
}

}  // namespace
}  // namespace tandem::testing
