// `tandem bench`: per-request records, the arrival generator and the
// aggregate metrics (TTFT, TPOT, ITL, e2e, throughput, goodput), following
// `vllm bench serve`: TTFT to the first streamed chunk, ITL = each gap between
// chunks, TPOT = (e2e - TTFT) / (output tokens - 1).
#ifndef TANDEM_BENCH_SERVE_STATS_H_
#define TANDEM_BENCH_SERVE_STATS_H_

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace tandem::bench {

// One request as the client saw it. Times are milliseconds from the request's
// send time (start_ms is from the start of the run).
struct RequestRecord {
  int64_t index = 0;
  bool ok = false;
  std::string error_code;  // "OK" when ok; a gRPC code name or "HTTP_503"
  std::string error_message;
  std::string finish_reason;
  double start_ms = 0;
  double ttft_ms = 0;          // send -> first chunk carrying a token
  double e2e_ms = 0;           // send -> end of stream
  std::vector<double> itl_ms;  // each gap between consecutive chunks
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t output_tokens = 0;  // tokens received (or the server's usage)
  int64_t num_chunks = 0;

  // (e2e - TTFT) / (output_tokens - 1); 0 with fewer than 2 tokens.
  double TpotMs() const;
};

// mean / p50 / p90 / p99 of a sample (all 0 when empty).
struct Distribution {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};

// Linear interpolation between closest ranks (numpy's default, as vLLM
// reports); p in [0, 1]; 0 for an empty input.
double Percentile(std::vector<double> values, double p);
Distribution Summarize(const std::vector<double>& values);

struct Slo {
  double ttft_ms = 0;  // 0 = no bound
  double tpot_ms = 0;
};

struct RunSummary {
  double request_rate = 0;  // requested; 0 = fixed concurrency
  int64_t max_concurrency = 0;
  double burstiness = 1;
  int64_t num_requests = 0;  // issued
  int64_t completed = 0;
  int64_t failed = 0;
  double wall_s = 0;
  int64_t total_prompt_tokens = 0;
  int64_t total_cached_tokens = 0;
  int64_t total_output_tokens = 0;
  double request_throughput = 0;  // completed / wall
  double output_tokens_per_second = 0;
  double total_tokens_per_second = 0;  // prompt + output
  double goodput = 0;                  // requests/s meeting every SLO
  int64_t good_requests = 0;
  double mean_in_flight = 0;  // sum of e2e / wall (Little's law)
  double prompt_tokens_mean = 0;
  double output_tokens_mean = 0;
  Distribution ttft, tpot, itl, e2e;
  std::map<std::string, int64_t> errors;  // code -> count
  std::vector<RequestRecord> records;
};

RunSummary Aggregate(std::vector<RequestRecord> records, double wall_s, const Slo& slo);

// Inter-arrival gaps of a Poisson process at `rate` requests/s (burstiness 1),
// or of a gamma process with shape `burstiness` and the same mean 1/rate
// (burstiness < 1 burstier, > 1 more regular), as vllm bench serve. A rate of
// 0 or infinity means every request at once (gap 0). Deterministic per seed.
class ArrivalGenerator {
 public:
  ArrivalGenerator(double rate, double burstiness, uint64_t seed);
  double NextGapSeconds();

 private:
  double rate_;
  std::mt19937_64 rng_;
  std::gamma_distribution<double> gamma_;
};

}  // namespace tandem::bench

#endif  // TANDEM_BENCH_SERVE_STATS_H_
