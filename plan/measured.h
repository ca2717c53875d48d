// `tandem plan --measured bench.json`: compares a measured run (as `tandem
// bench` writes it) with the plan's bounds.
//
// bench.json, schema "tandem.bench.v1" (one JSON object; unknown keys are
// ignored so bench can add fields):
//   output_tokens_per_second  number > 0   required  all output tokens / wall time
//   mean_tpot_ms              number > 0   required  mean time per output token
//   concurrency               number >= 1  required  mean running sequences
//   mean_ttft_ms              number > 0   optional  mean time to first token
//   prompt_tokens_mean        number >= 0  optional  mean prompt length
//   output_tokens_mean        number >= 1  optional  mean output length
//   request_throughput        number >= 0  optional  requests per second
//   model, device             string       optional  what was measured
//   schema                    string       optional  "tandem.bench.v1" if present
// The file is untrusted: at most kMaxBenchBytes, parsed by the bounded
// json::Parse, every known field type- and range-checked (InvalidArgument
// naming the field).
#ifndef TANDEM_PLAN_MEASURED_H_
#define TANDEM_PLAN_MEASURED_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "plan/capacity_plan.h"

namespace tandem::plan {

inline constexpr size_t kMaxBenchBytes = 1 << 20;
inline constexpr char kBenchSchema[] = "tandem.bench.v1";

struct BenchResult {
  double output_tokens_per_second = 0;
  double mean_tpot_ms = 0;
  double concurrency = 0;
  std::optional<double> mean_ttft_ms;
  std::optional<double> prompt_tokens_mean;
  std::optional<double> output_tokens_mean;
  std::optional<double> request_throughput;
  std::string model;
  std::string device;
};

absl::StatusOr<BenchResult> ParseBenchResult(std::string_view text);
// Reads and parses `path` (NotFound if it cannot be opened).
absl::StatusOr<BenchResult> ReadBenchResult(const std::string& path);

// The measurement against the plan's bounds.
struct MeasuredComparison {
  BenchResult bench;
  double decode_steps_per_second = 0;  // 1000 / mean_tpot_ms
  double decode_context = 0;           // cached tokens per sequence assumed read each step
  double decode_bytes_per_step = 0;    // weights + concurrency x context x KV bytes/token
  double achieved_bandwidth_bytes_per_second = 0;
  double bandwidth_fraction_of_limit = 0;     // achieved / peak bandwidth
  double output_tokens_per_second_bound = 0;  // at the measured concurrency and context
  double output_tokens_fraction_of_bound = 0;
  std::optional<double> prefill_tokens_per_second;  // prompt_tokens_mean / mean_ttft
  std::optional<double> compute_fraction_of_limit;  // a lower bound (TTFT includes queueing)
  double usd_per_million_output_tokens = 0;
  std::vector<std::string> warnings;  // e.g. a different model or device
};

// decode_context: prompt_tokens_mean + output_tokens_mean / 2 when the bench
// gives them, else the plan's decode_context.
MeasuredComparison CompareMeasured(const PlanInputs& in, const Plan& plan,
                                   const BenchResult& bench);

}  // namespace tandem::plan

#endif  // TANDEM_PLAN_MEASURED_H_
