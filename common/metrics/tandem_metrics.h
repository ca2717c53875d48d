// Every Tandem metric in one place: names, help, types, labels and buckets
// (docs/metrics.md is the reference), so that the router, workers and the
// colocated server export the same series.
//
// Every family carries the labels `phase` (router | prefill | decode |
// colocated) and `model`; TandemMetrics binds them once, so a service only
// touches typed children:
//
//   MetricsRegistry registry;
//   TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<TandemMetrics> m,
//                           TandemMetrics::Create(&registry, "decode", model_name));
//   m->generation_tokens->Inc(n);
//   m->inter_token_latency->Observe(seconds);
//   m->RequestSuccess("eos")->Inc();
//   m->kv_cache_usage_ratio->SetCallback([&] { return engine.KvUsage(); });
//
// Several TandemMetrics (one per phase) may share a registry: families are
// registered once and each instance binds its own phase.
//
// Thread safety: TandemMetrics is immutable after Create(); the children are
// thread-safe. It must not outlive the registry.
#ifndef TANDEM_COMMON_METRICS_TANDEM_METRICS_H_
#define TANDEM_COMMON_METRICS_TANDEM_METRICS_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/metrics/metrics.h"

namespace tandem::metrics {

// Bucket presets (upper bounds; +Inf is implicit). They span a CPU laptop
// (slow, seconds per request) and GPU serving (milliseconds).
// TTFT, queue and prefill time: vLLM's TTFT buckets, 1 ms .. 2560 s.
inline constexpr double kTtftSecondsBuckets[] = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
    1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
// Inter-token latency (TPOT): 1 ms (small model on a GPU) .. 80 s.
inline constexpr double kInterTokenSecondsBuckets[] = {
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2, 0.3,
    0.4,   0.5,    0.75,  1.0,    2.5,  5.0,   7.5,  10.0,  20.0, 40.0, 80.0};
// End-to-end and decode time: 10 ms .. 7680 s.
inline constexpr double kE2eSecondsBuckets[] = {
    0.01, 0.025, 0.05, 0.1,  0.3,  0.5,  0.8,   1.0,   1.5,   2.0,   2.5,    5.0,   10.0,
    15.0, 20.0,  30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
// KV transfer of one request: 100 us (NVLink) .. 60 s (host transport, long prompt).
inline constexpr double kTransferSecondsBuckets[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                     0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                                     1.0,    2.5,     5.0,    10.0,  30.0,   60.0};
// Tokens scheduled per engine step: powers of 2, 1 .. 16384.
inline constexpr double kIterationTokensBuckets[] = {1,   2,   4,    8,    16,   32,   64,   128,
                                                     256, 512, 1024, 2048, 4096, 8192, 16384};
// Sequences per engine step: powers of 2, 1 .. 1024.
inline constexpr double kBatchSizeBuckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};

// Valid `phase` label values.
inline constexpr std::string_view kPhaseRouter = "router";
inline constexpr std::string_view kPhasePrefill = "prefill";
inline constexpr std::string_view kPhaseDecode = "decode";
// Draft positions of tandem_spec_decode_num_accepted_tokens_per_pos_total
// (engine::kMaxSpeculativeTokens).
inline constexpr int kSpecMaxPositions = 16;
inline constexpr std::string_view kPhaseColocated = "colocated";

// `finish_reason` values (tandem.v1.FinishReason, lower case); created up
// front so that dashboards see zeros rather than missing series.
inline constexpr std::string_view kFinishReasons[] = {"eos", "stop", "length", "cancelled",
                                                      "deadline"};

struct TandemMetrics {
  // Registers (or finds) every Tandem family in `registry` and binds the
  // children for (phase, model). Errors: InvalidArgument for an unknown phase
  // or a model name that is not valid UTF-8; AlreadyExists if the registry
  // holds a conflicting family of the same name.
  static absl::StatusOr<std::unique_ptr<TandemMetrics>> Create(MetricsRegistry* registry,
                                                               std::string_view phase,
                                                               std::string_view model);

  // Child of tandem_request_success_total for this phase/model. Unknown
  // reasons get their own series (bounded by the registry's child limit; past
  // it, increments go to a sink that is not exported). Never null.
  Counter* RequestSuccess(std::string_view finish_reason);
  // Child of tandem_request_errors_total{code} with the canonical code name
  // ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", ...). Never null.
  Counter* RequestErrors(absl::StatusCode code);
  // Child of tandem_request_migrations_total{reason} (router): a request
  // re-dispatched after a worker failed: "decode_failed" (stream broke or
  // health checks missed; replayed elsewhere), "prefill_failed",
  // "transfer_failed" (the push to the decode worker failed). Never null.
  Counter* Migrations(std::string_view reason);
  // Router: tandem_router_prefill_decisions_total{where="remote"|"local"}.
  Counter* PrefillDecisions(std::string_view where);
  // Router: tandem_router_healthy_workers{role="prefill"|"decode"}; never null.
  Gauge* HealthyWorkers(std::string_view role);
  Counter* SpecAcceptedAtPosition(int64_t position);

  std::string phase;
  std::string model;

  // Histograms, seconds unless noted.
  Histogram* time_to_first_token = nullptr;  // router (user-visible) and colocated
  Histogram* inter_token_latency = nullptr;  // gap between streamed tokens (TPOT)
  Histogram* e2e_request_latency = nullptr;
  Histogram* request_queue_time = nullptr;             // waiting before the first scheduled step
  Histogram* request_prefill_time = nullptr;           // first scheduled step -> first token
  Histogram* request_decode_time = nullptr;            // first token -> finished
  Histogram* kv_transfer_time = nullptr;               // tandem_kv_transfer_seconds, per request
  Histogram* kv_transfer_after_first_token = nullptr;  // prefill: first token sent -> KV landed
  Histogram* iteration_tokens = nullptr;               // tokens per engine step
  Histogram* batch_size = nullptr;                     // sequences per engine step
  Histogram* step_time = nullptr;                      // tandem_engine_step_seconds
  Histogram* migration_recovery_time = nullptr;        // router: failure seen -> next token

  // Counters.
  Counter* kv_transfer_bytes = nullptr;
  Counter* kv_transfer_failures = nullptr;
  Counter* kv_transfer_overlapped_bytes = nullptr;  // prefill: pushed before the first token
  Counter* prompt_tokens = nullptr;
  Counter* generation_tokens = nullptr;
  Counter* num_preemptions = nullptr;
  Counter* prefix_cache_queries = nullptr;  // in tokens, as vLLM
  Counter* prefix_cache_hits = nullptr;     // in tokens
  Counter* spec_num_drafts = nullptr;       // speculative decoding
  Counter* spec_num_draft_tokens = nullptr;
  Counter* spec_num_accepted_tokens = nullptr;
  CounterFamily* spec_accepted_per_pos_family = nullptr;  // {phase, model, position}
  CounterFamily* request_success_family = nullptr;        // {phase, model, finish_reason}
  CounterFamily* request_errors_family = nullptr;         // {phase, model, code}
  CounterFamily* migrations_family = nullptr;             // {phase, model, reason}
  CounterFamily* prefill_decisions_family = nullptr;      // {phase, model, where}

  // Gauges (Set/Inc/Dec, or SetCallback to compute them at scrape time).
  Gauge* kv_cache_usage_ratio = nullptr;  // 0..1
  Gauge* num_requests_running = nullptr;
  Gauge* num_requests_waiting = nullptr;
  Gauge* num_kv_leases = nullptr;                 // decode: KV handoffs held, not yet adopted
  Gauge* num_leased_blocks = nullptr;             // decode: blocks held by those leases
  Gauge* num_inflight_tokens = nullptr;           // router: prompt + max_tokens of admitted calls
  GaugeFamily* healthy_workers_family = nullptr;  // router: {phase, model, role}

 private:
  Counter* LabelledCounter(CounterFamily* family, std::string_view value);
  // Absorb updates when a label lookup fails; registered nowhere.
  prometheus::Counter unexported_counter_;
  prometheus::Gauge unexported_gauge_;
  Counter sink_{&unexported_counter_};
  Gauge gauge_sink_{&unexported_gauge_, nullptr};
};

}  // namespace tandem::metrics

#endif  // TANDEM_COMMON_METRICS_TANDEM_METRICS_H_
