// `tandem bench` output: the table on stdout, the JSON file (schema
// tandem.bench.v1 at top level for the last run, plus every run with its
// per-request records under "runs"; docs/plan.md) and the PNG plot.
#ifndef TANDEM_BENCH_SERVE_REPORT_H_
#define TANDEM_BENCH_SERVE_REPORT_H_

#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/serve/stats.h"

namespace tandem::bench {

struct ReportContext {
  std::string backend;  // "grpc" | "openai-http"
  std::string target;
  std::string model;
  std::string device;
  std::string workload;  // "synthetic" | "dataset" | "shared-prefix"
  Slo slo;
  uint64_t seed = 0;
};

void PrintRun(const RunSummary& run, const ReportContext& ctx, std::FILE* out);
// One line per rate, when more than one run.
void PrintSweep(const std::vector<RunSummary>& runs, std::FILE* out);

std::string ToJson(const std::vector<RunSummary>& runs, const ReportContext& ctx);

// Runs `python tools/plot_bench.py JSON PNG` (python: $TANDEM_PYTHON, else the
// repository's .venv, else python3).
absl::Status Plot(const std::string& json_path, const std::string& png_path);

}  // namespace tandem::bench

#endif  // TANDEM_BENCH_SERVE_REPORT_H_
