// The prefill:decode worker ratio (DistServe, OSDI '24, section 3): size each
// phase's pool separately against its own latency target.
//
// Prefill worker: one prompt at a time (a long prompt already saturates the
// FLOPs, so batching prompts does not raise throughput). Service time D is
// the roofline max of FLOPs / (eff x peak FLOP/s) and weights / (eff x
// bandwidth). With Poisson arrivals at rate r per worker it is an M/D/1
// queue: mean TTFT = D + r D^2 / (2 (1 - r D)). Solving TTFT <= target for
// the utilisation rho = r D gives rho <= 2x / (1 + 2x), x = target / D - 1;
// workers = ceil(rate x D / rho_max).
//
// Decode worker: sequences hold prompt + output tokens of KV at the end and
// prompt + output / 2 on average, which every step reads. The batch is the
// largest that both fits the KV budget and keeps the step time (TPOT) under
// target; workers = ceil(rate x output_tokens / tokens per second per worker).
#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "plan/capacity_plan.h"

namespace tandem::plan {

WorkerRatio ComputeWorkerRatio(const PlanInputs& in, const Plan& plan) {
  const Workload& w = in.workload;
  const double weights = static_cast<double>(plan.weights_bytes);
  WorkerRatio r;

  // Prefill.
  const double prompt_flops =
      static_cast<double>(w.prompt_tokens) * PrefillFlopsPerToken(in.model, w.prompt_tokens);
  const double compute_s = prompt_flops / (in.compute_efficiency * in.device.flops_per_second);
  const double memory_s =
      weights / (in.bandwidth_efficiency * in.device.bandwidth_bytes_per_second);
  const double d = std::max(compute_s, memory_s);
  const double ttft_s = w.ttft_target_ms / 1000;
  r.prefill_seconds_per_request = d;
  if (d >= ttft_s) {
    r.infeasible_reason =
        absl::StrFormat("one %d-token prefill takes %.1f ms, over the %.1f ms TTFT target",
                        w.prompt_tokens, 1000 * d, w.ttft_target_ms);
    return r;
  }
  const double x = ttft_s / d - 1;
  const double rho_max = 2 * x / (1 + 2 * x);
  r.prefill_requests_per_second_per_worker = rho_max / d;
  r.prefill_workers =
      w.request_rate > 0 ? static_cast<int64_t>(std::ceil(w.request_rate * d / rho_max)) : 1;
  r.prefill_workers = std::max<int64_t>(r.prefill_workers, 1);
  const double rho = w.request_rate * d / static_cast<double>(r.prefill_workers);
  r.expected_ttft_ms = 1000 * (d + rho * d / (2 * (1 - rho)));

  // Decode.
  const int64_t final_tokens = w.prompt_tokens + w.output_tokens;
  const int64_t mean_context = w.prompt_tokens + w.output_tokens / 2;
  const double seq_bytes =
      static_cast<double>(final_tokens) * static_cast<double>(plan.kv_bytes_per_token);
  const int64_t batch_memory =
      plan.kv_budget_bytes > 0 ? static_cast<int64_t>(std::floor(plan.kv_budget_bytes / seq_bytes))
                               : 0;
  if (batch_memory < 1) {
    r.infeasible_reason = absl::StrFormat(
        "one %d-token sequence does not fit the decode worker's KV budget", final_tokens);
    return r;
  }
  // Step time grows linearly in the batch: solve step(b) <= TPOT for b on
  // both rooflines.
  const double tpot_s = w.tpot_target_ms / 1000;
  const double bytes_per_seq =
      static_cast<double>(mean_context) * static_cast<double>(plan.kv_bytes_per_token);
  const double bw = in.bandwidth_efficiency * in.device.bandwidth_bytes_per_second;
  const double flops_per_seq = 2.0 * static_cast<double>(plan.num_parameters) +
                               4.0 * static_cast<double>(in.model.num_layers) *
                                   static_cast<double>(in.model.q_dim()) *
                                   static_cast<double>(mean_context);
  const double flops = in.compute_efficiency * in.device.flops_per_second;
  const double batch_tpot =
      std::min((tpot_s * bw - weights) / bytes_per_seq, tpot_s * flops / flops_per_seq);
  if (batch_tpot < 1) {
    r.infeasible_reason = absl::StrFormat(
        "one decode step at batch 1 takes %.2f ms, over the %.2f ms TPOT target",
        1000 * DecodeStepSeconds(in, weights, plan.kv_bytes_per_token, 1, mean_context,
                                 in.bandwidth_efficiency, in.compute_efficiency),
        w.tpot_target_ms);
    return r;
  }
  r.decode_batch = std::min<int64_t>(batch_memory, static_cast<int64_t>(std::floor(batch_tpot)));
  const double step_s =
      DecodeStepSeconds(in, weights, plan.kv_bytes_per_token, r.decode_batch, mean_context,
                        in.bandwidth_efficiency, in.compute_efficiency);
  r.decode_step_ms = 1000 * step_s;
  r.decode_tokens_per_second_per_worker = static_cast<double>(r.decode_batch) / step_s;
  const double demand = w.request_rate * static_cast<double>(w.output_tokens);
  r.decode_workers = std::max<int64_t>(
      1, static_cast<int64_t>(std::ceil(demand / r.decode_tokens_per_second_per_worker)));
  r.prefill_to_decode_ratio =
      static_cast<double>(r.prefill_workers) / static_cast<double>(r.decode_workers);
  r.feasible = true;
  return r;
}

}  // namespace tandem::plan
