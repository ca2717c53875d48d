#include "plan/plan_report.h"

#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json.h"

namespace tandem::plan {
namespace {

// SI bytes: "26.03 GB", "96.6 MB", "46.1 kB".
std::string GbText(double bytes) {
  const double a = bytes < 0 ? -bytes : bytes;
  if (a >= 1e9) return absl::StrFormat("%.2f GB", bytes / 1e9);
  if (a >= 1e6) return absl::StrFormat("%.1f MB", bytes / 1e6);
  return absl::StrFormat("%.1f kB", bytes / 1e3);
}

// "13.02 B", "134.5 M".
std::string Count(double v) {
  if (v >= 1e9) return absl::StrFormat("%.2f B", v / 1e9);
  return absl::StrFormat("%.1f M", v / 1e6);
}

// "2.04 TB/s", "50 GB/s".
std::string Bandwidth(double bytes_per_second) {
  if (bytes_per_second >= 1e12) return absl::StrFormat("%.3g TB/s", bytes_per_second / 1e12);
  return absl::StrFormat("%.3g GB/s", bytes_per_second / 1e9);
}

// Rates with a thousands separator and a sensible number of decimals.
std::string Rate(double v) {
  if (v >= 1000) return WithCommas(static_cast<int64_t>(v + 0.5));
  if (v >= 100) return absl::StrFormat("%.0f", v);
  if (v >= 10) return absl::StrFormat("%.1f", v);
  return absl::StrFormat("%.3g", v);
}

void Row(std::string* out, absl::string_view label, absl::string_view value,
         absl::string_view note = "") {
  absl::StrAppendFormat(out, "  %-30s %s", label, value);
  if (!note.empty()) absl::StrAppend(out, "  (", note, ")");
  out->push_back('\n');
}

// One JSON object whose keys keep the order they were added in.
class JsonObject {
 public:
  void Num(const std::string& key, double v) { j_[key] = v; }
  // Whole numbers of bytes, printed as integers.
  void Bytes(const std::string& key, double v) {
    if (std::abs(v) < 9e15) {
      j_[key] = static_cast<int64_t>(std::llround(v));
    } else {
      j_[key] = v;
    }
  }
  void Int(const std::string& key, int64_t v) { j_[key] = v; }
  void Bool(const std::string& key, bool v) { j_[key] = v; }
  void Str(const std::string& key, const std::string& v) { j_[key] = v; }
  void Strs(const std::string& key, const std::vector<std::string>& v) { j_[key] = v; }
  void Set(const std::string& key, json::OrderedJson v) { j_[key] = std::move(v); }
  const json::OrderedJson& value() const { return j_; }
  std::string Finish() const { return json::Dump(j_); }

 private:
  json::OrderedJson j_ = json::OrderedJson::object();
};

void AppendRatioTable(std::string* out, const PlanInputs& in, const WorkerRatio& r) {
  const Workload& w = in.workload;
  absl::StrAppendFormat(out,
                        "disaggregation (%d prompt + %d output tokens, %g req/s, TTFT <= %g ms, "
                        "TPOT <= %g ms)\n",
                        w.prompt_tokens, w.output_tokens, w.request_rate, w.ttft_target_ms,
                        w.tpot_target_ms);
  if (!r.feasible) {
    Row(out, "not feasible", r.infeasible_reason);
    return;
  }
  Row(out, "prefill per prompt", absl::StrFormat("%.1f ms", 1000 * r.prefill_seconds_per_request));
  Row(out, "prefill workers", absl::StrCat(r.prefill_workers),
      absl::StrFormat("%.1f req/s each at the target; mean TTFT %.0f ms",
                      r.prefill_requests_per_second_per_worker, r.expected_ttft_ms));
  Row(out, "decode batch per worker", absl::StrCat(r.decode_batch),
      absl::StrFormat("TPOT %.1f ms; %s tokens/s each", r.decode_step_ms,
                      Rate(r.decode_tokens_per_second_per_worker)));
  Row(out, "decode workers", absl::StrCat(r.decode_workers));
  Row(out, "prefill:decode", absl::StrFormat("%d:%d", r.prefill_workers, r.decode_workers),
      absl::StrFormat("%.2f", r.prefill_to_decode_ratio));
}

void AppendMeasuredTable(std::string* out, const PlanInputs& in, const Plan& p,
                         const MeasuredComparison& m) {
  absl::StrAppendFormat(out, "measured (concurrency %g, %g cached tokens read per sequence)\n",
                        m.bench.concurrency, m.decode_context);
  Row(out, "output tokens/s", Rate(m.bench.output_tokens_per_second),
      absl::StrFormat("bound %s: %.0f%% of it", Rate(m.output_tokens_per_second_bound),
                      100 * m.output_tokens_fraction_of_bound));
  Row(out, "decode steps/s", Rate(m.decode_steps_per_second),
      absl::StrFormat("TPOT %.2f ms", m.bench.mean_tpot_ms));
  Row(out, "achieved bandwidth",
      absl::StrFormat("%.3g GB/s", m.achieved_bandwidth_bytes_per_second / 1e9),
      absl::StrFormat("%.0f%% of the memory-bandwidth limit", 100 * m.bandwidth_fraction_of_limit));
  if (m.prefill_tokens_per_second) {
    Row(out, "prefill tokens/s", Rate(*m.prefill_tokens_per_second),
        absl::StrFormat(">= %.1f%% of peak FLOP/s (TTFT includes queueing)",
                        100 * *m.compute_fraction_of_limit));
  }
  Row(out, "$ per 1M output tokens", absl::StrFormat("%.4g", m.usd_per_million_output_tokens),
      absl::StrFormat("estimate %.4g", p.usd_per_million_output_tokens));
  for (const std::string& w : m.warnings) absl::StrAppend(out, "  warning: ", w, "\n");
}

}  // namespace

std::string WithCommas(int64_t v) {
  std::string digits = absl::StrCat(std::llabs(v));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return v < 0 ? "-" + out : out;
}

std::string FormatPlanTable(const PlanInputs& in, const Plan& p,
                            const MeasuredComparison* measured) {
  const ModelShape& m = in.model;
  const DeviceSpec& d = in.device;
  std::string out =
      absl::StrFormat("plan: %s on %s (%s, %s, %.4g TFLOP/s), context %d, $%.2f/hour\n", m.name,
                      d.name, GbText(d.memory_bytes), Bandwidth(d.bandwidth_bytes_per_second),
                      d.flops_per_second / 1e12, in.context_length, in.usd_per_hour);
  out += "memory\n";
  Row(&out, "parameters", Count(static_cast<double>(p.num_parameters)));
  Row(&out, "weights", GbText(static_cast<double>(p.weights_bytes)),
      absl::StrFormat("%.3g bits/weight", p.weight_bits));
  Row(&out, "KV per token", WithCommas(p.kv_bytes_per_token) + " B",
      absl::StrFormat("2 x %d layers x %d KV heads x (%d head dim x %g B%s)%s", m.num_layers,
                      m.num_kv_heads, m.head_dim, in.kv_bytes_per_element,
                      in.kv_scale_bytes_per_head > 0
                          ? absl::StrFormat(" + %g B scale", in.kv_scale_bytes_per_head)
                          : "",
                      in.kv_dtype.empty() ? "" : ", KV " + in.kv_dtype));
  Row(&out, "KV per sequence", GbText(static_cast<double>(p.kv_bytes_per_sequence)),
      absl::StrFormat("%d tokens", in.context_length));
  Row(&out, "free for KV", GbText(p.kv_budget_bytes),
      absl::StrFormat("%s - weights - %s reserve", GbText(d.memory_bytes),
                      GbText(in.reserve_bytes)));
  Row(&out, "max concurrent sequences", absl::StrCat(p.max_concurrent_sequences));
  for (const Plan::KvDtypeCapacity& k : p.kv_dtype_capacity) {
    Row(&out, absl::StrCat("  with --kv-cache-dtype ", k.dtype),
        absl::StrCat(p.kv_budget_bytes > 0 ? k.max_concurrent_sequences : 0, " sequences"),
        WithCommas(k.kv_bytes_per_token) + " B/token");
  }
  Row(&out, absl::StrCat("KV for batch ", p.batch), GbText(p.kv_bytes_for_batch),
      p.batch_fits ? "fits" : "DOES NOT FIT");
  out +=
      p.decode_compute_bound ? "decode (compute-bound at this batch)\n" : "decode (memory-bound)\n";
  Row(&out, "bytes read per step", GbText(p.decode_bytes_per_step),
      p.decode_context == 0
          ? "weights"
          : absl::StrFormat("weights + KV of %d tokens x %d", p.decode_context, p.batch));
  Row(&out, "steps/s bound", Rate(p.decode_steps_per_second_bound), "peak bandwidth / bytes");
  Row(&out, "steps/s bound, full context", Rate(p.decode_steps_per_second_bound_full_context),
      absl::StrFormat("+%s KV read, every sequence at %d tokens",
                      GbText(p.kv_read_bytes_per_step_full_context), in.context_length));
  Row(&out, "steps/s", Rate(p.decode_steps_per_second),
      absl::StrFormat("x efficiency (%g bandwidth, %g compute); TPOT %.1f ms",
                      in.bandwidth_efficiency, in.compute_efficiency, p.tpot_ms));
  Row(&out, "output tokens/s", Rate(p.decode_tokens_per_second),
      absl::StrFormat("batch %d; bound %s", p.batch, Rate(p.decode_tokens_per_second_bound)));
  absl::StrAppendFormat(&out, "prefill (FLOP-bound, %d-token prompts)\n",
                        in.workload.prompt_tokens);
  Row(&out, "FLOPs per token", absl::StrFormat("%.3g", p.prefill_flops_per_token),
      "2 x params + attention");
  Row(&out, "tokens/s", Rate(p.prefill_tokens_per_second),
      absl::StrFormat("x %g efficiency; bound %s", in.compute_efficiency,
                      Rate(p.prefill_tokens_per_second_bound)));
  out += "cost\n";
  Row(&out, "$ per 1M output tokens", absl::StrFormat("%.3g", p.usd_per_million_output_tokens));
  Row(&out, "$ per 1M prompt tokens", absl::StrFormat("%.3g", p.usd_per_million_prompt_tokens));
  AppendRatioTable(&out, in, p.worker_ratio);
  if (measured != nullptr) AppendMeasuredTable(&out, in, p, *measured);
  out += "assumptions\n";
  for (const std::string& a : p.assumptions) absl::StrAppend(&out, "  - ", a, "\n");
  return out;
}

namespace {

void JsonInputs(JsonObject& o, const PlanInputs& in, const Plan& p) {
  o.Str("model", in.model.name);
  o.Str("device", in.device.name);
  o.Bytes("device_memory_bytes", in.device.memory_bytes);
  o.Num("device_bandwidth_bytes_per_second", in.device.bandwidth_bytes_per_second);
  o.Num("device_flops_per_second", in.device.flops_per_second);
  o.Int("num_layers", in.model.num_layers);
  o.Int("num_heads", in.model.num_heads);
  o.Int("num_kv_heads", in.model.num_kv_heads);
  o.Int("head_dim", in.model.head_dim);
  o.Int("num_parameters", p.num_parameters);
  o.Num("weight_bits", p.weight_bits);
  o.Num("kv_bytes_per_element", in.kv_bytes_per_element);
  o.Num("kv_scale_bytes_per_head", in.kv_scale_bytes_per_head);
  if (!in.kv_dtype.empty()) o.Str("kv_dtype", in.kv_dtype);
  o.Int("context_length", in.context_length);
  o.Num("usd_per_hour", in.usd_per_hour);
  o.Bytes("reserve_bytes", in.reserve_bytes);
  o.Num("bandwidth_efficiency", in.bandwidth_efficiency);
  o.Num("compute_efficiency", in.compute_efficiency);
}

void JsonMemory(JsonObject& o, const Plan& p) {
  o.Int("kv_bytes_per_token", p.kv_bytes_per_token);
  o.Int("kv_bytes_per_sequence", p.kv_bytes_per_sequence);
  o.Int("weights_bytes", p.weights_bytes);
  o.Bytes("kv_budget_bytes", p.kv_budget_bytes);
  o.Int("max_concurrent_sequences", p.max_concurrent_sequences);
  {
    json::OrderedJson arr = json::OrderedJson::array();
    for (const Plan::KvDtypeCapacity& k : p.kv_dtype_capacity) {
      JsonObject e;
      e.Str("dtype", k.dtype);
      e.Int("kv_bytes_per_token", k.kv_bytes_per_token);
      e.Int("max_concurrent_sequences", k.max_concurrent_sequences);
      arr.push_back(e.value());
    }
    o.Set("kv_dtypes", std::move(arr));
  }
  o.Int("batch", p.batch);
  o.Bool("batch_fits", p.batch_fits);
  o.Bytes("kv_bytes_for_batch", p.kv_bytes_for_batch);
}

void JsonDecodeAndPrefill(JsonObject& o, const Plan& p) {
  o.Int("decode_context", p.decode_context);
  o.Bytes("decode_bytes_per_step", p.decode_bytes_per_step);
  o.Bool("decode_compute_bound", p.decode_compute_bound);
  o.Num("decode_steps_per_second_bound", p.decode_steps_per_second_bound);
  o.Num("decode_steps_per_second_bound_full_context", p.decode_steps_per_second_bound_full_context);
  o.Num("decode_steps_per_second", p.decode_steps_per_second);
  o.Num("decode_tokens_per_second_bound", p.decode_tokens_per_second_bound);
  o.Num("decode_tokens_per_second", p.decode_tokens_per_second);
  o.Num("tpot_ms", p.tpot_ms);
  o.Num("prefill_flops_per_token", p.prefill_flops_per_token);
  o.Num("prefill_tokens_per_second_bound", p.prefill_tokens_per_second_bound);
  o.Num("prefill_tokens_per_second", p.prefill_tokens_per_second);
  o.Num("usd_per_million_output_tokens", p.usd_per_million_output_tokens);
  o.Num("usd_per_million_prompt_tokens", p.usd_per_million_prompt_tokens);
}

void JsonWorkerRatio(JsonObject& o, const PlanInputs& in, const WorkerRatio& r) {
  o.Int("workload_prompt_tokens", in.workload.prompt_tokens);
  o.Int("workload_output_tokens", in.workload.output_tokens);
  o.Num("workload_request_rate", in.workload.request_rate);
  o.Num("ttft_target_ms", in.workload.ttft_target_ms);
  o.Num("tpot_target_ms", in.workload.tpot_target_ms);
  o.Bool("disaggregation_feasible", r.feasible);
  if (!r.feasible) o.Str("disaggregation_infeasible_reason", r.infeasible_reason);
  o.Num("prefill_ms_per_request", 1000 * r.prefill_seconds_per_request);
  o.Num("prefill_requests_per_second_per_worker", r.prefill_requests_per_second_per_worker);
  o.Num("expected_ttft_ms", r.expected_ttft_ms);
  o.Int("prefill_workers", r.prefill_workers);
  o.Int("decode_batch_per_worker", r.decode_batch);
  o.Num("decode_step_ms", r.decode_step_ms);
  o.Num("decode_tokens_per_second_per_worker", r.decode_tokens_per_second_per_worker);
  o.Int("decode_workers", r.decode_workers);
  o.Num("prefill_to_decode_ratio", r.prefill_to_decode_ratio);
}

void JsonMeasured(JsonObject& o, const MeasuredComparison& m) {
  o.Num("measured_output_tokens_per_second", m.bench.output_tokens_per_second);
  o.Num("measured_concurrency", m.bench.concurrency);
  o.Num("measured_decode_steps_per_second", m.decode_steps_per_second);
  o.Num("measured_decode_context", m.decode_context);
  o.Bytes("measured_decode_bytes_per_step", m.decode_bytes_per_step);
  o.Num("achieved_bandwidth_bytes_per_second", m.achieved_bandwidth_bytes_per_second);
  o.Num("bandwidth_fraction_of_limit", m.bandwidth_fraction_of_limit);
  o.Num("measured_output_tokens_per_second_bound", m.output_tokens_per_second_bound);
  o.Num("output_tokens_fraction_of_bound", m.output_tokens_fraction_of_bound);
  if (m.prefill_tokens_per_second) {
    o.Num("measured_prefill_tokens_per_second", *m.prefill_tokens_per_second);
    o.Num("compute_fraction_of_limit", *m.compute_fraction_of_limit);
  }
  o.Num("measured_usd_per_million_output_tokens", m.usd_per_million_output_tokens);
  o.Strs("measured_warnings", m.warnings);
}

}  // namespace

std::string FormatPlanJson(const PlanInputs& in, const Plan& p,
                           const MeasuredComparison* measured) {
  JsonObject o;
  JsonInputs(o, in, p);
  JsonMemory(o, p);
  JsonDecodeAndPrefill(o, p);
  JsonWorkerRatio(o, in, p.worker_ratio);
  if (measured != nullptr) JsonMeasured(o, *measured);
  o.Strs("assumptions", p.assumptions);
  return o.Finish();
}

}  // namespace tandem::plan
