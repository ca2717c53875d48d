#include "plan/capacity_plan.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::plan {
namespace {

absl::Status OutOfRange(const char* what, double v, double lo, double hi) {
  return absl::InvalidArgumentError(
      absl::StrFormat("%s = %g is out of range [%g, %g]", what, v, lo, hi));
}

absl::Status CheckIn(const char* what, double v, double lo, double hi) {
  if (!(std::isfinite(v) && v >= lo && v <= hi)) return OutOfRange(what, v, lo, hi);
  return absl::OkStatus();
}

double Gb(double bytes) { return bytes / 1e9; }

}  // namespace

absl::Status PlanInputs::Validate() const {
  if (absl::Status s = model.Validate(); !s.ok()) return s;
  if (absl::Status s = device.Validate(); !s.ok()) return s;
  struct Check {
    const char* what;
    double v, lo, hi;
  };
  const Check checks[] = {
      {"weight bits", weight_bits, 1, 32},
      {"kv bytes per element", kv_bytes_per_element, 0.125, 8},
      {"kv scale bytes per head", kv_scale_bytes_per_head, 0, 8},
      {"context length", static_cast<double>(context_length), 1, kMaxContext},
      {"batch", static_cast<double>(batch), 0, 1 << 20},
      {"decode context", static_cast<double>(decode_context), 0, kMaxContext},
      {"usd per hour", usd_per_hour, 0, 1e6},
      {"reserve bytes", reserve_bytes, 0, 1e15},
      {"bandwidth efficiency", bandwidth_efficiency, 0.01, 1},
      {"compute efficiency", compute_efficiency, 0.01, 1},
      {"prompt tokens", static_cast<double>(workload.prompt_tokens), 1, kMaxContext},
      {"output tokens", static_cast<double>(workload.output_tokens), 1, kMaxContext},
      {"request rate", workload.request_rate, 0, 1e9},
      {"ttft target ms", workload.ttft_target_ms, 1e-3, 1e9},
      {"tpot target ms", workload.tpot_target_ms, 1e-3, 1e9},
  };
  for (const Check& c : checks) {
    if (absl::Status s = CheckIn(c.what, c.v, c.lo, c.hi); !s.ok()) return s;
  }
  if (use_file_weight_bytes && model.file_weight_bytes <= 0) {
    return absl::InvalidArgumentError("the model has no stored weight size (not a GGUF file)");
  }
  return absl::OkStatus();
}

double PrefillFlopsPerToken(const ModelShape& model, int64_t prompt_tokens) {
  return 2.0 * static_cast<double>(model.NumParameters()) +
         2.0 * static_cast<double>(model.num_layers) * static_cast<double>(model.q_dim()) *
             static_cast<double>(prompt_tokens + 1);
}

double DecodeStepSeconds(const PlanInputs& in, double weights_bytes, int64_t kv_bytes_per_token,
                         double batch, double context, double efficiency_bw,
                         double efficiency_flops) {
  const double b = batch;
  const double bytes = weights_bytes + b * context * static_cast<double>(kv_bytes_per_token);
  const double memory_s = bytes / (efficiency_bw * in.device.bandwidth_bytes_per_second);
  // Per sequence: one multiply-add per weight, and QK^T + AV over its context.
  const double flops = b * (2.0 * static_cast<double>(in.model.NumParameters()) +
                            4.0 * static_cast<double>(in.model.num_layers) *
                                static_cast<double>(in.model.q_dim()) * context);
  const double compute_s = flops / (efficiency_flops * in.device.flops_per_second);
  return std::max(memory_s, compute_s);
}

const std::vector<KvDtypeSpec>& KvDtypeSpecs() {
  static const std::vector<KvDtypeSpec> specs = {
      {"f32", 4, 0}, {"f16", 2, 0}, {"bf16", 2, 0}, {"int8", 1, 1}, {"fp8", 1, 1}};
  return specs;
}

const KvDtypeSpec* FindKvDtypeSpec(const std::string& name) {
  for (const KvDtypeSpec& s : KvDtypeSpecs()) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

namespace {

int64_t KvBytesPerToken(const ModelShape& m, double bytes_per_element, double scale_bytes) {
  return static_cast<int64_t>(std::llround(2.0 * static_cast<double>(m.num_layers) *
                                           (static_cast<double>(m.kv_dim()) * bytes_per_element +
                                            static_cast<double>(m.num_kv_heads) * scale_bytes)));
}

int64_t MaxSequences(double budget_bytes, int64_t kv_bytes_per_sequence) {
  return budget_bytes > 0 ? static_cast<int64_t>(std::floor(
                                budget_bytes / static_cast<double>(kv_bytes_per_sequence)))
                          : 0;
}

}  // namespace

namespace {

// Memory: weights, the KV budget, sequences that fit (per KV dtype too).
void PlanMemory(const PlanInputs& in, Plan& p) {
  const ModelShape& m = in.model;
  p.num_parameters = m.NumParameters();
  // The seed's formula, exactly (+ int8/fp8 scales).
  p.kv_bytes_per_token = KvBytesPerToken(m, in.kv_bytes_per_element, in.kv_scale_bytes_per_head);
  p.kv_bytes_per_sequence = p.kv_bytes_per_token * in.context_length;
  if (in.use_file_weight_bytes) {
    p.weights_bytes = m.file_weight_bytes;
  } else {
    p.weights_bytes = static_cast<int64_t>(
        std::llround(static_cast<double>(p.num_parameters) * in.weight_bits / 8));
  }
  p.weight_bits =
      8.0 * static_cast<double>(p.weights_bytes) / static_cast<double>(p.num_parameters);
  p.kv_budget_bytes =
      in.device.memory_bytes - static_cast<double>(p.weights_bytes) - in.reserve_bytes;
  p.max_concurrent_sequences = MaxSequences(p.kv_budget_bytes, p.kv_bytes_per_sequence);
  for (const KvDtypeSpec& s : KvDtypeSpecs()) {
    const int64_t bpt = KvBytesPerToken(m, s.bytes_per_element, s.scale_bytes_per_head);
    p.kv_dtype_capacity.push_back(
        {s.name, bpt, MaxSequences(p.kv_budget_bytes, bpt * in.context_length)});
  }
  p.batch = in.batch > 0 ? in.batch : std::max<int64_t>(p.max_concurrent_sequences, 1);
  p.batch_fits = p.batch <= p.max_concurrent_sequences;
  p.kv_bytes_for_batch =
      static_cast<double>(p.batch) * static_cast<double>(p.kv_bytes_per_sequence);
}

// Decode: bytes per step, the roofline bound and the expected rate.
void PlanDecode(const PlanInputs& in, Plan& p) {
  const double weights = static_cast<double>(p.weights_bytes);
  p.decode_context = std::min(in.decode_context, in.context_length);
  p.decode_bytes_per_step = weights + static_cast<double>(p.batch) *
                                          static_cast<double>(p.decode_context) *
                                          static_cast<double>(p.kv_bytes_per_token);
  const double bound_s =
      DecodeStepSeconds(in, weights, p.kv_bytes_per_token, p.batch, p.decode_context, 1.0, 1.0);
  p.decode_compute_bound =
      bound_s > p.decode_bytes_per_step / in.device.bandwidth_bytes_per_second * (1 + 1e-12);
  p.decode_steps_per_second_bound = 1.0 / bound_s;
  p.decode_steps_per_second =
      1.0 / DecodeStepSeconds(in, weights, p.kv_bytes_per_token, p.batch, p.decode_context,
                              in.bandwidth_efficiency, in.compute_efficiency);
  p.decode_tokens_per_second_bound = p.decode_steps_per_second_bound * static_cast<double>(p.batch);
  p.decode_tokens_per_second = p.decode_steps_per_second * static_cast<double>(p.batch);
  p.tpot_ms = 1000.0 / p.decode_steps_per_second;
  p.kv_read_bytes_per_step_full_context = p.kv_bytes_for_batch;
  p.decode_steps_per_second_bound_full_context =
      1.0 /
      DecodeStepSeconds(in, weights, p.kv_bytes_per_token, p.batch, in.context_length, 1.0, 1.0);
}

// The assumptions behind the numbers, printed with them.
std::vector<std::string> Assumptions(const PlanInputs& in, const Plan& p) {
  std::vector<std::string> a;
  a.push_back(absl::StrFormat(
      "weights %.3g bits/weight (%s); memory in SI units (1 GB = 1e9 B)", p.weight_bits,
      in.use_file_weight_bytes ? "as stored in the file" : "parameters x bits / 8"));
  a.push_back(
      absl::StrFormat("reserve %.1f GB for activations and buffers; each sequence "
                      "reserves KV for %d tokens",
                      Gb(in.reserve_bytes), in.context_length));
  if (p.decode_context == 0) {
    a.push_back(
        "decode reads the weights once per step; the KV read is left out (the seed's rule; "
        "--decode-context N adds it)");
  } else {
    a.push_back(
        absl::StrFormat("decode reads the weights plus %d cached tokens per sequence "
                        "each step",
                        p.decode_context));
  }
  a.push_back(
      absl::StrFormat("decode reaches %.0f%% of peak bandwidth, prefill %.0f%% of peak FLOP/s "
                      "(--bandwidth-efficiency, --compute-efficiency)",
                      100 * in.bandwidth_efficiency, 100 * in.compute_efficiency));
  if (in.context_length > in.model.context_length) {
    a.push_back(absl::StrFormat("context %d exceeds the model's trained context %d",
                                in.context_length, in.model.context_length));
  }
  if (!p.batch_fits) {
    a.push_back(absl::StrFormat("batch %d does not fit: only %d sequences of %d tokens fit",
                                p.batch, p.max_concurrent_sequences, in.context_length));
  }
  return a;
}

}  // namespace

absl::StatusOr<Plan> ComputePlan(const PlanInputs& in) {
  if (absl::Status s = in.Validate(); !s.ok()) return s;
  Plan p;
  PlanMemory(in, p);
  PlanDecode(in, p);
  // Prefill.
  p.prefill_flops_per_token = PrefillFlopsPerToken(in.model, in.workload.prompt_tokens);
  p.prefill_tokens_per_second_bound = in.device.flops_per_second / p.prefill_flops_per_token;
  p.prefill_tokens_per_second = in.compute_efficiency * p.prefill_tokens_per_second_bound;
  // Cost.
  p.usd_per_million_output_tokens = in.usd_per_hour / (p.decode_tokens_per_second * 3600) * 1e6;
  p.usd_per_million_prompt_tokens = in.usd_per_hour / (p.prefill_tokens_per_second * 3600) * 1e6;
  p.worker_ratio = ComputeWorkerRatio(in, p);
  p.assumptions = Assumptions(in, p);
  return p;
}

}  // namespace tandem::plan
