#include "common/metrics/tandem_metrics.h"

#include <algorithm>
#include <iterator>
#include <string>
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

// The metrics of one phase: tables of what Create registers, in this order
// (the order of the /metrics text). Every family has the labels {phase,
// model}; the labelled ones add one more.
struct HistogramSpec {
  Histogram* TandemMetrics::*field;
  const char* name;
  const char* help;
  absl::Span<const double> bounds;
};
struct SimpleSpec {
  const char* name;
  const char* help;
};
template <typename T>
struct BoundSpec {
  T* TandemMetrics::*field;
  SimpleSpec spec;
};
// A family with a third label; `values` are created at start-up (at 0) for
// the phases in `phases` (empty: every phase), so dashboards and rules see
// the series before the first event.
template <typename F>
struct LabelledSpec {
  F* TandemMetrics::*field;
  const char* name;
  const char* help;
  const char* label;
  std::vector<std::string> values;
  std::vector<std::string_view> phases;
};

const HistogramSpec kHistograms[] = {
    {&TandemMetrics::time_to_first_token, "tandem_time_to_first_token_seconds",
     "Time from request arrival to the first generated token, in seconds.", kTtftSecondsBuckets},
    {&TandemMetrics::inter_token_latency, "tandem_inter_token_latency_seconds",
     "Time between consecutive generated tokens of a request (TPOT), in seconds.",
     kInterTokenSecondsBuckets},
    {&TandemMetrics::e2e_request_latency, "tandem_e2e_request_latency_seconds",
     "Time from request arrival to its final token, in seconds.", kE2eSecondsBuckets},
    {&TandemMetrics::request_queue_time, "tandem_request_queue_time_seconds",
     "Time a request waited in this phase's queue before it was first scheduled, in seconds.",
     kTtftSecondsBuckets},
    {&TandemMetrics::request_prefill_time, "tandem_request_prefill_time_seconds",
     "Time from a request's first scheduled step to its first token (prompt compute), in seconds.",
     kTtftSecondsBuckets},
    {&TandemMetrics::request_decode_time, "tandem_request_decode_time_seconds",
     "Time from a request's first token to its last token, in seconds.", kE2eSecondsBuckets},
    {&TandemMetrics::kv_transfer_time, "tandem_kv_transfer_seconds",
     "Time to move one request's KV blocks from a prefill to a decode worker, in seconds.",
     kTransferSecondsBuckets},
    {&TandemMetrics::kv_transfer_after_first_token, "tandem_kv_transfer_after_first_token_seconds",
     "Prefill worker: time from sending a request's first token to its KV landing on the decode "
     "worker (the part of the transfer not overlapped with the prefill), in seconds.",
     kTransferSecondsBuckets},
    {&TandemMetrics::iteration_tokens, "tandem_iteration_tokens",
     "Tokens run in one engine step (prefill chunks + decodes + draft tokens verified).",
     kIterationTokensBuckets},
    {&TandemMetrics::batch_size, "tandem_batch_size", "Sequences scheduled in one engine step.",
     kBatchSizeBuckets},
    {&TandemMetrics::step_time, "tandem_engine_step_seconds",
     "Wall time of one engine step (schedule, forward, sampling, token processing), in seconds.",
     kInterTokenSecondsBuckets},
    {&TandemMetrics::migration_recovery_time, "tandem_migration_recovery_seconds",
     "Router: time from seeing a worker fail mid-request to the next token from the worker it "
     "migrated to, in seconds.",
     kTtftSecondsBuckets},
};

const BoundSpec<Counter> kCounters[] = {
    {&TandemMetrics::kv_transfer_bytes,
     {"tandem_kv_transfer_bytes_total", "KV cache bytes moved between workers."}},
    {&TandemMetrics::kv_transfer_failures,
     {"tandem_kv_transfer_failures_total",
      "KV handoffs that failed (rejected header, timeout, expired lease, peer error)."}},
    {&TandemMetrics::kv_transfer_overlapped_bytes,
     {"tandem_kv_transfer_overlapped_bytes_total",
      "Prefill worker: KV bytes handed to the transfer while the prompt was still being computed "
      "(before its first token): the share of the handoff that overlaps prefill."}},
    {&TandemMetrics::prompt_tokens, {"tandem_prompt_tokens_total", "Prompt tokens processed."}},
    {&TandemMetrics::generation_tokens, {"tandem_generation_tokens_total", "Tokens generated."}},
    {&TandemMetrics::num_preemptions,
     {"tandem_num_preemptions_total",
      "Sequences preempted (blocks freed, recomputed later) because KV blocks ran out."}},
    {&TandemMetrics::prefix_cache_queries,
     {"tandem_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache."}},
    {&TandemMetrics::prefix_cache_hits,
     {"tandem_prefix_cache_hits_total",
      "Prompt tokens found in the prefix cache (their KV was reused)."}},
    {&TandemMetrics::spec_num_drafts,
     {"tandem_spec_decode_num_drafts_total",
      "Speculative decoding: steps in which a sequence verified draft tokens."}},
    {&TandemMetrics::spec_num_draft_tokens,
     {"tandem_spec_decode_num_draft_tokens_total", "Speculative decoding: draft tokens proposed."}},
    {&TandemMetrics::spec_num_accepted_tokens,
     {"tandem_spec_decode_num_accepted_tokens_total",
      "Speculative decoding: draft tokens accepted."}},
};

const BoundSpec<Gauge> kGauges[] = {
    {&TandemMetrics::kv_cache_usage_ratio,
     {"tandem_kv_cache_usage_ratio", "Fraction of KV cache blocks in use, 0 to 1."}},
    {&TandemMetrics::num_requests_running,
     {"tandem_num_requests_running", "Requests in the running batch."}},
    {&TandemMetrics::num_requests_waiting,
     {"tandem_num_requests_waiting", "Requests waiting to be scheduled."}},
    {&TandemMetrics::num_kv_leases,
     {"tandem_num_kv_leases",
      "KV handoffs received and held under a lease, not yet adopted by a decode request."}},
    {&TandemMetrics::num_leased_blocks,
     {"tandem_num_leased_blocks", "KV blocks held by unexpired leases."}},
    {&TandemMetrics::num_inflight_tokens,
     {"tandem_num_inflight_tokens",
      "Router: prompt tokens + max_tokens of the requests admitted (--max-inflight-tokens)."}},
};

std::vector<std::string> Positions() {
  std::vector<std::string> v;
  for (int position = 0; position < kSpecMaxPositions; ++position)
    v.push_back(absl::StrCat(position));
  return v;
}

std::vector<std::string> FinishReasons() {
  return std::vector<std::string>(std::begin(kFinishReasons), std::end(kFinishReasons));
}

// Registered after kCounters.
const std::vector<LabelledSpec<CounterFamily>>& LabelledCounters() {
  static const auto* specs = new std::vector<LabelledSpec<CounterFamily>>{
      {&TandemMetrics::spec_accepted_per_pos_family,
       "tandem_spec_decode_num_accepted_tokens_per_pos_total",
       "Speculative decoding: draft tokens accepted at each draft position (0 = the first draft "
       "of a step).",
       "position",
       Positions(),
       {kPhaseDecode}},
      {&TandemMetrics::request_success_family,
       "tandem_request_success_total",
       "Requests finished, by finish reason.",
       "finish_reason",
       FinishReasons(),
       {}},
      {&TandemMetrics::request_errors_family,
       "tandem_request_errors_total",
       "Requests that ended with an error, by canonical status code.",
       "code",
       {},
       {}},
      {&TandemMetrics::migrations_family,
       "tandem_request_migrations_total",
       "Router: requests re-dispatched to another worker after one failed, by what failed "
       "(decode_failed, prefill_failed, transfer_failed).",
       "reason",
       {"decode_failed", "prefill_failed", "transfer_failed"},
       {kPhaseRouter}},
      {&TandemMetrics::prefill_decisions_family,
       "tandem_router_prefill_decisions_total",
       "Router: where each disaggregated request's prompt was prefilled: remote (a prefill "
       "worker, KV handed over) or local (on its decode worker: a short prompt or one mostly in "
       "that worker's prefix cache, --remote-prefill-min-tokens).",
       "where",
       {"remote", "local"},
       {kPhaseRouter}},
  };
  return *specs;
}

// Registered after kGauges.
const std::vector<LabelledSpec<GaugeFamily>>& LabelledGauges() {
  static const auto* specs = new std::vector<LabelledSpec<GaugeFamily>>{
      {&TandemMetrics::healthy_workers_family,
       "tandem_router_healthy_workers",
       "Router: workers in rotation (registered or static, answering their health polls), by "
       "role.",
       "role",
       {"prefill", "decode"},
       {kPhaseRouter}},
  };
  return *specs;
}

template <typename F, typename AddFn>
absl::Status AddLabelled(TandemMetrics& m, const std::vector<LabelledSpec<F>>& specs, AddFn add) {
  for (const LabelledSpec<F>& spec : specs) {
    TANDEM_ASSIGN_OR_RETURN(
        m.*spec.field,
        add(spec.name, spec.help, std::vector<std::string>{"phase", "model", spec.label}));
    const bool here = spec.phases.empty() || std::find(spec.phases.begin(), spec.phases.end(),
                                                       m.phase) != spec.phases.end();
    if (!here) continue;
    for (const std::string& value : spec.values) {
      TANDEM_RETURN_IF_ERROR((m.*spec.field)->WithLabelValues({m.phase, m.model, value}).status());
    }
  }
  return absl::OkStatus();
}

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
  for (const HistogramSpec& h : kHistograms) {
    TANDEM_ASSIGN_OR_RETURN(
        m.get()->*h.field,
        Bind(r.AddHistogram(h.name, h.help, PhaseModel(), h.bounds), phase, model));
  }
  for (const BoundSpec<Counter>& c : kCounters) {
    TANDEM_ASSIGN_OR_RETURN(
        m.get()->*c.field,
        Bind(r.AddCounter(c.spec.name, c.spec.help, PhaseModel()), phase, model));
  }
  TANDEM_RETURN_IF_ERROR(
      AddLabelled(*m, LabelledCounters(), [&](auto... a) { return r.AddCounter(a...); }));
  for (const BoundSpec<Gauge>& g : kGauges) {
    TANDEM_ASSIGN_OR_RETURN(m.get()->*g.field,
                            Bind(r.AddGauge(g.spec.name, g.spec.help, PhaseModel()), phase, model));
  }
  TANDEM_RETURN_IF_ERROR(
      AddLabelled(*m, LabelledGauges(), [&](auto... a) { return r.AddGauge(a...); }));
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
