// Per-request results of `tandem generate` and the timing summary it prints.
#ifndef TANDEM_SERVICES_CLI_RUN_STATS_H_
#define TANDEM_SERVICES_CLI_RUN_STATS_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace tandem::cli {

struct RequestResult {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> token_ids;  // every sampled token, the EOS / stop token included
  std::string text;                // emitted text (EOS / stop text excluded)
  std::string finish_reason;
  double ttft_ms = 0;  // submit -> first token
  double tpot_ms = 0;  // mean gap between later tokens (0 with < 2 tokens)
  int64_t num_cached_tokens = 0;
  double queue_ms = 0;
  double e2e_ms = 0;
  bool done = false;

  // Records the finish event (timings from its usage).
  void Finish(const engine::FinishEvent& finish, std::string reason);
};

// Median (p = 0.5) and other quantiles by nearest rank; 0 for an empty input.
double Quantile(std::vector<double> values, double p);

// One line per request (when per_request) and the aggregate: requests,
// tokens, throughput, TTFT / TPOT mean and p50 / p90 / p99, prefix-cache hit
// rate, preemptions.
void PrintRunStats(const std::vector<RequestResult>& results, double wall_s,
                   const engine::EngineStats& stats, bool per_request, std::FILE* out);

}  // namespace tandem::cli

#endif  // TANDEM_SERVICES_CLI_RUN_STATS_H_
