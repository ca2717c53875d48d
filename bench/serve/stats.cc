#include "bench/serve/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tandem::bench {

double RequestRecord::TpotMs() const {
  if (output_tokens < 2) return 0;
  return (e2e_ms - ttft_ms) / static_cast<double>(output_tokens - 1);
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  p = std::clamp(p, 0.0, 1.0);
  const double rank = p * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

Distribution Summarize(const std::vector<double>& values) {
  Distribution d;
  d.count = static_cast<int64_t>(values.size());
  if (values.empty()) return d;
  d.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  d.p50 = Percentile(values, 0.5);
  d.p90 = Percentile(values, 0.9);
  d.p99 = Percentile(values, 0.99);
  d.max = *std::max_element(values.begin(), values.end());
  return d;
}

RunSummary Aggregate(std::vector<RequestRecord> records, double wall_s, const Slo& slo) {
  RunSummary s;
  s.wall_s = wall_s;
  s.num_requests = static_cast<int64_t>(records.size());
  std::vector<double> ttft, tpot, itl, e2e;
  double e2e_sum_ms = 0;
  for (const RequestRecord& r : records) {
    if (!r.ok) {
      ++s.failed;
      ++s.errors[r.error_code.empty() ? "UNKNOWN" : r.error_code];
      continue;
    }
    ++s.completed;
    s.total_prompt_tokens += r.prompt_tokens;
    s.total_cached_tokens += r.cached_tokens;
    s.total_output_tokens += r.output_tokens;
    ttft.push_back(r.ttft_ms);
    e2e.push_back(r.e2e_ms);
    e2e_sum_ms += r.e2e_ms;
    const double t = r.TpotMs();
    if (r.output_tokens >= 2) tpot.push_back(t);
    itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
    const bool good = (slo.ttft_ms <= 0 || r.ttft_ms <= slo.ttft_ms) &&
                      (slo.tpot_ms <= 0 || r.output_tokens < 2 || t <= slo.tpot_ms);
    s.good_requests += good;
  }
  if (wall_s > 0) {
    s.request_throughput = static_cast<double>(s.completed) / wall_s;
    s.output_tokens_per_second = static_cast<double>(s.total_output_tokens) / wall_s;
    s.total_tokens_per_second =
        static_cast<double>(s.total_output_tokens + s.total_prompt_tokens) / wall_s;
    s.goodput = static_cast<double>(s.good_requests) / wall_s;
    s.mean_in_flight = e2e_sum_ms / 1e3 / wall_s;
  }
  if (s.completed > 0) {
    s.prompt_tokens_mean =
        static_cast<double>(s.total_prompt_tokens) / static_cast<double>(s.completed);
    s.output_tokens_mean =
        static_cast<double>(s.total_output_tokens) / static_cast<double>(s.completed);
  }
  s.ttft = Summarize(ttft);
  s.tpot = Summarize(tpot);
  s.itl = Summarize(itl);
  s.e2e = Summarize(e2e);
  s.records = std::move(records);
  return s;
}

ArrivalGenerator::ArrivalGenerator(double rate, double burstiness, uint64_t seed)
    : rate_(rate),
      rng_(seed),
      gamma_(burstiness > 0 ? burstiness : 1.0,
             (rate > 0 && std::isfinite(rate)) ? 1.0 / (rate * (burstiness > 0 ? burstiness : 1.0))
                                               : 1.0) {}

double ArrivalGenerator::NextGapSeconds() {
  if (!(rate_ > 0) || !std::isfinite(rate_)) return 0;
  return gamma_(rng_);
}

}  // namespace tandem::bench
