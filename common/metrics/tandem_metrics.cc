#include "common/metrics/tandem_metrics.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::metrics {
namespace {

// Binds the (phase, model) child of a family registered with exactly those
// labels.
template <typename T, typename P>
absl::StatusOr<T*> Bind(absl::StatusOr<Family<T, P>*> family, std::string_view phase,
                        std::string_view model) {
  if (!family.ok()) return family.status();
  return (*family)->WithLabelValues({phase, model});
}

std::vector<std::string> PhaseModel() { return {"phase", "model"}; }

}  // namespace

absl::StatusOr<std::unique_ptr<TandemMetrics>> TandemMetrics::Create(MetricsRegistry* registry,
                                                                     std::string_view phase,
                                                                     std::string_view model) {
  if (phase != kPhaseRouter && phase != kPhasePrefill && phase != kPhaseDecode &&
      phase != kPhaseColocated) {
    return absl::InvalidArgumentError("unknown phase \"" + std::string(phase) +
                                      "\" (router|prefill|decode|colocated)");
  }
  auto m = std::make_unique<TandemMetrics>();
  m->phase = std::string(phase);
  m->model = std::string(model);
  MetricsRegistry& r = *registry;
  auto hist = [&](std::string_view name, std::string_view help, absl::Span<const double> bounds) {
    return Bind(r.AddHistogram(name, help, PhaseModel(), bounds), phase, model);
  };
  auto counter = [&](std::string_view name, std::string_view help) {
    return Bind(r.AddCounter(name, help, PhaseModel()), phase, model);
  };
  auto gauge = [&](std::string_view name, std::string_view help) {
    return Bind(r.AddGauge(name, help, PhaseModel()), phase, model);
  };

  // Histograms.
  TANDEM_ASSIGN_OR_RETURN(
      m->time_to_first_token,
      hist("tandem_time_to_first_token_seconds",
           "Time from request arrival to the first generated token, in seconds.",
           kTtftSecondsBuckets));
  TANDEM_ASSIGN_OR_RETURN(
      m->inter_token_latency,
      hist("tandem_inter_token_latency_seconds",
           "Time between consecutive generated tokens of a request (TPOT), in seconds.",
           kInterTokenSecondsBuckets));
  TANDEM_ASSIGN_OR_RETURN(
      m->e2e_request_latency,
      hist("tandem_e2e_request_latency_seconds",
           "Time from request arrival to its final token, in seconds.", kE2eSecondsBuckets));
  TANDEM_ASSIGN_OR_RETURN(
      m->request_queue_time,
      hist("tandem_request_queue_time_seconds",
           "Time a request waited in this phase's queue before it was first scheduled, in "
           "seconds.",
           kTtftSecondsBuckets));
  TANDEM_ASSIGN_OR_RETURN(
      m->request_prefill_time,
      hist("tandem_request_prefill_time_seconds",
           "Time from a request's first scheduled step to its first token (prompt compute), in "
           "seconds.",
           kTtftSecondsBuckets));
  TANDEM_ASSIGN_OR_RETURN(
      m->request_decode_time,
      hist("tandem_request_decode_time_seconds",
           "Time from a request's first token to its last token, in seconds.", kE2eSecondsBuckets));
  TANDEM_ASSIGN_OR_RETURN(
      m->kv_transfer_time,
      hist("tandem_kv_transfer_seconds",
           "Time to move one request's KV blocks from a prefill to a decode worker, in seconds.",
           kTransferSecondsBuckets));
  TANDEM_ASSIGN_OR_RETURN(
      m->kv_transfer_after_first_token,
      hist("tandem_kv_transfer_after_first_token_seconds",
           "Prefill worker: time from sending a request's first token to its KV landing on the "
           "decode worker (the part of the transfer not overlapped with the prefill), in "
           "seconds.",
           kTransferSecondsBuckets));
  TANDEM_ASSIGN_OR_RETURN(m->iteration_tokens,
                          hist("tandem_iteration_tokens",
                               "Tokens scheduled in one engine step (prefill chunks + decodes).",
                               kIterationTokensBuckets));
  TANDEM_ASSIGN_OR_RETURN(
      m->batch_size,
      hist("tandem_batch_size", "Sequences scheduled in one engine step.", kBatchSizeBuckets));
  TANDEM_ASSIGN_OR_RETURN(
      m->migration_recovery_time,
      hist("tandem_migration_recovery_seconds",
           "Router: time from seeing a worker fail mid-request to the next token from the "
           "worker it migrated to, in seconds.",
           kTtftSecondsBuckets));

  // Counters.
  TANDEM_ASSIGN_OR_RETURN(m->kv_transfer_bytes, counter("tandem_kv_transfer_bytes_total",
                                                        "KV cache bytes moved between workers."));
  TANDEM_ASSIGN_OR_RETURN(
      m->kv_transfer_failures,
      counter("tandem_kv_transfer_failures_total",
              "KV handoffs that failed (rejected header, timeout, expired lease, peer error)."));
  TANDEM_ASSIGN_OR_RETURN(
      m->kv_transfer_overlapped_bytes,
      counter(
          "tandem_kv_transfer_overlapped_bytes_total",
          "Prefill worker: KV bytes handed to the transfer while the prompt was still being "
          "computed (before its first token): the share of the handoff that overlaps prefill."));
  TANDEM_ASSIGN_OR_RETURN(m->prompt_tokens,
                          counter("tandem_prompt_tokens_total", "Prompt tokens processed."));
  TANDEM_ASSIGN_OR_RETURN(m->generation_tokens,
                          counter("tandem_generation_tokens_total", "Tokens generated."));
  TANDEM_ASSIGN_OR_RETURN(
      m->num_preemptions,
      counter("tandem_num_preemptions_total",
              "Sequences preempted (blocks freed, recomputed later) because KV blocks ran out."));
  TANDEM_ASSIGN_OR_RETURN(
      m->prefix_cache_queries,
      counter("tandem_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache."));
  TANDEM_ASSIGN_OR_RETURN(
      m->prefix_cache_hits,
      counter("tandem_prefix_cache_hits_total",
              "Prompt tokens found in the prefix cache (their KV was reused)."));
  TANDEM_ASSIGN_OR_RETURN(
      m->spec_num_drafts,
      counter("tandem_spec_decode_num_drafts_total",
              "Speculative decoding: steps in which a sequence verified draft tokens."));
  TANDEM_ASSIGN_OR_RETURN(m->spec_num_draft_tokens,
                          counter("tandem_spec_decode_num_draft_tokens_total",
                                  "Speculative decoding: draft tokens proposed."));
  TANDEM_ASSIGN_OR_RETURN(m->spec_num_accepted_tokens,
                          counter("tandem_spec_decode_num_accepted_tokens_total",
                                  "Speculative decoding: draft tokens accepted."));
  TANDEM_ASSIGN_OR_RETURN(
      m->spec_accepted_per_pos_family,
      r.AddCounter("tandem_spec_decode_num_accepted_tokens_per_pos_total",
                   "Speculative decoding: draft tokens accepted at each draft position (0 = the "
                   "first draft of a step).",
                   {"phase", "model", "position"}));
  // Decode workers export every position from the start (at 0), so
  // dashboards and rules see the series before the first draft is accepted.
  if (phase == kPhaseDecode) {
    for (int position = 0; position < kSpecMaxPositions; ++position) {
      TANDEM_RETURN_IF_ERROR(
          m->spec_accepted_per_pos_family->WithLabelValues({phase, model, absl::StrCat(position)})
              .status());
    }
  }
  TANDEM_ASSIGN_OR_RETURN(
      m->request_success_family,
      r.AddCounter("tandem_request_success_total", "Requests finished, by finish reason.",
                   {"phase", "model", "finish_reason"}));
  TANDEM_ASSIGN_OR_RETURN(
      m->request_errors_family,
      r.AddCounter("tandem_request_errors_total",
                   "Requests that ended with an error, by canonical status code.",
                   {"phase", "model", "code"}));
  for (std::string_view reason : kFinishReasons) {
    TANDEM_RETURN_IF_ERROR(
        m->request_success_family->WithLabelValues({phase, model, reason}).status());
  }
  TANDEM_ASSIGN_OR_RETURN(
      m->migrations_family,
      r.AddCounter("tandem_request_migrations_total",
                   "Router: requests re-dispatched to another worker after one failed, by what "
                   "failed (decode_failed, prefill_failed, transfer_failed).",
                   {"phase", "model", "reason"}));
  if (phase == "router") {
    for (std::string_view reason : {"decode_failed", "prefill_failed", "transfer_failed"}) {
      TANDEM_RETURN_IF_ERROR(
          m->migrations_family->WithLabelValues({phase, model, reason}).status());
    }
  }

  TANDEM_ASSIGN_OR_RETURN(
      m->prefill_decisions_family,
      r.AddCounter(
          "tandem_router_prefill_decisions_total",
          "Router: where each disaggregated request's prompt was prefilled: remote (a "
          "prefill worker, KV handed over) or local (on its decode worker: a short "
          "prompt or one mostly in that worker's prefix cache, --remote-prefill-min-tokens).",
          {"phase", "model", "where"}));
  if (phase == "router") {
    for (std::string_view where : {"remote", "local"}) {
      TANDEM_RETURN_IF_ERROR(
          m->prefill_decisions_family->WithLabelValues({phase, model, where}).status());
    }
  }

  // Gauges.
  TANDEM_ASSIGN_OR_RETURN(
      m->kv_cache_usage_ratio,
      gauge("tandem_kv_cache_usage_ratio", "Fraction of KV cache blocks in use, 0 to 1."));
  TANDEM_ASSIGN_OR_RETURN(m->num_requests_running,
                          gauge("tandem_num_requests_running", "Requests in the running batch."));
  TANDEM_ASSIGN_OR_RETURN(m->num_requests_waiting, gauge("tandem_num_requests_waiting",
                                                         "Requests waiting to be scheduled."));
  TANDEM_ASSIGN_OR_RETURN(m->num_kv_leases,
                          gauge("tandem_num_kv_leases",
                                "KV handoffs received and held under a lease, not yet "
                                "adopted by a decode request."));
  TANDEM_ASSIGN_OR_RETURN(m->num_leased_blocks,
                          gauge("tandem_num_leased_blocks", "KV blocks held by unexpired leases."));
  TANDEM_ASSIGN_OR_RETURN(
      m->num_inflight_tokens,
      gauge(
          "tandem_num_inflight_tokens",
          "Router: prompt tokens + max_tokens of the requests admitted (--max-inflight-tokens)."));
  TANDEM_ASSIGN_OR_RETURN(
      m->healthy_workers_family,
      r.AddGauge("tandem_router_healthy_workers",
                 "Router: workers in rotation (registered or static, answering their health "
                 "polls), by role.",
                 {"phase", "model", "role"}));
  if (phase == "router") {
    for (std::string_view role : {"prefill", "decode"}) {
      TANDEM_RETURN_IF_ERROR(
          m->healthy_workers_family->WithLabelValues({phase, model, role}).status());
    }
  }
  return m;
}

Gauge* TandemMetrics::HealthyWorkers(std::string_view role) {
  absl::StatusOr<Gauge*> g = healthy_workers_family->WithLabelValues({phase, model, role});
  return g.ok() ? *g : &gauge_sink_;
}

Counter* TandemMetrics::LabelledCounter(CounterFamily* family, std::string_view value) {
  absl::StatusOr<Counter*> c = family->WithLabelValues({phase, model, value});
  return c.ok() ? *c : &sink_;
}

Counter* TandemMetrics::RequestSuccess(std::string_view finish_reason) {
  return LabelledCounter(request_success_family, finish_reason);
}

Counter* TandemMetrics::RequestErrors(absl::StatusCode code) {
  return LabelledCounter(request_errors_family, absl::StatusCodeToString(code));
}

Counter* TandemMetrics::Migrations(std::string_view reason) {
  return LabelledCounter(migrations_family, reason);
}

Counter* TandemMetrics::PrefillDecisions(std::string_view where) {
  return LabelledCounter(prefill_decisions_family, where);
}

Counter* TandemMetrics::SpecAcceptedAtPosition(int64_t position) {
  return LabelledCounter(spec_accepted_per_pos_family, absl::StrCat(position));
}

}  // namespace tandem::metrics
