#include "plan/measured.h"

#include <cmath>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json.h"
#include "common/status.h"

namespace tandem::plan {
namespace {

absl::Status BadField(const std::string& key, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("bench.json: ", key, " ", what));
}

// A finite number in [lo, hi]; absent -> nullopt (or an error when required).
absl::StatusOr<std::optional<double>> Number(const json::Json& obj, const std::string& key,
                                             double lo, double hi, bool required) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) return BadField(key, "is missing");
    return std::nullopt;
  }
  if (!it->is_number() || !std::isfinite(it->get<double>())) {
    return BadField(key, "must be a number");
  }
  const double v = it->get<double>();
  if (v < lo || v > hi) {
    return BadField(key, absl::StrFormat("= %g is out of range [%g, %g]", v, lo, hi));
  }
  return v;
}

absl::StatusOr<std::string> String(const json::Json& obj, const std::string& key) {
  auto it = obj.find(key);
  if (it == obj.end()) return std::string();
  if (!it->is_string()) return BadField(key, "must be a string");
  const std::string& s = it->get_ref<const std::string&>();
  if (s.size() > 256) return BadField(key, "is longer than 256 bytes");
  return s;
}

}  // namespace

absl::StatusOr<BenchResult> ParseBenchResult(std::string_view text) {
  json::ParseLimits limits;
  limits.max_bytes = kMaxBenchBytes;
  absl::StatusOr<json::Json> root = json::Parse(text, limits);
  if (!root.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("bench.json: ", root.status().message()));
  }
  if (!root->is_object()) return absl::InvalidArgumentError("bench.json: not a JSON object");
  const json::Json& o = *root;
  TANDEM_ASSIGN_OR_RETURN(std::string schema, String(o, "schema"));
  if (!schema.empty() && schema != kBenchSchema) {
    return BadField("schema", absl::StrCat("'", schema, "' is not ", kBenchSchema));
  }
  BenchResult b;
  constexpr double kHuge = 1e12;
  TANDEM_ASSIGN_OR_RETURN(std::optional<double> tps,
                          Number(o, "output_tokens_per_second", 1e-9, kHuge, true));
  TANDEM_ASSIGN_OR_RETURN(std::optional<double> tpot, Number(o, "mean_tpot_ms", 1e-9, kHuge, true));
  TANDEM_ASSIGN_OR_RETURN(std::optional<double> conc, Number(o, "concurrency", 1, 1 << 20, true));
  b.output_tokens_per_second = *tps;
  b.mean_tpot_ms = *tpot;
  b.concurrency = *conc;
  TANDEM_ASSIGN_OR_RETURN(b.mean_ttft_ms, Number(o, "mean_ttft_ms", 1e-9, kHuge, false));
  TANDEM_ASSIGN_OR_RETURN(b.prompt_tokens_mean,
                          Number(o, "prompt_tokens_mean", 0, kMaxContext, false));
  TANDEM_ASSIGN_OR_RETURN(b.output_tokens_mean,
                          Number(o, "output_tokens_mean", 1, kMaxContext, false));
  TANDEM_ASSIGN_OR_RETURN(b.request_throughput, Number(o, "request_throughput", 0, kHuge, false));
  TANDEM_ASSIGN_OR_RETURN(b.model, String(o, "model"));
  TANDEM_ASSIGN_OR_RETURN(b.device, String(o, "device"));
  return b;
}

absl::StatusOr<BenchResult> ReadBenchResult(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open bench file '", path, "'"));
  std::string text(kMaxBenchBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxBenchBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("bench.json: '", path, "' is larger than ", kMaxBenchBytes, " bytes"));
  }
  return ParseBenchResult(text);
}

MeasuredComparison CompareMeasured(const PlanInputs& in, const Plan& plan,
                                   const BenchResult& bench) {
  MeasuredComparison c;
  c.bench = bench;
  const double weights = static_cast<double>(plan.weights_bytes);
  const double kv = static_cast<double>(plan.kv_bytes_per_token);
  c.decode_steps_per_second = 1000.0 / bench.mean_tpot_ms;
  c.decode_context = static_cast<double>(plan.decode_context);
  if (bench.prompt_tokens_mean && bench.output_tokens_mean) {
    c.decode_context = *bench.prompt_tokens_mean + *bench.output_tokens_mean / 2;
  }
  c.decode_bytes_per_step = weights + bench.concurrency * c.decode_context * kv;
  c.achieved_bandwidth_bytes_per_second = c.decode_steps_per_second * c.decode_bytes_per_step;
  c.bandwidth_fraction_of_limit =
      c.achieved_bandwidth_bytes_per_second / in.device.bandwidth_bytes_per_second;
  const double bound_step_s = DecodeStepSeconds(in, weights, plan.kv_bytes_per_token,
                                                bench.concurrency, c.decode_context, 1.0, 1.0);
  c.output_tokens_per_second_bound = bench.concurrency / bound_step_s;
  c.output_tokens_fraction_of_bound =
      bench.output_tokens_per_second / c.output_tokens_per_second_bound;
  if (bench.mean_ttft_ms && bench.prompt_tokens_mean && *bench.prompt_tokens_mean > 0) {
    c.prefill_tokens_per_second = *bench.prompt_tokens_mean / (*bench.mean_ttft_ms / 1000);
    const double flops_per_token = PrefillFlopsPerToken(
        in.model, static_cast<int64_t>(std::llround(*bench.prompt_tokens_mean)));
    c.compute_fraction_of_limit =
        *c.prefill_tokens_per_second * flops_per_token / in.device.flops_per_second;
  }
  c.usd_per_million_output_tokens = in.usd_per_hour / (bench.output_tokens_per_second * 3600) * 1e6;
  if (!bench.model.empty() &&
      absl::AsciiStrToLower(bench.model) != absl::AsciiStrToLower(in.model.name)) {
    c.warnings.push_back(absl::StrCat("bench.json measured model '", bench.model,
                                      "', the plan is for '", in.model.name, "'"));
  }
  if (!bench.device.empty() &&
      absl::AsciiStrToLower(bench.device) != absl::AsciiStrToLower(in.device.name)) {
    c.warnings.push_back(absl::StrCat("bench.json measured device '", bench.device,
                                      "', the plan is for '", in.device.name, "'"));
  }
  if (c.bandwidth_fraction_of_limit > 1.0) {
    c.warnings.push_back(
        "the measurement exceeds the bandwidth limit: check the device numbers, the batch "
        "(concurrency) and the context assumed read per step");
  }
  return c;
}

}  // namespace tandem::plan
