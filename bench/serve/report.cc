#include "bench/serve/report.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/json.h"

namespace tandem::bench {
namespace {

std::string RateText(double rate) {
  return rate > 0 ? absl::StrFormat("%.3g req/s", rate) : std::string("inf");
}

void PrintDist(std::FILE* out, const char* name, const Distribution& d) {
  std::fprintf(out, "  %-12s %10.2f %10.2f %10.2f %10.2f %10.2f\n", name, d.mean, d.p50, d.p90,
               d.p99, d.max);
}

using json::OrderedJson;

void AddDist(OrderedJson& j, const std::string& name, const Distribution& d) {
  j["mean_" + name + "_ms"] = d.mean;
  j["p50_" + name + "_ms"] = d.p50;
  j["p90_" + name + "_ms"] = d.p90;
  j["p99_" + name + "_ms"] = d.p99;
  j["max_" + name + "_ms"] = d.max;
}

// The metric fields of one run (tandem.bench.v1 names where the schema has
// them), added to `j`.
void AddMetrics(OrderedJson& j, const RunSummary& r) {
  j["request_rate"] = r.request_rate > 0 ? OrderedJson(r.request_rate) : OrderedJson(nullptr);
  j["max_concurrency"] = r.max_concurrency;
  j["burstiness"] = r.burstiness;
  j["num_requests"] = r.num_requests;
  j["completed"] = r.completed;
  j["failed"] = r.failed;
  j["duration_s"] = r.wall_s;
  j["concurrency"] = std::max(1.0, r.mean_in_flight);
  j["mean_in_flight"] = r.mean_in_flight;
  j["request_throughput"] = r.request_throughput;
  j["output_tokens_per_second"] = r.output_tokens_per_second;
  j["total_tokens_per_second"] = r.total_tokens_per_second;
  j["goodput"] = r.goodput;
  j["good_requests"] = r.good_requests;
  j["total_prompt_tokens"] = r.total_prompt_tokens;
  j["total_cached_tokens"] = r.total_cached_tokens;
  j["total_output_tokens"] = r.total_output_tokens;
  j["prompt_tokens_mean"] = r.prompt_tokens_mean;
  j["output_tokens_mean"] = r.output_tokens_mean;
  OrderedJson errors = OrderedJson::object();
  for (const auto& [code, n] : r.errors) errors[code] = n;
  j["errors"] = std::move(errors);
  AddDist(j, "ttft", r.ttft);
  AddDist(j, "tpot", r.tpot);
  AddDist(j, "itl", r.itl);
  AddDist(j, "e2e", r.e2e);
}

OrderedJson RecordJson(const RequestRecord& q) {
  return {{"index", q.index},
          {"ok", q.ok},
          {"code", q.error_code},
          {"error", q.error_message},
          {"finish_reason", q.finish_reason},
          {"start_ms", q.start_ms},
          {"ttft_ms", q.ttft_ms},
          {"tpot_ms", q.TpotMs()},
          {"e2e_ms", q.e2e_ms},
          {"prompt_tokens", q.prompt_tokens},
          {"cached_tokens", q.cached_tokens},
          {"output_tokens", q.output_tokens},
          {"num_chunks", q.num_chunks},
          {"itl_ms", q.itl_ms}};
}

}  // namespace

void PrintRun(const RunSummary& r, const ReportContext& ctx, std::FILE* out) {
  std::fprintf(out, "bench: %s %s, model %s, %s workload, rate %s", ctx.backend.c_str(),
               ctx.target.c_str(), ctx.model.c_str(), ctx.workload.c_str(),
               RateText(r.request_rate).c_str());
  if (r.max_concurrency > 0) std::fprintf(out, ", max concurrency %d", (int)r.max_concurrency);
  std::fprintf(out, "\n");
  std::fprintf(out, "  requests          %d ok / %d sent in %.2f s (%d failed)\n", (int)r.completed,
               (int)r.num_requests, r.wall_s, (int)r.failed);
  std::fprintf(out, "  request rate      %.3f req/s  (goodput %.3f req/s, %d meet the SLOs)\n",
               r.request_throughput, r.goodput, (int)r.good_requests);
  std::fprintf(out, "  output tokens     %d  (%.1f tokens/s; prompt+output %.1f tokens/s)\n",
               (int)r.total_output_tokens, r.output_tokens_per_second, r.total_tokens_per_second);
  std::fprintf(out, "  prompt tokens     %d  (%d from the prefix cache)\n",
               (int)r.total_prompt_tokens, (int)r.total_cached_tokens);
  std::fprintf(out, "  mean in flight    %.2f\n", r.mean_in_flight);
  std::fprintf(out, "  %-12s %10s %10s %10s %10s %10s\n", "ms", "mean", "p50", "p90", "p99", "max");
  PrintDist(out, "TTFT", r.ttft);
  PrintDist(out, "TPOT", r.tpot);
  PrintDist(out, "ITL", r.itl);
  PrintDist(out, "e2e", r.e2e);
  if (!r.errors.empty()) {
    std::vector<std::string> parts;
    for (const auto& [code, n] : r.errors) parts.push_back(absl::StrCat(code, " x", n));
    std::fprintf(out, "  errors            %s\n", absl::StrJoin(parts, ", ").c_str());
    for (const RequestRecord& q : r.records) {
      if (!q.ok) {
        std::fprintf(out, "  first error       %s: %s\n", q.error_code.c_str(),
                     q.error_message.c_str());
        break;
      }
    }
  }
}

void PrintSweep(const std::vector<RunSummary>& runs, std::FILE* out) {
  std::fprintf(out, "%10s %6s %9s %10s %9s %9s %9s %9s %9s %9s\n", "rate", "ok", "req/s", "tok/s",
               "goodput", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "e2e p99");
  for (const RunSummary& r : runs) {
    std::fprintf(out, "%10s %6d %9.3f %10.1f %9.3f %9.1f %9.1f %9.2f %9.2f %9.1f\n",
                 RateText(r.request_rate).c_str(), (int)r.completed, r.request_throughput,
                 r.output_tokens_per_second, r.goodput, r.ttft.p50, r.ttft.p99, r.tpot.p50,
                 r.tpot.p99, r.e2e.p99);
  }
}

std::string ToJson(const std::vector<RunSummary>& runs, const ReportContext& ctx) {
  OrderedJson out = {{"schema", "tandem.bench.v1"},
                     {"backend", ctx.backend},
                     {"target", ctx.target},
                     {"model", ctx.model}};
  if (!ctx.device.empty()) out["device"] = ctx.device;
  out["workload"] = ctx.workload;
  out["seed"] = ctx.seed;
  out["slo_ttft_ms"] = ctx.slo.ttft_ms;
  out["slo_tpot_ms"] = ctx.slo.tpot_ms;
  if (!runs.empty()) AddMetrics(out, runs.back());
  OrderedJson list = OrderedJson::array();
  for (const RunSummary& run : runs) {
    OrderedJson j = OrderedJson::object();
    AddMetrics(j, run);
    OrderedJson requests = OrderedJson::array();
    for (const RequestRecord& q : run.records) requests.push_back(RecordJson(q));
    j["requests"] = std::move(requests);
    list.push_back(std::move(j));
  }
  out["runs"] = std::move(list);
  return json::Dump(out) + "\n";
}

absl::Status Plot(const std::string& json_path, const std::string& png_path) {
  const std::string src = TANDEM_SOURCE_DIR;
  std::string python = "python3";
  if (const char* env = std::getenv("TANDEM_PYTHON"); env != nullptr && *env) {
    python = env;
  } else if (access((src + "/.venv/bin/python").c_str(), X_OK) == 0) {
    python = src + "/.venv/bin/python";
  }
  const std::string script = src + "/tools/plot_bench.py";
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    execlp(python.c_str(), python.c_str(), script.c_str(), json_path.c_str(), png_path.c_str(),
           static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat(python, " ", script, " failed (exit ",
                                            WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                                            "); pip install -r tools/requirements.txt"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::bench
