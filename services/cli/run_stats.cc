#include "services/cli/run_stats.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace tandem::cli {

void RequestResult::Finish(const engine::FinishEvent& finish, std::string reason) {
  text += finish.text;
  finish_reason = std::move(reason);
  const engine::Usage& u = finish.usage;
  ttft_ms = u.ttft_s * 1000.0;
  const size_t n = u.token_times_s.size();
  tpot_ms = n > 1 ? (u.token_times_s.back() - u.token_times_s.front()) * 1000.0 / (n - 1) : 0.0;
  num_cached_tokens = u.num_cached_tokens;
  queue_ms = u.queue_time_s * 1000.0;
  e2e_ms = u.e2e_s * 1000.0;
  done = true;
}

double Quantile(std::vector<double> values, double p) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(p * values.size()));
  return values[std::min(values.size() - 1, rank == 0 ? 0 : rank - 1)];
}

namespace {

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / v.size();
}

void PrintDistribution(std::FILE* out, const char* name, const std::vector<double>& v) {
  std::fprintf(out, "  %-5s ms: mean %.2f  p50 %.2f  p90 %.2f  p99 %.2f\n", name, Mean(v),
               Quantile(v, 0.5), Quantile(v, 0.9), Quantile(v, 0.99));
}

}  // namespace

// Speculative decoding: acceptance rate, mean tokens per verification step
// (the accepted drafts + the sampled token) and acceptance by position.
void PrintSpecStats(const engine::EngineStats::Spec& spec, std::FILE* out) {
  if (spec.num_drafts == 0) return;
  std::string per_position;
  for (size_t i = 0; i < spec.accepted_per_position.size(); ++i) {
    absl::StrAppendFormat(&per_position, "%s%.2f", i == 0 ? "" : " ",
                          double(spec.accepted_per_position[i]) / spec.num_drafts);
  }
  std::fprintf(
      out,
      "[spec] %lld verify steps, %lld draft tokens, %lld accepted (%.1f%%); mean "
      "acceptance length %.2f tokens/step; accepted per position: %s\n",
      static_cast<long long>(spec.num_drafts), static_cast<long long>(spec.num_draft_tokens),
      static_cast<long long>(spec.num_accepted_tokens),
      spec.num_draft_tokens > 0 ? 100.0 * spec.num_accepted_tokens / spec.num_draft_tokens : 0.0,
      1.0 + double(spec.num_accepted_tokens) / spec.num_drafts, per_position.c_str());
}

void PrintRunStats(const std::vector<RequestResult>& results, double wall_s,
                   const engine::EngineStats& stats, bool per_request, std::FILE* out) {
  PrintSpecStats(stats.spec, out);
  int64_t prompt_tokens = 0, output_tokens = 0;
  std::vector<double> ttft, tpot;
  for (size_t i = 0; i < results.size(); ++i) {
    const RequestResult& r = results[i];
    prompt_tokens += r.prompt_ids.size();
    output_tokens += r.token_ids.size();
    ttft.push_back(r.ttft_ms);
    if (r.token_ids.size() > 1) tpot.push_back(r.tpot_ms);
    if (per_request) {
      std::fprintf(out,
                   "[request %zu] prompt %zu tokens (%lld cached), generated %zu (%s), queue "
                   "%.1f ms, TTFT %.1f ms, TPOT %.2f ms, e2e %.1f ms\n",
                   i + 1, r.prompt_ids.size(), static_cast<long long>(r.num_cached_tokens),
                   r.token_ids.size(), r.finish_reason.c_str(), r.queue_ms, r.ttft_ms, r.tpot_ms,
                   r.e2e_ms);
    }
  }
  if (!per_request && results.size() == 1) {
    const RequestResult& r = results[0];
    std::fprintf(out,
                 "[generate] prompt %zu tokens, prefill %.1f tokens/s | generated %zu tokens "
                 "(%s), decode %.1f tokens/s | TTFT %.1f ms, TPOT %.2f ms\n",
                 r.prompt_ids.size(),
                 r.ttft_ms > 0 ? r.prompt_ids.size() * 1000.0 / r.ttft_ms : 0.0, r.token_ids.size(),
                 r.finish_reason.c_str(), r.tpot_ms > 0 ? 1000.0 / r.tpot_ms : 0.0, r.ttft_ms,
                 r.tpot_ms);
    return;
  }
  std::fprintf(out,
               "[generate] %zu requests in %.2f s: %lld prompt + %lld generated tokens; output "
               "%.1f tokens/s, total %.1f tokens/s, %.2f requests/s\n",
               results.size(), wall_s, static_cast<long long>(prompt_tokens),
               static_cast<long long>(output_tokens), output_tokens / wall_s,
               (prompt_tokens + output_tokens) / wall_s, results.size() / wall_s);
  PrintDistribution(out, "TTFT", ttft);
  PrintDistribution(out, "TPOT", tpot);
  const double hit_rate =
      stats.num_prefix_cache_query_tokens > 0
          ? double(stats.num_prefix_cache_hit_tokens) / stats.num_prefix_cache_query_tokens
          : 0.0;
  std::fprintf(out,
               "  prefix cache: %lld of %lld prompt tokens hit (%.1f%%); preemptions %lld; "
               "steps %lld\n",
               static_cast<long long>(stats.num_prefix_cache_hit_tokens),
               static_cast<long long>(stats.num_prefix_cache_query_tokens), 100.0 * hit_rate,
               static_cast<long long>(stats.num_preemptions),
               static_cast<long long>(stats.num_steps));
}

}  // namespace tandem::cli
