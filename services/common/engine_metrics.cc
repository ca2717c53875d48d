#include "services/common/engine_metrics.h"

#include <algorithm>
#include <vector>

namespace tandem::services {

EngineMetricsExporter::EngineMetricsExporter(engine::Engine* engine,
                                             metrics::TandemMetrics* metrics)
    : engine_(engine), metrics_(metrics) {
  engine_->TakeStepRecords();  // starts recording; nothing ran before the exporter
}

void EngineMetricsExporter::Update() {
  metrics::TandemMetrics& m = *metrics_;
  absl::MutexLock lock(&mu_);
  // Stats after the records: every step in the records is counted in them.
  const std::vector<engine::StepRecord> steps = engine_->TakeStepRecords();
  const engine::EngineStats s = engine_->Stats();
  m.num_requests_running->Set(static_cast<double>(s.num_running));
  m.num_requests_waiting->Set(static_cast<double>(s.num_waiting));
  m.kv_cache_usage_ratio->Set(
      s.num_blocks_total > 0 ? static_cast<double>(s.num_blocks_used) / s.num_blocks_total : 0.0);
  auto add = [](metrics::Counter* c, int64_t now, int64_t before) {
    if (now > before) c->Inc(static_cast<double>(now - before));
  };
  add(m.num_preemptions, s.num_preemptions, last_.num_preemptions);
  // Tokens this engine sampled (prefill: the first token of each request;
  // decode: the rest), so tandem_generation_tokens_total{phase} is per phase.
  add(m.generation_tokens, s.num_generated_tokens, last_.num_generated_tokens);
  add(m.prefix_cache_queries, s.num_prefix_cache_query_tokens, last_.num_prefix_cache_query_tokens);
  add(m.prefix_cache_hits, s.num_prefix_cache_hit_tokens, last_.num_prefix_cache_hit_tokens);
  for (const engine::StepRecord& step : steps) {
    m.iteration_tokens->Observe(static_cast<double>(step.num_tokens));
    m.batch_size->Observe(static_cast<double>(step.num_sequences));
    m.step_time->Observe(step.seconds);
  }
  add(m.spec_num_drafts, s.spec.num_drafts, last_.spec.num_drafts);
  add(m.spec_num_draft_tokens, s.spec.num_draft_tokens, last_.spec.num_draft_tokens);
  add(m.spec_num_accepted_tokens, s.spec.num_accepted_tokens, last_.spec.num_accepted_tokens);
  for (size_t i = 0; i < s.spec.accepted_per_position.size(); ++i) {
    const int64_t before =
        i < last_.spec.accepted_per_position.size() ? last_.spec.accepted_per_position[i] : 0;
    if (s.spec.accepted_per_position[i] > before) {
      m.SpecAcceptedAtPosition(static_cast<int64_t>(i))
          ->Inc(static_cast<double>(s.spec.accepted_per_position[i] - before));
    }
  }
  last_ = s;
}

void ObserveRequest(metrics::TandemMetrics& m, const engine::Usage& usage, RequestPhases phases) {
  m.request_queue_time->Observe(usage.queue_time_s);
  const std::vector<double>& t = usage.token_times_s;
  if (phases.prefill) {
    m.prompt_tokens->Inc(static_cast<double>(usage.num_prompt_tokens));
    if (!t.empty()) m.request_prefill_time->Observe(std::max(0.0, t.front() - usage.queue_time_s));
  }
  if (phases.decode && !t.empty()) {
    // Decoding starts at the first token where this engine also prefilled,
    // else (a decode worker given the KV) at its first scheduled step.
    const double start = phases.prefill ? t.front() : usage.queue_time_s;
    m.request_decode_time->Observe(std::max(0.0, t.back() - start));
    for (size_t i = 1; i < t.size(); ++i) {
      m.inter_token_latency->Observe(std::max(0.0, t[i] - t[i - 1]));
    }
  }
}

}  // namespace tandem::services
